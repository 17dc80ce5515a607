"""The local engine of ``build``: walk a corpus once and write its ELMo vectors into a cache (docs/FORMAT.md).

The build's steps (plan, output, summary) are :mod:`elmo_cache.builder.skeleton`'s; this engine
runs and finishes it in one process. Three stages overlap, each in its own thread, so the build
runs at the encoder's speed:

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

import logging
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from elmo_cache.builder.alloc import WindowBuffers
from elmo_cache.builder.codebooks import corpus_windows, final_arrays, train_in_process
from elmo_cache.builder.corpus_record import compare, corpus_entry, line_hashes
from elmo_cache.builder.dedupe import SeenSentences
from elmo_cache.builder.encoding import (
    Window,
    WindowCutter,
    WindowEncoder,
    assign_window,
    default_batch_tokens,
    windows_entry,
)
from elmo_cache.builder.engine import BuildJob, Finished
from elmo_cache.builder.options import BuildOptions
from elmo_cache.builder.output import check_resumed
from elmo_cache.builder.plan import Plan, metadata, options_json
from elmo_cache.builder.update import StoredWindows, WindowCounts, copy_and_encode, update_batch_tokens
from elmo_cache.encoder.batch_free import rows_batch_free
from elmo_cache.errors import CorpusChangedError, CorpusError, ElmoCacheError, InvalidParameterError
from elmo_cache.store import OutputKind, OutputState, Progress, Writer, open_cache_arrays, staging_path, writer_class
from elmo_cache.store.format import metadata_digest
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.tokenize import sentence_hash

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder

__all__ = ["LocalEngine", "LocalRun", "load_encoder"]

_log = logging.getLogger("elmo_cache.builder")


@dataclass
class _Encoded:
    vectors: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    hashes: np.ndarray
    encoded_tokens: int
    tokens: list[list[str]]
    # The window's pooled vectors (--pool), else None.
    pooled: np.ndarray | None = None
    # The row its vectors start at (the rows before it up to a vectors file's start, zarr: Layout.window_rows).
    first_row: int = 0
    # An update's window whose vectors files the writer takes whole from the cache it updates: the row its rows
    # start at there (``vectors`` then holds zeros that are not written); else None.
    linked_from: int | None = None


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


def _read_windows(
    source: Corpus,
    start: int,
    committed: np.ndarray | None,
    window_tokens: int,
    output: queue.Queue,
    stop: threading.Event,
    known: Iterator[tuple[list[str], int]] | None = None,
) -> None:
    """Reader thread: put windows (then None at the end, or the exception that stopped it). ``known``: the tokens
    and keys of the corpus's first lines, as an update's corpus check found them (not read again)."""
    cutter = WindowCutter(start, window_tokens)
    try:
        check: list[int] = []
        read = 0
        for number, sentence, h in _keyed_sentences(source, known):
            read = number + 1
            if number < start:
                # Re-read committed lines only to prove the corpus is the one they came from.
                check.append(h)
                if len(check) == 65536 or read == start:
                    _check_prefix(source, committed, read - len(check), check)
                    check = []
                continue
            window = cutter.add(sentence, h)
            if window is not None:
                _put(output, window, stop)
        if read < start:
            _changed_since(
                source, committed, f"{source.name} has {read} lines but the interrupted build stored {start}"
            )
        window = cutter.flush()
        if window is not None:
            _put(output, window, stop)
        _put(output, None, stop)
    except _Stop:
        return
    except BaseException as exc:
        try:
            # Lines before a bad one are kept: nothing readable is lost.
            window = cutter.flush()
            if window is not None:
                _put(output, window, stop)
            _put(output, exc, stop)
        except _Stop:
            return


def _keyed_sentences(
    source: Corpus, known: Iterator[tuple[list[str], int]] | None
) -> Iterator[tuple[int, list[str], int]]:
    """``(line, tokens, key)`` of every sentence of ``source``: those of ``known`` first, then the corpus's from
    the line after them on (skipped unread, :meth:`Corpus.sentences`)."""
    first = 0
    for tokens, key in known if known is not None else ():
        yield first, tokens, key
        first += 1
    for number, sentence in source.sentences(first):
        yield number, sentence, sentence_hash(sentence)


def _check_prefix(source: Corpus, committed: np.ndarray | None, first: int, hashes: list[int]) -> None:
    if committed is None:
        return
    stored = np.asarray(committed[first : first + len(hashes)])
    mismatch = np.flatnonzero(stored != np.array(hashes, dtype=np.uint64))
    if len(mismatch):
        line = first + int(mismatch[0])
        _changed_since(
            source, committed, f"{source.name}, line {line + 1}: differs from the line the interrupted build stored"
        )


def _changed_since(source: Corpus, committed: np.ndarray | None, found: str) -> None:
    """Raise :class:`CorpusChangedError` for a resume over another version of the corpus: what ``found``, then
    (a file can be read again) how many of the committed lines changed or were removed and what was inserted."""
    detail = ""
    if committed is not None and source.is_regular_file:
        changes = compare(np.asarray(committed), line_hashes(source), stored_is_prefix=True)
        if changes is not None:
            detail = f" ({changes.describe()}, among the {len(committed)} lines it stored)"
    raise CorpusChangedError(
        f"{found}: the corpus changed since the build was interrupted{detail}. Rerun with the corpus it was started "
        "on to resume it, or pass --overwrite to start over"
    )


class _WriterThread(threading.Thread):
    def __init__(
        self, writer: Writer, commit_seconds: float, bar: Any, run_start: float, buffers: WindowBuffers | None = None
    ):
        super().__init__(name="elmo-cache-writer", daemon=True)
        self.writer = writer
        # Where written windows' rows go back to, for the encoder's next windows.
        self.buffers = buffers
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
                if item.linked_from is not None:
                    self.writer.link_window(item.linked_from, item.first_row, len(item.vectors))  # type: ignore[attr-defined]
                self.writer.append(
                    item.vectors,
                    item.offsets,
                    item.lengths,
                    item.hashes,
                    item.tokens,
                    item.pooled,
                    first_row=item.first_row,
                )
                if self.buffers is not None:  # written: the writers keep no reference to the rows they append
                    self.buffers.release(item.vectors)
                self._encoded_since += item.encoded_tokens
                self.tokens += int(item.lengths.sum(dtype=np.int64))
                if self.bar is not None:  # the count moves as sentences are encoded; this adds what is written
                    rate = self.tokens / max(1e-9, time.monotonic() - self.run_start)
                    self.bar.set_postfix_str(f"{self.tokens:,} tokens written, {rate:,.0f} tok/s")
                if time.monotonic() - self._last_commit >= self.commit_seconds:
                    self._commit(False)
        except BaseException as exc:
            self.error = exc
            while True:  # unblock the producer; nothing more will be written
                try:
                    self.queue.get_nowait()
                except queue.Empty:
                    break


def _encode_window(
    encode: WindowEncoder,
    seen: SeenSentences | None,
    window: Window,
    rows_before: int,
    bar: Any,
    stored: StoredWindows | None = None,
    counts: WindowCounts | None = None,
    align: int = 1,
) -> _Encoded:
    """The rows of ``window``: an update's ``stored`` ones when the cache it updates holds this window as a
    fresh build encodes it, else encoded. Its stored rows start at ``rows_before`` rounded up to ``align``."""
    offsets, new, first = assign_window(window, rows_before, seen, align)
    counts = counts if counts is not None else WindowCounts()
    reused = stored.rows(window, new) if stored is not None else None
    if reused is not None:
        counts.windows_reused += 1
        counts.lines_reused += len(window.tokens)
        if bar is not None:
            bar.update(len(window.tokens))
        vectors, pooled, linked_from = reused
        if linked_from is not None and stored is not None:
            counts.count_linked(len(vectors), stored.link_rows)
        return _Encoded(vectors, offsets, window.lengths, window.hashes, 0, window.tokens, pooled, first, linked_from)
    progress = None if bar is None else bar.update  # sentences as they are encoded, not as windows are written
    sources = stored.sources(window, new) if stored is not None else None
    if stored is not None and sources is not None and (sources >= 0).any():
        # A batch-free device: the window's sentences the cache holds are copied, the others encoded.
        to_encode = int((np.asarray(new, dtype=bool) & (sources < 0) & (window.lengths > 0)).sum())
        counts.windows_encoded += bool(to_encode)
        counts.windows_reused += not to_encode
        counts.lines_encoded += to_encode
        counts.lines_reused += len(window.tokens) - to_encode
        vectors, pooled, encoded = copy_and_encode(encode, window, offsets, new, first, stored, sources, progress)
        return _Encoded(vectors, offsets, window.lengths, window.hashes, encoded, window.tokens, pooled, first)
    counts.windows_encoded += 1
    counts.lines_encoded += len(window.tokens)
    vectors, pooled, encoded = encode.encode(
        window.tokens, window.lengths, offsets, new, first, progress, first_line=window.first_line
    )
    return _Encoded(vectors, offsets, window.lengths, window.hashes, encoded, window.tokens, pooled, first)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class LocalEngine:
    """The one-process engine: reader, encoder and writer threads (see the module docstring)."""

    name = "local"
    # It updates a cache in place (build --update): elmo_cache.builder.update.
    updates = True

    def __init__(self, encoder: Encoder | None = None):
        # The encoder given to build(), used instead of loading the model.
        self.given = encoder
        # The encoder the windows are encoded with, set by session().
        self.encoder: Encoder | None = None

    @classmethod
    def from_arguments(cls, *, encoder: Encoder | None, address: str | None, workers: int | None) -> LocalEngine:
        if address is not None or workers is not None:
            raise InvalidParameterError("address, workers: only the ray engine takes them (engine='ray')")
        return cls(encoder)

    def check(self, source: Corpus, plan: Plan) -> None:
        """Any corpus and container: nothing to refuse."""

    @contextmanager
    def session(self, job: BuildJob) -> Iterator[None]:
        # Loaded before the output is touched: a model that cannot load (a precision this CPU lacks)
        # must not cost an --overwrite its old cache.
        self.encoder = self.given if self.given is not None else load_encoder(job)
        yield

    def interrupted(self, output: Path, found: OutputState) -> bool:
        return found.progress is not None  # the writer's committed progress (Container.inspect)

    def start(self, job: BuildJob, found: OutputState) -> LocalRun:
        assert self.encoder is not None, "start() runs inside session()"
        return LocalRun(job, self.encoder, found)


def load_encoder(job: BuildJob) -> Encoder:
    """The encoder of the job's model files, on the options' device."""
    from elmo_cache.encoder.encoder import Encoder

    options = job.options
    return Encoder.load(
        job.model_files, device=options.device, precision=options.precision, initial_state=options.initial_state
    )


class LocalRun:
    """One local build from its staging (created, or resumed from its last commit) to the published cache."""

    def __init__(self, job: BuildJob, encoder: Encoder, found: OutputState):
        self.job = job
        self.encoder = encoder
        # This run's wall time counts from here: after the model loaded.
        self.began = time.monotonic()
        plan, options = job.plan, job.options
        layout = plan.layout()
        self.build_info: dict[str, Any] = {"args": options_json(options), "input": job.source.describe()}
        # The metadata of the cache this build updates in place (build --update), else None.
        self.updating = found.updating
        self.unchanged_lines = found.unchanged_lines
        device_type = getattr(getattr(encoder, "device", None), "type", "cpu")
        self.batch_tokens = (
            default_batch_tokens(options, device_type, job.model.identity)
            if self.updating is None
            else update_batch_tokens(plan.output, self.updating, options.batch_tokens, options.window_batches)
        )
        # How this build cuts windows (the metadata's ``windows``); None once a resume finds another rule.
        self.windows: dict[str, Any] | None = windows_entry(self.batch_tokens, options.window_batches)
        self.counts = WindowCounts()
        cls = writer_class(plan.format)
        if found.progress is not None:  # (CacheExistsError is an OSError: raised before the try below)
            check_resumed(staging_path(plan.output), found.progress.identity, job.identity)
        try:
            if found.kind is OutputKind.RESUMABLE:
                assert found.progress is not None
                self.writer = cls.resume(plan.output, layout, found.progress)
            else:
                updating = None if self.updating is None else metadata_digest(self.updating)
                progress = Progress(identity=job.identity, started=_now(), windows=self.windows, updating=updating)
                meta = metadata(
                    job.identity,
                    progress,
                    complete=False,
                    n_unique=0,
                    build_info={**self.build_info, "started": progress.started},
                    windows=self.windows,
                )
                self.writer = cls.create(plan.output, layout, progress, meta)
        except OSError as exc:
            raise ElmoCacheError(f"cannot write the build of {plan.output} ({exc})") from None
        self.resumed_from, self.tokens_from = self.writer.progress.lines, self.writer.progress.tokens
        if found.kind is OutputKind.RESUMABLE and self.writer.progress.windows != self.windows:
            # Committed lines cut by another rule (an earlier elmo-cache cut windows by count) or other sizes: they
            # stay, the rest is cut by this run's. The cache then records no rule (an update refuses it) and says so.
            self.windows = None
            if self.writer.progress.lines:
                _log.warning(
                    "%s: resuming a build whose committed lines were cut into windows another way (started by an "
                    "earlier elmo-cache, or with other --batch-tokens/--window-batches); the lines still to come are "
                    "cut as this run cuts them, so their vectors may differ in the last bits from an uninterrupted "
                    "build's, and build --update will not apply to this cache (rebuild it with --overwrite for that)",
                    plan.output,
                )

    def run(self) -> None:
        if not self.writer.progress.done:
            job = self.job
            batch_tokens = self.batch_tokens
            window_tokens = batch_tokens * job.options.window_batches
            # pq: the codebooks, trained on the corpus's first windows before any row is written (or staged before).
            windows = corpus_windows(job.source, window_tokens)
            train_in_process(self.writer.staging, job.plan, self.encoder, windows, batch_tokens, job.options.progress)
            stored = None
            if self.updating is not None:
                stored = StoredWindows(job.plan.output, self.updating, window_tokens, self.writer.layout.row_shape)
                stored.usable = self._same_codebooks()
                stored.batch_free = rows_batch_free(self.encoder)
                self.counts.batch_free = stored.batch_free
                # zarr: whole vectors files kept; HDF5: runs of rows the finish copies from the old file.
                link = getattr(self.writer, "link_unchanged", None)
                layout = self.writer.layout
                same_files = all(self.updating.get(key) == getattr(layout, key) for key in ("chunk_rows", "shard_rows"))
                # A re-chunked cache's files are all new, and so are those of a cache whose windows did not start
                # files of their own (windows version 2): its rows sit elsewhere in its files than in this build's.
                # An HDF5 cache's rows are taken a row at a time (file_rows 1): any run of them, in any version.
                file_rows = int(getattr(self.writer, "file_rows", 0))
                if link is not None and stored.usable and same_files and (stored.files_per_window or file_rows == 1):
                    kept = link(job.plan.output, stored.unchanged_rows(self.unchanged_lines))
                    self.counts.count_linked(kept * file_rows, file_rows)
                    stored.kept_rows = kept * file_rows
                    # A reused window's rows taken whole wherever it moved (its files, in a zarr cache whose
                    # windows start files), unless the cache has no block sums to check them by.
                    stored.link_rows = file_rows if "vectors" in stored.guards else 0
            _run(
                job.source,
                job.plan,
                job.options,
                self.encoder,
                self.writer,
                self.began,
                batch_tokens,
                stored,
                self.counts,
                self.unchanged_lines,
            )

    def _same_codebooks(self) -> bool:
        """Whether the rows of the cache being updated are codes of this build's codebooks: a pq/opq cache's are
        trained on the corpus's first rows, which an edit there changes (then every window is encoded)."""
        plan = self.job.plan
        if plan.codec.training_vectors is None or not self.writer.layout.token_rows:
            return True
        _, _, arrays, _ = open_cache_arrays(plan.output)
        for name, values in final_arrays(self.writer.staging, plan).items():
            there = arrays.get(name)
            if there is None or not np.array_equal(np.asarray(there[:]), values):
                return False
        return True

    def finish(self) -> Finished:
        plan, progress = self.job.plan, self.writer.progress
        hashes, _ = self.writer.index()
        self.build_info.update(
            started=progress.started,
            finished=_now(),
            seconds=round(progress.seconds, 3),
            tokens_per_s=round(progress.tokens / progress.seconds, 1) if progress.seconds > 0 else None,
        )
        corpus = corpus_entry(self.writer.sentences().read_keys, progress.lines)
        meta = metadata(
            self.job.identity,
            progress,
            complete=True,
            n_unique=len(hashes),
            build_info=self.build_info,
            corpus=corpus,
            windows=self.windows,
        )
        if self.writer.layout.token_rows:  # a pool-only cache holds no codebooks: it has no codes
            self.writer.extra_arrays = final_arrays(self.writer.staging, plan)
        try:
            path = self.writer.finalize(meta)
        except OSError as exc:
            raise ElmoCacheError(f"cannot finish {plan.output} ({exc}); rerun the same command to retry") from None
        return Finished(
            path,
            progress.lines,
            progress.tokens,
            self.writer.stored_rows,
            len(hashes),
            time.monotonic() - self.began,
            progress.tokens - self.tokens_from,
            {"resumed_from": self.resumed_from, "updated": self.updating is not None, **self.counts.summary()},
        )


