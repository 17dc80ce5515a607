"""The zarr v3 container behind :class:`~elmo_cache.store.container.Container`.

Reading and writing live beside it (``read``, ``maps``, ``write``, ``writer``); this module is what the rest of the
package may know about zarr: its suffix, detection, options and its own checks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elmo_cache.errors import InvalidParameterError
from elmo_cache.store.container import OutputState, ParallelWriter, inspect_store
from elmo_cache.store.format import CHECKSUMS_FILE, ZARR_JSON
from elmo_cache.store.staging import Writer
from elmo_cache.store.zarr.parallel import ZarrParallelWriter
from elmo_cache.store.zarr.read import is_store, open_arrays, open_with_library, read_metadata
from elmo_cache.store.zarr.write import COMPRESSIONS, file_checksum
from elmo_cache.store.zarr.writer import ZarrWriter

__all__ = ["ZarrContainer"]


def _array_of(relative: str) -> str:
    """The array a file of a zarr group belongs to (``vectors/c/3/0/0`` -> ``vectors``)."""
    if "/c/" in relative:
        return relative.split("/c/")[0]
    return relative.rsplit("/", 1)[0] if "/" in relative else relative


class ZarrContainer:
    """A zarr v3 directory: chunked (optionally sharded and compressed) arrays, one file per shard."""

    name = "zarr"
    description = "a zarr v3 directory"
    suffixes: tuple[str, ...] = (".zarr",)
    is_directory = True
    chunked = True

    def writer(self) -> type[Writer]:
        return ZarrWriter

    def parallel_writer(self) -> ParallelWriter:
        # Shards are independent files: workers write disjoint ones, the driver stitches the shared ones.
        return ZarrParallelWriter()

    def owns(self, path: Path) -> bool:
        return is_store(path)

    def explain(self, path: Path) -> str | None:
        if not path.is_dir():
            return None
        if (path / ".zgroup").exists() or (path / ".zattrs").exists():
            return f"{path}: a zarr v2 store; elmo-cache caches are zarr v3 ({ZARR_JSON}) or HDF5"
        return f"{path}: a directory without {ZARR_JSON}, not a zarr v3 cache"

    def check_options(self, *, compression: str | None, chunk_rows: int | None, shard_rows: int | None) -> None:
        if compression is not None and compression not in COMPRESSIONS:
            raise InvalidParameterError(f"compression: {compression!r} is not valid; choose from {list(COMPRESSIONS)}")
        if chunk_rows is not None and chunk_rows < 1:
            raise InvalidParameterError(f"chunk_rows: must be a positive number of rows, got {chunk_rows}")
        if shard_rows is not None and shard_rows < 1:
            raise InvalidParameterError(f"shard_rows: must be a positive number of rows, got {shard_rows}")

    def open_arrays(self, path: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
        return open_arrays(path, names)

    def open_with_library(self, path: Path) -> tuple[Any, dict[str, Any], Callable[[], None]]:
        return open_with_library(path)

    def read_metadata(self, path: Path) -> dict[str, Any] | None:
        return read_metadata(path)

    def inspect(self, output: Path) -> OutputState | None:
        if (output.exists() or output.is_symlink()) and not self.owns(output):
            return None
        return inspect_store(self, output, read_metadata)

    def checksum_problems(self, path: Path, meta: dict[str, Any], arrays: dict[str, Any]) -> tuple[list[str], str]:
        try:
            listing = json.loads((path / CHECKSUMS_FILE).read_text(encoding="utf-8"))["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return [f"{CHECKSUMS_FILE}: unreadable ({exc}); the file checksums cannot be checked"], "file"
        found: list[str] = []
        for relative, (size, crc) in sorted(listing.items()):
            where = f"{relative} (array {_array_of(relative)!r})"
            file = path / relative
            if not file.is_file():
                found.append(f"{where}: file missing")
                continue
            actual_size, actual_crc = file_checksum(file)
            if actual_size != size:
                found.append(f"{where}: {actual_size} bytes, expected {size} (truncated or overwritten)")
            elif actual_crc != crc:
                found.append(f"{where}: CRC-32 {actual_crc:#010x}, expected {crc:#010x} (bytes changed: bit flip?)")
        return found, "file"

    def structure_problems(self, meta: dict[str, Any], arrays: dict[str, Any]) -> list[str]:
        vectors = arrays["vectors"]
        problems = []
        chunks = tuple(vectors.chunks)
        if chunks[1:] != tuple(vectors.shape[1:]) or chunks[0] != meta.get("chunk_rows"):
            problems.append(f"vectors chunks {chunks} do not match chunk_rows {meta.get('chunk_rows')} along rows only")
        shards = tuple(vectors.shards or chunks)
        if meta.get("shard_rows") is not None and (shards[0] != meta["shard_rows"] or shards[1:] != chunks[1:]):
            problems.append(f"vectors shards {shards} do not match shard_rows {meta['shard_rows']} along rows only")
        return problems
