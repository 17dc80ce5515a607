"""The ``pooled`` array's place in the store: its block and chunk sizes, and the copies deduplicated repeats get.

What a pool is (mean, max, first-last) is :mod:`elmo_cache.rows.pooling`'s; the store only keeps one row per
sentence, checked and written like the other per-sentence arrays.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store.durable import ChunkedColumn, ChunkedRows, RawColumn
from elmo_cache.store.format import POOLED_CHUNK_BLOCKS, pooled_block_rows

__all__ = ["copy_repeats", "pooled_chunk_rows", "pooled_block_rows", "pooled_column", "rows_with_repeats"]

# Lines read at a time when repeats get their copies (copy_repeats).
_BLOCK_LINES = 1 << 16


def pooled_chunk_rows(n: int, row_bytes: int) -> int:
    """Rows per zarr chunk of a ``pooled`` array of ``n`` rows: whole checked blocks (so a block lies in one
    file), at most :data:`POOLED_CHUNK_BLOCKS` of them, or the whole array when smaller."""
    return max(1, min(n, pooled_block_rows(row_bytes) * POOLED_CHUNK_BLOCKS))


def copy_repeats(pooled: Any, offsets: np.ndarray, lengths: np.ndarray) -> int:
    """Give each repeat of a deduplicated build a copy of its first occurrence's pooled row, in place.

    The engines encode a repeat's rows once, with the sentence whose rows it shares, so the pooled row of a
    repeat is left as zeros while encoding (its first occurrence may be in another window or another
    worker's part). A repeat is a non-empty sentence whose offset is not past every earlier one (new
    sentences get increasing offsets); its first occurrence is the new sentence of that offset. Returns
    the rows copied (0 for a build without dedupe). Memory: 16 bytes per distinct sentence.
    """
    owner_offsets: list[np.ndarray] = []
    owner_lines: list[np.ndarray] = []
    top = -1  # the highest offset of a non-empty sentence so far
    copied = 0
    n = len(offsets)
    for start in range(0, n, _BLOCK_LINES):
        stop = min(n, start + _BLOCK_LINES)
        nonempty = np.flatnonzero(np.asarray(lengths[start:stop]) > 0)
        if not len(nonempty):
            continue
        off = np.asarray(offsets[start:stop])[nonempty]
        before = np.maximum.accumulate(np.concatenate([[top], off[:-1]]))
        new = off > before
        top = max(top, int(off.max()))
        owner_offsets.append(off[new])
        owner_lines.append(start + nonempty[new])
        repeats = ~new
        if not repeats.any():
            continue
        all_offsets, all_lines = np.concatenate(owner_offsets), np.concatenate(owner_lines)
        owner_offsets, owner_lines = [all_offsets], [all_lines]
        wanted = off[repeats]
        pos = np.searchsorted(all_offsets, wanted)
        if (pos >= len(all_offsets)).any() or (all_offsets[np.minimum(pos, len(all_offsets) - 1)] != wanted).any():
            raise CacheFormatError(
                "a repeated sentence points at rows no earlier sentence owns; rerun with --overwrite"
            )
        for line, source in zip((start + nonempty[repeats]).tolist(), all_lines[pos].tolist()):
            pooled[line] = pooled[source]
            copied += 1
    return copied


def pooled_column(
    path: Path, dtype: np.dtype, item_shape: tuple[int, ...], n: int, offsets: np.ndarray, lengths: np.ndarray
) -> np.ndarray:
    """The ``pooled`` array of ``n`` sentences from the raw staging file at ``path``, memory-mapped, after the
    deduplicated repeats got their copies (written into the file: done again, it writes the same bytes)."""
    if not n:
        return np.empty((0, *item_shape), dtype=dtype)
    want = n * int(np.prod(item_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if not path.is_file() or path.stat().st_size < want:
        raise CacheFormatError(
            f"{path}: the pooled vectors of {n} sentences are missing or short; rerun with --overwrite"
        )
    with open(path, "r+b") as handle:
        data = np.memmap(handle, dtype=dtype, mode="r+", shape=(n, *item_shape))
        if copy_repeats(data, offsets, lengths):
            data.flush()
            os.fsync(handle.fileno())
        del data
    return np.memmap(path, dtype=dtype, mode="r", shape=(n, *item_shape))


def rows_with_repeats(column: RawColumn, n: int, offsets: np.ndarray, lengths: np.ndarray) -> Any:
    """The first ``n`` rows of a staged column after the deduplicated repeats got their copies (written into its
    files: done again, it writes the same bytes); memory-mapped, or read through when it spans several files."""
    if not isinstance(column, ChunkedColumn) or n <= column.file_rows:
        return pooled_column(column.path, column.dtype, column.item_shape, n, offsets, lengths)
    for path, rows in column.files(n):
        if not path.is_file() or path.stat().st_size < rows * column.item_bytes:
            raise CacheFormatError(
                f"{path}: the staged rows of {n} sentences are missing or short; rerun with --overwrite"
            )
    rows_view = ChunkedRows(column, n)
    if copy_repeats(rows_view, offsets, lengths):
        rows_view.flush()
    return column.read(n)
