"""Arrays read from their files with positioned reads (``pread``), never memory-mapped.

Why not a mapping. A page of a mapped file that is truncated after it was mapped raises ``SIGBUS`` when
it is touched, and Python cannot recover from a fault inside numpy's copy loop: the process dies (exit
135) without a log line, whether it is a training loop or the server. Files shrink under readers in
ordinary ways (an ``rsync`` or copy of a new build over the old one, a user's ``truncate``, a damaged
disk). With ``pread`` the kernel copies from the same page cache and simply returns fewer bytes at the
end of a shortened file: :class:`PositionedRows` then raises
:class:`~elmo_cache.errors.CacheCorruptError` naming the file, the array and the rows, and the caller
(the server: 500 ``cache_corrupt``) carries on. The price is one copy per read where a mapping handed
out a view, plus a system call; benchmarks/RESULTS.md ("Reads without mappings") measures it.

Replaced files. A file is read through the descriptor opened first while the reader keeps it, so a
file renamed over by another keeps reading the bytes that were checked (a consistent view). A file
opened again (the zarr readers keep a bounded number open) must be the same file as the first time
(device, inode, size, modification time); a different one means the cache changed under the reader,
an error that says to reopen it.

The 1-D arrays (offsets, lengths, the index, block sums) are read a page at a time into a small
per-array page cache (:data:`PAGE_BYTES`, at most :data:`PAGE_CACHE_BYTES`), so the per-sentence
lookups of the hot path cost a dictionary lookup, not a system call.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from typing import Any

import numpy as np

from elmo_cache.errors import CacheCorruptError
from elmo_cache.store.chunked import ChunkedArray

__all__ = ["OpenFile", "PositionedRows", "PAGE_BYTES", "PAGE_CACHE_BYTES"]

# Bytes read at once for the entry lookups of a 1-D array: 4,096 int64 offsets, a few microseconds.
PAGE_BYTES = 32 * 2**10

# Pages kept per array, in bytes (first in, first out): the whole offsets and lengths of ~500k sentences.
PAGE_CACHE_BYTES = 8 * 2**20


class OpenFile:
    """A read-only descriptor of one file and the identity it had when opened; closed when collected
    (never explicitly: another thread may be reading through it)."""

    __slots__ = ("__weakref__", "fd", "identity", "path")

    def __init__(self, path: str, fd: int):
        self.path = path
        self.fd = fd
        st = os.fstat(fd)
        # What "the same file" means when it is opened again: replaced or rewritten files differ.
        self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        weakref.finalize(self, os.close, fd)

    @property
    def size(self) -> int:
        """The file's size now (it may have changed since it was opened)."""
        return os.fstat(self.fd).st_size

    def read_into(self, out: np.ndarray, offset: int) -> int:
        """Fill the C-contiguous ``out`` from byte ``offset``; the bytes read (fewer at the end of the file)."""
        total = out.nbytes
        done = _pread_into(self.fd, out, offset)  # one call reads it all, but at the end of the file
        if done == total or done == 0:
            return done
        rest = out.reshape(-1).view(np.uint8)
        while done < total:
            got = _pread_into(self.fd, rest[done:], offset + done)
            if got == 0:
                break
            done += got
        return done


