"""The zarr v3 container of docs/FORMAT.md: its reader and its writer.

Files. zarr keeps every chunk of an array in its own file unless chunks are grouped into
*shards* (the ``sharding_indexed`` codec): then a file holds a shard, its chunks one after the
other and an index of where each one is at its end. ``vectors`` is sharded (FORMAT.md says why:
a 100M-sentence cache would otherwise be millions of files); the 1-D arrays are not.

Reading. When an array's chunks are raw bytes (the ``bytes`` codec alone, no compressor, chunked
along rows only) a chunk file *is* the raw C-order bytes of ``chunk_rows`` rows (zarr pads edge
chunks), and so is the data part of a shard whose chunks lie back to back, as this module
writes them. Such an array is read here without zarr at all: each file is mapped with
:class:`numpy.memmap` when first touched, so a sentence is a zero-copy view of the page cache,
shared by every DataLoader worker, exactly as with HDF5. A sentence that straddles two files is
the concatenation of two slices (one copy). A file that does not exist is an error, not the fill
value zarr would read (see :func:`_open_file`), and so is one that is not a regular file. A shard's
index is checked (size, CRC-32C, layout) when the shard is first mapped; the rows themselves are
checked against their block sums by the reader (:mod:`elmo_cache.store._blocksums`).

Mappings are kept in an LRU (each holds a file descriptor before Python 3.13, and every one
counts against the kernel's mappings per process; see :func:`_max_open_maps`); re-mapping an
evicted file costs an ``open``, a small read and an ``mmap`` (tens of microseconds). Opening touches only the
``zarr.json`` files and the first and last file of each array, so it is independent of the
cache size, and ``zarr`` itself is not even imported (the writer imports it).

Arrays that are compressed (or chunked across columns) fall back to zarr's own reads, one decoded
chunk at a time (of a shard, zarr reads only that chunk), with a few decoded chunks kept (bounded
by bytes) so that sequential reads decode each chunk once. Random reads of a compressed cache
decode a whole chunk per sentence: that is the price of compression, which saves little on floats.

Writing. See :class:`ZarrWriter`: rows stream into the file of the shard being filled, which
becomes a vectors file when full, so finishing a build never copies the vectors again (at several
KB per token that copy would cost as much as a slow encoder). Finishing (:func:`finish_group`)
writes the per-sentence arrays, the tokens and the index, then ``checksums.json`` (size and CRC-32
of every file but the root ``zarr.json``), sets ``complete: true`` and renames the folder to the
output, so the output path only ever holds a finished cache. :func:`create_group` and
:func:`write_vectors_file` let other writers (a distributed build) fill vectors files in any order.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import resource
import shutil
import stat
import sys
import uuid
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheCorruptError, CacheFormatError
from elmo_cache.store._blocksums import BlockSummer, block_sums, read_sums_file, sums_listing, write_sums_file
from elmo_cache.store._staging import Layout, Progress, RawColumn, Writer, array_blocks, fsync_path
from elmo_cache.store.format import (
    ARRAYS,
    BLOCK_SUMS,
    BUILD_DIR,
    CHECKSUM_ALGORITHM,
    CHECKSUMS_FILE,
    META_KEY,
    SMALL_BLOCK_ROWS,
    ZARR_JSON,
    checksum,
    decode_metadata,
    metadata_checksum,
)

__all__ = [
    "COMPRESSIONS",
    "SMALL_CHUNK",
    "TEXT_CHUNK",
    "ChunkedArray",
    "file_checksum",
    "ZarrWriter",
    "create_group",
    "finish_group",
    "vectors_file_path",
    "vectors_file_rows",
    "write_vectors_file",
    "is_store",
    "read_metadata",
    "open_arrays",
    "open_with_library",
]

COMPRESSIONS = ("none", "zstd", "blosc-lz4", "blosc-zstd")
"""Valid ``compression`` names for zarr caches ("none" is stored as null)."""

# Entries per chunk of the 1-D arrays (offsets, lengths, index): 8 MiB of int64. Readers map
# them chunk by chunk (lazily) or load them whole; this size keeps a 100M-line cache at ~100
# files per array while a binary search of the index still touches only a few of them.
SMALL_CHUNK = 1 << 20

# Bytes per chunk of ``tokens/bytes`` (about 60 bytes a sentence: ~1.1M sentences a chunk).
TEXT_CHUNK = 1 << 26

# Bytes read at a time when a file's CRC-32 is computed.
_CRC_BYTES = 16 * 2**20


def file_checksum(path: Path) -> tuple[int, int]:
    """``(size, CRC-32)`` of the file at ``path``, read in pieces."""
    crc = size = 0
    with open(path, "rb") as f:
        while piece := f.read(_CRC_BYTES):
            crc = checksum(piece, crc)
            size += len(piece)
    return size, crc


def is_store(path: Path) -> bool:
    """Whether ``path`` is a directory holding a zarr v3 root (``zarr.json``)."""
    return path.is_dir() and (path / ZARR_JSON).is_file()


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The elmo-cache metadata of the zarr group at ``path``, or None if it is not one of ours."""
    try:
        group = json.loads((path / ZARR_JSON).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return decode_metadata((group.get("attributes") or {}).get(META_KEY)) if isinstance(group, dict) else None


# -- reading ----------------------------------------------------------------------------------------

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
            index = np.full((self._per_shard, 2), _ABSENT, dtype="<u8")
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
        used = index[:, 0] != _ABSENT
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
            if offset == _ABSENT:
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


def _chunk_key(encoding: dict[str, Any], where: Path) -> Callable[[int, int], str]:
    name = encoding.get("name", "default")
    configured: str | None = (encoding.get("configuration") or {}).get("separator")
    if name == "default":
        separator = configured or "/"

        def key(c: int, ndim: int) -> str:
            return separator.join(["c", str(c), *("0" * (ndim - 1))])

    elif name == "v2":
        separator = configured or "."

        def key(c: int, ndim: int) -> str:
            return separator.join([str(c), *("0" * (ndim - 1))])

    else:
        raise CacheFormatError(f"{where}: unsupported chunk key encoding {name!r}; expected 'default' or 'v2'")
    return key


def _fill_value(raw: Any, dtype: np.dtype) -> Any:
    if isinstance(raw, str):
        special = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
        if raw in special:
            return special[raw]
        if raw.startswith("0x"):  # the bit pattern of a float, big-endian hex per the zarr v3 spec
            return np.frombuffer(bytes.fromhex(raw[2:]), dtype=dtype.newbyteorder(">"))[0]
    return 0 if raw is None else raw


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheFormatError(f"{path}: cannot read the zarr metadata of {what}: {exc}") from None
    if not isinstance(data, dict):
        raise CacheFormatError(f"{path}: the zarr metadata of {what} is not a JSON object")
    return data


def _open_array(root: Path, name: str) -> ChunkedArray | None:
    directory = root / name
    meta_path = directory / ZARR_JSON
    if not meta_path.is_file():
        return None
    meta = _read_json(meta_path, f"array {name!r}")
    where = f"{root}: array {name!r}"
    if meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        raise CacheFormatError(f"{where} is not a zarr v3 array ({meta_path})")
    try:
        shape = tuple(int(s) for s in meta["shape"])
        data_type = meta["data_type"]
        if isinstance(data_type, dict):
            data_type = data_type.get("name")
        grid = meta["chunk_grid"]
        chunk_shape = tuple(int(s) for s in grid["configuration"]["chunk_shape"])
        codecs = list(meta.get("codecs") or [])
        dtype = np.dtype(data_type)
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheFormatError(f"{where}: malformed zarr.json ({exc})") from None
    if grid.get("name") != "regular" or len(chunk_shape) != len(shape) or not shape:
        raise CacheFormatError(f"{where}: expected a regular chunk grid matching shape {list(shape)}")
    plain = not meta.get("storage_transformers") and chunk_shape[1:] == shape[1:]
    if plain and _raw_bytes(codecs):
        dtype = dtype.newbyteorder(_raw_bytes(codecs))
        key = _chunk_key(meta.get("chunk_key_encoding") or {}, root / name)
        return MappedChunks(
            name, shape, dtype, chunk_shape[0], directory, key, _fill_value(meta.get("fill_value"), dtype)
        )
    sharded = len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed"
    sharding = (codecs[0].get("configuration") or {}) if sharded else {}
    inner = [int(s) for s in sharding.get("chunk_shape") or []]
    index_codecs = [c.get("name") for c in sharding.get("index_codecs") or []]
    if (
        plain
        and sharded
        and _raw_bytes(sharding.get("codecs") or []) == "<"
        and sharding.get("index_location", "end") == "end"
        and index_codecs in (["bytes"], ["bytes", "crc32c"])
        and _raw_bytes((sharding.get("index_codecs") or [])[:1]) == "<"
        and len(inner) == len(shape)
        and inner[1:] == list(shape[1:])
        and chunk_shape[0] % inner[0] == 0
    ):
        dtype = dtype.newbyteorder(_raw_bytes(sharding["codecs"]))
        key = _chunk_key(meta.get("chunk_key_encoding") or {}, root / name)
        fill = _fill_value(meta.get("fill_value"), dtype)
        return MappedShards(
            name, shape, dtype, chunk_shape[0], inner[0], directory, key, fill, index_codecs[-1] == "crc32c"
        )
    import zarr  # only compressed caches pay for importing zarr

    try:
        array = zarr.open_array(store=str(root), path=name, mode="r")
    except Exception as exc:  # zarr raises many types for unreadable metadata
        raise CacheFormatError(f"{where}: zarr cannot open it ({exc})") from None
    # Sharded arrays are decoded one inner chunk at a time (zarr reads only that part of a shard).
    rows = int(inner[0]) if sharded and inner else chunk_shape[0]
    key = _chunk_key(meta.get("chunk_key_encoding") or {}, root / name)
    per_file = chunk_shape[0] // rows if chunk_shape[1:] == shape[1:] else 0

    def file_of(c: int) -> tuple[int, str]:
        k = c // per_file
        return k, os.path.join(directory, key(k, len(shape)))

    return DecodedChunks(name, shape, array.dtype, rows, array, file_of if per_file else None)


def _raw_bytes(codecs: list[dict[str, Any]]) -> str | None:
    """The byte order ("<" or ">") when a codec chain is just the ``bytes`` codec, else None."""
    if len(codecs) != 1 or codecs[0].get("name") != "bytes":
        return None
    return "<" if (codecs[0].get("configuration") or {}).get("endian", "little") == "little" else ">"


def open_arrays(root: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, ChunkedArray | None]]:
    """Raw metadata attribute and the arrays ``names`` (None where missing) of a zarr cache."""
    group = _read_json(root / ZARR_JSON, "the root group")
    if group.get("node_type") != "group":
        raise CacheFormatError(
            f"{root}: zarr.json describes a {group.get('node_type')!r}, not a group; not an elmo-cache store"
        )
    attributes = group.get("attributes") or {}
    return attributes.get(META_KEY), {name: _open_array(root, name) for name in names}


