"""The HDF5 container of docs/FORMAT.md, written.

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
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from elmo_cache.store.blocksums import block_sums, sums_listing
from elmo_cache.store.durable import RawColumn, fsync_path
from elmo_cache.store.format import (
    BLOCK_SUMS,
    CHECKSUM_ALGORITHM,
    META_KEY,
    OPTIONAL_ARRAYS,
    SMALL_BLOCK_ROWS,
    block_sums_name,
    checksum,
    metadata_checksum,
    vector_block_rows,
)
from elmo_cache.store.staging import Layout, Progress, Writer, array_blocks

__all__ = ["Hdf5Writer", "little_endian"]

# Rows copied per step when the vectors move into the HDF5 file (bounds memory, keeps writes large).
_COPY_BYTES = 64 * 2**20


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
        self.vectors.open(self.stored_rows)

    def _append_vectors(self, vectors: np.ndarray) -> None:
        if len(vectors):
            self.vectors.append(vectors)

    def _sync_vectors(self) -> dict[str, Any]:
        self.vectors.sync()
        return {}

    def _close_vectors(self) -> None:
        self.vectors.close()

    def finalize(self, metadata: dict[str, Any]) -> Path:
        rows = self.stored_rows
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
            declared = self.array_columns()
            for name, data in self.small_arrays().items():
                # Copied a block at a time (a whole copy would stay resident); a step is whole sum blocks.
                dataset = f.create_dataset(name, shape=data.shape, dtype=data.dtype.newbyteorder("<"))
                crc, sums = 0, []
                row_bytes = data.dtype.itemsize * int(np.prod(data.shape[1:], dtype=np.int64))
                spec = declared.get(name)
                rows_per_sum = spec.block_rows if spec is not None else SMALL_BLOCK_ROWS
                if name in OPTIONAL_ARRAYS or (spec is not None and spec.optional):
                    optional[name] = rows_per_sum
                step = max(1, _COPY_BYTES // (row_bytes * rows_per_sum)) * rows_per_sum
                for start, block in array_blocks(data, step):
                    block = little_endian(block)
                    dataset[start : start + len(block)] = block
                    crc = checksum(block, crc)
                    sums.append(block_sums(block, rows_per_sum))
                crcs[name] = crc
                all_sums[block_sums_name(name)] = np.concatenate(sums) if sums else np.empty(0, np.uint32)
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
