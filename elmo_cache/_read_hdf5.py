"""Reading the HDF5 container of a cache through numpy.memmap.

FORMAT.md makes every dataset contiguous, unchunked and unfiltered, so its bytes sit at
one offset in the file. h5py is used only to read the metadata and those offsets; its
handle is closed before this function returns, so nothing of h5py (whose handles must not
cross a fork) lives in the returned arrays. The arrays are ``numpy.memmap`` maps (handed on
as plain ndarray views of them):
zero copy, shared between DataLoader workers through the page cache, opened in constant
time whatever the cache size.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError

__all__ = ["open_hdf5", "HDF5_SIGNATURE", "is_hdf5"]

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5(path: Path) -> bool:
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


def open_hdf5(path: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, np.ndarray | None]]:
    """Raw metadata attribute and memory-mapped arrays ``names`` (None where missing)."""
    import h5py

    layouts: dict[str, tuple[np.dtype, tuple[int, ...], int | None] | None] = {}
    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get("elmo_cache")
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
