"""``build``: walk a corpus once and write its ELMo vectors into a cache (docs/FORMAT.md).

Three stages overlap, each in its own thread, so the build runs at the encoder's speed:

* a reader streams the corpus and cuts it into *windows* of about ``window_batches *
  batch_tokens`` tokens (a deterministic function of the corpus, see below);
* the main thread sorts each window's sentences by length, encodes them in batches of at
  most ``batch_tokens`` tokens, selects layers or mixes (float32), casts, and puts every
  sentence's rows back in input order into one buffer per window;
* a writer thread appends windows to the store and commits now and then.

Resuming. Commits happen only at window ends and windows depend only on the corpus and the
options, so a resumed build encodes exactly the batches an uninterrupted one would, and the
cache it ends with is identical. On resume the committed lines are re-read and their hashes
compared with the stored ones, so a corpus that changed in the meantime is an error.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmo_cache import __version__
from elmo_cache.corpus import Corpus
from elmo_cache.errors import CacheExistsError, CorpusError, ElmoCacheError, InvalidParameterError
from elmo_cache.mix import ALL_LAYERS, MixSpec, parse_layers
from elmo_cache.store import (
    COMPRESSIONS,
    FORMATS,
    Layout,
    Progress,
    Writer,
    infer_format,
    load_progress,
    read_metadata,
    remove_output,
    staging_path,
    writer_class,
)
from elmo_cache.tokenize import TOKENIZATION, sentence_hash

__all__ = ["BuildOptions", "BuildSummary", "build", "DEFAULT_CHUNK_ROWS", "default_chunk_rows", "default_output", "resolve_output"]

DEFAULT_CHUNK_BYTES = 3 * 2**20
"""Largest zarr ``vectors`` chunk the default allows (see :func:`default_chunk_rows`)."""


DEFAULT_CHUNK_ROWS = 512
"""What :func:`default_chunk_rows` gives Original-size layered float16 rows (6 KiB each)."""


def default_chunk_rows(row_bytes: int) -> int:
    """Rows per zarr chunk when none is asked for: the largest power of two within 3 MiB.

    Measured with ``benchmarks/bench_build.py chunks`` (Original-size rows, 3 x 1024 fp16, 6 KiB
    each; 2-core VM): a random sentence read through zarr decodes whole chunks and cost 0.94 ms
    at 128 rows (0.75 MiB), 0.95 ms at 256, 1.01 ms at 512 (3 MiB), 1.62 ms at 1024, 2.65 ms at
    2048 and 4.74 ms at 4096 (24 MiB). Below ~3 MiB zarr's fixed per-read cost dominates, so
    smaller chunks only multiply files (a 2.5G-token corpus at 256 rows is ~10M files). The
    memory-mapped reader is 0.01-0.1 ms whatever the size. Latency follows bytes, not rows, so
    the rule is in bytes: 512 rows for Original fp16 layers, 256 for fp32, 1024 for a fp16 mix.
    """
    rows = 16
    while rows * 2 * row_bytes <= DEFAULT_CHUNK_BYTES and rows < 65536:
        rows *= 2
    return rows


_BATCH_TOKENS = {"cpu": 8192, "cuda": 32768}
# A window never holds more sentences than this, so a file of empty lines still commits.
_WINDOW_MAX_SENTENCES = 1 << 16
# Identity keys: options that change what the cache holds. A cache or interrupted build
# whose identity differs from the command's cannot be reused.
_IDENTITY_KEYS = ("container", "kind", "layers", "mix", "dim", "dtype", "dedupe", "compression", "chunk_rows", "model",
                  "tokenization", "sentence_hash")


@dataclass(frozen=True)
class BuildOptions:
    """What to build and how (every field has a default; see ``elmo-cache build --help``)."""

    # Cache path; None: beside the corpus, "corpus.txt" -> "corpus.zarr" (or ".h5"). Needed for stdin.
    output: str | os.PathLike[str] | None = None
    # Container "zarr" or "hdf5"; None: from the output suffix (.zarr, .h5, .hdf5), else zarr.
    format: str | None = None
    # Layers to store, a subset of 0,1,2 as "1,2" or (1, 2); None: all three. Exclusive with mix.
    layers: str | Sequence[int] | None = None
    # Store one fixed mix gamma * sum_j s_j h_j per token instead of layers (MixSpec.from_raw).
    mix: MixSpec | None = None
    # Store float16 instead of float32 (half the bytes); selection and mixing happen in float32 first.
    fp16: bool = False
    # zarr compressor: "none"/None, "zstd", "blosc-lz4", "blosc-zstd". HDF5 stays uncompressed (memmap).
    compression: str | None = None
    # zarr rows per vectors chunk; None: default_chunk_rows() (chunks of at most 3 MiB). Not valid for HDF5.
    chunk_rows: int | None = None
    # Encode each distinct sentence once; repeated sentences point at its rows.
    dedupe: bool = False
    # Model name or directory for Encoder.load; None with no files given: "original".
    model: str | None = None
    # Explicit options.json + weights HDF5 (both or neither); they win over ``model``.
    options_file: str | os.PathLike[str] | None = None
    weight_file: str | os.PathLike[str] | None = None
    # torch device: "cpu", "cuda", "cuda:N"; None: CUDA when available.
    device: str | None = None
    # Encoder arithmetic "fp32", "bf16" or "fp16" (part of the cache identity: it changes the vectors).
    precision: str = "fp32"
    # LSTM initial state "zero" or "warm" (see elmo_cache.encoder); "carry" is batch dependent, refused.
    initial_state: str = "zero"
    # Tokens per encoder batch (each sentence counts its length + 2 boundary tokens); None: 8192 CPU, 32768 CUDA.
    batch_tokens: int | None = None
    # Sentences are sorted by length within windows of this many batches' worth of tokens. Memory
    # holds about three windows of vectors (Original fp16 layers, CUDA defaults: ~1.5 GB each).
    window_batches: int = 8
    # Bytes that are not UTF-8: "strict" (CorpusError naming the line) or "replace" (U+FFFD).
    errors: str = "strict"
    # Discard any existing cache or interrupted build at the output and start from scratch.
    overwrite: bool = False
    # Show a progress bar on stderr.
    progress: bool = True
    # Seconds between durable commits; 0 commits after every window (slower, for tests).
    commit_seconds: float = 10.0


@dataclass(frozen=True)
class BuildSummary:
    """What a build produced (``str()`` gives the one-paragraph summary the CLI prints)."""

    path: Path
    format: str
    n_sentences: int
    n_tokens: int
    n_rows: int
    n_unique: int
    bytes: int
    # Wall seconds of this run, and tokens (all sentences, repeats included) per second in it.
    seconds: float
    tokens_per_s: float
    # Lines already committed by an earlier, interrupted run.
    resumed_from: int = 0
    # True when the cache was already complete and nothing was done.
    already_complete: bool = False

    def __str__(self) -> str:
        if self.already_complete:
            return (f"{self.path} is already complete ({self.n_sentences:,} sentences, {self.n_tokens:,} tokens); "
                    "nothing to do (pass --overwrite to rebuild it)")
        resumed = f", resumed after line {self.resumed_from:,}" if self.resumed_from else ""
        return (f"wrote {self.path} ({self.format}): {self.n_sentences:,} sentences, {self.n_tokens:,} tokens, "
                f"{self.n_rows:,} rows, {self.n_unique:,} distinct sentences, {_human_bytes(self.bytes)} "
                f"in {self.seconds:.1f} s ({self.tokens_per_s:,.0f} tokens/s{resumed})")


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    raise AssertionError


def _disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def default_output(corpus: str | os.PathLike[str], format: str) -> Path:
    """The cache path beside a corpus: ``data/corpus.txt(.gz)`` -> ``data/corpus.zarr`` (or ``.h5``)."""
    path = Path(corpus)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    stem = Path(name).stem or name
    return path.with_name(stem + (".zarr" if format == "zarr" else ".h5"))


# -- planning -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    output: Path
    format: str
    layers: tuple[int, ...] | None
    mix: MixSpec | None
    dtype: str
    chunk_rows: int | None
    compression: str | None


def _plan(source: Corpus, options: BuildOptions) -> _Plan:
    if options.format is not None and options.format not in FORMATS:
        raise InvalidParameterError(f"format: {options.format!r} is not valid; choose from {list(FORMATS)}")
    if options.output is None and source.path is None:
        raise InvalidParameterError("output: reading the corpus from stdin needs -o/--output")
    suffix_format = infer_format(options.output) if options.output is not None else None
    if options.format and suffix_format and options.format != suffix_format:
        raise InvalidParameterError(
            f"format: --format {options.format} contradicts the output suffix {Path(options.output).suffix!r} ({suffix_format})")
    fmt = options.format or suffix_format or "zarr"
    output = Path(options.output) if options.output is not None else default_output(source.path, fmt)  # type: ignore[arg-type]
    if source.path is not None and output.resolve() == source.path.resolve():
        raise InvalidParameterError(f"output: {output} is the corpus itself; choose another -o/--output")

    if options.mix is not None and options.layers is not None:
        raise InvalidParameterError("layers and mix are exclusive: store either layers or one mix")
    layers = None if options.mix is not None else parse_layers(options.layers)

    compression = None if options.compression in (None, "none") else options.compression
    if compression is not None and compression not in COMPRESSIONS:
        raise InvalidParameterError(f"compression: {compression!r} is not valid; choose from {list(COMPRESSIONS)}")
    if fmt == "hdf5":
        if compression is not None:
            raise InvalidParameterError("compression: only zarr caches can be compressed; HDF5 datasets stay "
                                        "contiguous so that readers can memory-map them")
        if options.chunk_rows is not None:
            raise InvalidParameterError("chunk_rows: only zarr caches are chunked; HDF5 datasets are contiguous")
        chunk_rows = None
    else:
        chunk_rows = None if options.chunk_rows is None else int(options.chunk_rows)  # None: set once dim is known
        if chunk_rows is not None and chunk_rows < 1:
            raise InvalidParameterError(f"chunk_rows: must be a positive number of rows, got {chunk_rows}")
    if options.batch_tokens is not None and options.batch_tokens < 1:
        raise InvalidParameterError(f"batch_tokens: must be positive, got {options.batch_tokens}")
    from elmo_cache.encoder import PRECISIONS

    if options.precision not in PRECISIONS:
        raise InvalidParameterError(f"precision: {options.precision!r} is not valid; choose from {list(PRECISIONS)}")
    if options.initial_state not in ("zero", "warm"):
        raise InvalidParameterError(f"initial_state: {options.initial_state!r} is not valid for a build; choose from "
                                    "['zero', 'warm'] ('carry' makes vectors depend on batch order)")
    if options.window_batches < 1:
        raise InvalidParameterError(f"window_batches: must be positive, got {options.window_batches}")
    if options.commit_seconds < 0:
        raise InvalidParameterError(f"commit_seconds: must be >= 0, got {options.commit_seconds}")
    return _Plan(output, fmt, layers, options.mix, "float16" if options.fp16 else "float32", chunk_rows, compression)


def resolve_output(corpus: str | os.PathLike[str] | Corpus, options: BuildOptions) -> Path:
    """The path ``build(corpus, options)`` will write (validating the options on the way)."""
    source = corpus if isinstance(corpus, Corpus) else Corpus(corpus, errors=options.errors)
    return _plan(source, options).output


def _load_encoder(options: BuildOptions) -> Any:
    from elmo_cache.encoder import load_encoder

    return load_encoder(options.model or "original", options.options_file, options.weight_file,
                        device=options.device, precision=options.precision, initial_state=options.initial_state)


def _identity(plan: _Plan, encoder: Any) -> dict[str, Any]:
    model = dict(encoder.identity)
    return {
        "container": plan.format,
        "kind": "mix" if plan.mix is not None else "layers",
        "layers": list(plan.layers) if plan.layers is not None else None,
        "mix": plan.mix.to_metadata() if plan.mix is not None else None,
        "dim": int(encoder.output_dim),
        "dtype": plan.dtype,
        "dedupe": None,  # filled by build()
        "compression": plan.compression,
        "chunk_rows": plan.chunk_rows,
        "model": model,
        "tokenization": TOKENIZATION,
        "sentence_hash": "blake2b-64-le",
    }


def _comparable(identity: dict[str, Any]) -> dict[str, Any]:
    # The model's display name does not change its vectors (the same files may be named differently).
    out = {key: identity.get(key) for key in _IDENTITY_KEYS}
    if isinstance(out["model"], dict):
        out["model"] = {k: v for k, v in out["model"].items() if k != "name"}
    return out


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    a, b = _comparable(old), _comparable(new)
    parts = []
    for key in _IDENTITY_KEYS:
        if a[key] != b[key]:
            if key == "model":
                keys = sorted(k for k in set(a[key] or {}) | set(b[key] or {}) if (a[key] or {}).get(k) != (b[key] or {}).get(k))
                parts.append(f"model ({', '.join(keys)} differ)")
            else:
                parts.append(f"{key}: {a[key]!r} there, {b[key]!r} now")
    return "; ".join(parts)


def _metadata(identity: dict[str, Any], progress: Progress, *, complete: bool, n_unique: int, build_info: dict[str, Any]) -> dict[str, Any]:
    meta = {
        "format": "elmo-cache",
        "format_version": 1,
        "complete": complete,
        **{k: v for k, v in identity.items() if k != "container"},
        "n_sentences": progress.lines,
        "n_tokens": progress.tokens,
        "n_rows": progress.rows,
        "n_unique": n_unique,
        "elmo_cache_version": __version__,
        "build": build_info,
    }
    return meta


def _options_json(options: BuildOptions) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if isinstance(value, MixSpec):
            value = value.to_metadata()
        elif isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


# -- deduplication ------------------------------------------------------------------------------


class _Seen:
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
    def rebuild(cls, hashes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> _Seen:
        """The state after the committed lines: first occurrence of every non-empty sentence."""
        seen = cls()
        keep = np.flatnonzero(lengths > 0)
        if len(keep):
            _, first = np.unique(hashes[keep], return_index=True)
            lines = keep[first]
            seen.add(np.asarray(hashes[lines]), np.asarray(offsets[lines]), np.asarray(lengths[lines]))
        return seen


# -- the pipeline -------------------------------------------------------------------------------


@dataclass
class _Window:
    first_line: int
    tokens: list[list[str]]
    hashes: np.ndarray  # uint64
    lengths: np.ndarray  # int32


@dataclass
class _Encoded:
    vectors: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    hashes: np.ndarray
    encoded_tokens: int


class _End:
    def __init__(self, done: bool):
        self.done = done


class _Stop(Exception):
    """The consumer went away; the reader thread just ends."""


def _put(q: queue.Queue, item: Any, stop: threading.Event) -> None:
    while True:
        if stop.is_set():
            raise _Stop
        try:
            q.put(item, timeout=0.2)
            return
        except queue.Full:
            continue


def _read_windows(source: Corpus, start: int, committed: np.ndarray | None, window_tokens: int, output: queue.Queue,
                  stop: threading.Event) -> None:
    """Reader thread: put windows (then None at the end, or the exception that stopped it)."""
    tokens: list[list[str]] = []
    hashes: list[int] = []
    first = start
    try:
        cost = 0
        check: list[int] = []
        read = 0
        for number, sentence in source.sentences():
            read = number + 1
            h = sentence_hash(sentence)
            if number < start:
                # Re-read committed lines only to prove the corpus is the one they came from.
                check.append(h)
                if len(check) == 65536 or read == start:
                    _check_prefix(source, committed, read - len(check), check)
                    check = []
                continue
            tokens.append(sentence)
            hashes.append(h)
            cost += len(sentence) + 2
            if cost >= window_tokens or len(tokens) >= _WINDOW_MAX_SENTENCES:
                _put(output, _make_window(first, tokens, hashes), stop)
                first += len(tokens)
                tokens, hashes, cost = [], [], 0
        if read < start:
            raise CacheExistsError(
                f"{source.name} has {read} lines but the interrupted build already stored {start}; the corpus changed "
                "since. Pass --overwrite to start over")
        if tokens:
            _put(output, _make_window(first, tokens, hashes), stop)
            tokens = []
        _put(output, None, stop)
    except _Stop:
        return
    except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
        try:
            if tokens:
                # Lines before a bad one are kept: nothing readable is lost.
                _put(output, _make_window(first, tokens, hashes), stop)
            _put(output, exc, stop)
        except _Stop:
            return


def _make_window(first: int, tokens: list[list[str]], hashes: list[int]) -> _Window:
    return _Window(first, tokens, np.array(hashes, dtype=np.uint64), np.array([len(t) for t in tokens], dtype=np.int32))


def _check_prefix(source: Corpus, committed: np.ndarray | None, first: int, hashes: list[int]) -> None:
    if committed is None:
        return
    stored = np.asarray(committed[first : first + len(hashes)])
    mismatch = np.flatnonzero(stored != np.array(hashes, dtype=np.uint64))
    if len(mismatch):
        line = first + int(mismatch[0])
        raise CacheExistsError(
            f"{source.name}, line {line + 1}: differs from the line the interrupted build stored; the corpus changed "
            "since. Pass --overwrite to start over")


class _WriterThread(threading.Thread):
    def __init__(self, writer: Writer, commit_seconds: float, bar: Any, run_start: float):
        super().__init__(name="elmo-cache-writer", daemon=True)
        self.writer = writer
        self.commit_seconds = commit_seconds
        self.bar = bar
        self.queue: queue.Queue = queue.Queue(maxsize=1)  # one window waits while one is written
        self.error: BaseException | None = None
        self.tokens = 0
        self.run_start = run_start
        self._last_commit = time.monotonic()
        self._encoded_since = 0

    def _commit(self, done: bool) -> None:
        now = time.monotonic()
        self.writer.commit(done=done, seconds=now - self._last_commit, encoded_tokens=self._encoded_since)
        self._last_commit = now
        self._encoded_since = 0

    def run(self) -> None:
        try:
            while True:
                item = self.queue.get()
                if isinstance(item, _End):
                    self._commit(item.done)
                    return
                self.writer.append(item.vectors, item.offsets, item.lengths, item.hashes)
                self._encoded_since += item.encoded_tokens
                self.tokens += int(item.lengths.sum(dtype=np.int64))
                if self.bar is not None:
                    rate = self.tokens / max(1e-9, time.monotonic() - self.run_start)
                    self.bar.set_postfix_str(f"{self.tokens:,} tokens, {rate:,.0f} tok/s", refresh=False)
                    self.bar.update(len(item.lengths))
                if time.monotonic() - self._last_commit >= self.commit_seconds:
                    self._commit(False)
        except BaseException as exc:  # noqa: BLE001 - the main thread raises it
            self.error = exc
            while True:  # unblock the producer; nothing more will be written
                try:
                    self.queue.get_nowait()
                except queue.Empty:
                    break


class _Encoding:
    """Turns windows into rows in input order, in the stored layout and dtype."""

    def __init__(self, encoder: Any, plan: _Plan, batch_tokens: int, dedupe: bool, seen: _Seen | None):
        self.encoder = encoder
        self.plan = plan
        self.batch_tokens = batch_tokens
        self.dedupe = dedupe
        self.seen = seen
        self.torch_dtype = torch.float16 if plan.dtype == "float16" else torch.float32
        self.np_dtype = np.dtype(plan.dtype)
        n_layers = len(plan.layers) if plan.layers is not None else None
        self.row_shape = (encoder.output_dim,) if n_layers is None else (n_layers, encoder.output_dim)
        self.layer_index = None if plan.layers in (None, ALL_LAYERS) else torch.tensor(plan.layers, device=encoder.device)

    def _encode(self, batch: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        """Rows of the batch's sentences, concatenated in batch order, and where each starts."""
        flat, offsets = self.encoder.encode_flat(batch)  # (3, tokens, D) float32 on the device, no padding
        if self.plan.mix is not None:
            out = self.plan.mix.apply(flat, layer_dim=0)  # (tokens, D), float32
        else:
            if self.layer_index is not None:
                flat = flat.index_select(0, self.layer_index)
            out = flat.transpose(0, 1)  # token-major: (tokens, L, D)
        # Cast on the device, so only the stored bytes cross to the host.
        rows = out.to(self.torch_dtype, memory_format=torch.contiguous_format).cpu().numpy()
        starts = offsets[:-1]
        return rows, starts

    def _forget_words(self) -> None:
        # The encoder caches char-CNN vectors per word, and a word's vector carries the last-bit
        # rounding of the batch it was first computed in. Starting every window with an empty
        # cache makes each window's vectors a function of the window alone, so a resumed build
        # is bit-identical to an uninterrupted one (costs ~4% of an Original-size encode).
        self.encoder.clear_word_cache()

    def __call__(self, window: _Window, rows_before: int) -> _Encoded:
        self._forget_words()
        n = len(window.tokens)
        lengths = window.lengths
        offsets = np.empty(n, dtype=np.int64)
        new = np.ones(n, dtype=bool)
        if self.dedupe:
            found, seen_offsets, seen_lengths = self.seen.lookup(window.hashes)
            local: dict[int, int] = {}  # hash -> line in window
        row = rows_before
        for i in range(n):
            length = int(lengths[i])
            if self.dedupe and length:
                h = int(window.hashes[i])
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
        vectors = np.empty((row - rows_before, *self.row_shape), dtype=self.np_dtype)
        todo = sorted((i for i in range(n) if new[i] and lengths[i]), key=lambda i: lengths[i])
        encoded = 0
        start = 0
        while start < len(todo):
            stop, cost = start, 0
            while stop < len(todo) and (stop == start or cost + lengths[todo[stop]] + 2 <= self.batch_tokens):
                cost += int(lengths[todo[stop]]) + 2
                stop += 1
            batch = todo[start:stop]
            out, starts = self._encode([window.tokens[i] for i in batch])
            for k, i in enumerate(batch):
                begin, length = int(offsets[i]) - rows_before, int(lengths[i])
                vectors[begin : begin + length] = out[starts[k] : starts[k] + length]
                encoded += length
            start = stop
        if self.dedupe:
            firsts = np.fromiter(local.values(), dtype=np.int64, count=len(local))
            self.seen.add(window.hashes[firsts], offsets[firsts], lengths[firsts])
        return _Encoded(vectors, offsets, lengths, window.hashes, encoded)


