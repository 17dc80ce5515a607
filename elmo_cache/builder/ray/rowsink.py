"""Where a distributed build's part puts its rows: streamed to disk as they are encoded.

A part owns the vectors files whose rows all lie in its range and writes them whole; rows of a file
shared with a neighbouring part go to a fragment file that the driver stitches in at the end. Rows go
to disk window by window (:class:`~elmo_cache.store.zarr.vectors_file.VectorsFileStream`, a fragment's own
spool): a worker used to gather a whole vectors file in memory first, 256 MiB by default, which put a
file's worth of rows on top of the encoder in every worker once the corpus filled a file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from elmo_cache.errors import ElmoCacheError
from elmo_cache.store import Layout, vectors_file_rows
from elmo_cache.store.format import BUILD_DIR
from elmo_cache.store.zarr.vectors_file import VectorsFileStream

__all__ = ["FRAGMENTS_DIR", "FragmentStream", "RowSink", "file_range", "fragment_path"]

FRAGMENTS_DIR = "fragments"


def file_range(k: int, file_rows: int, n_rows: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of vectors file ``k``."""
    return k * file_rows, min((k + 1) * file_rows, n_rows)


def fragment_path(staging: Path, k: int, first_row: int) -> Path:
    return staging / BUILD_DIR / FRAGMENTS_DIR / f"{k}-{first_row}.bin"


class FragmentStream:
    """Raw rows written to ``path`` through a per-process temporary name, renamed there once synced: a
    part still running in an actor of a killed driver must not write into the same file as its redo."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        self._handle: BinaryIO | None = open(self.tmp, "wb")  # noqa: SIM115 - closed by finish() or close()

    def write(self, rows: np.ndarray) -> None:
        assert self._handle is not None
        self._handle.write(np.ascontiguousarray(rows).data.cast("B"))

    def finish(self) -> None:
        assert self._handle is not None
        handle, self._handle = self._handle, None
        with handle:
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(self.tmp, self.path)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            self.tmp.unlink(missing_ok=True)


class RowSink:
    """Takes a part's rows in order; writes each vectors file it owns whole, and the rest as fragments."""

    def __init__(self, staging: Path, layout: Layout, n_rows: int, first_row: int, end_row: int):
        self.staging = staging
        self.layout = layout
        self.n_rows = n_rows
        self.file_rows = vectors_file_rows(layout)
        self.first, self.end = first_row, end_row
        self.pos = first_row
        self.stream: VectorsFileStream | FragmentStream | None = None
        self.files: dict[int, tuple[int, int]] = {}  # file -> (size, crc32)
        self.fragments: list[tuple[int, int, int]] = []  # (file, first row, end row)

    def _span(self, k: int) -> tuple[int, int]:
        start, stop = file_range(k, self.file_rows, self.n_rows)
        return max(start, self.first), min(stop, self.end)

    def add(self, vectors: np.ndarray) -> None:
        i = 0
        while i < len(vectors):
            k = self.pos // self.file_rows
            lo, hi = self._span(k)
            if self.stream is None:
                whole = (lo, hi) == file_range(k, self.file_rows, self.n_rows)
                self.stream = (
                    VectorsFileStream(self.staging, self.layout, self.n_rows, k)
                    if whole
                    else FragmentStream(fragment_path(self.staging, k, lo))
                )
            take = min(hi - self.pos, len(vectors) - i)
            self.stream.write(vectors[i : i + take])
            self.pos += take
            i += take
            if self.pos == hi:
                self._finish(k, lo, hi)

    def _finish(self, k: int, lo: int, hi: int) -> None:
        stream, self.stream = self.stream, None
        if isinstance(stream, VectorsFileStream):
            self.files[k] = stream.finish()
        else:
            assert stream is not None
            stream.finish()
            self.fragments.append((k, lo, hi))

    def close(self) -> None:
        if self.stream is not None:  # a part that failed midway: its spool goes
            self.stream.close()
            self.stream = None
        if self.pos != self.end:
            raise ElmoCacheError(
                f"a part of {self.staging} ended at row {self.pos}, not {self.end}; the plan is damaged"
            )

    def __enter__(self) -> RowSink:
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
