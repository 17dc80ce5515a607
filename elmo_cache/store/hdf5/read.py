"""The HDF5 container of docs/FORMAT.md, read.

Reading. FORMAT.md makes every dataset contiguous, unchunked and unfiltered, so its bytes sit at
one offset in the file. h5py is used only to read the metadata and those offsets; its
handle is closed before this function returns, so nothing of h5py (whose handles must not
cross a fork) lives in the returned arrays. The arrays read the file by position through one
descriptor (:mod:`elmo_cache.store.positioned`, which says why not a mapping): shared between
DataLoader workers through the page cache, opened in constant time whatever the cache size,
and a file truncated under them is an error, not a crash.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store.columns import cache_arrays, optional_arrays, with_block_sums
from elmo_cache.store.format import HDF5_SIGNATURE, META_KEY, block_sums_name, decode_metadata
from elmo_cache.store.positioned import OpenFile, PositionedRows

__all__ = ["is_store", "read_metadata", "read_owned_metadata", "open_arrays", "open_with_library", "DatasetRows"]


class DatasetRows(PositionedRows):
    """One contiguous dataset of an HDF5 cache: its rows at ``offset`` of the file ``handle`` reads."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: np.dtype, handle: OpenFile, offset: int):
        super().__init__(name, shape, dtype, max(1, shape[0]))
        self._where = (handle, offset)

    def _source(self, c: int) -> tuple[OpenFile, int]:
        return self._where

    def _what(self, c: int) -> str:
        return f"dataset {self.name!r}"


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


def open_arrays(path: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """Raw metadata attribute and the arrays ``names`` (None where missing), read by position."""
    layouts: dict[str, tuple[np.dtype, tuple[int, ...], int | None] | None] = {}
    try:
        handle = OpenFile(str(path), os.open(path, os.O_RDONLY))  # one descriptor for every dataset
    except OSError as exc:
        raise CacheFormatError(f"{path}: not a readable HDF5 file ({exc})") from None
    try:
        # h5py reads the offsets through the same descriptor: a file replaced meanwhile cannot pair its
        # offsets with another file's bytes.
        with open(os.dup(handle.fd), "rb") as fileobj, h5py.File(fileobj, "r") as f:
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
                        "dataset of an HDF5 cache to be contiguous and unfiltered (read at one offset of the file)"
                    )
                if node.dtype.kind not in "iuf":
                    raise CacheFormatError(f"{path}: dataset {name!r} has dtype {node.dtype}, not a number type")
                layouts[name] = (node.dtype, tuple(node.shape), node.id.get_offset())
    except OSError as exc:
        raise CacheFormatError(f"{path}: not a readable HDF5 file ({exc})") from None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    size = handle.identity[2]
    arrays: dict[str, Any] = {}
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
            arrays[name] = DatasetRows(name, shape, dtype, handle, offset)
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
    raw = handle.attrs.get(META_KEY)
    meta = decode_metadata(raw)
    arrays = {name: handle.get(name) for name in with_block_sums(cache_arrays(meta))}
    for name in optional_arrays(meta):  # an optional array a cache does not hold is not named at all
        if arrays[name] is None and arrays[block_sums_name(name)] is None:
            del arrays[name], arrays[block_sums_name(name)]
    return raw, arrays, handle.close
