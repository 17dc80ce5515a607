"""What every container's :class:`~elmo_cache.store.container.ParallelWriter` shares, whatever its files look like.

A parallel build cuts ``vectors`` into row-files (:meth:`ParallelWriter.file_rows` rows each). A part's
:class:`RowSink` streams the rows of each file it owns whole into the container's own file stream, and the
rows of a file it shares with a neighbour into a *fragment* (raw rows under ``.build/fragments/``);
:func:`stitch_files` later streams each shared file's fragments, in row order, into the same kind of stream.
:meth:`ParallelWriter.finish` derives the per-sentence arrays as the single writer does, through
:class:`~elmo_cache.store.staging.SentenceColumns`.

Nothing here knows how a container lays a row-file: that is the ``open_file`` stream it passes in.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from elmo_cache.errors import CacheFormatError, ElmoCacheError
from elmo_cache.store.container import PartFiles
from elmo_cache.store.durable import fsync_path
from elmo_cache.store.format import BUILD_DIR
from elmo_cache.store.staging import Layout

__all__ = [
    "FRAGMENTS_DIR",
    "FileStream",
    "FragmentStream",
    "RowSink",
    "copy_rows",
    "file_range",
    "fragment_path",
    "stitch_files",
]

FRAGMENTS_DIR = "fragments"
"""Folder of the staging's build folder holding the parts' fragments."""

# Bytes of rows read at a time when a fragment is copied into its file.
_COPY_BYTES = 16 * 2**20


class FileStream(Protocol):
    """One row-file of a container written as its rows arrive (as zarr's ``VectorsFileStream``)."""

    def write(self, rows: np.ndarray) -> None: ...

    def finish(self) -> tuple[int, int]:
        """Publish the whole file; its ``(size, CRC-32)``."""
        ...

    def close(self) -> None:
        """Drop an unfinished file."""
        ...


def file_range(k: int, file_rows: int, n_rows: int, ends: Mapping[int, int] | None = None) -> tuple[int, int]:
    """Rows ``[start, stop)`` of row-file ``k``; ``ends``: the files whose rows end short, by the row they end at
    (:func:`short_files`)."""
    stop = ends.get(k) if ends else None
    return k * file_rows, min((k + 1) * file_rows, n_rows) if stop is None else stop


def short_files(windows: np.ndarray, file_rows: int) -> dict[int, int]:
    """The row-files whose rows end short of the file, by the row they end at: each window's last but the array's
    (windows as rows of ``(first_line, lines, first_row, rows)``, each window's rows starting a file of its own:
    ``Layout.window_rows``)."""
    stored = windows[windows[:, 3] > 0] if len(windows) else windows
    ends = (stored[:-1, 2] + stored[:-1, 3]).tolist() if len(stored) else []
    return {(end - 1) // file_rows: int(end) for end in ends if end % file_rows}


def fragment_path(staging: Path, k: int, first_row: int) -> Path:
    """Where the fragment of row-file ``k`` starting at row ``first_row`` is kept."""
    return staging / BUILD_DIR / FRAGMENTS_DIR / f"{k}-{first_row}.bin"


class FragmentStream:
    """Raw rows written to ``path`` through a per-process temporary name, renamed there once synced: a
    part still running in an actor of a killed driver must not write into the same file as its redo."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        self._handle: BinaryIO | None = open(self.tmp, "wb")  # noqa: SIM115 - closed by finish() or close()

    def write(self, rows: np.ndarray) -> None:
        """Append rows, as their raw bytes."""
        assert self._handle is not None
        self._handle.write(np.ascontiguousarray(rows).data.cast("B"))

    def finish(self) -> None:
        """Sync the rows and move them to their final name."""
        assert self._handle is not None
        handle, self._handle = self._handle, None
        with handle:
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(self.tmp, self.path)

    def close(self) -> None:
        """Drop an unfinished fragment."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            self.tmp.unlink(missing_ok=True)


class RowSink:
    """A :class:`~elmo_cache.store.container.PartSink`: takes a part's rows in order; writes each row-file it
    owns whole through ``open_file(k)``, and the rows of the others as fragments."""

    def __init__(
        self,
        staging: Path,
        n_rows: int,
        file_rows: int,
        first_row: int,
        end_row: int,
        open_file: Callable[[int], FileStream],
        ends: Mapping[int, int] | None = None,
    ):
        self.staging = staging
        self.n_rows = n_rows
        self.file_rows = file_rows
        self.ends = dict(ends or {})
        self.open_file = open_file
        self.first, self.end = first_row, end_row
        self.pos = first_row
        self.stream: FileStream | FragmentStream | None = None
        self.files: dict[int, tuple[int, int]] = {}  # file -> (size, crc32)
        self.fragments: list[tuple[int, int, int]] = []  # (file, first row, end row)

    def _span(self, k: int) -> tuple[int, int]:
        start, stop = file_range(k, self.file_rows, self.n_rows, self.ends)
        return max(start, self.first), min(stop, self.end)

    def add(self, rows: np.ndarray, first_row: int | None = None) -> None:
        """Append the part's next rows; ``first_row``: the row they start at, past the rows before when those end
        a file short (a window's rows start a file of their own)."""
        if first_row is not None and first_row != self.pos and len(rows):
            if self.stream is not None or first_row % self.file_rows or first_row < self.pos:
                raise ElmoCacheError(
                    f"a part of {self.staging} was given rows from {first_row} after row {self.pos}: only a file's "
                    "start may follow a file that ends short; the plan is damaged"
                )
            self.pos = first_row
        i = 0
        while i < len(rows):
            k = self.pos // self.file_rows
            lo, hi = self._span(k)
            if self.stream is None:
                whole = (lo, hi) == file_range(k, self.file_rows, self.n_rows, self.ends)
                self.stream = self.open_file(k) if whole else FragmentStream(fragment_path(self.staging, k, lo))
            take = min(hi - self.pos, len(rows) - i)
            self.stream.write(rows[i : i + take])
            self.pos += take
            i += take
            if self.pos == hi:
                self._finish(k, lo, hi)

    def _finish(self, k: int, lo: int, hi: int) -> None:
        stream, self.stream = self.stream, None
        if isinstance(stream, FragmentStream):
            stream.finish()
            self.fragments.append((k, lo, hi))
        else:
            assert stream is not None
            self.files[k] = stream.finish()

    def finish(self) -> PartFiles:
        """Check that every row of the part came and make the fragments' names durable; what was written."""
        self.close()
        if self.pos != self.end:
            raise ElmoCacheError(
                f"a part of {self.staging} ended at row {self.pos}, not {self.end}; the plan is damaged"
            )
        fsync_path(self.staging / BUILD_DIR / FRAGMENTS_DIR, directory=True)
        return PartFiles(dict(self.files), tuple(self.fragments))

    def close(self) -> None:
        """Drop the file being written, if any (a part that failed midway: its spool goes)."""
        if self.stream is not None:
            self.stream.close()
            self.stream = None

    def __enter__(self) -> RowSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def copy_rows(source: Path, count: int, layout: Layout, sink: Any) -> None:
    """``sink.write`` the ``count`` rows of the raw file ``source``, a block at a time (read, not mapped)."""
    step = max(1, _COPY_BYTES // layout.row_bytes)
    per_row = layout.row_bytes // np.dtype(layout.dtype).itemsize
    for start in range(0, count, step):
        take = min(step, count - start)
        rows = np.fromfile(source, dtype=layout.dtype, count=take * per_row, offset=start * layout.row_bytes)
        if len(rows) != take * per_row:
            raise OSError(f"{source}: shorter than its {count} rows")
        sink.write(rows.reshape(take, *layout.row_shape))


def stitch_files(
    staging: Path,
    layout: Layout,
    n_rows: int,
    file_rows: int,
    parts: list[PartFiles],
    open_file: Callable[[int], FileStream],
    ends: Mapping[int, int] | None = None,
) -> dict[int, tuple[int, int]]:
    """Write every row-file shared by parts from its fragments through ``open_file(k)``; every row-file's
    ``(size, CRC-32)`` by number (:meth:`ParallelWriter.stitch`)."""
    sums: dict[int, tuple[int, int]] = {}
    fragments: dict[int, list[tuple[int, int]]] = {}
    for part in parts:
        sums.update(part.files)
        for k, lo, hi in part.fragments:
            fragments.setdefault(k, []).append((lo, hi))
    for k, pieces in sorted(fragments.items()):
        start, stop = file_range(k, file_rows, n_rows, ends)
        pieces.sort()
        if pieces[0][0] != start or pieces[-1][1] != stop or any(a[1] != b[0] for a, b in itertools.pairwise(pieces)):
            raise CacheFormatError(
                f"{staging}: the fragments of vectors file {k} ({pieces}) do not cover rows {start}-{stop}; "
                "rerun with --overwrite"
            )
        # Streamed fragment by fragment: gathered in memory, a shared file (up to 256 MiB) sat in the driver.
        stream = open_file(k)
        try:
            for lo, hi in pieces:
                copy_rows(fragment_path(staging, k, lo), hi - lo, layout, stream)
            sums[k] = stream.finish()
        except BaseException:
            stream.close()
            raise
    n_files = -(-n_rows // file_rows)
    missing = sorted(set(range(n_files)) - set(sums))
    if missing:
        raise CacheFormatError(
            f"{staging}: vectors files {missing[:10]} were written by no part; rerun with --overwrite"
        )
    return sums
