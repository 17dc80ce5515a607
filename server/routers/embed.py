"""``GET /embed`` (one sentence in the query) and ``POST /embed`` (many sentences in a JSON body)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from elmo_cache.rows.selection import Selection
from elmo_cache.server.deps import ServiceDep, TimingsDep, require_utf8_query
from elmo_cache.server.errors import error_responses
from elmo_cache.server.formats import NPY_MEDIA_TYPE, NPZ_MEDIA_TYPE, Format, render_many, render_one
from elmo_cache.server.service import EmbedService
from elmo_cache.server.sizes import check_response_size

__all__ = ["router", "EmbedRequest", "EmbedResult", "EmbedBatchResult"]

router = APIRouter(tags=["embed"])  # create_app adds the API-key check when one is set

_LAYERS_DOC = (
    "Comma-separated layer ids to return, e.g. `1,2` (0 = token layer, 1 and 2 = LSTM layers). "
    "Default: what the cache stores (all three without a cache). Layers the cache lacks are computed "
    "live when a model is loaded; otherwise 422 lists the available ones. Not with `mix`."
)
_MIX_DOC = (
    "Three comma-separated weights `s0,s1,s2`: return `gamma * sum_j s_j * layer_j` (computed in float32) "
    "with shape (n_tokens, dim) instead of layers. A layered cache answers it when every layer with a non-zero "
    "weight is stored; a mixed cache only for its own mix; anything else is computed live when a model is loaded."
)
_GAMMA_DOC = "Scale applied after the weighted sum (default 1). Only with `mix`."
_SOFTMAX_DOC = "Treat `mix` as raw ScalarMix parameters and apply a softmax to them first. Only with `mix`."
_GET_RULES = (
    " Rules across parameters that a query string cannot state in OpenAPI (422 `invalid_parameter`): not both "
    "`layers` and `mix`; `gamma` and `softmax` only with `mix`; a mix whose result is not finite in the answer's "
    "dtype is refused."
)

# Exactly what the parsers accept, so the schema refuses what the server would (ASCII digits and
# spaces only: a regex's \d and \s differ between Python, Rust and ECMAScript). Digits are bounded
# so that every matching number is finite in float64 (at most about 1e120): "1e400" would be inf.
_FLOAT = r"[+-]?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][+-]?[0-9]{1,2})?"
# One weight per layer of the model (ELMo: 3; a Transformer: its blocks + 1): how many the model has is the
# service's check (Selection.parse with the model's layer count), which names the count it expected.
MAX_LAYERS = 256
MIX_PATTERN = rf"^ *{_FLOAT} *(?:, *{_FLOAT} *){{0,{MAX_LAYERS - 1}}}$"
LAYERS_PATTERN = r"^ *[0-9]{1,3} *(?:, *[0-9]{1,3} *)*$"

# Strict: a JSON body's `"1"` is not a layer nor `"true"` a boolean (the schema says so too).
_Weight = Annotated[float, Field(strict=True, allow_inf_nan=False)]


def _integral(value: Any) -> Any:
    # JSON Schema counts 1.0 as an integer; strict ints would not.
    return int(value) if isinstance(value, float) and value.is_integer() else value


_LayerId = Annotated[int, Field(strict=True, ge=0, lt=MAX_LAYERS), BeforeValidator(_integral)]
_LayersStr = Annotated[str, Field(pattern=LAYERS_PATTERN)]
_LayersList = Annotated[list[_LayerId], Field(min_length=1)]
# A token of a token list: not empty and without a newline, which no cache can store (elmo_cache.text.tokenize).
_Token = Annotated[str, Field(min_length=1, pattern=r"^[^\n]+$")]
_TokenList = list[_Token]
_MixStr = Annotated[str, Field(pattern=MIX_PATTERN)]
_MixList = Annotated[list[_Weight], Field(min_length=1, max_length=MAX_LAYERS)]
_POOL_DOC = (
    "One vector for the sentence instead of one per token: `mean` or `max` over its tokens, or `first-last` (the "
    "first token's vector and the last token's, side by side: `dim` doubles), per layer or of the mix; shape "
    "(n_layers, dim) or (dim,) for a mix. Read from the cache's pooled vectors when it was built with that "
    "`--pool`, else computed in float32 from the token vectors; an empty sentence gives zeros."
)


class PoolName(str, enum.Enum):
    """The pools ``/embed`` computes (elmo_cache.rows.pooling.POOLS)."""

    mean = "mean"
    max = "max"
    first_last = "first-last"


_FORMAT_DOC = (
    "`json`: vectors as nested lists; `npy`: the raw array as a `.npy` file (`application/x-npy`; for POST a "
    "`.npz` of `arr_0`, `arr_1`, ... as `application/x-npz`), metadata in `X-Elmo-*` headers; `base64`: JSON whose "
    "`data` is the base64 of the little-endian C-order bytes, with `shape` and `dtype`."
)


class EmbedResult(BaseModel):
    """One sentence's answer (JSON and base64 formats)."""

    source: Literal["cache", "live"] = Field(description="`cache` when read from the store, `live` when encoded now")
    tokens: list[str] = Field(
        description="the sentence's tokens (a text is split on whitespace, as `build` does; a token list is as given)"
    )
    shape: list[int] = Field(
        description="(n_layers, n_tokens, dim) for layers, (n_tokens, dim) for a mix; with `pool`, (n_layers, dim) "
        "or (dim,) (dim doubled for first-last)"
    )
    dtype: str = Field(description="`float32` or `float16` (the cache's dtype; float32 without a cache)")
    vectors: list[Any] | None = Field(None, description="nested lists of numbers (format `json`)")
    encoding: str | None = Field(None, description="`base64-little-endian-c-order` (format `base64`)")
    data: str | None = Field(None, description="base64 of the raw bytes (format `base64`)")
    layers: list[int] | None = Field(None, description="the layer ids returned, or null for a mix (GET only)")
    mix: dict[str, Any] | None = Field(None, description="the mix applied (weights, gamma, raw, softmax) (GET only)")
    pool: PoolName | None = Field(None, description="the pool of a pooled answer (`pool` asked), else absent")


