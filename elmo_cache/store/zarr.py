"""The zarr v3 container: vectors go straight into the final chunk files while the build runs.

The staging folder ``<output>.partial/`` *is* the zarr group being built. Full chunks of
``vectors`` are written as soon as their rows exist, so finishing a build never copies
the vectors again (at several KB per token that copy would cost as much as a slow encoder);
the rows of the last, incomplete chunk wait in a small ``tail-N.bin`` file that each commit
rewrites (at most one chunk). Finishing writes the per-sentence arrays and the index, sets
``complete: true`` and renames the folder to the output, so the output path only ever holds
a finished cache.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync

from elmo_cache.errors import CacheFormatError
from elmo_cache.store._staging import BUILD_DIR, Layout, Progress, Writer, fsync_path

__all__ = ["ZarrWriter", "COMPRESSIONS", "read_zarr_metadata", "SMALL_CHUNK"]

META_KEY = "elmo_cache"

# Entries per chunk of the 1-D arrays (offsets, lengths, index): 512 KiB of int64. Readers map
# them chunk by chunk or load them whole; this size keeps a 100M-line cache at ~1,500 small
# files per array while a binary search of the index still touches only a few of them.
SMALL_CHUNK = 1 << 16


def _compressor(name: str | None, itemsize: int) -> Any:
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


COMPRESSIONS = ("none", "zstd", "blosc-lz4", "blosc-zstd")
"""Valid ``compression`` names for zarr caches ("none" is stored as null)."""


def read_zarr_metadata(path: Path) -> dict[str, Any] | None:
    """The ``elmo_cache`` attribute of a zarr group, or None if ``path`` is not one of ours."""
    try:
        group = json.loads((path / "zarr.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    meta = (group.get("attributes") or {}).get(META_KEY) if isinstance(group, dict) else None
    return meta if isinstance(meta, dict) and meta.get("format") == "elmo-cache" else None


class ZarrWriter(Writer):
    """Writes a zarr v3 cache (FORMAT.md) through its staging folder."""

    def __init__(self, output: Path, layout: Layout, progress: Progress):
        super().__init__(output, layout, progress)
        self.chunk_rows = int(layout.chunk_rows)
        self._array: Any = None
        self._tail = np.empty((0, *layout.row_shape), dtype=layout.dtype)
        self._full_rows = 0  # rows held in full chunks
        self._synced_chunks = 0  # chunks known to be on stable storage

    # -- container hooks ----------------------------------------------------------------------

    def _create_container(self) -> None:
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
        try:
            self._array = zarr.open_array(store=str(self.staging), path="vectors", mode="r+")
        except Exception as exc:  # zarr raises many types for unreadable metadata
            raise CacheFormatError(f"{self.staging}: cannot reopen the vectors being built ({exc}); rerun with --overwrite") from None
        rows = self.progress.rows
        self._full_rows = rows // self.chunk_rows * self.chunk_rows
        self._synced_chunks = self._full_rows // self.chunk_rows
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
                raise CacheFormatError(f"{path}: the committed tail of the vectors is missing or damaged; rerun with --overwrite")
            self._tail = np.fromfile(path, dtype=self.layout.dtype).reshape(tail_rows, *self.layout.row_shape)

    def _set_rows(self, rows: int) -> None:
        # Only the shape in zarr.json changes; chunk files are managed here, not by zarr.
        sync(self._array.async_array.resize((rows, *self.layout.row_shape), delete_outside_chunks=False))

    def _write_rows(self, start: int, block: np.ndarray) -> None:
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
            fsync_path(self._chunk_path(c))
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

    # -- finishing ----------------------------------------------------------------------------

    def finalize(self, metadata: dict[str, Any]) -> Path:
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
                chunks=(max(1, min(len(data), SMALL_CHUNK)),),
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
        # complete=true is the last write into the group; the rename then publishes it whole.
        group.attrs[META_KEY] = metadata
        fsync_path(self.staging / "zarr.json")
        self.close()
        os.rename(self.staging, self.output)
        fsync_path(self.output.parent, directory=True)
        shutil.rmtree(self.output / BUILD_DIR, ignore_errors=True)
        return self.output
