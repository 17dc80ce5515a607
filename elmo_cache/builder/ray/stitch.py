"""The ray engine's finish, in the driver: the shared vectors files stitched from their fragments, the
small arrays and checksums written, ``complete: true`` last, the staging renamed to the output."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.builder.firstpass import FirstPass
from elmo_cache.builder.ray.parts import PartSpec, marker_path
from elmo_cache.builder.ray.pooled_parts import join_pooled, part_lines
from elmo_cache.builder.ray.rowsink import file_range, fragment_path
from elmo_cache.errors import CacheFormatError
from elmo_cache.store import Layout, finish_group, vectors_file_rows
from elmo_cache.store.format import BUILD_DIR, POOLED_ARRAY
from elmo_cache.store.pooled import pooled_column
from elmo_cache.store.sentence_index import sort_index
from elmo_cache.store.staging import offsets_after_zero
from elmo_cache.store.zarr.vectors_file import VectorsFileStream, copy_rows

__all__ = ["stitch", "publish"]


def stitch(staging: Path, layout: Layout, first: FirstPass, specs: list[PartSpec]) -> dict[int, tuple[int, int]]:
    """Stitch the vectors files the parts shared from their fragments; every file's (size, CRC-32) by number."""
    file_rows = vectors_file_rows(layout)
    sums: dict[int, tuple[int, int]] = {}
    fragments: dict[int, list[tuple[int, int]]] = {}
    for spec in specs:
        marker = json.loads(marker_path(staging, spec.index).read_text(encoding="utf-8"))
        sums.update({int(k): (int(v[0]), int(v[1])) for k, v in marker["files"].items()})
        for k, lo, hi in marker["fragments"]:
            fragments.setdefault(int(k), []).append((int(lo), int(hi)))
    for k, pieces in sorted(fragments.items()):
        start, stop = file_range(k, file_rows, first.n_rows)
        pieces.sort()
        if pieces[0][0] != start or pieces[-1][1] != stop or any(a[1] != b[0] for a, b in itertools.pairwise(pieces)):
            raise CacheFormatError(
                f"{staging}: the fragments of vectors file {k} ({pieces}) do not cover rows {start}-{stop}; "
                "rerun with --overwrite"
            )
        # Streamed fragment by fragment: gathered in memory, a shared file (up to 256 MiB) sat in the driver.
        with VectorsFileStream(staging, layout, first.n_rows, k) as stream:
            for lo, hi in pieces:
                copy_rows(fragment_path(staging, k, lo), hi - lo, layout, stream)
            sums[k] = stream.finish()
    n_files = -(-first.n_rows // file_rows)
    missing = sorted(set(range(n_files)) - set(sums))
    if missing:
        raise CacheFormatError(
            f"{staging}: vectors files {missing[:10]} were written by no part; rerun with --overwrite"
        )
    return sums


def publish(
    staging: Path,
    output: Path,
    first: FirstPass,
    sums: dict[int, tuple[int, int]],
    meta_of: Callable[[int], dict[str, Any]],
    layout: Layout,
    specs: list[PartSpec],
    extra: dict[str, np.ndarray] | None = None,
) -> tuple[Path, int]:
    """Write the index and the other small arrays (with --pool, the parts' pooled rows joined; ``extra``:
    optional arrays such as a pq cache's codebooks), then the metadata ``meta_of(n_unique)`` last, and rename
    the staging to ``output``; returns the cache's path and its distinct sentences."""
    hashes, lines = sort_index(lambda a, b: first.hashes[a:b], first.n_lines, staging / BUILD_DIR / "index")
    starts = offsets_after_zero(first.directory / "text_ends.bin", first.n_lines, staging / BUILD_DIR / "offsets.bin")
    small = {
        "offsets": first.offsets,
        "lengths": first.lengths,
        "index/hashes": hashes,
        "index/rows": lines,
        "tokens/bytes": first.text,
        "tokens/offsets": starts,
        **(extra or {}),
    }
    if layout.pooled_shape is not None:
        dtype = np.dtype(layout.pooled_dtype or layout.dtype)
        joined = staging / BUILD_DIR / "pooled.bin"
        parts = [(s.index, part_lines(first.windows, s.first_window, s.end_window)) for s in specs]
        join_pooled(staging, parts, dtype.itemsize * math.prod(layout.pooled_shape), joined)
        shape = layout.pooled_shape
        small[POOLED_ARRAY] = pooled_column(joined, dtype, shape, first.n_lines, first.offsets, first.lengths)
    return finish_group(staging, output, small, meta_of(len(hashes)), sums), len(hashes)