# -- the entry point ----------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _prepare_output(plan: _Plan, identity: dict[str, Any], overwrite: bool) -> tuple[str, Any]:
    """Decide what to do about what is already at the output: ("complete", meta), ("resume", progress) or ("fresh", None)."""
    output = plan.output
    staging = staging_path(output)
    if output.exists() or output.is_symlink():
        meta = read_metadata(output)
        there = {**meta, "container": "zarr" if output.is_dir() else "hdf5"} if meta else None
        if not overwrite:
            if meta is None:
                raise CacheExistsError(f"{output} exists and is not an elmo-cache cache; choose another -o/--output "
                                       "or pass --overwrite to replace it")
            if _comparable(there) != _comparable(identity):
                raise CacheExistsError(f"{output} was built with other options ({_differences(there, identity)}); "
                                       "pass --overwrite to rebuild it")
            if meta.get("complete") is True:
                remove_output(output / ".build") if (output / ".build").is_dir() else None
                if staging.exists():
                    remove_output(staging)
                return "complete", meta
            raise CacheExistsError(f"{output} is an incomplete cache not written by this build; pass --overwrite to rebuild it")
        remove_output(output)
    if staging.exists():
        progress = None if overwrite else load_progress(output)
        if progress is not None:
            if _comparable(progress.identity) != _comparable(identity):
                raise CacheExistsError(
                    f"{staging} holds an interrupted build with other options ({_differences(progress.identity, identity)}); "
                    "rerun it with its own options to resume it, or pass --overwrite to discard it")
            return "resume", progress
        remove_output(staging)
    return "fresh", None