def open_with_library(path: Path) -> tuple[Any, dict[str, Any], Callable[[], None]]:
    """Metadata attribute, arrays (None where missing) and a ``close``, read by zarr-python itself.

    ``verify`` checks the format through this rather than through :func:`open_arrays`, so that it
    tests FORMAT.md, not this module's reading of it.
    """
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception as exc:  # zarr raises many types for foreign directories
        raise CacheFormatError(f"{path}: not a zarr v3 group ({exc})") from None
    arrays: dict[str, Any] = {}
    for name in ARRAYS:
        try:
            arrays[name] = group[name]
        except KeyError:
            arrays[name] = None
    return group.attrs.get(META_KEY), arrays, lambda: None


# -- writing ----------------------------------------------------------------------------------------


def _compressor(name: str | None, itemsize: int) -> Any:
    import zarr.codecs

    if name is None:
        return None
    if name == "zstd":
        # Level 1: higher levels cost much more time and gain almost nothing on float vectors.
        return zarr.codecs.ZstdCodec(level=1)
    if name == "blosc-lz4":
        return zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=itemsize)
    if name == "blosc-zstd":
        return zarr.codecs.BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle", typesize=itemsize)
    raise AssertionError(name)


# Bytes of a 1-D array written at a time when a cache is finished.
_BLOCK_BYTES = 64 * 2**20