def _pread_into(fd: int, buf: np.ndarray, offset: int) -> int:
    if _HAS_PREADV:
        return os.preadv(fd, [buf], offset)  # type: ignore[list-item]  # ndarray has the buffer protocol
    data = os.pread(fd, buf.nbytes, offset)  # a platform without preadv: one more copy
    buf.reshape(-1).view(np.uint8)[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    return len(data)


_HAS_PREADV = hasattr(os, "preadv")


class PositionedRows(ChunkedArray):
    """A read-only array whose chunk ``c`` is raw C-order rows at a byte offset of a file (or, for chunks
    that are not, an array in memory: a fill value, a shard gathered chunk by chunk).

    Subclasses provide :meth:`_source`. Every read is a fresh read-only array owned by the caller: nothing
    returned refers to a file, so a file that changes later cannot reach it.
    """

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, chunk_rows: int):
        super().__init__(name, shape, dtype, chunk_rows)
        self._tail = self.shape[1:]
        self._row_bytes = int(np.prod(self._tail, dtype=np.int64)) * self.dtype.itemsize
        self._page_rows = max(1, PAGE_BYTES // max(1, self._row_bytes))
        self._pages: dict[int, np.ndarray] = {}
        self._max_pages = max(2, PAGE_CACHE_BYTES // max(1, self._page_rows * self._row_bytes))

    def _source(self, c: int) -> tuple[OpenFile, int] | np.ndarray:
        """Where chunk ``c``'s rows are: a file and the byte offset of the chunk's first row, or an array."""
        raise NotImplementedError

    def _what(self, c: int) -> str:
        """Chunk ``c`` in an error message."""
        return f"array {self.name!r}"

    # -- reads --------------------------------------------------------------------------------------

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` (0 <= start <= stop <= len): a fresh read-only array, one ``pread`` per file."""
        n = max(0, stop - start)
        out = np.empty((n, *self._tail), dtype=self.dtype)
        size = self.chunk_rows
        c, r = divmod(start, size)
        if r + n <= size:  # inside one chunk: the hot path
            if n:
                self._fill(c, r, out)
        else:
            at = 0
            while at < n:
                take = min(size - r, n - at)
                self._fill(c, r, out[at : at + take])
                at += take
                c, r = c + 1, 0
        out.setflags(write=False)
        return out

    _rows = rows

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Rows ``start:start + len(out)`` read into ``out`` (C-contiguous, of this array's dtype and row shape): a
        caller copying many rows reuses one buffer instead of a fresh array per read (fresh memory is slow to fill)."""
        if out.dtype != self.dtype or out.shape[1:] != self._tail or not out.flags.c_contiguous:
            raise ValueError(f"read_into: {self.name!r} rows are {self.dtype} {self._tail}, C-contiguous")
        size, at, n = self.chunk_rows, 0, len(out)
        c, r = divmod(start, size)
        while at < n:
            take = min(size - r, n - at)
            self._fill(c, r, out[at : at + take])
            at += take
            c, r = c + 1, 0

    def _fill(self, c: int, r: int, out: np.ndarray) -> None:
        source = self._source(c)
        if isinstance(source, np.ndarray):
            out[...] = source[r : r + len(out)]
            return
        handle, base = source
        offset = base + r * self._row_bytes
        try:
            got = handle.read_into(out, offset)
        except OSError as exc:
            raise CacheCorruptError(
                f"{handle.path}: {self._what(c)} cannot be read ({exc}); run `elmo-cache verify` on the cache"
            ) from None
        if got != out.nbytes:
            start = c * self.chunk_rows + r
            raise CacheCorruptError(
                f"{handle.path}: the file ends at byte {handle.size}, but rows {start}..{start + len(out)} of "
                f"{self._what(c)} need bytes {offset}..{offset + out.nbytes}: it was truncated after the cache was "
                "opened (a copy or sync over it?) or is damaged; reopen the cache once it is whole, or run "
                "`elmo-cache verify` on it"
            )

    def item(self, i: int) -> Any:
        p, q = divmod(i, self._page_rows)
        page = self._pages.get(p)
        if page is None:
            page = self._load_page(p)
        return page.item(q)

    def _row(self, i: int) -> Any:
        if self.ndim == 1:
            p, q = divmod(i, self._page_rows)
            page = self._pages.get(p)
            return (page if page is not None else self._load_page(p))[q]
        return self.rows(i, i + 1)[0]

    def _load_page(self, p: int) -> np.ndarray:
        start = p * self._page_rows
        page = self.rows(start, min(self.shape[0], start + self._page_rows))
        pages = self._pages
        if len(pages) >= self._max_pages:
            with contextlib.suppress(KeyError, StopIteration, RuntimeError):  # another thread changed it: no matter
                del pages[next(iter(pages))]
        pages[p] = page
        return page

    def _load_chunk(self, c: int) -> np.ndarray:
        start = c * self.chunk_rows
        return self.rows(start, min(self.shape[0], start + self.chunk_rows))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        whole = self.rows(0, self.shape[0])
        whole.setflags(write=True)  # a fresh array of our own: the caller may write to it
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def searchsorted(self, value: int) -> int:
        """Leftmost insertion point of ``value`` in this sorted 1-D array: O(log n) pages read."""
        n_pages = -(-self.shape[0] // self._page_rows)
        if n_pages == 0:
            return 0
        lo, hi = 0, n_pages
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.item(mid * self._page_rows) < value:
                lo = mid
            else:
                hi = mid
        page = self._pages.get(lo)
        if page is None:
            page = self._load_page(lo)
        return lo * self._page_rows + int(np.searchsorted(page, value, side="left"))
