"""Deduplication: each distinct sentence is encoded and stored once; repeats point at its rows.

A sentence is a repeat when its 64-bit hash *and* its token count match an earlier one (in the
same window or in any earlier one, including those of an interrupted run). On a hash collision
between different sentences, the first keeps the hash and the later one is stored anew.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SeenSentences", "assign_rows"]


class SeenSentences:
    """First occurrences (hash -> offset, length) in sorted numpy runs, ~20 bytes per distinct sentence.

    A dict would need ~10x that for 100M sentences. Runs are merged when the newest is at
    least half the size of the one before, so there are O(log n) of them to search.
    """

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def lookup(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        found = np.zeros(len(hashes), dtype=bool)
        offsets = np.zeros(len(hashes), dtype=np.int64)
        lengths = np.zeros(len(hashes), dtype=np.int32)
        for run_hashes, run_offsets, run_lengths in self.runs:
            pos = np.minimum(np.searchsorted(run_hashes, hashes), len(run_hashes) - 1)
            hit = (run_hashes[pos] == hashes) & ~found
            offsets[hit] = run_offsets[pos[hit]]
            lengths[hit] = run_lengths[pos[hit]]
            found |= hit
        return found, offsets, lengths

    def add(self, hashes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
        if not len(hashes):
            return
        order = np.argsort(hashes, kind="stable")
        self.runs.append((hashes[order], offsets[order], lengths[order]))
        while len(self.runs) >= 2 and 2 * len(self.runs[-1][0]) >= len(self.runs[-2][0]):
            b, a = self.runs.pop(), self.runs.pop()
            merged = [np.concatenate([x, y]) for x, y in zip(a, b)]
            order = np.argsort(merged[0], kind="stable")
            self.runs.append(tuple(m[order] for m in merged))  # type: ignore[arg-type]

    @classmethod
    def rebuild(cls, hashes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> SeenSentences:
        """The state after the committed lines: first occurrence of every non-empty sentence."""
        seen = cls()
        keep = np.flatnonzero(lengths > 0)
        if len(keep):
            _, first = np.unique(hashes[keep], return_index=True)
            lines = keep[first]
            seen.add(np.asarray(hashes[lines]), np.asarray(offsets[lines]), np.asarray(lengths[lines]))
        return seen


def assign_rows(
    hashes: np.ndarray, lengths: np.ndarray, rows_before: int, seen: SeenSentences | None
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one window's sentences: ``(offsets, new)``, where ``new`` marks the sentences to encode.

    New sentences get consecutive rows from ``rows_before`` in input order; with ``seen`` (dedupe),
    repeats get the offset of their first occurrence and ``seen`` learns this window's firsts.
    """
    n = len(lengths)
    offsets = np.empty(n, dtype=np.int64)
    new = np.ones(n, dtype=bool)
    local: dict[int, int] = {}  # hash -> line in window
    if seen is not None:
        found, seen_offsets, seen_lengths = seen.lookup(hashes)
    row = rows_before
    for i in range(n):
        length = int(lengths[i])
        if seen is not None and length:
            h = int(hashes[i])
            j = local.get(h)
            if j is not None and lengths[j] == length:
                offsets[i], new[i] = offsets[j], False
                continue
            if found[i] and seen_lengths[i] == length:
                offsets[i], new[i] = seen_offsets[i], False
                continue
            if j is None and not found[i]:  # on a 64-bit collision the first sentence keeps the hash
                local[h] = i
        offsets[i] = row
        row += length
    if seen is not None:
        firsts = np.fromiter(local.values(), dtype=np.int64, count=len(local))
        seen.add(hashes[firsts], offsets[firsts], lengths[firsts])
    return offsets, new
