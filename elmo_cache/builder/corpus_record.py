"""What a cache was built from, and what changed since: the corpus record of the metadata (issue 32).

Every line's key is the 64-bit hash of its tokens as the build split them (the ``hashes`` column every
build already stages, :func:`elmo_cache.text.tokenize.sentence_hash`), so spacing that tokenises the same
is no change and any edit to a token is. The metadata's ``corpus`` records how many lines there were and a
digest over their keys in order (:func:`corpus_entry`); a build into an output that holds a cache of the
same options compares the corpus it was given against it (:func:`check_same_corpus`) and refuses another
one, naming how many lines changed, were added or removed and the first line that differs, rather than
leaving rows that no longer are the corpus's lines. Caches written before the record are compared through
their stored tokens; version-1 caches store none and cannot be compared.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CorpusChangedError
from elmo_cache.store import open_cache_arrays
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.tokenize import key_hash, sentence_hash

__all__ = [
    "DIGEST",
    "CorpusChanges",
    "corpus_entry",
    "line_hashes",
    "stored_line_hashes",
    "compare",
    "check_same_corpus",
]

DIGEST = "blake2b-128"
"""The digest of metadata ``corpus.digest``: BLAKE2b (16 bytes) over the line keys, uint64 little-endian, in order."""

# Lines read at a time from a staged or stored column: bounded memory for any corpus.
_BLOCK = 1 << 20

# Up to this many differing lines on each side, changes are counted by a line diff (difflib); beyond, from the
# common prefix and suffix alone (one edited region: what a diff of one edit reports).
_DIFF_LINES = 200_000


def corpus_entry(read_keys: Callable[[int, int], Any], n_lines: int) -> dict[str, Any]:
    """Metadata ``corpus``: the number of lines and the digest of their keys, ``read_keys(start, stop)`` (a
    staged ``hashes`` column, :meth:`SentenceColumns.read_keys <elmo_cache.store.staging.SentenceColumns.read_keys>`,
    or a slice of an array) read a block at a time."""
    digest = hashlib.blake2b(digest_size=16)
    for start in range(0, n_lines, _BLOCK):
        block = np.asarray(read_keys(start, min(n_lines, start + _BLOCK)), dtype="<u8")
        digest.update(np.ascontiguousarray(block).tobytes())
    return {"lines": int(n_lines), "digest": f"{DIGEST}:{digest.hexdigest()}"}


def line_hashes(source: Corpus) -> np.ndarray:
    """The key of every sentence of ``source``, split as the build splits it (one pass over the corpus)."""
    return np.fromiter((sentence_hash(tokens) for _, tokens in source.sentences()), dtype=np.uint64)


def stored_line_hashes(path: Path) -> np.ndarray | None:
    """The key of every sentence of the cache at ``path``, from its stored tokens; None for a version-1 cache."""
    _, _, arrays, _ = open_cache_arrays(path)
    starts, text = arrays.get("tokens/offsets"), arrays.get("tokens/bytes")
    if starts is None or text is None:
        return None
    n = int(starts.shape[0]) - 1
    keys = np.empty(max(0, n), dtype=np.uint64)
    for first in range(0, n, _BLOCK):
        last = min(n, first + _BLOCK)
        bounds = np.asarray(starts[first : last + 1], dtype=np.int64)
        raw = bytes(np.asarray(text[int(bounds[0]) : int(bounds[-1])]))
        base = int(bounds[0])
        for i in range(last - first):
            keys[first + i] = key_hash(raw[bounds[i] - base : bounds[i + 1] - base])
    return keys


@dataclass(frozen=True)
class CorpusChanges:
    """How a corpus differs from the one a cache was built from (counts of lines)."""

    changed: int
    added: int
    removed: int
    first: int  # the first differing line, from 0

    def describe(self) -> str:
        return (
            f"{self.changed} line{'s' * (self.changed != 1)} changed, {self.added} added, {self.removed} removed; "
            f"the first difference is at line {self.first + 1}"
        )


def compare(stored: np.ndarray, new: np.ndarray, *, stored_is_prefix: bool = False) -> CorpusChanges | None:
    """What changed from ``stored`` line keys to ``new`` ones; None when nothing did.

    ``stored_is_prefix``: ``stored`` are the lines an interrupted build committed, so lines of ``new`` past
    the last stored one are not additions but lines still to build.
    """
    n_stored, n_new = len(stored), len(new)
    limit = min(n_stored, n_new)
    differs = np.flatnonzero(stored[:limit] != new[:limit])
    prefix = int(differs[0]) if len(differs) else limit
    if prefix == n_stored and (stored_is_prefix or prefix == n_new):
        return None
    tail = 0
    if not stored_is_prefix:
        while tail < limit - prefix and stored[n_stored - 1 - tail] == new[n_new - 1 - tail]:
            tail += 1
    old_mid = stored[prefix : n_stored - tail]
    new_mid = new[prefix : n_new - tail]
    if max(len(old_mid), len(new_mid)) <= _DIFF_LINES:
        changed = added = removed = 0
        matcher = difflib.SequenceMatcher(None, old_mid.tolist(), new_mid.tolist(), autojunk=False)
        opcodes = matcher.get_opcodes()
        if stored_is_prefix and opcodes and opcodes[-1][0] == "insert" and opcodes[-1][2] == len(old_mid):
            opcodes = opcodes[:-1]  # lines after the committed ones: still to build
        for tag, i1, i2, j1, j2 in opcodes:
            if tag == "replace":
                changed += min(i2 - i1, j2 - j1)
                added += max(0, (j2 - j1) - (i2 - i1))
                removed += max(0, (i2 - i1) - (j2 - j1))
            elif tag == "insert":
                added += j2 - j1
            elif tag == "delete":
                removed += i2 - i1
        return CorpusChanges(changed, added, removed, prefix)
    if stored_is_prefix:
        new_mid = new_mid[: len(old_mid)]
    both = min(len(old_mid), len(new_mid))
    return CorpusChanges(both, len(new_mid) - both, len(old_mid) - both, prefix)


def check_same_corpus(
    output: Path, meta: dict[str, Any], source: Corpus, *, update: bool = False
) -> CorpusChanges | None:
    """None when ``source`` is the corpus the complete cache at ``output`` (metadata ``meta``) was built from (a
    version-1 cache stores no tokens: it is taken as it is). Another corpus raises :class:`CorpusChangedError`
    unless ``update`` (``build --update``), which gets what changed."""
    new = line_hashes(source)
    recorded = meta.get("corpus")
    if isinstance(recorded, dict) and recorded == corpus_entry(lambda a, b: new[a:b], len(new)):
        return None
    stored = stored_line_hashes(output)
    if stored is None:
        return None
    changes = compare(stored, new)
    if changes is None or update:
        return changes
    raise CorpusChangedError(
        f"{output} was built from another version of {source.name} ({len(stored)} lines, now {len(new)}): "
        f"{changes.describe()}. Its row i would no longer be line i of the corpus. Pass --update to bring it up "
        "to date (encoding only the new or changed lines), --overwrite to rebuild it, or build into another "
        "-o/--output"
    )
