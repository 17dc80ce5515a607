"""Reading the zarr v3 container of a cache, memory-mapped wherever the format allows.

Design. zarr keeps every chunk of an array in its own file (``vectors/c/<i>/0/0`` with the
default chunk key encoding). When an array's codec chain is just the ``bytes`` codec (no
compressor, no sharding, no transpose) and it is chunked along rows only, as FORMAT.md asks
of an uncompressed cache, each chunk file *is* the raw C-order bytes of ``chunk_rows`` rows,
always full-size (zarr v3 pads edge chunks). Such an array is read here without zarr at all:
each chunk file is mapped with :class:`numpy.memmap` when first touched, so a sentence is a
zero-copy view of the page cache, shared by every DataLoader worker, exactly as with HDF5.
A sentence that straddles a chunk boundary is the concatenation of two slices (one copy).
A chunk file that does not exist reads as the array's fill value, as zarr specifies
(zarr skips writing chunks that hold only the fill value).

Open mappings are kept in a small LRU because every ``mmap`` holds a file descriptor; a
100M-sentence cache has tens of thousands of chunk files and re-mapping an evicted chunk
costs an ``open`` + ``mmap`` (microseconds). Opening touches only the ``zarr.json`` files,
so it is independent of the cache size, and ``zarr`` itself is not even imported.

Arrays that are compressed (or sharded, or chunked across columns) fall back to zarr's own
reads, one decoded chunk at a time, with a few decoded chunks kept (bounded by bytes) so
that sequential reads decode each chunk once. Random reads of a compressed cache decode a
whole chunk per sentence: that is the price of compression, which saves little on floats.
"""

from __future__ import annotations

import json
import math
import os
import resource
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError

__all__ = ["open_zarr", "ChunkedArray"]

# Decoded (compressed) chunks kept per array, in bytes; at least two chunks are always kept.
_DECODED_CACHE_BYTES = 256 * 2**20


def _max_open_maps() -> int:
    # Leave most descriptors to the user's program (DataLoader workers, sockets...).
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(8, min(1024, soft // 8))


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
        if isinstance(key, np.ndarray) or isinstance(key, (list, tuple)):
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


class MappedChunks(ChunkedArray):
    """Uncompressed zarr chunk files, each mapped with numpy.memmap on first use (LRU-bounded)."""

    def __init__(self, name, shape, dtype, chunk_rows, directory: Path, key, fill_value):
        super().__init__(name, shape, dtype, chunk_rows)
        self._directory = directory
        self._key = key
        self._fill = fill_value
        self._chunk_shape = (self.chunk_rows, *self.shape[1:])
        self._chunk_bytes = int(np.prod(self._chunk_shape)) * self.dtype.itemsize
        self._maps: OrderedDict[int, np.ndarray] = OrderedDict()
        self._max_maps = _max_open_maps()

    def _load_chunk(self, c: int) -> np.ndarray:
        block = self._maps.get(c)
        if block is not None:
            self._maps.move_to_end(c)
            return block
        if not 0 <= c < self.n_chunks:
            raise IndexError(f"chunk {c} out of range for array {self.name!r}")
        path = self._directory / self._key(c, self.ndim)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            block = np.broadcast_to(np.asarray(self._fill, dtype=self.dtype), self._chunk_shape)
        else:
            if size != self._chunk_bytes:
                raise CacheFormatError(
                    f"{path}: chunk of array {self.name!r} has {size} bytes, expected {self._chunk_bytes} "
                    f"(an uncompressed chunk of shape {self._chunk_shape} {self.dtype}); the cache is corrupt"
                )
            # A plain ndarray view of the map: indexing np.memmap itself runs Python code per call.
            block = np.memmap(path, dtype=self.dtype, mode="r", shape=self._chunk_shape).view(np.ndarray)
        self._maps[c] = block
        if len(self._maps) > self._max_maps:
            self._maps.popitem(last=False)
        return block

    def contiguous(self) -> np.ndarray | None:
        if self.n_chunks == 1:
            return self._load_chunk(0)[: self.shape[0]]
        if self.n_chunks == 0:
            return self._empty()
        return None


class DecodedChunks(ChunkedArray):
    """Compressed (or otherwise non-raw) zarr arrays: zarr decodes, we keep a few decoded chunks."""

    def __init__(self, name, shape, dtype, chunk_rows, array):
        super().__init__(name, shape, dtype, chunk_rows)
        self._array = array
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._max_chunks = max(2, _DECODED_CACHE_BYTES // max(1, row_bytes * self.chunk_rows))
        self._decoded: OrderedDict[int, np.ndarray] = OrderedDict()

    def _load_chunk(self, c: int) -> np.ndarray:
        block = self._decoded.get(c)
        if block is not None:
            self._decoded.move_to_end(c)
            return block
        block = np.asarray(self._array[c * self.chunk_rows : (c + 1) * self.chunk_rows])
        block.setflags(write=False)
        self._decoded[c] = block
        if len(self._decoded) > self._max_chunks:
            self._decoded.popitem(last=False)
        return block


def _chunk_key(encoding: dict[str, Any], where: Path):
    name = encoding.get("name", "default")
    separator = (encoding.get("configuration") or {}).get("separator")
    if name == "default":
        separator = separator or "/"

        def key(c: int, ndim: int) -> str:
            return separator.join(["c", str(c), *("0" * (ndim - 1))])

    elif name == "v2":
        separator = separator or "."

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
    meta_path = directory / "zarr.json"
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
    raw = (
        len(codecs) == 1
        and codecs[0].get("name") == "bytes"
        and not meta.get("storage_transformers")
        and chunk_shape[1:] == shape[1:]
    )
    if raw:
        endian = (codecs[0].get("configuration") or {}).get("endian", "little")
        dtype = dtype.newbyteorder("<" if endian == "little" else ">")
        key = _chunk_key(meta.get("chunk_key_encoding") or {}, root / name)
        return MappedChunks(name, shape, dtype, chunk_shape[0], directory, key, _fill_value(meta.get("fill_value"), dtype))
    import zarr  # only compressed caches pay for importing zarr

    try:
        array = zarr.open_array(store=str(root), path=name, mode="r")
    except Exception as exc:  # zarr raises many types for unreadable metadata
        raise CacheFormatError(f"{where}: zarr cannot open it ({exc})") from None
    return DecodedChunks(name, shape, array.dtype, chunk_shape[0], array)


def open_zarr(root: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, ChunkedArray | None]]:
    """Raw metadata attribute and the arrays ``names`` (None where missing) of a zarr cache."""
    group = _read_json(root / "zarr.json", "the root group")
    if group.get("node_type") != "group":
        raise CacheFormatError(f"{root}: zarr.json describes a {group.get('node_type')!r}, not a group; not an elmo-cache store")
    attributes = group.get("attributes") or {}
    return attributes.get("elmo_cache"), {name: _open_array(root, name) for name in names}
