"""``GET /info``: model identity, cache metadata and the limits clients must respect."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from elmo_cache.server.deps import ServiceDep, SettingsDep
from elmo_cache.server.errors import error_responses
from elmo_cache.version import __version__

__all__ = ["router", "Info"]

router = APIRouter(tags=["info"])  # create_app adds the API-key check when one is set


class Info(BaseModel):
    version: str = Field(description="elmo-cache version of the server")
    model: dict[str, Any] | None = Field(description="`Encoder.identity` of the live model, or null")
    cache: dict[str, Any] | None = Field(description="path, sentence count and metadata of the cache, or null")
    default_output: dict[str, Any] = Field(description="what `/embed` returns without `layers`/`mix`")
    available_layers: list[int] = Field(description="layer ids `layers` may name")
    dtype: str = Field(description="dtype of every answer")
    dim: int = Field(description="vector width")
    limits: dict[str, Any] = Field(description="request limits and live batching settings")
    write_back: dict[str, Any] | None = Field(
        None,
        description="with --write-back: the journal's path, sentences, bytes, max_bytes and commit_ms; else null",
    )
    auth: bool = Field(description="whether routes other than /health need `Authorization: Bearer <key>`")


@router.get("/info", response_model=Info, summary="Model, cache and limits", responses=error_responses(401, 503))
async def info(service: ServiceDep, settings: SettingsDep) -> Info:
    """Describe what this server answers from and what it accepts."""
    return Info(version=__version__, limits=settings.limits(), auth=settings.api_key is not None, **service.info())
