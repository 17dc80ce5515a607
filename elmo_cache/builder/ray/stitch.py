"""The ray engine's finish, in the driver: the parts' markers read, the shared row-files stitched and the cache
finished by the container's :class:`~elmo_cache.store.container.ParallelWriter`, from the layout's declared
per-sentence columns: the first pass's files, and the parts' values of the others joined in line order."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.builder.corpus_record import corpus_entry
from elmo_cache.builder.firstpass import PLANNED_COLUMNS, FirstPass
from elmo_cache.builder.ray.columns import join_column, part_lines
from elmo_cache.builder.ray.parts import PartSpec, marker_path
from elmo_cache.store.container import ParallelWriter, PartFiles
from elmo_cache.store.durable import RawColumn
from elmo_cache.store.format import BUILD_DIR
from elmo_cache.store.staging import Layout, SentenceColumns, staged_column

__all__ = ["stitch", "publish", "sentence_columns"]


def stitch(
    writer: ParallelWriter,
    staging: Path,
    layout: Layout,
    n_rows: int,
    specs: list[PartSpec],
    ends: dict[int, int] | None = None,
) -> dict[int, tuple[int, int]]:
    """Stitch the row-files the parts shared from the fragments their markers name; every file's (size, CRC-32).
    ``n_rows``: the rows of ``vectors`` (0 for a layout without token rows: no file to stitch); ``ends``: the files
    whose rows end short (``PartJob.ends``)."""
    parts = [
        PartFiles.from_json(json.loads(marker_path(staging, spec.index).read_text(encoding="utf-8"))) for spec in specs
    ]
    return writer.stitch(staging, layout, n_rows, parts, ends)


def sentence_columns(staging: Path, layout: Layout, first: FirstPass, specs: list[PartSpec]) -> SentenceColumns:
    """Every declared per-sentence column's values: the first pass's files for those it holds, and for the others
    the parts' files joined in line order into the column's staging file (written afresh: a finish redone after a
    crash joins them again)."""
    build = staging / BUILD_DIR
    lines = [(s.index, part_lines(first.windows, s.first_window, s.end_window)) for s in specs]
    files: dict[str, RawColumn] = {}
    for spec in layout.sentence_columns:
        if spec.name in PLANNED_COLUMNS:
            files[spec.name] = first.column(spec)
        else:
            files[spec.name] = join_column(staging, spec, lines, staged_column(build, spec))
    return SentenceColumns(layout.sentence_columns, files, first.n_lines, build)


def publish(
    writer: ParallelWriter,
    staging: Path,
    output: Path,
    first: FirstPass,
    sums: dict[int, tuple[int, int]],
    meta_of: Callable[[int, dict[str, Any]], dict[str, Any]],
    layout: Layout,
    specs: list[PartSpec],
    extra: dict[str, np.ndarray] | None = None,
) -> tuple[Path, int]:
    """Write the index and the other per-sentence arrays (``extra``: optional arrays such as a pq cache's
    codebooks), then the metadata ``meta_of(n_unique, corpus)`` (``corpus``: the record of the lines it was built
    from) last, and publish the staging at ``output``; returns the cache's path and its distinct sentences."""
    sentences = sentence_columns(staging, layout, first, specs)
    n_unique = len(sentences.index()[0])
    corpus = corpus_entry(sentences.read_keys, sentences.lines)
    return writer.finish(staging, output, sentences, meta_of(n_unique, corpus), sums, extra), n_unique