def build(corpus: str | os.PathLike[str] | Corpus, options: BuildOptions | None = None, encoder: Any = None) -> BuildSummary:
    """Encode every line of ``corpus`` and write the cache; returns a :class:`BuildSummary`.

    ``corpus``: a path (``-`` for stdin; gzip is detected) or a :class:`~elmo_cache.corpus.Corpus`.
    ``encoder``: an :class:`~elmo_cache.Encoder` to use instead of loading ``options.model``.
    Running the same build again after an interruption (even ``kill -9``) resumes it and
    ends with the cache an uninterrupted build writes; on a complete cache it does nothing.
    Raises :class:`~elmo_cache.errors.CacheExistsError` when the output holds a cache or an
    interrupted build made with other options (unless ``overwrite``),
    :class:`~elmo_cache.errors.CorpusError` for unreadable input (lines before the bad one are
    committed first), :class:`~elmo_cache.errors.InvalidParameterError` for bad options.
    """
    options = options or BuildOptions()
    source = corpus if isinstance(corpus, Corpus) else Corpus(corpus, errors=options.errors)
    plan = _plan(source, options)
    if encoder is None:
        encoder = _load_encoder(options)
    elif getattr(encoder, "initial_state", "zero") == "carry":
        raise InvalidParameterError("encoder: initial_state 'carry' makes vectors depend on batch order; use 'zero' or 'warm'")
    row_shape = (encoder.output_dim,) if plan.mix is not None else (len(plan.layers), encoder.output_dim)
    if plan.format == "zarr" and plan.chunk_rows is None:
        row_bytes = int(np.prod(row_shape)) * np.dtype(plan.dtype).itemsize
        plan = dataclasses.replace(plan, chunk_rows=default_chunk_rows(row_bytes))
    identity = {**_identity(plan, encoder), "dedupe": bool(options.dedupe)}
    run_start = time.monotonic()

    action, state = _prepare_output(plan, identity, options.overwrite)
    if action == "complete":
        meta = state
        return BuildSummary(plan.output, plan.format, meta["n_sentences"], meta["n_tokens"], meta["n_rows"], meta["n_unique"],
                            _disk_bytes(plan.output), 0.0, 0.0, already_complete=True)

    layout = Layout(plan.format, row_shape, plan.dtype, plan.chunk_rows, plan.compression)
    build_info = {"args": _options_json(options), "input": source.describe()}
    cls = writer_class(plan.format)
    try:
        if action == "resume":
            writer = cls.resume(plan.output, layout, state)
        else:
            plan.output.parent.mkdir(parents=True, exist_ok=True)
            progress = Progress(identity=identity, started=_now())
            meta = _metadata(identity, progress, complete=False, n_unique=0, build_info={**build_info, "started": progress.started})
            writer = cls.create(plan.output, layout, progress, meta)
    except OSError as exc:
        raise ElmoCacheError(f"cannot write the build of {plan.output} ({exc})") from None
    progress = writer.progress
    resumed_from, tokens_from = progress.lines, progress.tokens

    if not progress.done:
        _run(source, plan, options, encoder, writer, run_start)

    hashes, _ = writer.index()
    build_info.update(started=progress.started, finished=_now(), seconds=round(progress.seconds, 3),
                      tokens_per_s=round(progress.tokens / progress.seconds, 1) if progress.seconds > 0 else None)
    meta = _metadata(identity, progress, complete=True, n_unique=len(hashes), build_info=build_info)
    try:
        path = writer.finalize(meta)
    except OSError as exc:
        raise ElmoCacheError(f"cannot finish {plan.output} ({exc}); rerun the same command to retry") from None
    seconds = time.monotonic() - run_start
    return BuildSummary(path, plan.format, progress.lines, progress.tokens, progress.rows, len(hashes), _disk_bytes(path),
                        seconds, (progress.tokens - tokens_from) / max(seconds, 1e-9), resumed_from=resumed_from)


