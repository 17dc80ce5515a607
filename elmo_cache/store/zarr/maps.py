"""Memory-mapped and decoded views of a zarr array's rows (the reading half of :mod:`elmo_cache.store.zarr`).

:class:`ChunkedArray` is what the reader indexes; :class:`MappedChunks` and :class:`MappedShards` map raw
chunk or shard files with :mod:`mmap` (zarr is not imported), :class:`DecodedChunks` asks zarr for one
decoded chunk at a time when an array is compressed. The module docstring of :mod:`elmo_cache.store.zarr`
explains the choice.
"""

from __future__ import annotations

import math
import mmap
import os
import resource
import stat
import sys
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheCorruptError, CacheFormatError

__all__ = ["ChunkedArray", "DecodedChunks", "MappedChunks", "MappedShards"]

# zarr's sharding codec marks an inner chunk that is not in the shard file with this offset and size.
ABSENT_CHUNK = 2**64 - 1


# Decoded (compressed) chunks kept per array, in bytes; at least two chunks are always kept.
_DECODED_CACHE_BYTES = 256 * 2**20


# Python 3.13 can map a file without keeping a duplicate of its descriptor; before, every mapping
# holds one open file.
_MAP_OPTIONS: dict[str, Any] = {"trackfd": False} if sys.version_info >= (3, 13) else {}


def _max_open_maps() -> int:
    """Files one array keeps mapped: an eighth of the kernel's per-process ``vm.max_map_count``
    and, where every mapping holds a file descriptor (Python < 3.13), of the soft ``ulimit -n``,
    leaving the rest to the user's program (DataLoader workers, sockets...)."""
    try:
        limit = int(Path("/proc/sys/vm/max_map_count").read_text()) // 8
    except (OSError, ValueError):
        limit = 65530 // 8
    if not _MAP_OPTIONS:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, soft // 8)
    return max(8, limit)


def _map_block(fd: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The first bytes of the open file ``fd`` as a read-only array of ``shape``, memory-mapped.

    ``mmap`` + ``frombuffer`` rather than ``numpy.memmap``, which resolves the path and builds a
    subclass whose indexing runs Python code: a cache that maps tens of thousands of files in turn
    pays that on every one.
    """
    count = math.prod(shape)
    if count == 0:
        return np.empty(shape, dtype=dtype)
    mapping = mmap.mmap(fd, count * dtype.itemsize, access=mmap.ACCESS_READ, **_MAP_OPTIONS)
    return np.frombuffer(mapping, dtype=dtype, count=count).reshape(shape)


def _open_file(path: str, array: ChunkedArray, c: int) -> int | None:
    """A read-only descriptor of file ``c`` of ``array``, which must be a regular file.

    zarr reads an absent chunk as the fill value, but every file of a finished elmo-cache cache is
    written: an absent one means a partial copy or sync, and reading zeros in its place would hand a
    training loop vectors that were never computed. So it is an error, except in an unfinished cache
    opened with ``allow_incomplete`` (None: the caller reads the fill value). ``O_NONBLOCK`` and the
    ``fstat`` refuse a FIFO (whose plain ``open`` would block forever) or a device; a symbolic link
    is followed (caches are legitimately spread over disks by links): the block checksums vouch for
    what it points at.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        if array.allow_missing:
            return None
        raise CacheCorruptError(
            f"{path}: file {c} of array {array.name!r} is missing; the cache is incomplete (a partial copy "
            "or sync?): run `elmo-cache verify` on it, then re-copy or rebuild it"
        ) from None
    except OSError as exc:
        raise CacheCorruptError(f"{path}: file {c} of array {array.name!r} cannot be opened ({exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CacheCorruptError(
            f"{path}: file {c} of array {array.name!r} is not a regular file (a FIFO, device or directory); "
            "refusing to read it: the cache is damaged, re-copy or rebuild it"
        )
    return fd


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
        self.chunk_rows = int(chunk_rows)
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
        """Rows ``start:stop`` (0 <= start <= stop <= len): one view when inside one chunk, else a copy."""
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
            c, r = divmod(i, self.chunk_rows)
            return self._load_chunk(c)[r]
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
        joined.setflags(write=False)  # read-only like the mapped views, whichever path served it
        return joined

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # Always a fresh, writable array: never a view that would pin a mapping by surprise.
        return np.array(self._rows(0, self.shape[0]), dtype=dtype)

    def contiguous(self) -> np.ndarray | None:
        """The whole array as one memory-mapped view when it is a single mapped chunk, else None."""
        return None

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


class _MappedFiles(ChunkedArray):
    """An array whose files hold raw rows, each checked and mapped on first use (LRU-bounded).

    A "chunk" of :class:`ChunkedArray` is one file here. Subclasses say how many rows a file's
    block has, how a file is checked (:meth:`_check`, which raises :class:`CacheFormatError`)
    and how it is mapped.
    """

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        file_rows: int,
        directory: Path,
        key: Callable[[int, int], str],
        fill_value: Any,
    ):
        super().__init__(name, shape, dtype, file_rows)
        self._directory = directory
        self._key = key
        self._fill = fill_value
        self._row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._maps: OrderedDict[int, np.ndarray] = OrderedDict()
        self._max_maps = _max_open_maps()
        self._plain: set[int] = set()  # files checked and found to be raw rows (mapped whole)

    def _block_rows(self, c: int) -> int:
        raise NotImplementedError

    def _check(self, c: int, path: str, fd: int) -> Any:
        raise NotImplementedError

    def _map(self, c: int, path: str, fd: int, checked: Any) -> np.ndarray:
        return _map_block(fd, (self._block_rows(c), *self.shape[1:]), self.dtype)

    def _load_chunk(self, c: int) -> np.ndarray:
        block = self._maps.get(c)
        if block is not None:
            self._maps.move_to_end(c)
            return block
        if not 0 <= c < self.n_chunks:
            raise IndexError(f"file {c} out of range for array {self.name!r}")
        path = os.path.join(self._directory, self._key(c, self.ndim))  # not pathlib: this runs per re-map
        fd = _open_file(path, self, c)
        if fd is None:  # only in an unfinished cache opened with allow_incomplete: the fill value, as zarr says
            block = np.broadcast_to(np.asarray(self._fill, dtype=self.dtype), (self._block_rows(c), *self.shape[1:]))
        else:
            try:
                # A file re-mapped after the LRU dropped it was checked the first time.
                checked = None if c in self._plain else self._check(c, path, fd)
                if checked is None:
                    self._plain.add(c)
                block = self._map(c, path, fd, checked)
            finally:
                os.close(fd)
        self._maps[c] = block
        if len(self._maps) > self._max_maps:
            self._maps.popitem(last=False)
        return block

    def check_files(self) -> None:
        """Check the first and the last file (a ``stat`` and, for shards, a small read each; the rest on first use)."""
        for c in sorted({0, self.n_chunks - 1} if self.n_chunks else set()):
            path = os.path.join(self._directory, self._key(c, self.ndim))
            fd = _open_file(path, self, c)
            if fd is None:
                continue
            try:
                self._check(c, path, fd)
            finally:
                os.close(fd)

    def contiguous(self) -> np.ndarray | None:
        if self.n_chunks == 1:
            return self._load_chunk(0)[: self.shape[0]]
        if self.n_chunks == 0:
            return self._empty()
        return None


