"""``verify`` of the pooled sentence vectors (``build --pool``): the ``pooled`` array's shape and dtype, finite
values, zeros for empty sentences, a repeat's copy of its first occurrence's vector (dedupe), and, for a
bounded, evenly spread set of sentences, the pool recomputed from the stored token vectors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.rows.codecs import codec_of_metadata
from elmo_cache.rows.pooling import pool_rows, pooled_shape
from elmo_cache.store.format import POOLED_ARRAY

if TYPE_CHECKING:
    from elmo_cache.verify.report import VerifyReport

__all__ = ["check_pooled", "RECOMPUTED"]

RECOMPUTED = 10_000
"""At most this many sentences get their pool recomputed from their token vectors (reading every sentence's
rows a second time would double verify's reads of a large cache)."""

# Sentences' pooled rows read at a time.
_BLOCK = 1 << 14


def check_pooled(meta: dict[str, Any], arrays: dict[str, Any], report: VerifyReport) -> None:
    """Append what is wrong with the pooled vectors to ``report.problems`` (nothing for a cache without them)."""
    pool, pooled = meta.get("pool"), arrays.get(POOLED_ARRAY)
    if pool is None:
        if pooled is not None:
            report.problems.append(f"array {POOLED_ARRAY!r} is present but the metadata has no 'pool'")
        return
    if pooled is None:
        report.problems.append(f"array {POOLED_ARRAY!r} is missing but the metadata says pool {pool!r}")
        return
    offsets, lengths = np.asarray(arrays["offsets"][:]), np.asarray(arrays["lengths"][:])
    n = len(lengths)
    row = (len(meta["layers"]), meta["dim"]) if meta["kind"] == "layers" else (meta["dim"],)
    want = (n, *pooled_shape(row, pool["method"]))
    if str(pooled.dtype) != pool["dtype"] or tuple(pooled.shape) != want:
        report.problems.append(
            f"{POOLED_ARRAY} is {pooled.dtype} {tuple(pooled.shape)}, expected {pool['dtype']} {want}"
        )
        return
    firsts = _first_occurrences(offsets, lengths) if meta.get("dedupe") else None
    for start in range(0, n, _BLOCK):
        block = np.asarray(pooled[start : start + _BLOCK])
        if not np.isfinite(block).all():
            bad = start + int(np.flatnonzero(~np.isfinite(block.reshape(len(block), -1)).all(axis=1))[0])
            report.problems.append(f"{POOLED_ARRAY}: sentence {bad}'s pooled vector is not finite")
            return
        empty = np.flatnonzero(lengths[start : start + len(block)] == 0)
        if len(empty) and block[empty].any():
            report.problems.append(
                f"{POOLED_ARRAY}: empty sentence {start + int(empty[0])} has a non-zero pooled vector"
            )
            return
    if firsts is not None:
        for i, j in firsts:
            if not np.array_equal(np.asarray(pooled[i]), np.asarray(pooled[j])):
                report.problems.append(
                    f"{POOLED_ARRAY}: sentence {i} repeats sentence {j} but their pooled vectors differ"
                )
                return
    unbounded = codec_of_metadata(meta).rounding_step(1.0) is None
    if pool.get("only") or unbounded:
        # Nothing to recompute from: a --pool-only cache stores no token vectors, and a pq cache's token rows
        # are nearest centroids, whose error has no bound a recomputed pool could be held to.
        why = "a --pool-only cache stores none" if pool.get("only") else "a pq cache's are centroids, not the values"
        report.notes.append(
            f"{POOLED_ARRAY}: not recomputed from token vectors ({why}); --sample re-encodes sentences"
            + (" and compares their pools" if pool.get("only") else "")
        )
        report.checks.append(
            f"pooled {pool['method']} vectors of all {n:,} sentences: finite, zeros for empty ones"
            + (", repeats equal to their first occurrence" if firsts is not None else "")
        )
        return
    checked = _recompute(meta, arrays, offsets, lengths, pooled, pool["method"], report)
    if checked is not None:
        report.checks.append(
            f"pooled {pool['method']} vectors of all {n:,} sentences: finite, zeros for empty ones"
            + (", repeats equal to their first occurrence" if firsts is not None else "")
            + f"; {checked:,} recomputed from their token vectors"
        )


def _first_occurrences(offsets: np.ndarray, lengths: np.ndarray) -> list[tuple[int, int]]:
    """``(repeat, first occurrence)`` of every non-empty sentence sharing an earlier one's rows."""
    nonempty = np.flatnonzero(lengths > 0)
    _, first, inverse = np.unique(offsets[nonempty], return_index=True, return_inverse=True)
    owners = nonempty[first][inverse]
    return [(i, j) for i, j in zip(nonempty.tolist(), owners.tolist()) if i != j]


def _recompute(
    meta: dict[str, Any],
    arrays: dict[str, Any],
    offsets: np.ndarray,
    lengths: np.ndarray,
    pooled: Any,
    method: str,
    report: VerifyReport,
) -> int | None:
    """Compare the stored pool of up to :data:`RECOMPUTED` sentences with the pool of their stored token rows.

    A float32 cache pools exactly its stored rows: equal bit for bit. Otherwise the stored rows were rounded
    after pooling (float16: a unit in the last place; int8: half a step), so the two agree within that."""
    n = len(lengths)
    chosen: Any = np.unique(np.linspace(0, n - 1, num=min(n, RECOMPUTED)).astype(np.int64)) if n else []
    codec = codec_of_metadata(meta)
    vectors = arrays["vectors"]
    count = 0
    for i in (int(i) for i in chosen):
        start, length = int(offsets[i]), int(lengths[i])
        rows = np.asarray(vectors[start : start + length])
        if codec.quantized:
            rows = codec.decode(rows)
        stored = np.asarray(pooled[i], dtype=np.float32)
        again = pool_rows(rows, method)
        if codec.exact_pool:
            same = np.array_equal(stored, again)
        else:
            scale = float(np.abs(rows).max()) if length else 0.0
            step = codec.rounding_step(scale) or 0.0
            same = bool(np.allclose(stored, again, rtol=2.0**-10, atol=step + 1e-6))
        if not same:
            report.problems.append(
                f"{POOLED_ARRAY}: sentence {i}'s stored {method} vector is not the {method} of its token vectors "
                f"(largest difference {float(np.abs(stored - again).max()):.3g})"
            )
            return None
        count += 1
    return count
