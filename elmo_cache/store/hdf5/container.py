"""The HDF5 container behind :class:`~elmo_cache.store.container.Container`.

Reading and writing live in ``read`` and ``writer`` beside it; this module is what the rest of the
package may know about HDF5: its suffixes, detection, options and its own checks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import InvalidParameterError
from elmo_cache.store.container import OutputState, inspect_store
from elmo_cache.store.format import checksum
from elmo_cache.store.hdf5.read import is_store, open_arrays, open_with_library, read_metadata, read_owned_metadata
from elmo_cache.store.hdf5.writer import Hdf5Writer, little_endian
from elmo_cache.store.staging import Writer

__all__ = ["Hdf5Container"]

# Bytes read at a time when a dataset's CRC-32 is computed.
_CRC_BYTES = 64 * 2**20


def _dataset_checksum(dataset: Any) -> int:
    """CRC-32 of an HDF5 dataset's little-endian C-order bytes, read a block of rows at a time."""
    shape = dataset.shape
    if not shape or shape[0] == 0:
        return checksum(little_endian(dataset[()]))
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dataset.dtype.itemsize)
    step = max(1, _CRC_BYTES // row_bytes)
    crc = 0
    for start in range(0, shape[0], step):
        crc = checksum(little_endian(dataset[start : start + step]), crc)
    return crc


class Hdf5Container:
    """One HDF5 file with contiguous, unfiltered datasets, so that readers memory-map them."""

    name = "hdf5"
    description = "an HDF5 file"
    suffixes: tuple[str, ...] = (".h5", ".hdf5", ".he5")
    is_directory = False
    chunked = False

    def writer(self) -> type[Writer]:
        return Hdf5Writer

    def parallel_writer(self) -> None:
        # An HDF5 file has a single writer: h5py cannot let several processes write one file.
        return None

    def owns(self, path: Path) -> bool:
        return path.is_file() and is_store(path)

    def explain(self, path: Path) -> str | None:
        return None

    def check_options(self, *, compression: str | None, chunk_rows: int | None, shard_rows: int | None) -> None:
        if compression is not None:
            raise InvalidParameterError(
                "compression: only zarr caches can be compressed; HDF5 datasets stay "
                "contiguous so that readers can memory-map them"
            )
        if chunk_rows is not None:
            raise InvalidParameterError("chunk_rows: only zarr caches are chunked; HDF5 datasets are contiguous")
        if shard_rows is not None:
            raise InvalidParameterError("shard_rows: only zarr caches are sharded; HDF5 datasets are contiguous")

    def open_arrays(self, path: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
        return open_arrays(path, names)

    def open_with_library(self, path: Path) -> tuple[Any, dict[str, Any], Callable[[], None]]:
        return open_with_library(path)

    def read_metadata(self, path: Path) -> dict[str, Any] | None:
        return read_metadata(path)

    def inspect(self, output: Path) -> OutputState | None:
        if (output.exists() or output.is_symlink()) and not self.owns(output):
            return None
        return inspect_store(self, output, read_owned_metadata)  # the signature was just read

    def checksum_problems(self, path: Path, meta: dict[str, Any], arrays: dict[str, Any]) -> tuple[list[str], str]:
        found: list[str] = []
        for name, crc in sorted((meta["checksums"].get("datasets") or {}).items()):
            dataset = arrays.get(name)
            if dataset is None:
                found.append(f"dataset {name!r}: missing")
                continue
            try:
                actual = _dataset_checksum(dataset)
            except Exception as exc:  # h5py raises many types for damaged files
                found.append(f"dataset {name!r}: unreadable ({type(exc).__name__}: {exc})")
                continue
            if actual != crc:
                found.append(
                    f"dataset {name!r}: CRC-32 {actual:#010x}, expected {crc:#010x} (bytes changed: bit flip?)"
                )
        return found, "dataset"

    def structure_problems(self, meta: dict[str, Any], arrays: dict[str, Any]) -> list[str]:
        return [
            f"HDF5 dataset {name} is chunked or compressed; FORMAT.md wants it contiguous (read at one offset)"
            for name, ds in arrays.items()
            if ds.chunks is not None or ds.compression is not None
        ]
