"""The zarr container's :class:`~elmo_cache.store.container.ParallelWriter`: a ``vectors`` shard is a row-file.

Shards are independent files, so workers write the ones whose rows they own, whole
(:class:`~elmo_cache.store.zarr.vectors_file.VectorsFileStream`, the bytes ``write_vectors_file`` writes),
and the driver stitches the shared ones from their fragments through the same stream. The group is
created (:func:`~elmo_cache.store.zarr.write.create_group`) before any part runs and finished
(:func:`~elmo_cache.store.zarr.write.finish_sentences`) as the single writer finishes it, from the same
declared columns (:class:`~elmo_cache.store.staging.SentenceColumns`), so both builds write
the same cache, byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.store.container import PartFiles
from elmo_cache.store.format import BUILD_DIR
from elmo_cache.store.parallel import FRAGMENTS_DIR, RowSink, stitch_files
from elmo_cache.store.staging import Layout, SentenceColumns
from elmo_cache.store.zarr.vectors_file import VectorsFileStream
from elmo_cache.store.zarr.write import create_group, finish_sentences, vectors_file_rows

__all__ = ["ZarrParallelWriter"]


def _opener(
    staging: Path, layout: Layout, n_rows: int, ends: Mapping[int, int] | None
) -> Callable[[int], VectorsFileStream]:
    """Vectors file ``k`` as a stream, ending short where ``ends`` says."""
    ends = dict(ends or {})
    return lambda k: VectorsFileStream(staging, layout, n_rows, k, ends.get(k))


class ZarrParallelWriter:
    """Several workers writing one zarr cache: one row-file per ``vectors`` shard."""

    def file_rows(self, layout: Layout) -> int:
        return vectors_file_rows(layout)

    def create(self, staging: Path, layout: Layout, n_rows: int, metadata: dict[str, Any]) -> None:
        create_group(staging, layout, n_rows, metadata)
        (staging / BUILD_DIR / FRAGMENTS_DIR).mkdir(parents=True, exist_ok=True)

    def part(
        self,
        staging: Path,
        layout: Layout,
        n_rows: int,
        first_row: int,
        end_row: int,
        ends: Mapping[int, int] | None = None,
    ) -> RowSink:
        return RowSink(
            staging, n_rows, vectors_file_rows(layout), first_row, end_row, _opener(staging, layout, n_rows, ends), ends
        )

    def stitch(
        self,
        staging: Path,
        layout: Layout,
        n_rows: int,
        parts: list[PartFiles],
        ends: Mapping[int, int] | None = None,
    ) -> dict[int, tuple[int, int]]:
        opener = _opener(staging, layout, n_rows, ends)
        return stitch_files(staging, layout, n_rows, vectors_file_rows(layout), parts, opener, ends)

    def finish(
        self,
        staging: Path,
        output: Path,
        sentences: SentenceColumns,
        metadata: dict[str, Any],
        sums: dict[int, tuple[int, int]],
        extra: dict[str, np.ndarray] | None = None,
    ) -> Path:
        return finish_sentences(staging, output, sentences, sentences.arrays(extra), metadata, sums)
