"""The sentence index of a corpus of any size in bounded memory: sorted runs on disk, merged in blocks.

``index/hashes`` and ``index/rows`` (FORMAT.md) are the sorted distinct sentence hashes and the line of
each one's first occurrence. Sorting every line's hash at once needs ~33 bytes of memory per line (3.3 GB
for 100M lines), so a build whose memory must not grow with its corpus sorts runs of at most
``run_items`` lines, writes each run to disk, and merges the runs in blocks: memory is O(run_items +
runs * block) whatever the corpus. The result is the same arrays, byte for byte, as sorting in memory.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

__all__ = ["RUN_ITEMS", "sort_index", "index_in_memory"]

RUN_ITEMS = 1 << 21
"""Lines sorted in memory at a time (~50 MiB of work space); a corpus with no more is sorted in memory."""

# Items read from each run per refill during the merge: large enough for big sequential reads, small
# enough that a thousand runs (2 billion lines) stay under ~200 MiB of buffers.
_BLOCK_BYTES = 8 * 2**20
_MIN_BLOCK = 8192


def index_in_memory(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct hashes and each one's first line, sorting all of ``hashes`` at once."""
    hashes = np.array(hashes)
    order = np.argsort(hashes, kind="stable")  # stable: ties keep line order, so first = earliest
    ordered = hashes[order]
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    return ordered[first], order[first].astype(np.int64)


class _Run:
    """A sorted run on disk, (hash, line) pairs read back a block at a time."""

    def __init__(self, hashes: Path, lines: Path, size: int, block: int):
        self.paths = (hashes, lines)
        self.size, self.block = size, block
        self.pos = 0
        self.hashes = np.empty(0, dtype=np.uint64)
        self.lines = np.empty(0, dtype=np.int64)

    def refill(self) -> None:
        """Append the next block to what is buffered (nothing once the run is read)."""
        count = min(self.block, self.size - self.pos)
        if count <= 0:
            return
        h = np.fromfile(self.paths[0], dtype=np.uint64, count=count, offset=self.pos * 8)
        n = np.fromfile(self.paths[1], dtype=np.int64, count=count, offset=self.pos * 8)
        self.hashes = np.concatenate([self.hashes, h])
        self.lines = np.concatenate([self.lines, n])
        self.pos += count


def sort_index(
    read: Callable[[int, int], np.ndarray],
    n: int,
    work: Path,
    *,
    run_items: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The index of ``n`` lines whose hashes ``read(start, stop)`` gives, in bounded memory.

    Up to ``run_items`` (default :data:`RUN_ITEMS`) lines the index is sorted in memory. Beyond, runs
    go to ``work`` (created, and emptied first) and the two arrays are written there as ``index-hashes.bin`` and
    ``index-rows.bin`` and returned memory-mapped; ``work`` must outlive them.
    """
    run_items = run_items or RUN_ITEMS
    if n <= run_items:
        return index_in_memory(read(0, n))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    n_runs = -(-n // run_items)
    block = max(_MIN_BLOCK, _BLOCK_BYTES // (16 * n_runs))
    runs = []
    for r, start in enumerate(range(0, n, run_items)):
        stop = min(n, start + run_items)
        hashes = np.ascontiguousarray(read(start, stop), dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        paths = (work / f"run-{r}.hashes", work / f"run-{r}.lines")
        hashes[order].tofile(paths[0])
        (order.astype(np.int64) + start).tofile(paths[1])
        del hashes, order
        runs.append(_Run(*paths, stop - start, block))
    out_hashes, out_rows = work / "index-hashes.bin", work / "index-rows.bin"
    written = 0
    last: int | None = None  # the last hash written: a repeat in a later block is not a first
    with open(out_hashes, "wb") as fh, open(out_rows, "wb") as fr:
        while True:
            for run in runs:
                if not len(run.hashes):
                    run.refill()
            live = [run for run in runs if len(run.hashes)]
            if not live:
                break
            # Every pair up to the smallest buffered maximum is buffered, so the pairs up to it can be
            # sorted and written now. A run whose buffer ends at that hash may hold more of it, but on
            # later lines than those buffered (runs are sorted by hash, then line): not first occurrences.
            bound = min(run.hashes[-1] for run in live)
            hashes_parts, lines_parts = [], []
            for run in live:  # in run order, that is line order, so a stable sort keeps ties by line
                cut = int(np.searchsorted(run.hashes, bound, side="right"))
                hashes_parts.append(run.hashes[:cut])
                lines_parts.append(run.lines[:cut])
                run.hashes, run.lines = run.hashes[cut:], run.lines[cut:]
            merged = np.concatenate(hashes_parts)
            order = np.argsort(merged, kind="stable")
            merged, lines = merged[order], np.concatenate(lines_parts)[order]
            first = np.ones(len(merged), dtype=bool)
            first[1:] = merged[1:] != merged[:-1]
            if last is not None and len(merged):
                first[0] = merged[0] != last
            if len(merged):
                last = int(merged[-1])
            merged[first].tofile(fh)
            lines[first].tofile(fr)
            written += int(first.sum())
        for handle in (fh, fr):
            handle.flush()
            os.fsync(handle.fileno())
    for run in runs:
        for path in run.paths:
            path.unlink()
    if not written:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    return (
        np.memmap(out_hashes, dtype=np.uint64, mode="r", shape=(written,)),
        np.memmap(out_rows, dtype=np.int64, mode="r", shape=(written,)),
    )
