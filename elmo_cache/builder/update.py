"""Update in place (``build --update``): a complete cache brought to a new version of its corpus, the stored
rows of unchanged sentences copied, only new or changed lines encoded.

An update is the local engine's build of the new corpus, into the usual staging beside the cache, published
over it at the end (atomically: :func:`elmo_cache.store.durable.publish_directory`, ``os.replace`` for HDF5).
It must write the bytes a fresh build of the new corpus writes. A build encodes the corpus window by window
(:mod:`elmo_cache.builder.encoding`), windows cut by content, so a fresh build of the new corpus cuts the same
windows as the cache's build wherever the corpus did not change. For each window of the new corpus
(:class:`StoredWindows`):

* the cache's build cut a window of the same sentences (the same keys, lengths and stored tokens), and it
  encoded the same of them (with ``--dedupe``, a window's repeats of earlier lines are not encoded, so the
  lines it encoded must be the same ones): its rows are copied, read through the cache's block sums;
* otherwise, where this device's rows are *batch-free* (a sentence's rows the same bits in any batch:
  :func:`elmo_cache.encoder.batch_free.rows_batch_free`, checked at the update's start), each of the window's
  sentences the cache holds (the same key and stored tokens, anywhere in the cache) has its rows copied and only
  the others are encoded (:meth:`StoredWindows.sources`);
* else (a device whose rows depend on their batch) the window is encoded whole, as a fresh build encodes it.

So the encoding cost follows the change: on a batch-free device, the new and edited lines alone; elsewhere, the
windows holding them (an append re-encodes the old last window too, which the corpus's end cut). In a zarr cache
the bytes written follow it too: each window's rows start a vectors file of their own (``Layout.window_rows``,
format version 5), so the files of a window reused whole are the old cache's own, hard-linked under their new
numbers wherever the window moved (:meth:`ZarrWriter.link_window
<elmo_cache.store.zarr.writer.ZarrWriter.link_window>`), and so are the files wholly before the first changed line
(on a batch-free device; elsewhere the first changed window: :meth:`ZarrWriter.link_unchanged
<elmo_cache.store.zarr.writer.ZarrWriter.link_unchanged>`): an update writes the files of the windows cut anew and
the per-line arrays. An HDF5 cache (one file) is written whole.
The lines before the first one the corpus check found changed are not split again either: their tokens and keys
come from the cache (:meth:`StoredWindows.sentences`), so a small append tokenises its corpus once, in the check.
A cache written before the windows were recorded (metadata ``windows``), by an encoder that did not round its
products (``windows`` version 1), or cut and batched with other sizes, cannot give a fresh build's bytes: the
update refuses it and says how to rebuild.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.builder.encoding import (
    READABLE_WINDOW_VERSIONS,
    WINDOW_RULE,
    Window,
    WindowEncoder,
    window_bounds,
    windows_entry,
)
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.store import open_cache_arrays
from elmo_cache.store.blocksums import guards
from elmo_cache.store.format import POOLED_ARRAY
from elmo_cache.store.staging import decode_tokens, encode_tokens, stored_key
from elmo_cache.text.tokenize import key_hash

__all__ = ["StoredWindows", "WindowCounts", "copy_and_encode", "update_batch_tokens"]


@dataclass
class WindowCounts:
    """What a build did with its windows: encoded, or (an update) copied from the cache it updates."""

    windows_encoded: int = 0
    lines_encoded: int = 0
    windows_reused: int = 0
    lines_reused: int = 0
    # zarr: vectors files of the updated cache taken as they are (hard links), not written again.
    files_linked: int = 0
    # HDF5: rows of the updated cache its finish copies into the new file, never staged (written once, not twice).
    rows_taken: int = 0
    # Whether this device's rows were batch-free: a changed window's unchanged sentences were copied one by one
    # (their lines count as reused, the window as encoded when any of its lines was).
    batch_free: bool = False

    def count_linked(self, rows: int, file_rows: int) -> None:
        """Count ``rows`` rows a writer takes from the cache it replaces, in units of ``file_rows``-row files (zarr)
        or one row (HDF5: :attr:`rows_taken`)."""
        if file_rows == 1:
            self.rows_taken += rows
        elif file_rows > 1:
            self.files_linked += -(-rows // file_rows)

    def summary(self) -> dict[str, int]:
        return dict(self.__dict__)


def update_batch_tokens(output: Path, meta: dict[str, Any], batch_tokens: int | None, window_batches: int) -> int:
    """The tokens per batch of an update of the cache at ``output`` (metadata ``meta``): the one given, else
    the cache's own; refused (naming what to pass) when the cache's windows were cut by another rule or sizes."""
    recorded = meta.get("windows")
    if not isinstance(recorded, dict) or recorded.get("cut") != WINDOW_RULE["cut"]:
        raise CacheExistsError(
            f"{output} was built before windows were cut by content (its metadata records no "
            f"{WINDOW_RULE['cut']} windows, version {WINDOW_RULE['version']}): an update could not reproduce a "
            "fresh build's bytes from its rows. Rebuild it once with --overwrite; later updates reuse its rows"
        )
    if recorded.get("version") not in READABLE_WINDOW_VERSIONS:
        raise CacheExistsError(
            f"{output} was built by an earlier elmo-cache (windows version {recorded.get('version')}; this one "
            f"updates versions {' and '.join(map(str, READABLE_WINDOW_VERSIONS))}: their encoder rounds its products "
            "so that a sentence's rows do not depend on its batch), whose vectors differ from this one's in their "
            "last bits: an update could "
            "not reproduce a fresh build's bytes from its rows. Rebuild it once with --overwrite; later updates "
            "reuse its rows"
        )
    there = int(recorded["batch_tokens"]), int(recorded["window_tokens"])
    batch = int(batch_tokens) if batch_tokens is not None else there[0]
    if {**windows_entry(batch, window_batches), "version": recorded.get("version")} != recorded:
        raise InvalidParameterError(
            f"{output} was cut into windows of {there[1]} tokens and batches of {there[0]} "
            f"(--batch-tokens {there[0]} --window-batches {there[1] // max(1, there[0])}), this update into "
            f"{batch * window_batches} and {batch}: its stored rows would not be a fresh build's. Update with the "
            "cache's sizes (or leave --batch-tokens out), or rebuild it with --overwrite"
        )
    return batch


def _digest(hashes: np.ndarray, lengths: np.ndarray) -> bytes:
    """A window's content key: its sentences' keys and lengths in order."""
    digest = hashlib.blake2b(np.ascontiguousarray(hashes, dtype="<u8").tobytes(), digest_size=16)
    digest.update(np.ascontiguousarray(lengths, dtype="<i4").tobytes())
    return digest.digest()


class StoredWindows:
    """The complete cache an update replaces, as the windows its build cut, each found by its content."""

    def __init__(self, path: Path, meta: dict[str, Any], window_tokens: int, row_shape: tuple[int, ...]):
        self.path = path
        _, _, arrays, sums = open_cache_arrays(path)
        # Every row copied is checked against the cache's block sums: damage there is an error, not a copy.
        self.guards = guards(path, meta, arrays, sums)
        for name in ("offsets", "lengths", "tokens/offsets", "tokens/bytes"):
            if name in self.guards:
                self.guards[name].check_all()
        self.offsets = np.asarray(arrays["offsets"][:], dtype=np.int64)
        self.lengths = np.asarray(arrays["lengths"][:], dtype=np.int32)
        self.text_starts = np.asarray(arrays["tokens/offsets"][:], dtype=np.int64)
        self.text = np.asarray(arrays["tokens/bytes"][:], dtype=np.uint8).tobytes()
        self.vectors = arrays["vectors"]
        self.pooled = arrays.get(POOLED_ARRAY)
        self.token_rows = not ((meta.get("pool") or {}).get("only"))
        self.row_shape = row_shape
        n = len(self.lengths)
        keys = np.fromiter(
            (key_hash(self.text[self.text_starts[i] : self.text_starts[i + 1]]) for i in range(n)),
            dtype=np.uint64,
            count=n,
        )
        # Which lines the cache's build encoded (the others are --dedupe repeats, pointing back at earlier
        # rows): a line is encoded when its rows start where every earlier line's end.
        ends = self.offsets + self.lengths
        before = np.concatenate([[0], np.maximum.accumulate(ends)[:-1]]) if n else ends
        self.encoded = self.offsets >= before
        # The row each line's rows would start at: where every earlier line's end.
        self.row_at = np.concatenate([[0], np.maximum.accumulate(ends)]) if n else np.zeros(1, np.int64)
        self.keys = keys
        self.bounds = window_bounds(keys, self.lengths, window_tokens)
        self.windows: dict[bytes, list[tuple[int, int]]] = {}
        for first, stop in self.bounds:
            self.windows.setdefault(_digest(keys[first:stop], self.lengths[first:stop]), []).append((first, stop))
        self.usable = True
        # Whether this device's rows are batch-free (set by the run): a changed window's unchanged sentences are
        # then copied one by one (sources).
        self.batch_free = False
        # Rows below this are in vectors files the writer keeps as they are (zarr's link_unchanged): not read.
        self.kept_rows = 0
        # Whether each window's rows start a vectors file of their own in the cache (windows version 3): a reused
        # window's files are then the new cache's, wherever the window moved.
        self.files_per_window = int((meta.get("windows") or {}).get("version", 0)) >= 3
        # Rows per vectors file where the writer takes a reused window's files whole (ZarrWriter.link_window), set
        # by the run; 0: the rows are read and written.
        self.link_rows = 0
        # The cache's lines by key, for sources: sorted keys, and the line of each (the first of equal keys).
        self._by_key = np.argsort(keys, kind="stable")
        self._sorted_keys = keys[self._by_key]

    def unchanged_rows(self, unchanged_lines: int) -> int:
        """The rows a build of a corpus that shares its first ``unchanged_lines`` lines with this cache writes as
        the cache holds them, at the same places: on a batch-free device, every row of those lines; elsewhere
        those of the windows before the first change (not the last window: a corpus's end cuts it, which a
        longer corpus may not)."""
        if self.batch_free:
            return int(self.row_at[min(unchanged_lines, len(self.lengths))])
        before = [stop for _, stop in self.bounds[:-1] if stop <= unchanged_lines]
        return int(self.row_at[before[-1]]) if before else 0

    def sentences(self, stop: int) -> Iterator[tuple[list[str], int]]:
        """The tokens and key of each of the cache's first ``stop`` lines, from its stored tokens: an update's
        reader takes the lines the corpus check found unchanged from here instead of splitting them again (the
        PTB rules cost ~17 us a line, a stored line ~1)."""
        for i in range(min(stop, len(self.lengths))):
            yield decode_tokens(self.text[self.text_starts[i] : self.text_starts[i + 1]]), int(self.keys[i])

    def rows(self, window: Window, new: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, int | None] | None:
        """The stored rows of ``window``'s encoded (``new``) sentences in line order, with ``--pool`` its
        sentences' pooled vectors (zeros for repeats, as an encoder gives them), and the row its rows start at in
        the cache when the writer is to take their files whole (the rows are then not read: zeros stand for them),
        when the cache's build cut and encoded the same window; else None (it must be encoded)."""
        if not self.usable:
            return None
        for first, stop in self.windows.get(_digest(window.hashes, window.lengths), ()):
            if np.array_equal(self.encoded[first:stop], new) and self._same_tokens(window, first, stop):
                return self._copy(first, stop, new)
        return None

    def sources(self, window: Window, new: np.ndarray) -> np.ndarray:
        """For each of ``window``'s sentences, the cache's line whose stored rows are its own (the same key and
        stored tokens, anywhere in the cache: on a batch-free device a sentence's rows do not depend on the
        sentences around it), or -1: a sentence to encode (not ``new``, empty or unknown are -1 too)."""
        found = np.full(len(window.lengths), -1, dtype=np.int64)
        if not (self.usable and self.batch_free) or not len(self._sorted_keys):
            return found
        at = np.minimum(np.searchsorted(self._sorted_keys, window.hashes), len(self._sorted_keys) - 1)
        candidates = np.flatnonzero((self._sorted_keys[at] == window.hashes) & new & (window.lengths > 0))
        for k in candidates.tolist():
            line = int(self._by_key[at[k]])
            # The 64-bit keys matched; the stored tokens confirm it: colliding sentences never share rows.
            stored = self.text[self.text_starts[line] : self.text_starts[line + 1]]
            if stored == stored_key(window.tokens[k]):
                found[k] = line
        return found

    def copy_sentences(
        self, sources: np.ndarray, places: np.ndarray, vectors: np.ndarray, kept: int = 0
    ) -> np.ndarray | None:
        """The stored rows of the cache's lines ``sources[sources >= 0]`` written into ``vectors`` at their
        ``places`` (the row each one's rows start at there), contiguous runs read in one go through the cache's
        block sums, but for runs wholly below ``vectors`` row ``kept`` (rows the writer keeps as the cache holds
        them: :attr:`kept_rows`); returns, in a cache with pooled vectors, each of those lines' stored pooled
        vector."""
        lines = sources[sources >= 0]
        if self.token_rows and len(lines):
            starts = self.offsets[lines]
            counts = self.lengths[lines].astype(np.int64)
            read = getattr(self.vectors, "rows", None)
            for first, stop, into in _runs(starts, counts, places[sources >= 0]):
                if into + stop - first <= kept:
                    continue
                if "vectors" in self.guards:
                    self.guards["vectors"].check_rows(first, stop)
                rows = read(first, stop) if read is not None else self.vectors[first:stop]
                vectors[into : into + stop - first] = rows
        if self.pooled is None:
            return None
        pooled = np.empty((len(lines), *self.pooled.shape[1:]), dtype=self.pooled.dtype)
        ones = np.ones(len(lines), dtype=np.int64)
        for first, stop, into in _runs(lines, ones, np.arange(len(lines))):
            if POOLED_ARRAY in self.guards:
                self.guards[POOLED_ARRAY].check_rows(first, stop)
            pooled[into : into + stop - first] = self.pooled[first:stop]
        return pooled

    def _same_tokens(self, window: Window, first: int, stop: int) -> bool:
        # The 64-bit keys matched; the stored tokens confirm it (as dedupe does for a repeat): two sentences
        # colliding on their key never share rows.
        text, _ = encode_tokens(window.tokens)
        return text.tobytes() == self.text[self.text_starts[first] : self.text_starts[stop]]

    def _copy(self, first: int, stop: int, new: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, int | None]:
        lengths = self.lengths[first:stop]
        rows = lengths[new]
        count = int(rows.sum(dtype=np.int64))
        with_rows = np.flatnonzero(new & (lengths > 0))
        start = int(self.offsets[first + with_rows[0]]) if len(with_rows) else 0
        link = None
        whole_files = self.files_per_window or self.link_rows == 1  # zarr: files of their own; HDF5: any rows
        if self.token_rows and count and self.link_rows and whole_files and start >= self.kept_rows:
            link = start  # the window's files, whole (start is a file's first row in such a cache), or its rows
        if not self.token_rows or start + count <= self.kept_rows or link is not None:
            # Rows the writer counts but does not write: a pool-only cache stores none, and the writer keeps the
            # old cache's files holding these as they are.
            vectors = np.broadcast_to(np.zeros((), dtype=self.vectors.dtype), (count, *self.row_shape))
        elif count:
            if "vectors" in self.guards:
                self.guards["vectors"].check_rows(start, start + count)
            read = getattr(self.vectors, "rows", None)
            vectors = np.asarray(
                read(start, start + count) if read is not None else self.vectors[start : start + count]
            )
        else:
            vectors = np.empty((0, *self.row_shape), dtype=self.vectors.dtype)
        pooled = None
        if self.pooled is not None:
            if POOLED_ARRAY in self.guards:
                self.guards[POOLED_ARRAY].check_rows(first, stop)
            stored = np.array(self.pooled[first:stop])
            pooled = np.zeros_like(stored)
            pooled[new] = stored[new]
        return vectors, pooled, link


