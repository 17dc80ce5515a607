"""``/embed?pool=``: one vector per sentence (:mod:`elmo_cache.rows.pooling`), without HTTP.

A cache hit is answered from the cache's ``pooled`` array when it holds that pool of what is asked (the
same mix, or any of its stored layers: a pool is taken per layer, so a layer's pooled vector is the pool of
that layer), else the pool is computed from the hit's token vectors; a live answer pools the encoder's
float32 output. Every pool is computed in float32 by the build's own function, then cast to the answer's
dtype, as the stored ones were.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from elmo_cache.rows.pooling import pool_rows, pooled_shape
from elmo_cache.rows.selection import Selection

if TYPE_CHECKING:
    from elmo_cache.reader.cache import Cache

__all__ = [
    "pooled_vector_shape",
    "pooled_cached",
    "pooled_written_back",
    "pooled_live",
    "pooled_empty",
    "pool_only_refusal",
    "stored_pool_answers",
]


def pooled_vector_shape(selection: Selection, dim: int, method: str) -> tuple[int, ...]:
    """The shape of one pooled answer: ``(n_layers, dim)``, ``(dim,)`` for a mix, ``dim`` doubled for first-last."""
    return pooled_shape(selection.row_shape(dim), method)


def _pool(vectors: np.ndarray, selection: Selection, method: str) -> np.ndarray:
    """The pool of one sentence in the answer's layout ((L, n, D) layers or (n, D) mix), float32."""
    rows = vectors.transpose(1, 0, 2) if selection.mix is None else vectors  # token-major, as the build pools
    return pool_rows(rows, method)


def pooled_cached(
    cache: Cache, index: int, selection: Selection, stored: Selection, method: str, dtype: np.dtype
) -> np.ndarray:
    """Sentence ``index`` of ``cache`` (which stores ``stored``) pooled by ``method``, in ``dtype``."""
    if stored_pool_answers(cache, selection, stored, method):
        # Layers from layers (a pooled row is per layer) or the cache's own mix: read, not computed.
        row = cache.sentence_vector(index)
        assert row is not None
        return selection.extract(stored, row, dtype)
    tokens = selection.extract(stored, cache[index], np.float32)
    return _pool(tokens, selection, method).astype(dtype, copy=False)


def pooled_written_back(
    cache: Cache,
    vectors: np.ndarray,
    pooled: np.ndarray | None,
    selection: Selection,
    stored: Selection,
    method: str,
    dtype: np.dtype,
) -> np.ndarray:
    """A written-back sentence (its ``vectors`` as ``cache[i]`` gives them, and the ``pooled`` vector stored with
    them) pooled by ``method``, as :func:`pooled_cached` pools a cached one."""
    if pooled is not None and stored_pool_answers(cache, selection, stored, method):
        return selection.extract(stored, pooled, dtype)
    tokens = selection.extract(stored, vectors, np.float32)
    return _pool(tokens, selection, method).astype(dtype, copy=False)


def stored_pool_answers(cache: Cache, selection: Selection, stored: Selection, method: str | None) -> bool:
    """Whether ``cache``'s own ``pooled`` array answers a request for ``selection`` pooled by ``method``: the same
    pool, and layers from layers (a pooled row is per layer) or the cache's own mix. For a ``--pool-only`` cache,
    which has no token vectors to compute anything else from, this is everything it can answer."""
    own = cache.pool
    return own is not None and own.method == method and (selection.mix is None) == (stored.mix is None)


def pool_only_refusal(cache: Cache, method: str | None) -> str:
    """The 422 of a request a ``--pool-only`` cache cannot answer, on a server without a model."""
    own = cache.pool.method if cache.pool is not None else "?"
    asked = f"pool={method}" if method is not None else "token vectors (no pool)"
    return (
        f"pool: the cache stores only {own} pooled sentence vectors (--pool-only), no token vectors, so it cannot "
        f"answer {asked} (nor a mix it was not built with); ask with pool={own}, or start the server with --model "
        "to encode the rest live"
    )


def pooled_live(acts: np.ndarray, selection: Selection, method: str, dtype: np.dtype) -> np.ndarray:
    """An encoder output ``(3, n_tokens, dim)`` float32 pooled by ``method`` over the selection, in ``dtype``.

    Pooled from the float32 vectors even for a quantised cache, as its stored pooled vectors are."""
    return _pool(selection.apply_array(acts, np.float32), selection, method).astype(dtype, copy=False)


def pooled_empty(selection: Selection, dim: int, method: str, dtype: np.dtype) -> np.ndarray:
    """The pool of a sentence of no tokens: zeros."""
    return np.zeros(pooled_vector_shape(selection, dim, method), dtype=dtype)
