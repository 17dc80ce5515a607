"""The HDF5 container: raw staging files, copied once into contiguous datasets at the end.

HDF5 files are not crash safe (a killed writer can leave the whole file unreadable) and a
contiguous dataset, the only kind a reader can memory-map, cannot grow. So the build appends
vectors to a raw ``vectors.bin`` in the staging folder and only the finished build writes
``cache.h5`` there, with every dataset contiguous and of its final shape, then renames it to
the output path: the output only ever holds a finished cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from elmo_cache.store._staging import Layout, Progress, RawColumn, Writer, fsync_path

__all__ = ["Hdf5Writer", "read_hdf5_metadata", "is_hdf5"]

META_KEY = "elmo_cache"
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# Rows copied per step when the vectors move into the HDF5 file (bounds memory, keeps writes large).
_COPY_BYTES = 64 * 2**20


def is_hdf5(path: Path) -> bool:
    """True when ``path`` is a file starting with the HDF5 signature."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == _HDF5_SIGNATURE
    except OSError:
        return False


def read_hdf5_metadata(path: Path) -> dict[str, Any] | None:
    """The ``elmo_cache`` attribute of an HDF5 file, or None if ``path`` is not one of ours."""
    if not is_hdf5(path):
        return None
    try:
        with h5py.File(path, "r") as f:
            raw = f.attrs.get(META_KEY)
    except OSError:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    try:
        meta = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == "elmo-cache" else None


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
        source = self.vectors.read(rows)
        with h5py.File(tmp, "w") as f:
            f.attrs[META_KEY] = json.dumps({**metadata, "complete": False})
            # No chunks, no compression, fixed shape: contiguous, so readers can numpy.memmap it.
            dataset = f.create_dataset("vectors", shape=source.shape, dtype=source.dtype)
            step = max(1, _COPY_BYTES // max(1, self.layout.row_bytes))
            for start in range(0, rows, step):
                dataset[start : start + step] = source[start : start + step]
            for name, data in self.small_arrays().items():
                f.create_dataset(name, data=np.asarray(data))
            f.flush()
            f.attrs[META_KEY] = json.dumps(metadata)
        del source
        fsync_path(tmp)
        self.close()
        os.replace(tmp, self.output)
        fsync_path(self.output.parent, directory=True)
        self.remove_staging()
        return self.output