def _run(
    source: Corpus,
    plan: Plan,
    options: BuildOptions,
    encoder: Encoder,
    writer: Writer,
    run_start: float,
    batch_tokens: int,
    stored: StoredWindows | None = None,
    counts: WindowCounts | None = None,
    unchanged_lines: int = 0,
) -> None:
    """Encode from the last committed line to the end of the corpus, committing as it goes: a reader
    thread cuts windows, this thread encodes them (or, updating, copies ``stored`` rows), a writer thread
    commits their rows. ``unchanged_lines``: an update's lines before the first the corpus check found changed."""
    progress = writer.progress
    committed = writer.hashes.read(progress.lines) if progress.lines else None
    seen = _seen_sentences(writer, committed) if options.dedupe else None
    buffers = WindowBuffers()
    encode = WindowEncoder(encoder, plan, batch_tokens, source.name, buffers)
    bar = _progress_bar(source, progress.lines) if options.progress else None
    windows: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    # An update's lines before its first change are the cache's own: their tokens come from it.
    known = stored.sentences(unchanged_lines) if stored is not None else None
    reader = threading.Thread(
        target=_read_windows,
        name="elmo-cache-reader",
        daemon=True,
        args=(source, progress.lines, committed, batch_tokens * options.window_batches, windows, stop, known),
    )
    writer_thread = _WriterThread(writer, options.commit_seconds, bar, run_start, buffers)
    reader.start()
    writer_thread.start()
    failure: BaseException | None = None
    done = False
    try:
        done, failure = _encode_windows(
            windows,
            encode,
            seen,
            progress.rows,
            bar,
            writer_thread,
            batch_tokens,
            stored,
            counts,
            writer.layout.window_rows,
        )
    finally:
        stop.set()
        # Whatever happened, let the writer commit what it already has: nothing is lost.
        if writer_thread.error is None:
            writer_thread.queue.put(_End(done))
        writer_thread.join()
        if bar is not None:
            bar.close()
        reader.join(timeout=5)
        if seen is not None:
            seen.close()
    _raise_what_stopped_it(writer_thread.error, failure, writer, source)