class EmbedBatchResult(BaseModel):
    """The answer of ``POST /embed``: one entry per sentence, in request order."""

    results: list[EmbedResult]
    layers: list[int] | None = Field(None, description="the layer ids returned, or null for a mix")
    mix: dict[str, Any] | None = Field(None, description="the mix applied, or null")


class EmbedRequest(BaseModel):
    """Body of ``POST /embed``: `layers` or `mix`, not both; `gamma` and `softmax` only with `mix`."""

    # The rules across fields, in the schema too (JSON Schema 2020-12, as OpenAPI 3.1 uses).
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "not": {"required": ["layers", "mix"]},
            "dependentRequired": {"gamma": ["mix"], "softmax": ["mix"]},
        },
    )

    sentences: list[str | _TokenList] = Field(
        min_length=1,
        description="sentences: each a text, split on whitespace, or a list of tokens taken as they are (tokens "
        "with spaces inside, as `build --input-format tsv|conllu` stores them). Limits: see `GET /info`",
    )
    layers: _LayersStr | _LayersList | None = Field(None, description=_LAYERS_DOC)
    # Not nullable: `gamma`/`softmax` require the key `mix`, which must then hold a mix.
    mix: _MixStr | _MixList | SkipJsonSchema[None] = Field(None, description=_MIX_DOC)
    gamma: _Weight | None = Field(None, description=_GAMMA_DOC)
    softmax: Annotated[bool, Field(strict=True)] = Field(False, description=_SOFTMAX_DOC)
    # Not nullable, as format: leave it out for token vectors.
    pool: PoolName | SkipJsonSchema[None] = Field(None, description=_POOL_DOC)
    format: Format = Field(Format.json, description=_FORMAT_DOC)

    @model_validator(mode="before")
    @classmethod
    def _rules_across_fields(cls, data: Any) -> Any:
        # By key, as the schema's `not`/`dependentRequired` say: `"layers": null` beside `mix` is refused too.
        if isinstance(data, dict):
            if "mix" in data and data["mix"] is None:
                raise ValueError("mix: null is not a mix; leave mix out, or give three weights")
            if "pool" in data and data["pool"] is None:
                choices = [p.value for p in PoolName]
                raise ValueError(f"pool: null is not a pool; leave pool out, or give one of {choices}")
            if "layers" in data and "mix" in data:
                raise ValueError("layers and mix are exclusive: give one of them, not both")
            for key in ("gamma", "softmax"):
                if key in data and "mix" not in data:
                    raise ValueError(f"{key} only applies with mix: drop it, or give mix")
        return data


