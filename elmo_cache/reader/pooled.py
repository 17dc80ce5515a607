"""Reading pooled sentence vectors: the stored ``pooled`` array of a cache built with ``--pool``, or a pool
computed from a sentence's token vectors (:mod:`elmo_cache.rows.pooling`) for any other cache or method.

:meth:`elmo_cache.reader.cache.Cache.sentence_vector` is the public entry point; this module keeps the reader's
own file to the token vectors.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.pooling import POOLS, Pool, parse_pool, pool_rows
from elmo_cache.store.blocksums import BlockGuard

__all__ = ["PooledVectors", "pool_of_sentence", "choose_pool", "pool_only_refusal"]


class PooledVectors:
    """The ``pooled`` array of one cache: row ``i`` is sentence ``i``'s pooled vector."""

    def __init__(self, array: Any, pool: Pool, guard: BlockGuard | None):
        self.pool = pool
        self._guard = guard
        self._read = array.rows if hasattr(array, "rows") else (lambda start, stop: array[start:stop])

    def row(self, i: int) -> np.ndarray:
        """Sentence ``i``'s stored pooled vector (read-only, stored dtype); its block is checked on first read."""
        guard = self._guard
        if guard is not None and not guard.ok[i // guard.block_rows]:
            guard.check(i // guard.block_rows)
        return self._read(i, i + 1)[0]


def choose_pool(asked: str | None, stored: Pool | None, where: Any) -> str:
    """The pool a read computes or reads: ``asked`` (checked), else the cache's own; an error naming the choices
    when there is neither."""
    method = parse_pool(asked)
    if method is not None:
        return method
    if stored is None:
        raise InvalidParameterError(
            f"pool: {where} was built without --pool, so it has no pooled vectors of its own; pass pool= one of "
            f"{list(POOLS)} to compute one from the sentence's token vectors (or rebuild with --pool)"
        )
    return stored.method


def pool_of_sentence(vectors: np.ndarray, layered: bool, method: str) -> np.ndarray:
    """The ``method`` pool (float32) of one sentence as the reader returns it: ``(n_layers, n_tokens, dim)`` for
    a layered cache, ``(n_tokens, dim)`` for a mixed one."""
    rows = np.asarray(vectors).transpose(1, 0, 2) if layered else vectors  # token-major, as the build pools
    return pool_rows(rows, method)


def pool_only_refusal(where: Any, stored: Pool | None, asked: str | None = None) -> str:
    """Why a ``--pool-only`` cache cannot answer: token vectors, or a pool other than its own, were asked for."""
    own = stored.method if stored is not None else "?"
    if asked is not None:
        return (
            f"pool: {where} stores only {own!r} pooled vectors (--pool-only) and no token vectors to compute "
            f"{asked!r} from; ask for pool={own!r}, or rebuild without --pool-only"
        )
    return (
        f"{where}: this cache stores only pooled vectors (--pool-only, pool {own!r}), no token vectors; "
        "use cache.sentence_vector(i), or rebuild without --pool-only"
    )