class MappedChunks(_MappedFiles):
    """Uncompressed, unsharded zarr arrays: each chunk file is ``chunk_rows`` raw rows (edge chunks padded)."""

    def _block_rows(self, c: int) -> int:
        return self.chunk_rows

    def _check(self, c: int, path: str, fd: int) -> None:
        size, expected = os.fstat(fd).st_size, self.chunk_rows * self._row_bytes
        if size != expected:
            raise CacheFormatError(
                f"{path}: chunk of array {self.name!r} has {size} bytes, expected {expected} (an uncompressed "
                f"chunk of shape {(self.chunk_rows, *self.shape[1:])} {self.dtype}); the cache is corrupt"
            )


class MappedShards(_MappedFiles):
    """Uncompressed sharded zarr arrays: each shard file is inner chunks in row order, then its index.

    elmo-cache writes shards whose inner chunks lie back to back from byte 0 (the layout zarr itself
    writes), so a shard's rows are one raw C-order block: it is mapped whole, and a "chunk" of this
    class is a shard (``chunk_rows`` = rows per shard). The index at the end of the file is checked
    (its CRC-32C, and that it describes exactly that layout) when the file is first mapped; a shard
    laid out otherwise (valid zarr, written by another tool) is read chunk by chunk into memory.
    """

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        shard_rows: int,
        inner_rows: int,
        directory: Path,
        key: Callable[[int, int], str],
        fill_value: Any,
        index_crc: bool,
    ):
        super().__init__(name, shape, dtype, shard_rows, directory, key, fill_value)
        self.inner_rows = int(inner_rows)
        self._inner_bytes = self.inner_rows * self._row_bytes
        self._per_shard = self.chunk_rows // self.inner_rows
        self._index_bytes = 16 * self._per_shard + (4 if index_crc else 0)
        self._index_crc = index_crc
        self._layouts: dict[int, bytes] = {}

    def _block_rows(self, c: int) -> int:
        return self._present(c) * self.inner_rows

    def _present(self, c: int) -> int:
        rows = min(self.chunk_rows, self.shape[0] - c * self.chunk_rows)
        return -(-rows // self.inner_rows)

    def _layout_index(self, present: int) -> bytes:
        """The index body of a shard with ``present`` chunks back to back from byte 0 (the layout written here)."""
        body = self._layouts.get(present)
        if body is None:
            index = np.full((self._per_shard, 2), ABSENT_CHUNK, dtype="<u8")
            index[:present, 0] = np.arange(present, dtype=np.uint64) * np.uint64(self._inner_bytes)
            index[:present, 1] = self._inner_bytes
            body = self._layouts[present] = index.tobytes()
        return body

    def _check(self, c: int, path: str, fd: int) -> np.ndarray | None:
        """Check shard ``c``'s size and index; None when its chunks lie back to back (it can be
        mapped whole), else its (offset, size) pairs."""
        size = os.fstat(fd).st_size
        present = self._present(c)
        expected = present * self._inner_bytes + self._index_bytes
        if size < self._index_bytes:
            raise CacheFormatError(
                f"{path}: shard {c} of array {self.name!r} has {size} bytes (expected {expected}), too short "
                "for its index; the cache is corrupt"
            )
        raw = os.pread(fd, self._index_bytes, size - self._index_bytes)
        body = raw[: 16 * self._per_shard]
        if self._index_crc:
            import google_crc32c

            if int(google_crc32c.value(body)) != int.from_bytes(raw[-4:], "little"):
                raise CacheFormatError(
                    f"{path}: shard {c} of array {self.name!r} has {size} bytes (expected {expected}) and its "
                    "index fails its CRC-32C: truncated or damaged; the cache is corrupt"
                )
        if body == self._layout_index(present):
            if size != expected:
                raise CacheFormatError(
                    f"{path}: shard {c} of array {self.name!r} has {size} bytes, expected {expected} "
                    f"({present} uncompressed chunks of {self.inner_rows} rows and the index); the cache is corrupt"
                )
            return None
        index = np.frombuffer(body, dtype="<u8").reshape(self._per_shard, 2)
        used = index[:, 0] != ABSENT_CHUNK
        if used.any() and int((index[used, 0] + index[used, 1]).max()) > size - self._index_bytes:
            raise CacheFormatError(
                f"{path}: the index of shard {c} of array {self.name!r} points past the end "
                "of the file; the cache is corrupt"
            )
        return index

    def _map(self, c: int, path: str, fd: int, checked: np.ndarray | None) -> np.ndarray:
        return super()._map(c, path, fd, None) if checked is None else self._gather(path, fd, checked, self._present(c))

    def _gather(self, path: str, fd: int, index: np.ndarray, present: int) -> np.ndarray:
        """A shard whose inner chunks are not back to back, read chunk by chunk (a copy)."""
        block = np.full((present * self.inner_rows, *self.shape[1:]), self._fill, dtype=self.dtype)
        for j, (offset, size) in enumerate(index[:present].tolist()):
            if offset == ABSENT_CHUNK:
                continue
            if size != self._inner_bytes:
                raise CacheFormatError(
                    f"{path}: inner chunk {j} of array {self.name!r} has {size} bytes, "
                    f"expected {self._inner_bytes} (uncompressed); the cache is corrupt"
                )
            chunk = np.frombuffer(os.pread(fd, size, offset), dtype=self.dtype)
            block[j * self.inner_rows : (j + 1) * self.inner_rows] = chunk.reshape(self.inner_rows, *self.shape[1:])
        block.setflags(write=False)
        return block


class DecodedChunks(ChunkedArray):
    """Compressed (or otherwise non-raw) zarr arrays: zarr decodes, we keep a few decoded chunks."""

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        chunk_rows: int,
        array: Any,
        file_of: Callable[[int], tuple[int, str]] | None = None,
    ):
        super().__init__(name, shape, dtype, chunk_rows)
        self._array = array
        self._file_of = file_of  # (file number, path) holding chunk c: checked before zarr reads it
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._max_chunks = max(2, _DECODED_CACHE_BYTES // max(1, row_bytes * self.chunk_rows))
        self._decoded: OrderedDict[int, np.ndarray] = OrderedDict()

    def _load_chunk(self, c: int) -> np.ndarray:
        block = self._decoded.get(c)
        if block is not None:
            self._decoded.move_to_end(c)
            return block
        if self._file_of is not None:  # zarr would read an absent file as zeros, and block on a FIFO
            k, path = self._file_of(c)
            fd = _open_file(path, self, k)
            if fd is not None:
                os.close(fd)
        block = np.asarray(self._array[c * self.chunk_rows : (c + 1) * self.chunk_rows])
        block.setflags(write=False)
        self._decoded[c] = block
        if len(self._decoded) > self._max_chunks:
            self._decoded.popitem(last=False)
        return block