_ERRORS = error_responses(401, 404, 413, 422, 429, 500, 503)
_POST_ERRORS = error_responses(401, 404, 413, 422, 429, 500, 503)
_BINARY = {"schema": {"type": "string", "format": "binary"}}


# Up to this many numbers, writing the body takes less time than a thread hop (tens of µs).
_INLINE_NUMBERS = 16384


async def _render(service: EmbedService, render: Callable[..., Response], embeddings: Any, *args: Any) -> Response:
    items = embeddings if isinstance(embeddings, list) else [embeddings]
    if sum(e.vectors.size for e in items) <= _INLINE_NUMBERS:
        return render(embeddings, *args)
    # Writing a big JSON or npz body takes milliseconds: keep it off the event loop, bounded in time.
    return await service.pool.run(service.timeout_s, "writing the response", render, embeddings, *args)


def _check_size(
    service: EmbedService, token_lists: list[list[str]], selection: Selection, fmt: Format, pool: PoolName | None
) -> None:
    """413 before anything is read or encoded when the answer could pass ``max_response_bytes``."""
    limit = service.settings.max_response_bytes
    check_response_size(token_lists, selection, service.dim, service.dtype, fmt, limit, pool=_name(pool))


def _name(pool: PoolName | None) -> str | None:
    return None if pool is None else pool.value


@router.get(
    "/embed",
    response_model=EmbedResult,
    summary="Vectors of one sentence",
    responses={200: {"content": {NPY_MEDIA_TYPE: _BINARY}, "description": "the vectors"}, **_ERRORS},
    dependencies=[Depends(require_utf8_query)],
)
async def embed_one(
    service: ServiceDep,
    timings: TimingsDep,
    sentence: Annotated[str, Query(description="the sentence; tokens are separated by whitespace")],
    layers: Annotated[
        str | None, Query(description=_LAYERS_DOC + _GET_RULES, examples=["0,1,2"], pattern=LAYERS_PATTERN)
    ] = None,
    mix: Annotated[
        str | None, Query(description=_MIX_DOC + _GET_RULES, examples=["0.2,0.3,0.5"], pattern=MIX_PATTERN)
    ] = None,
    gamma: Annotated[float | None, Query(description=_GAMMA_DOC + _GET_RULES, allow_inf_nan=False)] = None,
    softmax: Annotated[bool, Query(description=_SOFTMAX_DOC)] = False,
    pool: Annotated[PoolName | None, Query(description=_POOL_DOC)] = None,
    format: Annotated[Format, Query(description=_FORMAT_DOC)] = Format.json,
) -> Response:
    """Answer from the cache when the sentence is there, else encode it live (404 with a cache alone)."""
    selection = service.resolve(layers, mix, gamma, softmax)
    token_lists = service.tokenize_all([sentence], name="sentence")
    _check_size(service, token_lists, selection, format, pool)
    [embedding] = await service.embed(token_lists, selection, timings, _name(pool))
    started = time.perf_counter()
    response = await _render(service, render_one, embedding, selection, format)
    timings.add("serialize", time.perf_counter() - started)
    return response


@router.post(
    "/embed",
    response_model=EmbedBatchResult,
    summary="Vectors of many sentences",
    responses={200: {"content": {NPZ_MEDIA_TYPE: _BINARY}, "description": "the vectors, per sentence"}, **_POST_ERRORS},
)
async def embed_many(service: ServiceDep, timings: TimingsDep, body: EmbedRequest) -> Response:
    """Same as ``GET /embed`` for every sentence of the body; misses of one request share live batches."""
    selection = service.resolve(body.layers, body.mix, body.gamma, body.softmax)
    token_lists = service.tokenize_all(body.sentences)
    _check_size(service, token_lists, selection, body.format, body.pool)
    embeddings = await service.embed(token_lists, selection, timings, _name(body.pool))
    started = time.perf_counter()
    response = await _render(service, render_many, embeddings, selection, body.format)
    timings.add("serialize", time.perf_counter() - started)
    return response
