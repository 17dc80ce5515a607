"""Response bodies of ``/embed``: JSON lists, ``.npy`` / ``.npz`` bytes, or base64 inside JSON.

Binary forms exist because nested JSON lists cost far more to write and parse than
the vectors themselves; ``npy`` and ``base64`` carry the raw little-endian bytes.
"""

from __future__ import annotations

import base64
import enum
import io
import json
from typing import Any

import numpy as np
import orjson
from fastapi.responses import Response

from elmo_cache.rows.selection import Selection
from elmo_cache.server.service import Embedding

__all__ = [
    "Format",
    "NPY_MEDIA_TYPE",
    "NPZ_MEDIA_TYPE",
    "render_one",
    "render_many",
    "render_openai",
    "EXPOSED_HEADERS",
]

NPY_MEDIA_TYPE = "application/x-npy"
NPZ_MEDIA_TYPE = "application/x-npz"
_MAX_TOKENS_HEADER = 8192
EXPOSED_HEADERS = (
    "X-Elmo-Source",
    "X-Elmo-Shape",
    "X-Elmo-Dtype",
    "X-Elmo-Pool",
    "X-Elmo-Tokens",
    "X-Elmo-Sources",
    "X-Elmo-Count",
)
"""The metadata headers of npy/npz answers: a browser may read them when CORS allows the origin."""


class Format(str, enum.Enum):
    """How vectors are written in the response."""

    json = "json"
    npy = "npy"
    base64 = "base64"


def _little_endian(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


def _item(embedding: Embedding, fmt: Format) -> dict[str, Any]:
    vectors = embedding.vectors
    item: dict[str, Any] = {
        "source": embedding.source,
        "tokens": embedding.tokens,
        "shape": list(vectors.shape),
        "dtype": vectors.dtype.name,
        **({} if embedding.pool is None else {"pool": embedding.pool}),
    }
    if fmt is Format.base64:
        item["encoding"] = "base64-little-endian-c-order"
        item["data"] = base64.b64encode(_little_endian(vectors).tobytes()).decode("ascii")
    else:
        # float16 -> float32 is exact, and the shortest float32 text reads back to the same value.
        item["vectors"] = vectors.astype(np.float32, copy=False)
    return item


def _dumps(payload: dict[str, Any]) -> bytes:
    # One encoder, so one text for the same vectors: orjson (a dependency of the `server` extra)
    # writes numpy arrays directly, ~17x faster than json.dumps of nested lists.
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def render_one(embedding: Embedding, selection: Selection, fmt: Format) -> Response:
    """The response of ``GET /embed``."""
    if fmt is Format.npy:
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, _little_endian(embedding.vectors), allow_pickle=False)
        headers = {
            "X-Elmo-Source": embedding.source,
            "X-Elmo-Shape": ",".join(str(n) for n in embedding.vectors.shape),
            "X-Elmo-Dtype": embedding.vectors.dtype.name,
            **({} if embedding.pool is None else {"X-Elmo-Pool": embedding.pool}),
        }
        # ASCII-only JSON so any token survives the latin-1 header encoding; left out when long,
        # since HTTP clients refuse big header blocks (the tokens are the sentence split on whitespace).
        tokens = json.dumps(embedding.tokens, ensure_ascii=True)
        if len(tokens) <= _MAX_TOKENS_HEADER:
            headers["X-Elmo-Tokens"] = tokens
        return Response(buffer.getvalue(), media_type=NPY_MEDIA_TYPE, headers=headers)
    payload = _item(embedding, fmt)
    payload.update(selection.describe())
    return Response(_dumps(payload), media_type="application/json")


def render_many(embeddings: list[Embedding], selection: Selection, fmt: Format) -> Response:
    """The response of ``POST /embed``: one entry per sentence, in request order."""
    if fmt is Format.npy:
        buffer = io.BytesIO()
        np.savez(buffer, *[_little_endian(e.vectors) for e in embeddings])
        headers = {
            "X-Elmo-Sources": ",".join(e.source for e in embeddings),
            "X-Elmo-Dtype": embeddings[0].vectors.dtype.name if embeddings else "float32",
            "X-Elmo-Count": str(len(embeddings)),
        }
        return Response(buffer.getvalue(), media_type=NPZ_MEDIA_TYPE, headers=headers)
    payload = {"results": [_item(e, fmt) for e in embeddings], **selection.describe()}
    return Response(_dumps(payload), media_type="application/json")


def render_openai(embeddings: list[Embedding], model: str, encoding_format: str) -> Response:
    """The response of ``POST /v1/embeddings`` in the OpenAI embeddings API's shape: one pooled float32 vector
    per input, as numbers or (``base64``) the base64 of its little-endian float32 bytes, and the token count."""
    data = []
    for index, embedding in enumerate(embeddings):
        vector = embedding.vectors.astype(np.float32, copy=False)
        encoded: Any = vector
        if encoding_format == "base64":
            encoded = base64.b64encode(_little_endian(vector).tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    tokens = sum(len(embedding.tokens) for embedding in embeddings)
    payload = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return Response(_dumps(payload), media_type="application/json")
