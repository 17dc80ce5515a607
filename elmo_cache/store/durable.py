"""Durable files of a build's staging: fsync, atomic replacement, and append-only columns of fixed-size items.

What makes a build survive ``kill -9``: data is flushed and fsync'ed before the record that claims it is
replaced atomically, and an append-only column is cut back to its committed size when it is opened again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from elmo_cache.errors import CacheFormatError

__all__ = ["RawColumn", "atomic_write_json", "fsync_path"]


def fsync_path(path: Path, *, directory: bool = False) -> None:
    """Flush ``path`` (a file, or a directory's entries) to stable storage."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)


class RawColumn:
    """An append-only file of fixed-size items (one per sentence or row)."""

    def __init__(self, path: Path, dtype: str, item_shape: tuple[int, ...] = ()):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.item_shape = item_shape
        self.item_bytes = int(np.prod(item_shape, dtype=np.int64)) * self.dtype.itemsize
        self._file: BinaryIO | None = None

    def _handle(self) -> BinaryIO:
        if self._file is None:
            raise ValueError(f"{self.path}: not open")
        return self._file

    def open(self, committed_items: int) -> None:
        """Open for appending after cutting the file back to ``committed_items``."""
        want = committed_items * self.item_bytes
        if not self.path.exists():
            if want:
                raise CacheFormatError(
                    f"{self.path}: missing, but {committed_items} items were committed (a build begun by an older "
                    "elmo-cache, or a damaged staging folder); rerun with --overwrite"
                )
            self.path.touch()
        size = self.path.stat().st_size
        if size < want:
            raise CacheFormatError(f"{self.path}: {size} bytes on disk but {want} were committed; staging is damaged")
        handle = self._file = open(self.path, "r+b")  # noqa: SIM115 - held open across appends until close()
        handle.truncate(want)
        handle.seek(want)

    def append(self, data: np.ndarray) -> None:
        array = np.ascontiguousarray(data, dtype=self.dtype)
        if array.size:
            self._handle().write(array.data.cast("B"))

    def sync(self) -> None:
        handle = self._handle()
        handle.flush()
        os.fsync(handle.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def read(self, count: int) -> np.ndarray:
        """The first ``count`` items (memory-mapped; a copy is not made)."""
        if count == 0:
            return np.empty((0, *self.item_shape), dtype=self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(count, *self.item_shape))

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Items ``[start, stop)`` read into memory (no map: the pages do not stay in the process)."""
        count = max(0, stop - start)
        data = np.fromfile(
            self.path,
            dtype=self.dtype,
            count=count * max(1, self.item_bytes // self.dtype.itemsize),
            offset=start * self.item_bytes,
        )
        return data.reshape(count, *self.item_shape)