def copy_and_encode(
    encode: WindowEncoder,
    window: Window,
    offsets: np.ndarray,
    new: np.ndarray,
    rows_before: int,
    stored: StoredWindows,
    sources: np.ndarray,
    progress: Callable[[int], None] | None = None,
) -> tuple[np.ndarray, np.ndarray | None, int]:
    """What :meth:`WindowEncoder.encode` returns for ``window`` (its ``new`` sentences' rows from row
    ``rows_before`` on, the pooled vectors, the tokens encoded), on a batch-free device: the sentences with a
    source line (:meth:`StoredWindows.sources`) copied from the cache, only the others encoded."""
    lengths = window.lengths.astype(np.int64)
    copied = sources >= 0
    todo = np.asarray(new, dtype=bool) & ~copied
    shape = (int(lengths[new].sum()), *encode.row_shape)
    buffers = encode.buffers
    vectors = np.empty(shape, encode.np_dtype) if buffers is None else buffers.empty(shape, encode.np_dtype)
    places = np.asarray(offsets, dtype=np.int64) - rows_before
    # The sentences to encode (maybe none), as a window of their own rows (offsets from 0), then each one's rows to
    # its place; the encoder also gives the window's pooled array (zeros for the others) and reports its progress.
    compact = np.zeros(len(lengths), dtype=np.int64)
    compact[todo] = np.cumsum(lengths[todo]) - lengths[todo]
    rows, pooled, encoded = encode.encode(
        window.tokens, window.lengths, compact, todo, 0, progress, first_line=window.first_line
    )
    into = np.repeat(places[todo] - compact[todo], lengths[todo]) + np.arange(len(rows))
    vectors[into] = rows
    if buffers is not None:
        buffers.release(rows)
    copied_pooled = stored.copy_sentences(sources, places, vectors, stored.kept_rows - rows_before)
    if pooled is not None and copied_pooled is not None:
        pooled[copied] = copied_pooled
    return vectors, pooled, encoded


def _runs(starts: np.ndarray, counts: np.ndarray, places: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """``(first, stop, place)`` of each run of consecutive items whose ``starts:starts + counts`` follow each other,
    and whose places do too: one read (and one write) per run instead of one per item."""
    if not len(starts):
        return
    ends = starts + counts
    breaks = np.flatnonzero((starts[1:] != ends[:-1]) | (places[1:] != places[:-1] + counts[:-1])) + 1
    for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), len(starts)]):
        yield int(starts[a]), int(ends[b - 1]), int(places[a])
