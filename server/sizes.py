"""How big an answer will be, known before anything is read, encoded or written.

The answer's shape follows from the request alone (tokens x layers x dim), so an oversized
answer is refused (413) before it costs memory: a 69 KB POST within every other limit once
asked for 110 MB of JSON. The estimate is an upper bound for JSON text and exact, up to the
fixed headers, for the binary formats.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from elmo_cache.errors import LimitExceededError
from elmo_cache.rows.selection import Selection
from elmo_cache.server import formats
from elmo_cache.server.formats import Format

__all__ = ["response_bytes", "check_response_size"]

# Longest text of one float32 number plus its comma: orjson writes the shortest round-trip form,
# at most 15 characters ("-1.17549435e-38"); json.dumps of the widened float64 at most 23.
_JSON_NUMBER_ORJSON = 16
_JSON_NUMBER_STDLIB = 24
# One token in JSON: quotes and comma, and up to 6 bytes ("\u0001") per byte of a control character.
_JSON_TOKEN_BYTES = 6
# Everything else of one entry (keys, shape, dtype, source, echoed layers/mix) and of the envelope.
_ENTRY_OVERHEAD = 512
# .npy header (a multiple of 64 bytes, 128 for these shapes) and a .npz member's zip headers.
_NPY_HEADER = 128
_NPZ_MEMBER = 128 + 2 * 64


def response_bytes(
    token_lists: Sequence[Sequence[str]],
    selection: Selection,
    dim: int,
    dtype: np.dtype,
    fmt: Format,
    pool: str | None = None,
) -> int:
    """An upper bound of the response body's size for these sentences (exact for ``npy`` up to headers);
    with ``pool`` one vector per sentence (first-last: two vectors' numbers)."""
    per_number = _JSON_NUMBER_ORJSON if formats.orjson is not None else _JSON_NUMBER_STDLIB
    total = _ENTRY_OVERHEAD
    for tokens in token_lists:
        shape = selection.vector_shape(len(tokens) if pool is None else 2 if pool == "first-last" else 1, dim)
        numbers = math.prod(shape)
        if fmt is Format.npy:
            total += _NPY_HEADER + _NPZ_MEMBER + numbers * dtype.itemsize
            continue
        text = sum(len(token.encode("utf-8")) * _JSON_TOKEN_BYTES + 3 for token in tokens)
        if fmt is Format.base64:
            body = 4 * math.ceil(numbers * dtype.itemsize / 3)
        else:  # json: every number, and the brackets and commas of each row of each layer
            rows = math.prod(shape[:-1])
            body = numbers * per_number + 3 * (rows + 1)
        total += _ENTRY_OVERHEAD + text + body
    return total


def check_response_size(
    token_lists: Sequence[Sequence[str]],
    selection: Selection,
    dim: int,
    dtype: np.dtype,
    fmt: Format,
    limit: int,
    *,
    pool: str | None = None,
) -> None:
    """:class:`LimitExceededError` (413) when the answer could be larger than ``limit`` bytes."""
    size = response_bytes(token_lists, selection, dim, dtype, fmt, pool)
    if size > limit:
        tokens = sum(len(tokens) for tokens in token_lists)
        per_token = math.prod(selection.vector_shape(1, dim))
        raise LimitExceededError(
            f"response: the answer would be up to {size} bytes ({tokens} tokens x {per_token} {dtype.name} numbers "
            f"as {fmt.value}); the limit is {limit} bytes (max_response_bytes); ask for fewer sentences or "
            "layers, a mix, or format npy/base64"
        )
