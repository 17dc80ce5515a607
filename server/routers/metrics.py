"""``GET /metrics``: Prometheus text exposition of this app's metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from elmo_cache.server.deps import MetricsDep
from elmo_cache.server.errors import error_responses
from elmo_cache.server.metrics import CONTENT_TYPE_LATEST

__all__ = ["router"]

router = APIRouter(tags=["metrics"])  # create_app adds the API-key check when one is set


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: {
            "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}},
            "description": "requests, latencies, cache hits/misses, live batch sizes, queue depth",
        },
        **error_responses(401),
    },
)
async def metrics(metrics: MetricsDep) -> Response:
    """Counters and histograms in the Prometheus text format (scrape with a bearer token when one is set)."""
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
