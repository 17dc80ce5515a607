"""``GET /health``: liveness and readiness, open even when the server has an API key."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

__all__ = ["router", "Health"]

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: Literal["ok", "loading", "error"] = Field(
        description="`ok` once the model/cache are loaded and live encoding runs; `loading` before (503)"
    )
    cache: bool = Field(description="a cache is loaded")
    model: bool = Field(description="a model is loaded for live encodings")


@router.get(
    "/health",
    response_model=Health,
    summary="Ready to answer?",
    responses={503: {"model": Health, "description": "still loading, or live encoding stopped"}},
)
async def health(request: Request) -> JSONResponse:
    """200 once the model/cache are loaded (and the live batcher runs), 503 otherwise."""
    service = getattr(request.app.state, "service", None)
    if service is None:
        status = "loading"
    elif service.batcher is not None and not service.batcher.running:
        status = "error"
    else:
        status = "ok"
    body = {
        "status": status,
        "cache": service is not None and service.cache is not None,
        "model": service is not None and service.encoder is not None,
    }
    return JSONResponse(body, status_code=200 if status == "ok" else 503)