def _run(source: Corpus, plan: _Plan, options: BuildOptions, encoder: Any, writer: Writer, run_start: float) -> None:
    """Encode from the last committed line to the end of the corpus, committing as it goes."""
    progress = writer.progress
    device_type = getattr(getattr(encoder, "device", None), "type", "cpu")
    batch_tokens = options.batch_tokens or _BATCH_TOKENS.get(device_type, _BATCH_TOKENS["cpu"])
    committed = writer.hashes.read(progress.lines) if progress.lines else None
    seen = None
    if options.dedupe:
        seen = _Seen.rebuild(np.asarray(committed) if committed is not None else np.empty(0, np.uint64),
                             np.asarray(writer.offsets.read(progress.lines)), np.asarray(writer.lengths.read(progress.lines)))
    encode = _Encoding(encoder, plan, batch_tokens, options.dedupe, seen)

    bar = None
    if options.progress:
        from tqdm import tqdm

        total = source.count_lines() if source.is_regular_file else None
        bar = tqdm(total=total, initial=progress.lines, unit=" sent", desc="encoding", file=sys.stderr,
                   dynamic_ncols=True, smoothing=0.05)
    windows: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    reader = threading.Thread(target=_read_windows, name="elmo-cache-reader", daemon=True,
                              args=(source, progress.lines, committed, batch_tokens * options.window_batches, windows, stop))
    writer_thread = _WriterThread(writer, options.commit_seconds, bar, run_start)
    reader.start()
    writer_thread.start()
    rows = progress.rows
    failure: BaseException | None = None
    done = False
    try:
        with torch.inference_mode():
            while True:
                item = windows.get()
                if item is None:
                    done = True
                    break
                if isinstance(item, BaseException):
                    failure = item
                    break
                try:
                    encoded = encode(item, rows)
                except torch.cuda.OutOfMemoryError:
                    raise ElmoCacheError(
                        f"the device ran out of memory encoding lines {item.first_line + 1}-{item.first_line + len(item.tokens)}; "
                        f"rerun with a smaller --batch-tokens (now {batch_tokens}) to resume") from None
                rows += len(encoded.vectors)
                while True:  # hand over, unless the writer died
                    if writer_thread.error is not None:
                        break
                    try:
                        writer_thread.queue.put(encoded, timeout=0.2)
                        break
                    except queue.Full:
                        continue
                if writer_thread.error is not None:
                    break
    finally:
        stop.set()
        # Whatever happened, let the writer commit what it already has: nothing is lost.
        if writer_thread.error is None:
            writer_thread.queue.put(_End(done))
        writer_thread.join()
        if bar is not None:
            bar.close()
        reader.join(timeout=5)
    if writer_thread.error is not None:
        exc = writer_thread.error
        if isinstance(exc, ElmoCacheError):
            raise exc
        raise ElmoCacheError(f"writing {writer.staging} failed ({exc}); everything committed before is kept: "
                             "fix the cause (disk space?) and rerun the same command to resume") from exc
    if failure is not None:
        if isinstance(failure, (ElmoCacheError, KeyboardInterrupt)):
            raise failure
        raise CorpusError(f"reading {source.name} failed ({failure})") from failure
