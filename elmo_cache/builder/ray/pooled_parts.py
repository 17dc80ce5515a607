"""The ray engine's pooled vectors (``--pool``): each part writes its sentences' pooled rows to a file of its
own, and the driver joins the parts' files in line order into the cache's ``pooled`` array.

A part's file is written under a temporary name of its own and renamed into place once synced, before the
part's marker: a part with a marker always has its whole file, and a part redone (or a stale worker of a
killed driver) replaces it whole. The joined rows are those the local engine stages, so both engines give
the same ``pooled`` bytes (repeats get their copies afterwards, from the same offsets, in the store).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store.durable import fsync_path
from elmo_cache.store.format import BUILD_DIR

__all__ = ["POOLED_DIR", "PooledPart", "join_pooled", "part_lines", "pooled_part_path"]

POOLED_DIR = "pooled"
"""Folder of the staging's build folder holding each part's pooled rows."""

# Bytes copied at a time when the parts' files are joined.
_COPY_BYTES = 16 * 2**20


def pooled_part_path(staging: Path, index: int) -> Path:
    """Where part ``index`` keeps the pooled rows of its sentences."""
    return staging / BUILD_DIR / POOLED_DIR / f"{index}.bin"


class PooledPart:
    """The pooled rows of one part, appended window by window and published whole by :meth:`close`."""

    def __init__(self, staging: Path, index: int):
        self.final = pooled_part_path(staging, index)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.final.with_name(f"{index}.{uuid.uuid4().hex}.tmp")
        self._handle: BinaryIO | None = open(self.tmp, "wb")  # noqa: SIM115 - held across windows until close()

    def add(self, pooled: np.ndarray) -> None:
        assert self._handle is not None
        self._handle.write(np.ascontiguousarray(pooled).data.cast("B"))

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(self.tmp, self.final)
        fsync_path(self.final.parent, directory=True)


def join_pooled(staging: Path, parts: list[tuple[int, int]], item_bytes: int, dest: Path) -> None:
    """Concatenate the parts' files into ``dest``, in the order given: ``(part index, its lines)``."""
    with open(dest, "wb") as out:
        for index, lines in parts:
            path = pooled_part_path(staging, index)
            want = lines * item_bytes
            size = path.stat().st_size if path.is_file() else -1
            if size != want:
                raise CacheFormatError(
                    f"{path}: the pooled vectors of part {index} are missing or not {want} bytes ({size}); "
                    "rerun with --overwrite"
                )
            with open(path, "rb") as source:
                while piece := source.read(_COPY_BYTES):
                    out.write(piece)
        out.flush()
        os.fsync(out.fileno())


def part_lines(windows: Any, first_window: int, end_window: int) -> int:
    """Lines of windows ``[first_window, end_window)`` (rows of the first pass's ``(first_line, lines, ...)``)."""
    return int(np.asarray(windows[first_window:end_window, 1]).sum(dtype=np.int64))
