"""``POST /v1/embeddings``: the OpenAI embeddings API's shape (as TEI and infinity serve it).

One pooled vector per input text; which mix and pool, and why the request's ``model`` is not
checked, is :mod:`elmo_cache.server.openai_compat`'s docstring.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from elmo_cache.server.deps import ServiceDep, TimingsDep
from elmo_cache.server.errors import error_responses
from elmo_cache.server.formats import Format, render_openai
from elmo_cache.server.openai_compat import check_dimensions, openai_selection, served_model_name
from elmo_cache.server.sizes import check_response_size

__all__ = ["router", "EmbeddingsRequest", "EmbeddingsResponse"]

router = APIRouter(tags=["openai"])  # create_app adds the API-key check when one is set

_INPUT_DOC = (
    "A text or a list of texts; each is split on whitespace as `build` splits a corpus line and gets one vector: "
    "the server's pool (`mean` unless started with --openai-pool) over its tokens of the average of the layers the "
    "cache stores (all three without a cache; a mixed cache's own mix; --openai-mix overrides). Token-id inputs "
    "are not accepted. Limits: see `GET /info`."
)


class EmbeddingsRequest(BaseModel):
    """Body of ``POST /v1/embeddings`` (the OpenAI embeddings request)."""

    # Unknown fields are ignored, as the API's other servers do: clients add their own (e.g. `user`).
    model_config = ConfigDict(extra="ignore")

    input: str | Annotated[list[str], Field(min_length=1)] = Field(description=_INPUT_DOC)
    model: str | None = Field(
        None, description="accepted and not checked: a server holds one model; the response names it"
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="`float`: numbers; `base64`: the base64 of each vector's little-endian float32 bytes"
    )
    dimensions: int | None = Field(
        None, description="the vectors' width, if given (ELMo vectors cannot be shortened: any other value is 422)"
    )
    user: str | None = Field(None, description="accepted and ignored")


class EmbeddingItem(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int = Field(description="the input's position")
    embedding: list[float] | str = Field(description="the vector: numbers, or base64 (`encoding_format`)")


class Usage(BaseModel):
    prompt_tokens: int = Field(description="whitespace tokens of all inputs")
    total_tokens: int = Field(description="the same: nothing is generated")


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str = Field(description="the model that answered (the live model, else the one that built the cache)")
    usage: Usage


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingsResponse,
    summary="One vector per text, in the OpenAI embeddings API's shape",
    responses=error_responses(401, 404, 413, 422, 429, 500, 503),
)
async def embeddings(service: ServiceDep, timings: TimingsDep, body: EmbeddingsRequest) -> Response:
    """Pooled sentence vectors from the cache when the text is there, else encoded live (404 with a cache alone)."""
    texts = [body.input] if isinstance(body.input, str) else body.input
    check_dimensions(service, body.dimensions)
    selection = openai_selection(service)
    pool = service.settings.openai_pool
    token_lists = service.tokenize_all(texts, name="input")
    fmt = Format.base64 if body.encoding_format == "base64" else Format.json
    check_response_size(
        token_lists, selection, service.dim, service.dtype, fmt, service.settings.max_response_bytes, pool=pool
    )
    answers: Any = await service.embed(token_lists, selection, timings, pool)
    started = time.perf_counter()
    response = render_openai(answers, served_model_name(service), body.encoding_format)
    timings.add("serialize", time.perf_counter() - started)
    return response
