"""The zarr v3 container of docs/FORMAT.md: its reader and its writer.

Reading. zarr keeps every chunk of an array in its own file (``vectors/c/<i>/0/0`` with the
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
so it is independent of the cache size, and ``zarr`` itself is not even imported (the writer
imports it when a build starts).

Arrays that are compressed (or sharded, or chunked across columns) fall back to zarr's own
reads, one decoded chunk at a time, with a few decoded chunks kept (bounded by bytes) so
that sequential reads decode each chunk once. Random reads of a compressed cache decode a
whole chunk per sentence: that is the price of compression, which saves little on floats.

Writing. Vectors go straight into the final chunk files while the build runs. The staging
folder ``<output>.partial/`` *is* the zarr group being built. Full chunks of ``vectors`` are
written as soon as their rows exist, so finishing a build never copies the vectors again (at
several KB per token that copy would cost as much as a slow encoder); the rows of the last,
incomplete chunk wait in a small ``tail-N.bin`` file that each commit rewrites (at most one
chunk). Each committed chunk file's size and CRC-32 are staged as it is synced. Finishing
writes the per-sentence arrays, the tokens and the index, then ``checksums.json`` (size and
CRC-32 of every file but the root ``zarr.json``), sets ``complete: true`` and renames the folder
to the output, so the output path only ever holds a finished cache.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store._staging import Layout, Progress, RawColumn, Writer, fsync_path
from elmo_cache.store.format import (
    ARRAYS,
    BUILD_DIR,
    CHECKSUM_ALGORITHM,
    CHECKSUMS_FILE,
    META_KEY,
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
    "is_store",
    "read_metadata",
    "open_arrays",
    "open_with_library",
]

COMPRESSIONS = ("none", "zstd", "blosc-lz4", "blosc-zstd")
"""Valid ``compression`` names for zarr caches ("none" is stored as null)."""

# Entries per chunk of the 1-D arrays (offsets, lengths, index): 512 KiB of int64. Readers map
# them chunk by chunk or load them whole; this size keeps a 100M-line cache at ~1,500 small
# files per array while a binary search of the index still touches only a few of them.
SMALL_CHUNK = 1 << 16

# Bytes per chunk of ``tokens/bytes`` (about 60 bytes a sentence: ~70,000 sentences a chunk).
TEXT_CHUNK = 1 << 22

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


class MappedChunks(ChunkedArray):
    """Uncompressed zarr chunk files, each mapped with numpy.memmap on first use (LRU-bounded)."""

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        chunk_rows: int,
        directory: Path,
        key: Callable[[int, int], str],
        fill_value: Any,
    ):
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

    def check_files(self) -> None:
        """Check the sizes of the first and last chunk files (two ``stat`` calls; the rest on first use)."""
        for c in sorted({0, self.n_chunks - 1} if self.n_chunks else set()):
            path = self._directory / self._key(c, self.ndim)
            try:
                size = os.path.getsize(path)
            except FileNotFoundError:
                continue  # reads as the fill value, as zarr specifies
            if size != self._chunk_bytes:
                raise CacheFormatError(
                    f"{path}: chunk of array {self.name!r} has {size} bytes, expected {self._chunk_bytes} "
                    f"(an uncompressed chunk of shape {self._chunk_shape} {self.dtype}); the cache is corrupt"
                )

    def contiguous(self) -> np.ndarray | None:
        if self.n_chunks == 1:
            return self._load_chunk(0)[: self.shape[0]]
        if self.n_chunks == 0:
            return self._empty()
        return None


class DecodedChunks(ChunkedArray):
    """Compressed (or otherwise non-raw) zarr arrays: zarr decodes, we keep a few decoded chunks."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, chunk_rows: int, array: Any):
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
        return MappedChunks(
            name, shape, dtype, chunk_shape[0], directory, key, _fill_value(meta.get("fill_value"), dtype)
        )
    import zarr  # only compressed caches pay for importing zarr

    try:
        array = zarr.open_array(store=str(root), path=name, mode="r")
    except Exception as exc:  # zarr raises many types for unreadable metadata
        raise CacheFormatError(f"{where}: zarr cannot open it ({exc})") from None
    return DecodedChunks(name, shape, array.dtype, chunk_shape[0], array)


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


