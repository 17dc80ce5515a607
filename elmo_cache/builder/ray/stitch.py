"""The ray engine's finish, in the driver: the parts' markers read, the shared row-files stitched and the cache
finished by the container's :class:`~elmo_cache.store.container.ParallelWriter`, from the per-sentence arrays
of the first pass (and, with ``--pool``, the parts' pooled rows joined in line order)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.builder.firstpass import FirstPass
from elmo_cache.builder.ray.parts import PartSpec, marker_path
from elmo_cache.builder.ray.pooled_parts import join_pooled, part_lines
from elmo_cache.store.container import ParallelWriter, PartFiles
from elmo_cache.store.format import BUILD_DIR
from elmo_cache.store.parallel import sentence_arrays
from elmo_cache.store.staging import Layout

__all__ = ["stitch", "publish"]


def stitch(
    writer: ParallelWriter, staging: Path, layout: Layout, first: FirstPass, specs: list[PartSpec]
) -> dict[int, tuple[int, int]]:
    """Stitch the row-files the parts shared from the fragments their markers name; every file's (size, CRC-32)."""
    parts = [
        PartFiles.from_json(json.loads(marker_path(staging, spec.index).read_text(encoding="utf-8"))) for spec in specs
    ]
    return writer.stitch(staging, layout, first.n_rows, parts)


def publish(
    writer: ParallelWriter,
    staging: Path,
    output: Path,
    first: FirstPass,
    sums: dict[int, tuple[int, int]],
    meta_of: Callable[[int], dict[str, Any]],
    layout: Layout,
    specs: list[PartSpec],
    extra: dict[str, np.ndarray] | None = None,
) -> tuple[Path, int]:
    """Write the index and the other per-sentence arrays (with --pool, the parts' pooled rows joined; ``extra``:
    optional arrays such as a pq cache's codebooks), then the metadata ``meta_of(n_unique)`` last, and publish
    the staging at ``output``; returns the cache's path and its distinct sentences."""
    pooled = None
    if layout.pooled_shape is not None:
        dtype = np.dtype(layout.pooled_dtype or layout.dtype)
        joined = staging / BUILD_DIR / "pooled.bin"
        parts = [(s.index, part_lines(first.windows, s.first_window, s.end_window)) for s in specs]
        join_pooled(staging, parts, dtype.itemsize * math.prod(layout.pooled_shape), joined)
        pooled = (joined, dtype, tuple(layout.pooled_shape))
    arrays = sentence_arrays(
        staging / BUILD_DIR,
        first.n_lines,
        first.offsets,
        first.lengths,
        lambda a, b: first.hashes[a:b],
        first.text,
        first.directory / "text_ends.bin",
        pooled,
        extra,
    )
    n_unique = len(arrays["index/hashes"])
    return writer.finish(staging, output, arrays, meta_of(n_unique), sums), n_unique
