"""The HDF5 container of docs/FORMAT.md: its reader and its writer.

Reading. FORMAT.md makes every dataset contiguous, unchunked and unfiltered, so its bytes sit at
one offset in the file. h5py is used only to read the metadata and those offsets; its
handle is closed before this function returns, so nothing of h5py (whose handles must not
cross a fork) lives in the returned arrays. The arrays are ``numpy.memmap`` maps (handed on
as plain ndarray views of them):
zero copy, shared between DataLoader workers through the page cache, opened in constant
time whatever the cache size.

Writing. HDF5 files are not crash safe (a killed writer can leave the whole file unreadable) and a
contiguous dataset, the only kind a reader can memory-map, cannot grow. So the build appends
vectors to a raw ``vectors.bin`` in the staging folder and only the finished build writes
``cache.h5`` there, with every dataset contiguous and of its final shape (and records each
dataset's CRC-32 in the metadata), then renames it to the output path: the output only ever
holds a finished cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store._blocksums import block_sums, sums_listing
from elmo_cache.store._durable import RawColumn, fsync_path
from elmo_cache.store._pooled import pooled_block_rows
from elmo_cache.store._staging import Layout, Progress, Writer, array_blocks
from elmo_cache.store.format import (
    ARRAYS,
    BLOCK_SUMS,
    CHECKSUM_ALGORITHM,
    HDF5_SIGNATURE,
    META_KEY,
    OPTIONAL_ARRAYS,
    POOLED_ARRAY,
    SMALL_BLOCK_ROWS,
    checksum,
    decode_metadata,
    metadata_checksum,
    vector_block_rows,
)

__all__ = [
    "Hdf5Writer",
    "is_store",
    "read_metadata",
    "read_owned_metadata",
    "open_arrays",
    "open_with_library",
    "little_endian",
]

# The block sums of OPTIONAL_ARRAYS: like them, listed by open_with_library only when present.
_OPTIONAL_SUMS = {BLOCK_SUMS[name] for name in OPTIONAL_ARRAYS}

# Rows copied per step when the vectors move into the HDF5 file (bounds memory, keeps writes large).
_COPY_BYTES = 64 * 2**20


def is_store(path: Path) -> bool:
    """Whether ``path`` starts with the HDF5 signature (at 0, or after a user block of 512 * 2**k bytes)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            where = 0
            while where + 8 <= size:
                f.seek(where)
                if f.read(8) == HDF5_SIGNATURE:
                    return True
                where = 512 if where == 0 else where * 2
    except OSError:
        return False
    return False


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The elmo-cache metadata of the HDF5 file at ``path``, or None if it is not one of ours."""
    if not is_store(path):
        return None
    return read_owned_metadata(path)


def read_owned_metadata(path: Path) -> dict[str, Any] | None:
    """:func:`read_metadata` of a file already known to be HDF5 (:func:`is_store`)."""
    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get(META_KEY)
    except OSError:
        return None
    return decode_metadata(raw)


# -- reading ----------------------------------------------------------------------------------------


def open_arrays(path: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, np.ndarray | None]]:
    """Raw metadata attribute and memory-mapped arrays ``names`` (None where missing)."""
    layouts: dict[str, tuple[np.dtype, tuple[int, ...], int | None] | None] = {}
    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get(META_KEY)
            for name in names:
                node = f.get(name)
                if node is None:
                    layouts[name] = None
                    continue
                if not isinstance(node, h5py.Dataset):
                    raise CacheFormatError(f"{path}: {name!r} is a group, expected a dataset")
                plist = node.id.get_create_plist()
                if plist.get_layout() != h5py.h5d.CONTIGUOUS or plist.get_nfilters() != 0:
                    raise CacheFormatError(
                        f"{path}: dataset {name!r} is chunked, compressed or compact; FORMAT.md requires every "
                        "dataset of an HDF5 cache to be contiguous and unfiltered (so it can be memory-mapped)"
                    )
                if node.dtype.kind not in "iuf":
                    raise CacheFormatError(f"{path}: dataset {name!r} has dtype {node.dtype}, not a number type")
                layouts[name] = (node.dtype, tuple(node.shape), node.id.get_offset())
    except OSError as exc:
        raise CacheFormatError(f"{path}: not a readable HDF5 file ({exc})") from None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    size = os.path.getsize(path)
    arrays: dict[str, np.ndarray | None] = {}
    for name, layout in layouts.items():
        if layout is None:
            arrays[name] = None
            continue
        dtype, shape, offset = layout
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes == 0:
            arrays[name] = np.empty(shape, dtype=dtype)
        elif offset is None:
            # Storage never allocated: HDF5 reads it as the fill value (zeros for our writers).
            arrays[name] = np.broadcast_to(np.zeros((), dtype=dtype), shape)
        elif offset + nbytes > size:
            raise CacheFormatError(
                f"{path}: dataset {name!r} needs bytes {offset}..{offset + nbytes} but the file has {size}; truncated"
            )
        else:
            # Handed on as a plain ndarray view of the map (indexing np.memmap runs Python code per call).
            arrays[name] = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape).view(np.ndarray)
    return raw, arrays


def open_with_library(path: Path) -> tuple[Any, dict[str, Any], Callable[[], None]]:
    """Metadata attribute, datasets (None where missing) and a ``close`` of the file, read by h5py itself.

    ``verify`` checks the format through this rather than through :func:`open_arrays`, so that it
    tests FORMAT.md, not this module's reading of it. The datasets are valid until ``close()``.
    """
    try:
        handle = h5py.File(path, "r")
    except OSError as exc:
        raise CacheFormatError(f"{path}: neither a zarr directory nor a readable HDF5 file ({exc})") from None
    names = (*ARRAYS, *OPTIONAL_ARRAYS, *BLOCK_SUMS.values())
    arrays = {name: handle.get(name) for name in names}
    for name in OPTIONAL_ARRAYS:  # an optional array a cache does not hold is not named at all
        if arrays[name] is None and arrays[BLOCK_SUMS[name]] is None:
            del arrays[name], arrays[BLOCK_SUMS[name]]
    return handle.attrs.get(META_KEY), arrays, handle.close


# -- writing ----------------------------------------------------------------------------------------


def little_endian(data: Any) -> np.ndarray:
    """``data`` as a C-contiguous little-endian array (no copy when it already is one)."""
    array = np.asarray(data)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


class Hdf5Writer(Writer):
    """Writes an HDF5 cache (FORMAT.md) through its staging folder."""

    def __init__(self, output: Path, layout: Layout, progress: Progress):
        super().__init__(output, layout, progress)
        self.vectors = RawColumn(self.build_dir / "vectors.bin", layout.dtype, layout.row_shape)

    def _create_container(self) -> None:
        pass  # nothing but raw files until the end

    def _open_vectors(self) -> None:
        self.vectors.open(self.progress.rows)

    def _append_vectors(self, vectors: np.ndarray) -> None:
        if len(vectors):
            self.vectors.append(vectors)

    def _sync_vectors(self) -> dict[str, Any]:
        self.vectors.sync()
        return {}

    def _close_vectors(self) -> None:
        self.vectors.close()

    def finalize(self, metadata: dict[str, Any]) -> Path:
        rows = self.progress.rows
        tmp = self.staging / "cache.h5"
        tmp.unlink(missing_ok=True)
        self.vectors.sync()
        shape = (rows, *self.layout.row_shape)
        # CRC-32 of each dataset's little-endian C-order bytes, computed from what is written.
        crcs: dict[str, int] = {}
        with h5py.File(tmp, "w") as f:
            f.attrs[META_KEY] = json.dumps({**metadata, "complete": False})
            # No chunks, no compression, fixed shape: contiguous, so readers can numpy.memmap it.
            dataset = f.create_dataset("vectors", shape=shape, dtype=self.vectors.dtype)
            # Block sums (FORMAT.md) as the rows are copied: a step is a whole number of blocks.
            block_rows = vector_block_rows(self.layout.row_bytes, None)
            step = max(1, _COPY_BYTES // max(1, self.layout.row_bytes * block_rows)) * block_rows
            crc, sums = 0, []
            for start in range(0, rows, step):
                # Read, not memory-mapped: a map's pages would stay in the process, all the vectors by the end.
                block = little_endian(self.vectors.read_range(start, min(rows, start + step)))
                dataset[start : start + step] = block
                crc = checksum(block, crc)
                sums.append(block_sums(block, block_rows))
            crcs["vectors"] = crc
            all_sums = {BLOCK_SUMS["vectors"]: np.concatenate(sums) if sums else np.empty(0, np.uint32)}
            optional: dict[str, int] = {}  # block rows of the optional arrays written (pooled)
            for name, data in self.small_arrays().items():
                # Copied a block at a time (a whole copy would stay resident); a step is whole sum blocks.
                dataset = f.create_dataset(name, shape=data.shape, dtype=data.dtype.newbyteorder("<"))
                crc, sums = 0, []
                row_bytes = data.dtype.itemsize * int(np.prod(data.shape[1:], dtype=np.int64))
                rows_per_sum = pooled_block_rows(row_bytes) if name == POOLED_ARRAY else SMALL_BLOCK_ROWS
                optional.update({name: rows_per_sum} if name in OPTIONAL_ARRAYS else {})
                step = max(1, _COPY_BYTES // (row_bytes * rows_per_sum)) * rows_per_sum
                for start, block in array_blocks(data, step):
                    block = little_endian(block)
                    dataset[start : start + len(block)] = block
                    crc = checksum(block, crc)
                    sums.append(block_sums(block, rows_per_sum))
                crcs[name] = crc
                if name in BLOCK_SUMS:
                    all_sums[BLOCK_SUMS[name]] = np.concatenate(sums) if sums else np.empty(0, np.uint32)
            for name, array in all_sums.items():
                array = little_endian(array)
                f.create_dataset(name, data=array)
                crcs[name] = checksum(array)
            f.flush()
            final = {**metadata}
            final["checksums"] = {
                "algorithm": CHECKSUM_ALGORITHM,
                "datasets": crcs,
                "metadata": metadata_checksum(final),
                "blocks": sums_listing(block_rows, optional),
            }
            f.attrs[META_KEY] = json.dumps(final)
        fsync_path(tmp)
        self.close()
        os.replace(tmp, self.output)
        fsync_path(self.output.parent, directory=True)
        self.remove_staging()
        return self.output
