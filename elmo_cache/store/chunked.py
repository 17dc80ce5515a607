"""The reader's array interface: read-only, chunked along rows, indexable like a numpy array.

Both containers hand the reader objects of this shape (``shape``, ``dtype``, ``rows``, ``item``,
``searchsorted`` and numpy indexing), so :class:`~elmo_cache.reader.cache.Cache` makes the same calls for an
HDF5 dataset and a zarr array. :class:`ChunkedArray` implements the interface over one primitive,
:meth:`ChunkedArray._load_chunk` (a whole decoded chunk: zarr's compressed arrays);
:class:`elmo_cache.store.positioned.PositionedRows` re-implements the reads with positioned reads of the
files (the raw arrays of both containers).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ChunkedArray"]


class ChunkedArray:
    """A read-only array chunked along axis 0, indexable like a numpy array by int or slice.

    Subclasses provide :meth:`_load_chunk`, which returns the full chunk ``c`` (``chunk_rows``
    rows; edge chunks may hold padding beyond ``shape[0]``).
    """

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, chunk_rows: int):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.ndim = len(self.shape)
        self.chunk_rows = max(1, int(chunk_rows))
        self.n_chunks = math.ceil(self.shape[0] / self.chunk_rows) if self.shape[0] else 0
        # Whether an absent file reads as the fill value (an unfinished cache opened with allow_incomplete).
        self.allow_missing = False

    def __len__(self) -> int:
        return self.shape[0]

    def _load_chunk(self, c: int) -> np.ndarray:
        raise NotImplementedError

    def item(self, i: int) -> Any:
        """Element ``i`` (0 <= i < len) of a 1-D array as a Python scalar: the reader's hot path."""
        c, r = divmod(i, self.chunk_rows)
        return self._load_chunk(c).item(r)

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` (0 <= start <= stop <= len), read-only."""
        return self._rows(start, stop)

    def chunk(self, c: int) -> np.ndarray:
        """Chunk ``c``, restricted to the rows that exist."""
        block = self._load_chunk(c)
        valid = min(self.chunk_rows, self.shape[0] - c * self.chunk_rows)
        return block if valid == self.chunk_rows else block[:valid]

    def __getitem__(self, key: Any) -> Any:
        n = self.shape[0]
        if isinstance(key, (int, np.integer)):
            i = int(key)
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"index {int(key)} out of range for array {self.name!r} of length {n}")
            return self._row(i)
        if isinstance(key, slice):
            start, stop, step = key.indices(n)
            if step != 1:
                return np.stack([self[i] for i in range(start, stop, step)]) if start != stop else self._empty()
            return self._rows(start, stop)
        if isinstance(key, (np.ndarray, list, tuple)):
            idx = np.asarray(key, dtype=np.int64).reshape(-1)
            if idx.size == 0:
                return self._empty()
            return np.stack([self[int(i)] for i in idx])
        raise TypeError(f"array {self.name!r}: unsupported index {key!r}")

    def _row(self, i: int) -> Any:
        c, r = divmod(i, self.chunk_rows)
        return self._load_chunk(c)[r]

    def _empty(self) -> np.ndarray:
        return np.empty((0, *self.shape[1:]), dtype=self.dtype)

    def _rows(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return self._empty()
        c0, r0 = divmod(start, self.chunk_rows)
        c1, r1 = divmod(stop - 1, self.chunk_rows)
        if c0 == c1:
            return self._load_chunk(c0)[r0 : r1 + 1]
        parts = [self._load_chunk(c0)[r0:]]
        parts.extend(self._load_chunk(c) for c in range(c0 + 1, c1))
        parts.append(self._load_chunk(c1)[: r1 + 1])
        joined = np.concatenate(parts)
        joined.setflags(write=False)  # read-only like a single chunk's view, whichever path served it
        return joined

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # Always a fresh, writable array: never a view that would pin a chunk by surprise.
        return np.array(self._rows(0, self.shape[0]), dtype=dtype)

    def searchsorted(self, value: int) -> int:
        """Leftmost insertion point of ``value`` in this sorted 1-D array, touching O(log n) chunks."""
        if self.n_chunks == 0:
            return 0
        # First find the last chunk whose first element is <= value, then search inside it.
        lo, hi = 0, self.n_chunks
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._load_chunk(mid)[0] < value:
                lo = mid
            else:
                hi = mid
        block = self.chunk(lo)
        return lo * self.chunk_rows + int(np.searchsorted(block, value, side="left"))
