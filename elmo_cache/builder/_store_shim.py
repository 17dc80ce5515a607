"""TEMPORARY shim, to be deleted when main's "store: sharded vectors" lands: the four store functions
the distributed build writes through, on the current (unsharded) zarr layout, where one vectors file is one
chunk of ``chunk_rows`` rows. Same signatures as the lead's ``elmo_cache.store.zarr`` functions."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.store._staging import Layout, fsync_path
from elmo_cache.store.format import (
    BUILD_DIR,
    CHECKSUM_ALGORITHM,
    CHECKSUMS_FILE,
    META_KEY,
    ZARR_JSON,
    metadata_checksum,
)
from elmo_cache.store.zarr import SMALL_CHUNK, TEXT_CHUNK, _compressor, file_checksum

__all__ = ["vectors_file_rows", "create_group", "write_vectors_file", "finish_group"]


def vectors_file_rows(layout: Layout) -> int:
    rows = getattr(layout, "shard_rows", None) or layout.chunk_rows
    assert rows is not None
    return int(rows)


def _chunk_path(staging: Path, layout: Layout, k: int) -> Path:
    return (staging / "vectors" / "c").joinpath(str(k), *("0" * len(layout.row_shape)))


def create_group(staging: Path, layout: Layout, n_rows: int, metadata: dict[str, Any]) -> None:
    import zarr

    if (staging / "vectors" / ZARR_JSON).is_file():
        array = zarr.open_array(store=str(staging), path="vectors", mode="r")
        if array.shape == (n_rows, *layout.row_shape):
            return
    group = zarr.create_group(store=str(staging), attributes={META_KEY: metadata})
    row = layout.row_shape
    group.create_array(
        "vectors",
        shape=(n_rows, *row),
        chunks=(vectors_file_rows(layout), *row),
        dtype=layout.dtype,
        compressors=_compressor(layout.compression, np.dtype(layout.dtype).itemsize),
        fill_value=0,
        dimension_names=("row", "layer", "dim") if len(row) == 2 else ("row", "dim"),
    )


def write_vectors_file(staging: Path, layout: Layout, n_rows: int, k: int, rows: np.ndarray) -> tuple[int, int]:
    import zarr

    f = vectors_file_rows(layout)
    start, stop = k * f, min((k + 1) * f, n_rows)
    assert len(rows) == stop - start, (k, len(rows), start, stop)
    array = zarr.open_array(store=str(staging), path="vectors", mode="r+")
    with zarr.config.set({"array.write_empty_chunks": True}):
        array[start:stop] = rows
    path = _chunk_path(staging, layout, k)
    fsync_path(path)
    return file_checksum(path)


def finish_group(
    staging: Path,
    output: Path,
    small_arrays: dict[str, np.ndarray],
    metadata: dict[str, Any],
    vector_sums: dict[int, tuple[int, int]] | None = None,
) -> Path:
    import json

    import zarr

    group = zarr.open_group(store=str(staging), mode="r+")
    for name, data in small_arrays.items():
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
    ndim = zarr.open_array(store=str(staging), path="vectors", mode="r").ndim
    known = {"/".join(["vectors", "c", str(k), *("0" * (ndim - 1))]): v for k, v in (vector_sums or {}).items()}
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
            if key not in known:
                fsync_path(Path(directory) / name)
            files[key] = list(known.get(key) or file_checksum(Path(directory) / name))
    with open(staging / CHECKSUMS_FILE, "w", encoding="utf-8") as f:
        json.dump({"algorithm": CHECKSUM_ALGORITHM, "files": files}, f, sort_keys=True, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())
    final = {**metadata}
    final["checksums"] = {"algorithm": CHECKSUM_ALGORITHM, "file": CHECKSUMS_FILE, "metadata": metadata_checksum(final)}
    group.attrs[META_KEY] = final
    fsync_path(staging / ZARR_JSON)
    os.rename(staging, output)
    fsync_path(output.parent, directory=True)
    shutil.rmtree(output / BUILD_DIR, ignore_errors=True)
    return output