# zarr's sharding codec marks an inner chunk that is not in the shard file with this offset and size.
_ABSENT = 2**64 - 1


def vectors_file_rows(layout: Layout) -> int:
    """Rows per ``vectors`` file of a zarr layout (one shard): row ``r`` lives in file ``r // vectors_file_rows``."""
    if layout.shard_rows is None or layout.chunk_rows is None:
        raise ValueError("a zarr layout needs chunk_rows and shard_rows")
    return int(layout.shard_rows)


def vectors_file_path(root: Path, layout: Layout, k: int) -> Path:
    """Where ``vectors`` file ``k`` lives in the zarr group at ``root`` (the default chunk key encoding)."""
    return root.joinpath("vectors", "c", str(k), *("0" * len(layout.row_shape)))


def _vectors_array_spec(layout: Layout, n_rows: int) -> dict[str, Any]:
    row = layout.row_shape
    return {
        "shape": (n_rows, *row),
        "chunks": (int(layout.chunk_rows or 0), *row),
        "shards": (vectors_file_rows(layout), *row),
        "dtype": layout.dtype,
        "compressors": _compressor(layout.compression, np.dtype(layout.dtype).itemsize),
        "fill_value": 0,
        "dimension_names": ("row", "layer", "dim") if len(row) == 2 else ("row", "dim"),
    }


