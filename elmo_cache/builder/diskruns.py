"""Sorted runs of first occurrences on disk, for a dedupe whose memory does not grow with the corpus.

A run is one file of fixed-size records (hash, offset, length, check hash) sorted by hash, all hashes
distinct (dedupe adds a hash once). Memory per run is a sparse index: every :data:`STRIDE`-th hash
(8 bytes per 256 records). A lookup reads, with ``pread`` (no map, so nothing stays resident), the
one block of records where each asked hash can be.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

__all__ = ["RECORD", "STRIDE", "DiskRun", "write_run", "merge_runs"]

RECORD = np.dtype([("hash", "<u8"), ("offset", "<i8"), ("length", "<i4"), ("check", "<u8")])
"""One first occurrence (28 bytes, packed)."""

STRIDE = 256
"""Records per block: one pread of 7 KiB per distinct block asked for, 8 bytes of index per block."""

# Hashes looked up together (their blocks: up to 28 MiB).
_LOOKUP_CHUNK = 4096
# Records per read while merging two runs.
_MERGE_BLOCK = 1 << 18


class DiskRun:
    """A sorted run file, searched through its sparse index."""

    def __init__(self, path: Path, size: int):
        self.path, self.size = path, size
        self._fd = os.open(path, os.O_RDONLY)
        # The first hash of each block, read once.
        self.index = np.empty(-(-size // STRIDE), dtype=np.uint64)
        for b in range(0, len(self.index), _MERGE_BLOCK // STRIDE):
            records = self.read(b * STRIDE, min(size, (b + _MERGE_BLOCK // STRIDE) * STRIDE))
            self.index[b : b + -(-len(records) // STRIDE)] = records["hash"][::STRIDE]

    def read(self, start: int, stop: int) -> np.ndarray:
        want = (stop - start) * RECORD.itemsize
        data = os.pread(self._fd, want, start * RECORD.itemsize)
        if len(data) != want:
            raise OSError(f"{self.path}: short read ({len(data)} of {want} bytes)")
        return np.frombuffer(data, dtype=RECORD)

    def lookup(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(found, records)``: whether each hash is in the run, and its record where it is."""
        found = np.zeros(len(hashes), dtype=bool)
        records = np.zeros(len(hashes), dtype=RECORD)
        if not self.size or not len(hashes):
            return found, records
        blocks = np.searchsorted(self.index, hashes, side="right") - 1
        # A chunk of asked hashes at a time bounds the blocks held (each 7 KiB) whatever the window.
        for start in range(0, len(hashes), _LOOKUP_CHUNK):
            ask = start + np.flatnonzero(blocks[start : start + _LOOKUP_CHUNK] >= 0)
            if not len(ask):
                continue
            wanted, row = np.unique(blocks[ask], return_inverse=True)
            size = RECORD.itemsize * STRIDE
            raw = b"".join(os.pread(self._fd, size, b * size) for b in wanted.tolist())
            table = np.frombuffer(raw + bytes(len(wanted) * size - len(raw)), dtype=RECORD).reshape(-1, STRIDE)
            valid = np.minimum(STRIDE, self.size - wanted * STRIDE)[row]  # the last block may be short
            keys = table["hash"][row]  # (asked, STRIDE)
            asked = hashes[ask]
            below = (keys < asked[:, None]) & (np.arange(STRIDE) < valid[:, None])  # not the padding
            pos = np.minimum(below.sum(axis=1), STRIDE - 1)
            hit = (keys[np.arange(len(ask)), pos] == asked) & (pos < valid)
            found[ask[hit]] = True
            records[ask[hit]] = table[row[hit], pos[hit]]
        return found, records

    def close(self, *, remove: bool = False) -> None:
        os.close(self._fd)
        if remove:
            self.path.unlink(missing_ok=True)


def write_run(path: Path, records: np.ndarray) -> DiskRun:
    """``records`` (sorted by hash) written to ``path`` as a run."""
    records.astype(RECORD, copy=False).tofile(path)
    return DiskRun(path, len(records))


def merge_runs(a: DiskRun, b: DiskRun, path: Path) -> DiskRun:
    """The two runs merged into ``path``, a block at a time (their hashes are distinct)."""
    with open(path, "wb") as out:
        pa = pb = 0
        buffer_a, buffer_b = a.read(0, 0), b.read(0, 0)
        while True:
            if not len(buffer_a) and pa < a.size:
                buffer_a, pa = a.read(pa, min(a.size, pa + _MERGE_BLOCK)), min(a.size, pa + _MERGE_BLOCK)
            if not len(buffer_b) and pb < b.size:
                buffer_b, pb = b.read(pb, min(b.size, pb + _MERGE_BLOCK)), min(b.size, pb + _MERGE_BLOCK)
            if not len(buffer_a) or not len(buffer_b):
                break
            # Everything up to the smaller of the two buffered maxima is buffered on both sides.
            bound = min(buffer_a["hash"][-1], buffer_b["hash"][-1])
            cut_a = int(np.searchsorted(buffer_a["hash"], bound, side="right"))
            cut_b = int(np.searchsorted(buffer_b["hash"], bound, side="right"))
            merged = np.concatenate([buffer_a[:cut_a], buffer_b[:cut_b]])
            merged[np.argsort(merged["hash"], kind="stable")].tofile(out)
            buffer_a, buffer_b = buffer_a[cut_a:], buffer_b[cut_b:]
        for buffer, run, pos in ((buffer_a, a, pa), (buffer_b, b, pb)):
            buffer.tofile(out)
            while pos < run.size:
                run.read(pos, min(run.size, pos + _MERGE_BLOCK)).tofile(out)
                pos = min(run.size, pos + _MERGE_BLOCK)
    return DiskRun(path, a.size + b.size)