class ZarrWriter(Writer):
    """Writes a zarr v3 cache (FORMAT.md) through its staging folder."""

    def __init__(self, output: Path, layout: Layout, progress: Progress):
        super().__init__(output, layout, progress)
        assert layout.chunk_rows is not None, "a zarr layout carries chunk_rows (the build plan fills it)"
        self.chunk_rows = int(layout.chunk_rows)
        self._array: Any = None
        self._tail = np.empty((0, *layout.row_shape), dtype=layout.dtype)
        self._full_rows = 0  # rows held in full chunks
        self._synced_chunks = 0  # chunks known to be on stable storage
        # (size, CRC-32) of each synced chunk file of vectors, for checksums.json.
        self.chunk_sums = RawColumn(self.build_dir / "chunk_sums.bin", "int64", (2,))

    # -- container hooks ----------------------------------------------------------------------

    def _create_container(self) -> None:
        import zarr

        group = zarr.create_group(store=str(self.staging), attributes={META_KEY: self.initial_metadata})
        row = self.layout.row_shape
        group.create_array(
            "vectors",
            shape=(0, *row),
            chunks=(self.chunk_rows, *row),
            dtype=self.layout.dtype,
            compressors=_compressor(self.layout.compression, np.dtype(self.layout.dtype).itemsize),
            fill_value=0,
            dimension_names=("row", "layer", "dim") if len(row) == 2 else ("row", "dim"),
        )

    def _chunk_dir(self) -> Path:
        return self.staging / "vectors" / "c"

    def _chunk_path(self, c: int) -> Path:
        return self._chunk_dir().joinpath(str(c), *("0" * len(self.layout.row_shape)))

    def _open_vectors(self) -> None:
        import zarr

        try:
            self._array = zarr.open_array(store=str(self.staging), path="vectors", mode="r+")
        except Exception as exc:  # zarr raises many types for unreadable metadata
            raise CacheFormatError(
                f"{self.staging}: cannot reopen the vectors being built ({exc}); rerun with --overwrite"
            ) from None
        rows = self.progress.rows
        self._full_rows = rows // self.chunk_rows * self.chunk_rows
        self._synced_chunks = self._full_rows // self.chunk_rows
        self.chunk_sums.open(self._synced_chunks)
        # A crash may have left chunks past the last commit; they are rewritten or dropped.
        self._set_rows(self._full_rows)
        chunk_dir = self._chunk_dir()
        if chunk_dir.is_dir():
            for entry in chunk_dir.iterdir():
                if not entry.name.isdigit() or int(entry.name) >= self._synced_chunks:
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        tail_rows = rows - self._full_rows
        self._tail = np.empty((0, *self.layout.row_shape), dtype=self.layout.dtype)
        if tail_rows:
            name = self.progress.extra.get("tail")
            path = self.build_dir / str(name)
            expected = tail_rows * self.layout.row_bytes
            if not name or not path.is_file() or path.stat().st_size != expected:
                raise CacheFormatError(
                    f"{path}: the committed tail of the vectors is missing or damaged; rerun with --overwrite"
                )
            self._tail = np.fromfile(path, dtype=self.layout.dtype).reshape(tail_rows, *self.layout.row_shape)

    def _set_rows(self, rows: int) -> None:
        from zarr.core.sync import sync

        # Only the shape in zarr.json changes; chunk files are managed here, not by zarr.
        sync(self._array.async_array.resize((rows, *self.layout.row_shape), delete_outside_chunks=False))

    def _write_rows(self, start: int, block: np.ndarray) -> None:
        import zarr

        # Chunks that are all zeros must still exist as files: readers map them.
        with zarr.config.set({"array.write_empty_chunks": True}):
            self._array[start : start + len(block)] = block

    def _append_vectors(self, vectors: np.ndarray) -> None:
        if not len(vectors):
            return
        c = self.chunk_rows
        start = 0
        if len(self._tail):
            # Complete the pending chunk first (copies at most one chunk of rows).
            start = min(len(vectors), c - len(self._tail))
            self._tail = np.concatenate([self._tail, vectors[:start]])
            if len(self._tail) < c:
                return
            self._set_rows(self._full_rows + c)
            self._write_rows(self._full_rows, self._tail)
            self._full_rows += c
            self._tail = self._tail[:0]
        aligned = (len(vectors) - start) // c * c
        if aligned:  # whole chunks straight from the window, no copy
            self._set_rows(self._full_rows + aligned)
            self._write_rows(self._full_rows, vectors[start : start + aligned])
            self._full_rows += aligned
        self._tail = np.array(vectors[start + aligned :])

    def _sync_vectors(self) -> dict[str, Any]:
        chunks = self._full_rows // self.chunk_rows
        for c in range(self._synced_chunks, chunks):
            path = self._chunk_path(c)
            fsync_path(path)
            self.chunk_sums.append(np.array([file_checksum(path)], dtype=np.int64))
        self.chunk_sums.sync()
        self._synced_chunks = chunks
        commit = int(self.progress.extra.get("commit", 0)) + 1
        name = f"tail-{commit}.bin"
        with open(self.build_dir / name, "wb") as f:
            f.write(np.ascontiguousarray(self._tail).tobytes())
            f.flush()
            os.fsync(f.fileno())
        return {"tail": name, "commit": commit}

    def _after_commit(self) -> None:
        keep = self.progress.extra.get("tail")
        for path in self.build_dir.glob("tail-*.bin"):
            if path.name != keep:
                path.unlink(missing_ok=True)

    def _close_vectors(self) -> None:
        self._array = None
        self.chunk_sums.close()

    # -- finishing ----------------------------------------------------------------------------

    def _write_checksums(self) -> None:
        """``checksums.json``: size and CRC-32 of every file of the group but the root ``zarr.json``.

        Committed chunks of ``vectors`` were summed when they were synced; the rest is read now.
        """
        known = {
            self._chunk_path(c).relative_to(self.staging).as_posix(): (int(size), int(crc))
            for c, (size, crc) in enumerate(self.chunk_sums.read(self._synced_chunks).tolist())
        }
        files: dict[str, list[int]] = {}
        for directory, subdirectories, names in os.walk(self.staging):
            relative = Path(directory).relative_to(self.staging)
            if relative.parts[:1] == (BUILD_DIR,):
                subdirectories.clear()
                continue
            for name in names:
                key = (relative / name).as_posix()
                if key in (ZARR_JSON, CHECKSUMS_FILE):
                    continue
                files[key] = list(known.get(key) or file_checksum(Path(directory) / name))
        path = self.staging / CHECKSUMS_FILE
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"algorithm": CHECKSUM_ALGORITHM, "files": files}, f, sort_keys=True, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())

    def finalize(self, metadata: dict[str, Any]) -> Path:
        import zarr

        rows = self.progress.rows
        self._set_rows(rows)
        if len(self._tail):
            self._write_rows(self._full_rows, self._tail)
            fsync_path(self._chunk_path(self._full_rows // self.chunk_rows))
        group = zarr.open_group(store=str(self.staging), mode="r+")
        for name, data in self.small_arrays().items():
            array = group.create_array(
                name,
                shape=data.shape,
                dtype=data.dtype,
                chunks=(max(1, min(len(data), TEXT_CHUNK if name == "tokens/bytes" else SMALL_CHUNK)),),
                compressors=None,
                fill_value=0,
                overwrite=True,
            )
            if len(data):
                with zarr.config.set({"array.write_empty_chunks": True}):
                    array[:] = np.asarray(data)
        for directory, _, files in os.walk(self.staging):
            parts = Path(directory).relative_to(self.staging).parts
            if parts[:1] == (BUILD_DIR,) or parts[:2] == ("vectors", "c"):
                continue  # vector chunks were synced as they were committed
            for file in files:
                fsync_path(Path(directory) / file)
        self._write_checksums()
        # complete=true is the last write into the group; the rename then publishes it whole.
        final = {**metadata}
        final["checksums"] = {
            "algorithm": CHECKSUM_ALGORITHM,
            "file": CHECKSUMS_FILE,
            "metadata": metadata_checksum(final),
        }
        group.attrs[META_KEY] = final
        fsync_path(self.staging / ZARR_JSON)
        self.close()
        os.rename(self.staging, self.output)
        fsync_path(self.output.parent, directory=True)
        shutil.rmtree(self.output / BUILD_DIR, ignore_errors=True)
        return self.output
