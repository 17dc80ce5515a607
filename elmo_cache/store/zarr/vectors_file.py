"""One zarr ``vectors`` file written as its rows arrive, never held whole in memory.

:func:`elmo_cache.store.zarr.write_vectors_file` takes a file's rows as one array: a writer that gets its
rows window by window (a distributed build's part, the driver stitching fragments) would have to gather
up to a whole file, 64 MiB by default, before writing it. :class:`VectorsFileStream` spools the rows to
a temporary file in the build folder instead, summing them as they pass, and at :meth:`finish` turns it
into the same file, byte for byte, that ``write_vectors_file`` writes: for an uncompressed layout by
appending the padding and the shard index (the rows are not read back); for a compressed one zarr must
encode the shard from its rows, so they are read back once, and that layout still holds one file's rows
at its end.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from elmo_cache.store.blocksums import BlockSummer, write_sums_file
from elmo_cache.store.format import BUILD_DIR, checksum
from elmo_cache.store.staging import Layout
from elmo_cache.store.zarr.write import (
    file_geometry,
    publish_file,
    shard_index,
    sums_path,
    vectors_file_path,
    write_vectors_file,
)

__all__ = ["VectorsFileStream"]


class VectorsFileStream:
    """Vectors file ``k`` of an array of ``n_rows`` rows, written by :meth:`write` in row order; ``end``: where
    its rows end when short of the file (a window's last file, see ``write_vectors_file``).

    The spool has a name of its own (two writers of one file, a part redone while a stale worker still
    runs, never share a temporary file); the file appears at its final name whole, after being synced,
    with its block sums beside it, as with ``write_vectors_file``.
    """

    def __init__(self, staging: Path, layout: Layout, n_rows: int, k: int, end: int | None = None):
        self.staging, self.layout, self.n_rows, self.k, self.end = staging, layout, n_rows, k, end
        self.want, self.present = file_geometry(layout, n_rows if end is None else end, k)
        self.rows = 0
        self.crc = 0
        self.summer = BlockSummer(int(layout.chunk_rows or 0) * layout.row_bytes)
        (staging / BUILD_DIR).mkdir(parents=True, exist_ok=True)
        self.path = staging / BUILD_DIR / f"vectors-{k}.{uuid.uuid4().hex}.tmp"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        self._handle: BinaryIO | None = os.fdopen(fd, "wb")

    def write(self, rows: np.ndarray) -> None:
        """Append the next rows (of the layout's row shape; cast to its dtype)."""
        if self._handle is None:
            raise ValueError(f"{self.path}: already finished or closed")
        if tuple(rows.shape[1:]) != tuple(self.layout.row_shape) or self.rows + len(rows) > self.want:
            raise ValueError(
                f"vectors file {self.k} holds {self.want} rows of shape {self.layout.row_shape}; got {rows.shape} "
                f"after {self.rows}"
            )
        data = np.ascontiguousarray(rows, dtype=self.layout.dtype).data.cast("B")
        self._handle.write(data)
        self.crc = checksum(data, self.crc)
        self.summer.update(data)
        self.rows += len(rows)

    def finish(self) -> tuple[int, int]:
        """Publish the file (every row written); returns its ``(size, CRC-32)`` for ``checksums.json``."""
        if self.rows != self.want or self._handle is None:
            raise ValueError(f"vectors file {self.k}: {self.rows} rows written of {self.want}")
        handle, self._handle = self._handle, None
        try:
            if self.layout.compression is not None:
                handle.close()
                return self._encode()
            chunk_bytes = int(self.layout.chunk_rows or 0) * self.layout.row_bytes
            padding = bytes(self.present * chunk_bytes - self.rows * self.layout.row_bytes)
            index = shard_index(self.layout, self.present)
            with handle:
                handle.write(padding)
                handle.write(index)
                handle.flush()
                os.fsync(handle.fileno())
                size = handle.tell()
            if self.end is not None:  # a short file's last block is a whole chunk (see write_vectors_file)
                self.summer.pad_block()
            write_sums_file(sums_path(self.staging, self.k), self.summer.finish())
            publish_file(self.path, vectors_file_path(self.staging, self.layout, self.k))
            return size, checksum(index, checksum(padding, self.crc))
        except BaseException:
            self.close()
            raise

    def _encode(self) -> tuple[int, int]:
        # zarr encodes a compressed shard from all its rows: the one place a whole file is read back.
        rows = np.fromfile(self.path, dtype=self.layout.dtype).reshape(-1, *self.layout.row_shape)
        try:
            return write_vectors_file(self.staging, self.layout, self.n_rows, self.k, rows, end=self.end)
        finally:
            del rows
            self.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Drop an unfinished file (its spool is removed)."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> VectorsFileStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._handle is not None:
            self.close()
