"""The ray engine's declared per-sentence columns beyond the first pass's: each part writes, for each column the
layout declares (:attr:`Layout.sentence_columns <elmo_cache.store.staging.Layout>`) that the first pass does not
hold (:data:`~elmo_cache.builder.firstpass.PLANNED_COLUMNS`), its sentences' values to a file of its own; the
driver joins the parts' files in line order into the column's staging file, as the local writer stages it
(:func:`~elmo_cache.store.staging.staged_column`), and the container finishes the cache from them as the single
writer does (:class:`~elmo_cache.store.staging.SentenceColumns`). Today that is ``--pool``'s ``pooled``.

A part's file is written under a temporary name of its own and renamed into place once synced, before the
part's marker: a part with a marker always has its whole file, and a part redone (or a stale worker of a
killed driver) replaces it whole. The joined values are those the local engine stages, so both engines give
the same bytes (a column that ``copies_repeats`` gets its repeats' copies at the finish, from the same offsets).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from elmo_cache.builder.firstpass import PLANNED_COLUMNS
from elmo_cache.errors import CacheFormatError, ElmoCacheError
from elmo_cache.store.columns import Column
from elmo_cache.store.durable import RawColumn, fsync_path
from elmo_cache.store.format import BUILD_DIR
from elmo_cache.store.staging import Layout

__all__ = ["COLUMNS_DIR", "PartColumns", "join_column", "part_column_path", "part_columns", "part_lines"]

COLUMNS_DIR = "columns"
"""Folder of the staging's build folder holding each part's values of each column, one folder per column."""

# Bytes copied at a time when the parts' files are joined.
_COPY_BYTES = 16 * 2**20


def part_columns(layout: Layout) -> tuple[Column, ...]:
    """The declared columns whose values the parts write: every one the first pass does not hold."""
    return tuple(spec for spec in layout.sentence_columns if spec.name not in PLANNED_COLUMNS)


def part_column_path(staging: Path, name: str, index: int) -> Path:
    """Where part ``index`` keeps its sentences' values of column ``name``."""
    return staging / BUILD_DIR / COLUMNS_DIR / name.replace("/", "_") / f"{index}.bin"


class PartColumns:
    """One part's values of the columns ``specs``, appended window by window and published whole by :meth:`finish`."""

    def __init__(self, staging: Path, index: int, specs: tuple[Column, ...]):
        # A variable-size column's values cannot be cut back to a part's lines without its sizes: the first pass
        # holds the only one (the text).
        sized = [spec.name for spec in specs if spec.sized_by is not None]
        if sized:
            raise ElmoCacheError(f"the ray engine's parts write fixed-size columns only, not {sized}")
        self.specs = specs
        self._files: dict[str, tuple[Path, Path, BinaryIO]] = {}
        try:
            for spec in specs:
                final = part_column_path(staging, spec.name, index)
                final.parent.mkdir(parents=True, exist_ok=True)
                tmp = final.with_name(f"{index}.{uuid.uuid4().hex}.tmp")
                self._files[spec.name] = (final, tmp, open(tmp, "wb"))  # noqa: SIM115 - held until finish() or close()
        except BaseException:
            self.close()
            raise

    def add(self, values: Mapping[str, np.ndarray], lines: int) -> None:
        """Append the values of the part's next ``lines`` sentences: one array per declared column, by name."""
        for spec in self.specs:
            data = values.get(spec.name)
            if data is None or len(data) != lines:
                raise ElmoCacheError(
                    f"the layout declares column {spec.name!r}, but the encoding gave no value for each sentence"
                )
            self._files[spec.name][2].write(np.ascontiguousarray(data, dtype=spec.dtype).data.cast("B"))

    def finish(self) -> None:
        """Sync every file and move it to its final name (before the part's marker is written)."""
        files, self._files = self._files, {}
        for final, tmp, handle in files.values():
            with handle:
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, final)
            fsync_path(final.parent, directory=True)

    def close(self) -> None:
        """Drop the files of a part that did not finish."""
        files, self._files = self._files, {}
        for _, tmp, handle in files.values():
            handle.close()
            tmp.unlink(missing_ok=True)

    def __enter__(self) -> PartColumns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def join_column(staging: Path, spec: Column, parts: list[tuple[int, int]], dest: RawColumn) -> RawColumn:
    """Write ``dest`` afresh: the parts' values of column ``spec`` in the order given (``(part index, its lines)``);
    returns it, closed and synced."""
    per_part = RawColumn(Path(), spec.dtype, spec.row_shape)
    step = max(1, _COPY_BYTES // max(1, spec.row_bytes))
    dest.open(0)
    try:
        for index, lines in parts:
            path = part_column_path(staging, spec.name, index)
            want = lines * spec.row_bytes
            size = path.stat().st_size if path.is_file() else -1
            if size != want:
                raise CacheFormatError(
                    f"{path}: the {spec.name} values of part {index} are missing or not {want} bytes ({size}); "
                    "rerun with --overwrite"
                )
            per_part.path = path
            for start in range(0, lines, step):
                dest.append(per_part.read_range(start, min(lines, start + step)))
        dest.sync()
    finally:
        dest.close()
    return dest


def part_lines(windows: Any, first_window: int, end_window: int) -> int:
    """Lines of windows ``[first_window, end_window)`` (rows of the first pass's ``(first_line, lines, ...)``)."""
    return int(np.asarray(windows[first_window:end_window, 1]).sum(dtype=np.int64))