def create_group(staging: Path, layout: Layout, n_rows: int, metadata: dict[str, Any]) -> None:
    """Create the zarr group at ``staging`` (root attribute ``metadata``) with an empty ``vectors`` array of
    ``n_rows`` rows laid out per ``layout``; no vectors file is written. Nothing happens when the group is
    already there with that shape (a resumed build)."""
    import zarr

    vectors_meta = staging / "vectors" / ZARR_JSON
    if vectors_meta.is_file():
        shape = _read_json(vectors_meta, "array 'vectors'").get("shape")
        if shape == [n_rows, *layout.row_shape]:
            return
        raise CacheFormatError(
            f"{staging}: the vectors being built have shape {shape}, expected {[n_rows, *layout.row_shape]}; "
            "rerun with --overwrite"
        )
    group = zarr.create_group(store=str(staging), attributes={META_KEY: metadata})
    group.create_array("vectors", **_vectors_array_spec(layout, n_rows))


def _file_geometry(layout: Layout, n_rows: int, k: int) -> tuple[int, int]:
    """``(rows, inner chunks present)`` of vectors file ``k`` in an array of ``n_rows`` rows."""
    shard, chunk = vectors_file_rows(layout), int(layout.chunk_rows or 0)
    rows = max(0, min(shard, n_rows - k * shard))
    return rows, -(-rows // chunk)


def _shard_index(layout: Layout, present: int) -> bytes:
    """The index zarr's sharding codec ends an uncompressed shard with: (offset, size) per inner chunk, then
    its CRC-32C (the ``crc32c`` index codec)."""
    import google_crc32c

    chunk_bytes = int(layout.chunk_rows or 0) * layout.row_bytes
    index = np.full((vectors_file_rows(layout) // int(layout.chunk_rows or 1), 2), _ABSENT, dtype="<u8")
    index[:present, 0] = np.arange(present, dtype=np.uint64) * np.uint64(chunk_bytes)
    index[:present, 1] = chunk_bytes
    raw = index.tobytes()
    return raw + int(google_crc32c.value(raw)).to_bytes(4, "little")


def _encode_with_zarr(layout: Layout, n_rows: int, k: int, rows: np.ndarray) -> bytes:
    """Vectors file ``k`` as zarr itself encodes it (compressed layouts), in memory."""
    import zarr
    from zarr.storage import MemoryStore

    # Public API only: MemoryStore keeps its values in the mapping it is given (zarr Buffers, which
    # have to_bytes()); zarr's store getters would need its private event-loop helpers.
    # write_empty_chunks as the array's config: zarr 3.1 ignores the global "array.write_empty_chunks" key.
    files: dict[str, Any] = {}
    array = zarr.create_array(
        MemoryStore(files), **_vectors_array_spec(layout, n_rows), config={"write_empty_chunks": True}
    )
    start = k * vectors_file_rows(layout)
    array[start : start + len(rows)] = rows
    key = "/".join(["c", str(k), *("0" * len(layout.row_shape))])
    encoded = files.get(key)
    assert encoded is not None, key
    return encoded.to_bytes()


def _write_file_body(handle: Any, layout: Layout, n_rows: int, k: int, rows: np.ndarray) -> int:
    """Write vectors file ``k`` (whose rows are ``rows``) to ``handle``; returns its CRC-32."""
    if layout.compression is not None:
        data = _encode_with_zarr(layout, n_rows, k, rows)
        handle.write(data)
        return checksum(data)
    _, present = _file_geometry(layout, n_rows, k)
    body = np.ascontiguousarray(rows, dtype=layout.dtype).data.cast("B")
    padding = bytes(present * int(layout.chunk_rows or 0) * layout.row_bytes - len(body))
    index = _shard_index(layout, present)
    for piece in (body, padding, index):
        handle.write(piece)
    return checksum(index, checksum(padding, checksum(body)))


def write_vectors_file(staging: Path, layout: Layout, n_rows: int, k: int, rows: np.ndarray) -> tuple[int, int]:
    """Write ``vectors`` file ``k`` of an array of ``n_rows`` rows: its rows ``[k*F, min((k+1)*F, n_rows))``
    (``F = vectors_file_rows(layout)``) are ``rows``, exactly that many.

    The file goes to a temporary name in the build folder, is synced, then renamed into place, so a
    file at its final name is always whole. Returns its ``(size, CRC-32)`` for ``checksums.json``.
    """
    want, _ = _file_geometry(layout, n_rows, k)
    if len(rows) != want or tuple(rows.shape[1:]) != tuple(layout.row_shape):
        raise ValueError(
            f"vectors file {k} holds {want} rows of shape {layout.row_shape}, got an array of shape {rows.shape}"
        )
    (staging / BUILD_DIR).mkdir(parents=True, exist_ok=True)
    # A name of its own: two writers of the same file (a part redone while a stale worker still
    # runs) must never write into one temporary file; the last rename wins, whole either way.
    # (Not mkstemp: its files are private, 0600; a cache is read by other users and services.)
    name = staging / BUILD_DIR / f"vectors-{k}.{uuid.uuid4().hex}.tmp"
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            crc = _write_file_body(handle, layout, n_rows, k, rows)
            handle.flush()
            os.fsync(handle.fileno())
            size = handle.tell()
        # The block sums first: a vectors file at its final name always has them beside it.
        write_sums_file(_sums_path(staging, k), block_sums(rows, int(layout.chunk_rows or 0)))
        _publish(Path(name), vectors_file_path(staging, layout, k))
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return size, crc


def _sums_path(staging: Path, k: int) -> Path:
    """Where a build keeps the block sums of vectors file ``k`` until :func:`finish_group` gathers them."""
    return staging / BUILD_DIR / f"blocksums-{k}.bin"


def _vector_block_sums(staging: Path, vectors: Any) -> np.ndarray:
    """``blocksums/vectors``: the sums the writers left beside each vectors file, or for a file without
    them (a build resumed from an older elmo-cache) its rows read back through zarr."""
    rows, chunk = int(vectors.shape[0]), int(vectors.chunks[0])
    file_rows = int((vectors.shards or vectors.chunks)[0])
    parts = []
    for k in range(-(-rows // file_rows)):
        start, stop = k * file_rows, min(rows, (k + 1) * file_rows)
        sums = read_sums_file(_sums_path(staging, k), -(-(stop - start) // chunk))
        parts.append(sums if sums is not None else block_sums(np.asarray(vectors[start:stop]), chunk))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)


def _publish(source: Path, final: Path) -> None:
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, final)
    fsync_path(final.parent, directory=True)


def _write_checksums(staging: Path, known: dict[str, tuple[int, int]]) -> None:
    """``checksums.json``: size and CRC-32 of every file of the group but the root ``zarr.json``; ``known``
    holds the sums already computed (relative paths), the other files are read now."""
    files: dict[str, list[int]] = {}
    for directory, subdirectories, names in os.walk(staging):
        relative = Path(directory).relative_to(staging)
        if relative.parts[:1] == (BUILD_DIR,):
            subdirectories.clear()
            continue
        for name in names:
            key = (relative / name).as_posix()
            if key in (ZARR_JSON, CHECKSUMS_FILE):
                continue
            files[key] = list(known.get(key) or file_checksum(Path(directory) / name))
    path = staging / CHECKSUMS_FILE
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"algorithm": CHECKSUM_ALGORITHM, "files": files}, f, sort_keys=True, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())


def _write_small_array(group: Any, name: str, data: np.ndarray) -> np.ndarray:
    """Write 1-D ``data`` as array ``name`` of ``group`` a block at a time; returns its block sums."""
    array = group.create_array(
        name,
        shape=data.shape,
        dtype=data.dtype,
        chunks=(max(1, min(len(data), TEXT_CHUNK if name == "tokens/bytes" else SMALL_CHUNK)),),
        compressors=None,
        fill_value=0,
        overwrite=True,
        # Every chunk written, zeros too, so that an absent file always means damage (a reader refuses
        # it). As the array's config: zarr 3.1 ignores the global "array.write_empty_chunks" key.
        config={"write_empty_chunks": True},
    )
    # Whole chunks and whole sum blocks per step, so each chunk is written once and each sum is of one block.
    unit = math.lcm(array.chunks[0], SMALL_BLOCK_ROWS)
    step = unit * max(1, _BLOCK_BYTES // (unit * data.dtype.itemsize))
    sums = []
    for start, block in array_blocks(data, step):
        array[start : start + len(block)] = block
        sums.append(block_sums(block, SMALL_BLOCK_ROWS))
    return np.concatenate(sums) if sums else np.empty(0, np.uint32)


def finish_group(
    staging: Path,
    output: Path,
    small_arrays: dict[str, np.ndarray],
    metadata: dict[str, Any],
    vector_sums: dict[int, tuple[int, int]] | None = None,
) -> Path:
    """Finish the zarr cache built in ``staging`` and publish it at ``output``.

    Every ``vectors`` file must already be written. Sets ``vectors`` to ``metadata["n_rows"]`` rows,
    writes the 1-D arrays (``offsets``, ``lengths``, ``index/hashes``, ``index/rows``, ``tokens/bytes``,
    ``tokens/offsets``), ``checksums.json`` (``vector_sums[k]`` is vectors file ``k``'s ``(size, CRC-32)``
    when already known), then the metadata with ``complete: true`` and its checksum, last; syncs,
    renames the folder to ``output`` and removes the build folder.
    """
    import zarr

    group = zarr.open_group(store=str(staging), mode="r+")
    vectors: Any = group["vectors"]
    rows = int(metadata["n_rows"])
    if vectors.shape[0] != rows:
        # Public Array.resize (the private async_array is gone in some zarr 3 releases): it rewrites
        # the shape in zarr.json and deletes only vectors files wholly past the new end, which hold no row.
        vectors.resize((rows, *vectors.shape[1:]))
    # Block sums (FORMAT.md, "Block checksums"): the vectors' from the files' writers, the others' as their
    # blocks are copied in (a block at a time: a whole copy would stay resident, bytes per line of corpus).
    sums = {BLOCK_SUMS["vectors"]: _vector_block_sums(staging, vectors)}
    for name, data in small_arrays.items():
        sums[BLOCK_SUMS[name]] = _write_small_array(group, name, data)
    for name, data in sums.items():
        _write_small_array(group, name, data)
    for directory, _, files in os.walk(staging):
        parts = Path(directory).relative_to(staging).parts
        if parts[:1] == (BUILD_DIR,) or parts[:2] == ("vectors", "c"):
            continue  # vectors files were synced when they were written
        for file in files:
            fsync_path(Path(directory) / file)
    ndim = len(vectors.shape)
    known = {
        "/".join(["vectors", "c", str(k), *("0" * (ndim - 1))]): (int(size), int(crc))
        for k, (size, crc) in (vector_sums or {}).items()
    }
    _write_checksums(staging, known)
    # complete=true is the last write into the group; the rename then publishes it whole.
    final = {**metadata}
    final["checksums"] = {
        "algorithm": CHECKSUM_ALGORITHM,
        "file": CHECKSUMS_FILE,
        "metadata": metadata_checksum(final),
        "blocks": sums_listing(int(vectors.chunks[0])),
    }
    group.attrs[META_KEY] = final
    fsync_path(staging / ZARR_JSON)
    os.rename(staging, output)
    fsync_path(output.parent, directory=True)
    shutil.rmtree(output / BUILD_DIR, ignore_errors=True)
    return output


class ZarrWriter(Writer):
    """Writes a zarr v3 cache (FORMAT.md) through its staging folder.

    Rows stream into ``_build/rows-<k>.bin``, the raw rows of the vectors file ``k`` being filled. At a
    commit each filled file is finished into ``_build/shard-<k>.ready`` (uncompressed: its index is
    appended and the file renamed, so the vectors are never copied; compressed: zarr encodes it) and
    synced; ``progress.json`` is written; then the ready files are renamed into ``vectors/c/``. A
    crash between the two is repaired on resume, which also cuts the open file back to the commit.
    """

    def __init__(self, output: Path, layout: Layout, progress: Progress):
        super().__init__(output, layout, progress)
        assert layout.chunk_rows is not None and layout.shard_rows is not None, "the build plan fills both"
        self.file_rows = vectors_file_rows(layout)
        self._rows = 0  # rows appended, committed or not
        self._handle: Any = None  # the open rows-<k>.bin of file k = self._rows // file_rows
        self._filled: list[int] = []  # files whose rows are all appended, not yet finished
        self._ready: list[int] = []  # files finished at the last sync, renamed after the commit
        # CRC-32 of the rows appended so far to each file not yet finished, so that finishing a file
        # does not read its rows back (up to 256 MiB) to sum them.
        self._rows_crc: dict[int, int] = {}
        # Block sums (CRC-32C per chunk of rows) of each file not yet finished, likewise summed as appended.
        self._summers: dict[int, BlockSummer] = {}
        # (size, CRC-32) of each finished vectors file, for checksums.json.
        self.file_sums = RawColumn(self.build_dir / "file_sums.bin", "int64", (2,))

    def _rows_path(self, k: int) -> Path:
        return self.build_dir / f"rows-{k}.bin"

    def _ready_path(self, k: int) -> Path:
        return self.build_dir / f"shard-{k}.ready"

    # -- container hooks ----------------------------------------------------------------------

    def _create_container(self) -> None:
        create_group(self.staging, self.layout, 0, self.initial_metadata)

    def _open_vectors(self) -> None:
        rows = self.progress.rows
        published = rows // self.file_rows
        self.file_sums.open(published)
        for k in range(published):  # finish a publication a crash interrupted
            final = vectors_file_path(self.staging, self.layout, k)
            if not final.is_file():
                if not self._ready_path(k).is_file():
                    raise CacheFormatError(f"{final}: a committed vectors file is missing; rerun with --overwrite")
                _publish(self._ready_path(k), final)
        current = self._rows_path(published)
        if self.layout.compression is None and not current.exists():
            # Its rows were finished into a vectors file (index appended) by a commit or a finish that
            # did not complete: take them back; the cut below drops the index.
            for finished in (self._ready_path(published), vectors_file_path(self.staging, self.layout, published)):
                if finished.is_file():
                    os.replace(finished, current)
                    break
        for path in self.build_dir.glob("*.bin"):
            if path.name.startswith("rows-") and path != current:
                path.unlink()
        for path in self.build_dir.glob("shard-*.ready"):
            path.unlink()
        chunk_dir = self.staging / "vectors" / "c"
        if chunk_dir.is_dir():
            for entry in chunk_dir.iterdir():
                if not entry.name.isdigit() or int(entry.name) >= published:
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        want = (rows - published * self.file_rows) * self.layout.row_bytes
        if want:
            if not current.is_file() or current.stat().st_size < want:
                raise CacheFormatError(
                    f"{current}: the committed rows of the vectors are missing or damaged; rerun with --overwrite"
                )
            os.truncate(current, want)
            summer, crc = BlockSummer(self.chunk_rows_bytes), 0
            with open(current, "rb") as f:  # the committed rows of the open file, summed again (once per resume)
                while piece := f.read(_CRC_BYTES):
                    crc = checksum(piece, crc)
                    summer.update(piece)
            self._rows_crc, self._summers = {published: crc}, {published: summer}
        else:
            current.unlink(missing_ok=True)
            self._rows_crc, self._summers = {}, {}
        self._rows = rows

    def _file_handle(self, k: int) -> Any:
        if self._handle is None:
            self._handle = open(self._rows_path(k), "ab")  # noqa: SIM115 - held across appends
        return self._handle

    def _close_handle(self, *, sync: bool) -> None:
        if self._handle is not None:
            if sync:
                self._handle.flush()
                os.fsync(self._handle.fileno())
            self._handle.close()
            self._handle = None

    def _append_vectors(self, vectors: np.ndarray) -> None:
        done, n = 0, len(vectors)
        while done < n:
            k = self._rows // self.file_rows
            take = min(n - done, (k + 1) * self.file_rows - self._rows)
            data = np.ascontiguousarray(vectors[done : done + take]).data.cast("B")
            self._file_handle(k).write(data)
            self._rows_crc[k] = checksum(data, self._rows_crc.get(k, 0))
            summer = self._summers.get(k)
            if summer is None:
                summer = self._summers[k] = BlockSummer(self.chunk_rows_bytes)
            summer.update(data)
            done += take
            self._rows += take
            if self._rows % self.file_rows == 0:
                self._close_handle(sync=False)
                self._filled.append(k)

    def _finish_file(self, k: int, n_rows: int) -> tuple[int, int]:
        """Turn rows-<k>.bin into the vectors file shard-<k>.ready (synced); returns its (size, CRC-32)."""
        rows_path, ready = self._rows_path(k), self._ready_path(k)
        summer = self._summers.pop(k, None)
        if summer is not None:  # else: no rows appended in this session and none to resume (cannot happen)
            write_sums_file(_sums_path(self.staging, k), summer.finish())
        if self.layout.compression is None:
            _, present = _file_geometry(self.layout, n_rows, k)
            padding_and_index = bytes(present * self.chunk_rows_bytes - rows_path.stat().st_size)
            padding_and_index += _shard_index(self.layout, present)
            with open(rows_path, "ab") as handle:
                handle.write(padding_and_index)
                handle.flush()
                os.fsync(handle.fileno())
                size = handle.tell()
            os.replace(rows_path, ready)
            return size, checksum(padding_and_index, self._rows_crc.pop(k, 0))
        self._rows_crc.pop(k, None)  # compressed: the file's sum is of the encoded bytes
        block = np.fromfile(rows_path, dtype=self.layout.dtype).reshape(-1, *self.layout.row_shape)
        with open(ready, "wb") as handle:
            crc = _write_file_body(handle, self.layout, n_rows, k, block)
            handle.flush()
            os.fsync(handle.fileno())
            return handle.tell(), crc

    @property
    def chunk_rows_bytes(self) -> int:
        return int(self.layout.chunk_rows or 0) * self.layout.row_bytes

    def _sync_vectors(self) -> dict[str, Any]:
        for k in self._filled:
            self.file_sums.append(np.array([self._finish_file(k, (k + 1) * self.file_rows)], dtype=np.int64))
        self._ready, self._filled = self._filled, []
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
        self.file_sums.sync()
        return {}

    def _after_commit(self) -> None:
        for k in self._ready:
            _publish(self._ready_path(k), vectors_file_path(self.staging, self.layout, k))
            self._rows_path(k).unlink(missing_ok=True)  # compressed: the raw rows, now encoded
        self._ready = []

    def _close_vectors(self) -> None:
        self._close_handle(sync=False)
        self.file_sums.close()

    # -- finishing ----------------------------------------------------------------------------

    def finalize(self, metadata: dict[str, Any]) -> Path:
        rows = self.progress.rows
        assert rows == self._rows and not self._filled, "finalize follows the last commit"
        self._close_handle(sync=True)
        files = -(-rows // self.file_rows)
        sums = {
            k: (int(size), int(crc))
            for k, (size, crc) in enumerate(self.file_sums.read(rows // self.file_rows).tolist())
        }
        if rows % self.file_rows:  # the last, partly filled file
            k = files - 1
            sums[k] = self._finish_file(k, rows)
            # Compressed: the raw rows stay until the build folder goes, in case finishing fails.
            _publish(self._ready_path(k), vectors_file_path(self.staging, self.layout, k))
        small = self.small_arrays()
        self.close()
        return finish_group(self.staging, self.output, small, metadata, sums)
