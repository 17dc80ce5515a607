"""Pooled sentence vectors (``build --pool``): one vector per sentence from its tokens' vectors.

A pool is taken over a sentence's tokens, separately for each stored layer (or over the mixed vectors),
from the float32 rows the build selected or mixed, before any cast or quantisation:

* ``mean``: the float32 sum of the token vectors in token order, divided by the token count in float32
  (exactly ``numpy.mean(rows, axis=0, dtype=numpy.float32)`` of C-contiguous rows: numpy sums an outer
  axis one row after another, so the value does not depend on the device, the batch or the library);
* ``max``: the largest value of each component over the tokens;
* ``first-last``: the first token's vector followed by the last token's (the last axis doubles, per
  layer for layered output); a one-token sentence gives its vector twice.

An empty sentence has no token to pool: its pooled vector is all zeros (never NaN), and ``lengths[i] ==
0`` tells it apart from a sentence whose pool happens to be zero.

The same :func:`pool_rows` computes the build's pooled vectors, the reader's fallback for a cache built
without (or with another) pool, and the server's answers, so they agree wherever their float32 rows do.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.store.format import POOL_METHODS, POOLED_ARRAY, VECTOR_DTYPES

__all__ = [
    "POOLS",
    "POOLED",
    "Pool",
    "parse_pool",
    "pool_of",
    "pool_rows",
    "pool_batch",
    "pooled_shape",
]

POOLS = POOL_METHODS
"""Valid ``--pool`` methods."""

POOLED = POOLED_ARRAY
"""Name of the per-sentence array holding the pooled vectors (FORMAT.md, "Pooled sentence vectors")."""


def parse_pool(value: str | None, *, parameter: str = "pool") -> str | None:
    """``value`` checked against :data:`POOLS` (None or ``"none"``: no pool); the error lists the choices."""
    if value is None or value == "none":
        return None
    if not isinstance(value, str) or value not in POOLS:
        raise InvalidParameterError(f"{parameter}: {value!r} is not valid; choose from {list(POOLS)}")
    return value


def pooled_shape(row_shape: tuple[int, ...], method: str) -> tuple[int, ...]:
    """The shape of one pooled vector from rows of ``row_shape``: ``(n_layers, dim)``, ``(dim,)``, or the last
    axis doubled for ``first-last``."""
    if method == "first-last":
        return (*row_shape[:-1], 2 * row_shape[-1])
    return tuple(row_shape)


@dataclass(frozen=True)
class Pool:
    """What a cache's ``pooled`` array holds (metadata ``pool``)."""

    # One of POOLS.
    method: str
    # Storage dtype of the pooled vectors: the cache's float dtype, float32 in a quantised cache (a pooled
    # vector is one row per sentence: quantising it would save little and add error to the vector asked for).
    dtype: str
    # True for ``build --pool-only``: the pooled vectors are stored *instead of* the token vectors (``vectors``
    # has no rows), so no other pool can be computed from the cache.
    only: bool = False

    @classmethod
    def for_cache(cls, method: str, vectors_dtype: str, *, only: bool = False) -> Pool:
        """The pool of a cache whose ``vectors`` have dtype ``vectors_dtype``."""
        return cls(method, vectors_dtype if vectors_dtype in VECTOR_DTYPES else "float32", only)

    def to_metadata(self) -> dict[str, Any]:
        # "only" appears in pool-only caches alone, so the metadata of caches with both stays as it was.
        return {"method": self.method, "dtype": self.dtype, **({"only": True} if self.only else {})}

    def shape(self, row_shape: tuple[int, ...]) -> tuple[int, ...]:
        """One pooled vector of a cache whose (float) rows have ``row_shape``."""
        return pooled_shape(row_shape, self.method)


def pool_of(meta: Mapping[str, Any], where: Any = "cache") -> Pool | None:
    """The :class:`Pool` recorded in a cache's metadata (None: built without ``--pool``)."""
    raw = meta.get("pool")
    if raw is None:
        return None
    if (
        not isinstance(raw, dict)
        or raw.get("method") not in POOLS
        or raw.get("dtype") not in VECTOR_DTYPES
        or raw.get("only", True) is not True
    ):
        # parse_metadata refuses these at open; metadata from elsewhere (a build's identity) is checked here.
        raise CacheFormatError(f"{where}: invalid metadata: pool {raw!r}")
    return Pool(raw["method"], raw["dtype"], bool(raw.get("only", False)))


def pool_rows(rows: Any, method: str) -> np.ndarray:
    """The pool of one sentence's token-major rows ``(n_tokens, *row)``, as float32 ``pooled_shape(row)``.

    The rows are taken in float32 (float16 rows widen exactly); zero tokens give zeros.
    """
    # C order: numpy then reduces the token axis row after row (sequentially), which is what makes the mean
    # the same wherever it is computed. A transposed view could be summed pairwise instead.
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    n = rows.shape[0]
    if n == 0:
        return np.zeros(pooled_shape(tuple(rows.shape[1:]), method), dtype=np.float32)
    if method == "mean":
        return np.add.reduce(rows, axis=0, dtype=np.float32) / np.float32(n)
    if method == "max":
        return np.maximum.reduce(rows, axis=0)
    if method == "first-last":
        return np.concatenate([rows[0], rows[-1]], axis=-1)
    raise InvalidParameterError(f"pool: {method!r} is not valid; choose from {list(POOLS)}")


def pool_batch(rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray, method: str) -> np.ndarray:
    """The pools of consecutive sentences of one batch: sentence ``k`` is ``rows[starts[k]:starts[k] + lengths[k]]``;
    returns float32 ``(len(starts), *pooled_shape)``."""
    out = np.empty((len(starts), *pooled_shape(tuple(rows.shape[1:]), method)), dtype=np.float32)
    for k, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
        out[k] = pool_rows(rows[start : start + length], method)
    return out
