"""Deduplication: each distinct sentence is encoded and stored once; repeats point at its rows.

A sentence is a repeat when its 64-bit hash, its token count *and* a second, independent 64-bit
hash of its key (:func:`check_hashes`) match an earlier one (in the same window or in any earlier
one, including those of an interrupted run): two different sentences would have to collide on
128 bits to share rows. On a collision of the index hash between different sentences, the first
keeps the hash and the later one is stored anew.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from elmo_cache.builder.diskruns import RECORD, DiskRun, merge_runs, write_run
from elmo_cache.store.format import TEXT_ENCODING
from elmo_cache.text.tokenize import sentence_key

__all__ = ["SeenSentences", "assign_rows", "check_hashes", "check_hashes_of_keys"]


def check_hashes_of_keys(keys: Iterable[bytes]) -> np.ndarray:
    """The dedupe check hash (BLAKE2b-64 personalised "elmo-dedupe") of each UTF-8 sentence key."""
    return np.array(
        [int.from_bytes(hashlib.blake2b(key, digest_size=8, person=b"elmo-dedupe").digest(), "little") for key in keys],
        dtype=np.uint64,
    )


def check_hashes(token_lists: Sequence[Sequence[str]]) -> np.ndarray:
    """The dedupe check hash of each sentence (of its key, as stored)."""
    return check_hashes_of_keys(sentence_key(tokens).encode(*TEXT_ENCODING) for tokens in token_lists)


MEMORY_ITEMS = 1 << 22
"""First occurrences a :class:`SeenSentences` with a folder keeps in memory (~112 MiB) before it writes them to disk."""

# Committed lines read at a time when the state of an interrupted build is rebuilt.
_REBUILD_LINES = 1 << 16


class SeenSentences:
    """First occurrences (hash -> offset, length, check hash) in sorted runs, 28 bytes per distinct sentence.

    A dict would need ~10x that. Runs are merged when the newest is at least half the size of the one
    before, so there are O(log n) of them to search. With a ``directory``, memory stays bounded whatever
    the corpus: once the runs in memory hold ``memory_items`` entries they go to disk as one sorted run
    (:mod:`elmo_cache.builder.diskruns`), and runs on disk are merged the same way, file to file.
    """

    def __init__(self, directory: Path | None = None, memory_items: int | None = None) -> None:
        # (hashes, offsets, lengths, check hashes), sorted by hash
        self.runs: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.directory = directory
        self.memory_items = memory_items or MEMORY_ITEMS
        self.disk: list[DiskRun] = []
        self._files = 0
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)  # what a killed run left is rebuilt
            directory.mkdir(parents=True)

    def lookup(self, hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        found = np.zeros(len(hashes), dtype=bool)
        offsets = np.zeros(len(hashes), dtype=np.int64)
        lengths = np.zeros(len(hashes), dtype=np.int32)
        checks = np.zeros(len(hashes), dtype=np.uint64)
        for run_hashes, run_offsets, run_lengths, run_checks in self.runs:
            pos = np.minimum(np.searchsorted(run_hashes, hashes), len(run_hashes) - 1)
            hit = (run_hashes[pos] == hashes) & ~found
            offsets[hit] = run_offsets[pos[hit]]
            lengths[hit] = run_lengths[pos[hit]]
            checks[hit] = run_checks[pos[hit]]
            found |= hit
        for run in self.disk:
            ask = np.flatnonzero(~found)
            if not len(ask):
                break
            hit, records = run.lookup(hashes[ask])
            where = ask[hit]
            offsets[where] = records["offset"][hit]
            lengths[where] = records["length"][hit]
            checks[where] = records["check"][hit]
            found[where] = True
        return found, offsets, lengths, checks

    def add(self, hashes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray, checks: np.ndarray) -> None:
        if not len(hashes):
            return
        order = np.argsort(hashes, kind="stable")
        self.runs.append((hashes[order], offsets[order], lengths[order], checks[order]))
        while len(self.runs) >= 2 and 2 * len(self.runs[-1][0]) >= len(self.runs[-2][0]):
            b, a = self.runs.pop(), self.runs.pop()
            merged = [np.concatenate([x, y]) for x, y in zip(a, b)]
            order = np.argsort(merged[0], kind="stable")
            self.runs.append(tuple(m[order] for m in merged))  # type: ignore[arg-type]
        if self.directory is not None and sum(len(run[0]) for run in self.runs) >= self.memory_items:
            self._spill()

    def _spill(self) -> None:
        assert self.directory is not None
        records = np.zeros(sum(len(run[0]) for run in self.runs), dtype=RECORD)
        for field, k in (("hash", 0), ("offset", 1), ("length", 2), ("check", 3)):
            records[field] = np.concatenate([run[k] for run in self.runs])
        records = records[np.argsort(records["hash"], kind="stable")]
        self.runs = []
        self.disk.append(write_run(self._next_file(), records))
        del records
        while len(self.disk) >= 2 and 2 * self.disk[-1].size >= self.disk[-2].size:
            b, a = self.disk.pop(), self.disk.pop()
            self.disk.append(merge_runs(a, b, self._next_file()))
            a.close(remove=True)
            b.close(remove=True)

    def _next_file(self) -> Path:
        assert self.directory is not None
        self._files += 1
        return self.directory / f"seen-{self._files}.bin"

    def close(self) -> None:
        """Close and remove the runs on disk."""
        for run in self.disk:
            run.close(remove=True)
        self.disk = []
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    @classmethod
    def rebuild(
        cls,
        hashes: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        key: Callable[[int], bytes],
        directory: Path | None = None,
    ) -> SeenSentences:
        """The state after the committed lines (``key(i)``: line i's stored key): the first
        occurrence of every non-empty sentence's hash, which is the one rows were shared with.
        Read a block of lines at a time, so that it needs no more memory than the build."""
        seen = cls(directory)
        for start in range(0, len(hashes), _REBUILD_LINES):
            stop = min(len(hashes), start + _REBUILD_LINES)
            keep = start + np.flatnonzero(np.asarray(lengths[start:stop]) > 0)
            if not len(keep):
                continue
            block = np.asarray(hashes[keep])
            _, first = np.unique(block, return_index=True)
            lines, block = keep[first], block[first]
            new = ~seen.lookup(block)[0]
            lines, block = lines[new], block[new]
            seen.add(
                block,
                np.asarray(offsets[lines]),
                np.asarray(lengths[lines]),
                check_hashes_of_keys(key(i) for i in lines.tolist()),
            )
        return seen


def assign_rows(
    hashes: np.ndarray,
    lengths: np.ndarray,
    rows_before: int,
    seen: SeenSentences | None,
    checks: np.ndarray | None = None,
    align: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one window's sentences: ``(offsets, new)``, where ``new`` marks the sentences to encode.

    New sentences get consecutive rows from ``rows_before`` in input order, the first one with rows from
    ``rows_before`` rounded up to a multiple of ``align`` (a window's rows start a vectors file of their own:
    :attr:`Layout.window_rows <elmo_cache.store.staging.Layout.window_rows>`); with ``seen`` (dedupe, which needs
    each sentence's ``checks`` hash), repeats get the offset of their first occurrence and ``seen`` learns this
    window's firsts.
    """
    n = len(lengths)
    offsets = np.empty(n, dtype=np.int64)
    new = np.ones(n, dtype=bool)
    local: dict[int, int] = {}  # hash -> line in window
    if seen is not None:
        if checks is None:
            raise ValueError("assign_rows: dedupe needs the check hashes")
        found, seen_offsets, seen_lengths, seen_checks = seen.lookup(hashes)
    row = rows_before
    for i in range(n):
        length = int(lengths[i])
        if seen is not None and length:
            assert checks is not None
            h = int(hashes[i])
            j = local.get(h)
            if j is not None and lengths[j] == length and checks[j] == checks[i]:
                offsets[i], new[i] = offsets[j], False
                continue
            if found[i] and seen_lengths[i] == length and seen_checks[i] == checks[i]:
                offsets[i], new[i] = seen_offsets[i], False
                continue
            if j is None and not found[i]:  # on a 64-bit collision the first sentence keeps the hash
                local[h] = i
        if length and row == rows_before:
            row = -(-row // align) * align
        offsets[i] = row
        row += length
    if seen is not None:
        firsts = np.fromiter(local.values(), dtype=np.int64, count=len(local))
        assert checks is not None
        seen.add(hashes[firsts], offsets[firsts], lengths[firsts], checks[firsts])
    return offsets, new