def _seen_sentences(writer: Writer, committed: Any) -> SeenSentences:
    """The distinct sentences of the lines already committed, for a resumed dedupe build."""
    lines = writer.progress.lines
    return SeenSentences.rebuild(
        np.asarray(committed) if committed is not None else np.empty(0, np.uint64),
        np.asarray(writer.offsets.read(lines)),
        np.asarray(writer.lengths.read(lines)),
        writer.committed_key,
        writer.build_dir / "seen",
    )


def _progress_bar(source: Corpus, lines_done: int) -> Any:
    from elmo_cache.progress import progress_bar

    total = source.count_sentences() if source.is_regular_file else None
    return progress_bar(total=total, initial=lines_done, unit=" sent", desc="encoding", smoothing=0.05)


def _encode_windows(
    windows: queue.Queue,
    encode: WindowEncoder,
    seen: SeenSentences | None,
    rows: int,
    bar: Any,
    writer_thread: _WriterThread,
    batch_tokens: int,
    stored: StoredWindows | None = None,
    counts: WindowCounts | None = None,
    align: int = 1,
) -> tuple[bool, BaseException | None]:
    """Encode the reader's windows and hand them to the writer until the corpus ends (``(True, None)``),
    the reader fails (``(False, its error)``) or the writer dies (``(False, None)``, its error on it)."""
    with torch.inference_mode():
        while True:
            item = windows.get()
            if item is None:
                return True, None
            if isinstance(item, BaseException):
                return False, item
            try:
                encoded = _encode_window(encode, seen, item, rows, bar, stored, counts, align)
            except torch.cuda.OutOfMemoryError:
                raise ElmoCacheError(
                    f"the device ran out of memory encoding lines {item.first_line + 1}-"
                    f"{item.first_line + len(item.tokens)}; "
                    f"rerun with a smaller --batch-tokens (now {batch_tokens}) to resume"
                ) from None
            rows = encoded.first_row + len(encoded.vectors)
            if not _hand_over(writer_thread, encoded):
                return False, None


def _hand_over(writer_thread: _WriterThread, encoded: Any) -> bool:
    """Queue ``encoded`` for the writer; False when the writer died instead."""
    while writer_thread.error is None:
        try:
            writer_thread.queue.put(encoded, timeout=0.2)
            return True
        except queue.Full:
            continue
    return False


def _raise_what_stopped_it(
    writer_error: BaseException | None, failure: BaseException | None, writer: Writer, source: Corpus
) -> None:
    """The writer's error, else the reader's, as the error a user reads (None: the run finished)."""
    if writer_error is not None:
        if isinstance(writer_error, ElmoCacheError):
            raise writer_error
        raise ElmoCacheError(
            f"writing {writer.staging} failed ({writer_error}); everything committed before is kept: "
            "fix the cause (disk space?) and rerun the same command to resume"
        ) from writer_error
    if failure is not None:
        if isinstance(failure, (ElmoCacheError, KeyboardInterrupt)):
            raise failure
        raise CorpusError(f"reading {source.name} failed ({failure})") from failure
