"""What both build engines share so that they write the same bytes: the window cuts and the window encoding.

A *window* is a run of consecutive sentences of about ``window_batches * batch_tokens`` tokens
(:class:`WindowCutter`); it is a function of the corpus and those two options alone. Its cuts are
*content-defined*: where a window ends depends on the sentences near the cut, not on how many tokens
came before, so an edit to the corpus changes the windows around it and no others (the windows resync
after it), and an update (:mod:`elmo_cache.builder.update`) re-encodes only those. Each window is
encoded on its own (:class:`WindowEncoder`): its sentences sorted by length, batched by
``batch_tokens``, with an empty word cache. So the vectors of a window do not depend on which
process encodes it, nor on what was encoded before: the local pipeline and the distributed build
(:mod:`elmo_cache.builder.ray.engine`) give byte-identical caches. Each batch goes through
:class:`BatchEncoder` (the selection, the codec, the pool, the finiteness check), which write-back also uses
for a sentence encoded alone (:mod:`elmo_cache.builder.writeback`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from elmo_cache.builder.alloc import WindowBuffers, fix_mmap_threshold, trim_heap
from elmo_cache.builder.dedupe import SeenSentences, assign_rows, check_hashes
from elmo_cache.builder.options import BuildOptions
from elmo_cache.builder.plan import Plan
from elmo_cache.encoder.names import batch_tokens_for
from elmo_cache.encoder.transfer import HostCopy, to_device
from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.codecs import nonfinite_rows, stored_rows_on_device
from elmo_cache.rows.pooling import pool_batch

if TYPE_CHECKING:
    import torch

    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.rows.codecs import RowCodec
    from elmo_cache.rows.pooling import Pool
    from elmo_cache.rows.selection import Selection

__all__ = [
    "BatchEncoder",
    "EncodedBatch",
    "SubmittedBatch",
    "Window",
    "WindowCutter",
    "WindowEncoder",
    "assign_window",
    "first_stored_row",
    "default_batch_tokens",
    "WINDOW_MAX_SENTENCES",
    "WINDOW_RULE",
    "is_cut_point",
    "window_bounds",
    "windows_entry",
]

# A window never holds more sentences than this, so a file of empty lines still commits.
WINDOW_MAX_SENTENCES = 1 << 16


def is_cut_point(sentence_hash: int, cost: int, span: int) -> bool:
    """Whether a window may end after a sentence of hash ``sentence_hash`` costing ``cost`` tokens: with
    probability ``cost / span`` for a uniform hash, so cut points are spaced about ``span`` tokens apart
    whatever the sentences' lengths."""
    return sentence_hash % span < cost


def default_batch_tokens(options: BuildOptions, device_type: str, model_identity: dict | None = None) -> int:
    """Tokens per encoder batch: ``options.batch_tokens``, else the default of the device type for the model of
    ``model_identity`` (its ``options["format"]``; None: ELMo)."""
    model_format = ((model_identity or {}).get("options") or {}).get("format")
    return options.batch_tokens or batch_tokens_for(device_type, model_format)


def windows_entry(batch_tokens: int, window_batches: int) -> dict[str, int | str]:
    """Metadata ``windows``: how the build cut and batched the corpus (:data:`WINDOW_RULE`, the window's
    target tokens and the batch's), all of which the stored bytes depend on in their last bits."""
    return {**WINDOW_RULE, "window_tokens": batch_tokens * window_batches, "batch_tokens": batch_tokens}


@dataclass
class Window:
    first_line: int
    tokens: list[list[str]]
    hashes: np.ndarray  # uint64
    lengths: np.ndarray  # int32


WINDOW_RULE: dict[str, int | str] = {"cut": "content-defined", "version": 3}
"""The rule :class:`WindowCutter` cuts by, as the metadata's ``windows`` records it (docs/FORMAT.md): an update
reuses a cache's rows only when its windows were cut by this rule with the same sizes. Version 2: the rows of an
encoder that rounds its products' row counts (:mod:`elmo_cache.model.bilm`), whose last bits differ from version
1's, so a version-1 cache's rows are not what this elmo-cache's fresh build writes. Version 3: the same rows, each
window's starting a zarr vectors file of its own (``Layout.window_rows``), so an update may take a window's files
whole wherever it moved; a version-2 cache's rows are still copied (not its files)."""

READABLE_WINDOW_VERSIONS = (2, 3)
"""Versions of ``windows`` whose rows an update copies (the same bits as this encoder's)."""


class WindowCutter:
    """Cuts consecutive sentences into windows: :meth:`add` returns a window once it ends.

    A window of target size ``W = window_tokens`` (a sentence costs its tokens + 2) ends after a sentence
    once it holds at least ``3 W / 4`` tokens and that sentence is a *cut point*: its hash modulo ``W / 4`` is
    below its cost, so about one cut point per ``W / 4`` tokens whatever the sentences' lengths, and windows
    of about ``W`` tokens on average (99% under ``1.6 W``). It always ends at ``2 W`` tokens and at
    :data:`WINDOW_MAX_SENTENCES` sentences.

    Why not simply cut at ``W`` tokens: each sentence's vectors depend, in their last bits, on the window it
    is encoded in (batching, the word cache), so an update must encode a changed window whole and may copy
    only the rows of windows a fresh build would cut and encode alike. With cuts by running count, one
    inserted line moves every later cut; cut points chosen by content are the same sentences in the old and
    new corpus, so a window stream that starts elsewhere after an edit meets the old one at the first cut
    point both reach past their minimum, and is the same from there on. One edited line costs about
    ``1.1 W`` tokens re-encoded on average (simulated: the window holding it, sometimes the next); a smaller
    minimum resyncs later, a larger one leaves too few cut points to choose from.
    """

    def __init__(self, first_line: int, window_tokens: int):
        self.first = first_line
        self.window_tokens = window_tokens
        # The spacing of cut points, and the least a window holds before one ends it.
        self.span = max(1, window_tokens // 4)
        self.least = window_tokens - self.span
        self.limit = 2 * window_tokens
        self.tokens: list[list[str]] = []
        self.hashes: list[int] = []
        self.cost = 0

    def add(self, sentence: list[str], sentence_hash: int) -> Window | None:
        self.tokens.append(sentence)
        self.hashes.append(sentence_hash)
        if self._ends(len(sentence) + 2, sentence_hash, len(self.tokens)):
            return self.flush()
        return None

    def _ends(self, cost: int, sentence_hash: int, count: int) -> bool:
        """Whether the window ends after a sentence of ``cost`` tokens and hash ``sentence_hash``, its ``count``-th
        (the one rule, also of :func:`window_bounds`)."""
        self.cost += cost
        if self.cost >= self.limit or count >= WINDOW_MAX_SENTENCES:
            return True
        return self.cost >= self.least and is_cut_point(sentence_hash, cost, self.span)

    def flush(self) -> Window | None:
        """The sentences added since the last window, as a window (None when there are none)."""
        if not self.tokens:
            return None
        tokens, hashes = self.tokens, self.hashes
        window = Window(
            self.first,
            tokens,
            np.array(hashes, dtype=np.uint64),
            np.array([len(t) for t in tokens], dtype=np.int32),
        )
        self.first += len(tokens)
        self.tokens, self.hashes, self.cost = [], [], 0
        return window


def window_bounds(hashes: np.ndarray, lengths: np.ndarray, window_tokens: int) -> list[tuple[int, int]]:
    """``(first, stop)`` lines of each window :class:`WindowCutter` cuts sentences of these hashes and lengths
    into (a stored cache's windows, from its arrays, without its tokens)."""
    cutter = WindowCutter(0, window_tokens)
    bounds, first, count = [], 0, 0
    for i, (h, n) in enumerate(zip(hashes.tolist(), lengths.tolist())):
        count += 1
        if cutter._ends(int(n) + 2, int(h), count):
            bounds.append((first, i + 1))
            first, count, cutter.cost = i + 1, 0, 0
    if first < len(hashes):
        bounds.append((first, len(hashes)))
    return bounds


def assign_window(
    window: Window, rows_before: int, seen: SeenSentences | None, align: int = 1
) -> tuple[np.ndarray, np.ndarray, int]:
    """``(offsets, new, first_row)`` of the window's sentences from row ``rows_before`` on, its stored rows from
    ``first_row`` (``rows_before`` rounded up to a multiple of ``align`` when the window stores any row); with
    ``seen`` (dedupe), repeats point at their first occurrence's rows and ``new`` is false for them."""
    checks = check_hashes(window.tokens) if seen is not None else None
    offsets, new = assign_rows(window.hashes, window.lengths, rows_before, seen, checks, align)
    return offsets, new, first_stored_row(offsets, new, window.lengths, rows_before)


def first_stored_row(offsets: np.ndarray, new: np.ndarray, lengths: np.ndarray, rows_before: int) -> int:
    """The row a window's stored rows start at: its first new sentence's with tokens, else ``rows_before``."""
    stored = np.flatnonzero(np.asarray(new, dtype=bool) & (np.asarray(lengths) > 0))
    return int(offsets[stored[0]]) if len(stored) else rows_before


@dataclass
class SubmittedBatch:
    """One batch on its way (:meth:`BatchEncoder.submit`): the encoder's output and the selected rows on the
    device, the sentences' token offsets, and the stored rows and the finiteness flag being copied to the host."""

    flat: torch.Tensor
    out: torch.Tensor
    offsets: np.ndarray
    rows: torch.Tensor  # the stored rows where the codec made them (on the device where it can)
    stored: HostCopy | None  # their copy to the host; None when the window is put together on the device
    finite: HostCopy | None  # on CUDA: whether every stored value is finite (else the codec checks the host rows)


@dataclass(frozen=True)
class EncodedBatch:
    """One batch as a build stores it (:meth:`BatchEncoder.collect`)."""

    # The encoder's float32 output (n_layers, tokens, D) and the selected float32 rows, token-major, on the device.
    flat: torch.Tensor
    out: torch.Tensor
    # Where each sentence's rows start, and where the last one ends (len(batch) + 1 entries).
    offsets: np.ndarray
    # The stored rows of the batch's sentences concatenated in batch order, on the host; None when they stay on
    # the device (``SubmittedBatch.rows``).
    rows: np.ndarray | None
    # With a pool: each sentence's pooled vector in float32, and as stored (the pool's dtype); else None.
    pooled: np.ndarray | None
    pooled_stored: np.ndarray | None
    # The first sentence (its place in the batch) that would be stored with a value that is not finite, with the
    # token row to blame (None: its pooled vector overflows, its rows do not); None when all is finite.
    nonfinite: tuple[int, int | None] | None


class BatchEncoder:
    """A batch of sentences -> their stored rows, pooled vectors and whether all is finite once stored: the one
    per-batch path of a build (:class:`WindowEncoder`) and of a sentence encoded alone
    (:class:`~elmo_cache.builder.writeback.AloneEncoder`), so both store the same bytes.

    ``codec`` must be bound to the encoder's width (and trained, pq); ``pooling`` is the stored pool (None:
    none); ``token_rows`` false (a pool-only cache) checks only the pooled vectors for finiteness. The caller
    owns the word cache (clear it where the batch must not depend on what was encoded before) and
    ``torch.inference_mode``."""

    def __init__(
        self, encoder: Encoder, selection: Selection, codec: RowCodec, pooling: Pool | None, token_rows: bool = True
    ) -> None:
        self.encoder = encoder
        self.selection = selection
        self.codec = codec
        self.pooling = pooling
        self.token_rows = token_rows

    def encode(self, batch: list[list[str]]) -> EncodedBatch:
        """``batch`` (sentences of at least one token) encoded, its rows on the host in memory of its own (a caller
        may keep them)."""
        return self.collect(self.submit(batch), own=True)

    def submit(self, batch: list[list[str]], to_host: bool = True) -> SubmittedBatch:
        """Queue one batch's work: the encoder, the selection, the storage cast or codes, and (``to_host``) their copy
        to the host. On CUDA nothing here waits for the device, so the host prepares the next batch while this one
        runs."""
        import torch

        flat, offsets = self.encoder.encode_flat(batch)  # (n_layers, tokens, D) float32 on the device, no padding
        out = self.selection.apply(flat, layer_dim=0)  # (tokens, D) mixed in float32, or (L, tokens, D)
        if self.selection.layers is not None:
            out = out.transpose(0, 1)  # token-major: (tokens, L, D)
        # From the float32 rows, on the device: only the stored bytes (a cast, or codes and scales) cross.
        stored = stored_rows_on_device(self.codec, out)
        finite = None
        if stored.device.type == "cuda":
            # Whether anything could be stored non-finite, decided on the GPU and copied with the rows, so the host
            # reads no row for it: a float codec's stored rows (a cast keeps a NaN or an inf, and float16 overflows
            # past 65504), else the float rows (finite floats give finite int8 scales and meaningful pq codes). A
            # codec's own diagnosis runs only when this fails. On a CPU numpy's check of the host rows is the
            # faster (3.5x torch's on float16 here).
            finite = HostCopy(torch.isfinite(stored if stored.is_floating_point() else out).all().reshape(1))
        return SubmittedBatch(flat, out, offsets, stored, HostCopy(stored) if to_host else None, finite)

    def collect(self, submitted: SubmittedBatch, own: bool = False) -> EncodedBatch:
        """A submitted batch once done: its stored rows on the host (unless they stay on the device; on CUDA in the
        pinned buffer of their copy, unless ``own``: :meth:`HostCopy.result`), its pooled vectors, and the first
        sentence that would be stored with a value that is not finite."""
        out, offsets = submitted.out, submitted.offsets
        stored = submitted.stored.result(own=own) if submitted.stored is not None else None
        pooled = pooled_stored = None
        if self.pooling is not None:
            # On the host in numpy: its sum is sequential in token order, so a pool is the same on every
            # device and equals numpy's (on CUDA the float32 rows cross once more for it).
            pooled = pool_batch(out.cpu().numpy(), offsets[:-1], np.diff(offsets), self.pooling.method)
            with np.errstate(over="ignore"):  # an overflowing cast is refused below, not a warning
                pooled_stored = pooled.astype(self.pooling.dtype, copy=False)
        all_finite = submitted.finite is not None and bool(submitted.finite.result()[0])
        # Rows kept on the device cross only to be diagnosed, once something is not finite.
        host = stored if stored is not None or all_finite else submitted.rows.cpu().numpy()
        bad = self._nonfinite(out, host, offsets, pooled_stored, all_finite)
        return EncodedBatch(submitted.flat, out, offsets, stored, pooled, pooled_stored, bad)

    def _nonfinite(
        self,
        out: torch.Tensor,
        stored: np.ndarray | None,
        offsets: np.ndarray,
        pooled_stored: np.ndarray | None,
        all_finite: bool,
    ) -> tuple[int, int | None] | None:
        """The first sentence of a batch that would be stored with a value that is not finite, and its token row
        to blame (None: its pooled vector). Checked after the storage cast (the codec's
        :meth:`~RowCodec.nonfinite`: float16's overflow, int8's scale, pq's input), so a reader never gets back
        what the build did not refuse: one check per batch while all is well, the diagnosis only once something
        is wrong."""
        import torch

        bad = self.codec.nonfinite(out, stored) if self.token_rows and not all_finite and stored is not None else None
        if bad is not None:
            row = int(np.flatnonzero(bad)[0])
            return int(np.searchsorted(offsets, row, "right")) - 1, row
        if pooled_stored is None:
            return None
        bad = nonfinite_rows(pooled_stored)
        if bad is None:
            return None
        k = int(np.flatnonzero(bad)[0])
        begin, end = int(offsets[k]), int(offsets[k + 1])
        rows_bad = ~torch.isfinite(out[begin:end].reshape(end - begin, -1)).all(dim=1)
        if bool(rows_bad.any()):  # its token rows already (a pool-only build stores none of them)
            return k, begin + int(torch.nonzero(rows_bad)[0, 0])
        return k, None


class WindowEncoder:
    """Turns windows into rows in input order, in the stored layout and dtype."""

    def __init__(
        self,
        encoder: Encoder,
        plan: Plan,
        batch_tokens: int,
        corpus: str = "the corpus",
        buffers: WindowBuffers | None = None,
    ):
        # Both engines encode windows through here: glibc's heap keeps a window's blocks and gives them back at
        # its end (trim_heap in encode; see elmo_cache.builder.alloc).
        fix_mmap_threshold()
        self.encoder = encoder
        # Where a window's rows go: blocks the caller gives back once written (the local engine), else fresh.
        self.buffers = buffers
        self.selection = plan.selection
        self.batch_tokens = batch_tokens
        # What a refused non-finite value names: the corpus, and how its sentences are counted.
        self.corpus = corpus
        self.unit = "sentence" if plan.input_format == "conllu" else "line"
        # A pool-only cache stores no token rows: only its pooled vectors must be finite.
        self.token_rows = not plan.pool_only
        # The options a refused value names: how rows are stored, how they are selected, and what to change.
        codec = plan.codec
        if codec.quantized:
            self.storage = f"{codec.dtype} codes (--quantize {codec.name})"
        elif codec.dtype == "float16":
            self.storage = "float16 (--fp16; it holds magnitudes up to 65504)"
        else:
            self.storage = codec.dtype
        mix = plan.selection.mix
        self.selection_option = (
            "--layers" if mix is None else f"--mix {','.join(map(str, mix.weights))} --gamma {mix.gamma:g}"
        )
        self.fix = "lower --gamma or the --mix weights" if mix is not None else "check the model"
        if codec.quantized:
            self.fix += f", or drop --quantize {codec.name}"
        elif codec.dtype == "float16":
            self.fix += ", or drop --fp16"
        self.np_dtype = np.dtype(plan.dtype)
        self.row_shape = plan.row_shape(encoder.output_dim)
        self.codec = plan.bound_codec(encoder.output_dim)
        # The pooled vectors (--pool), from the float32 rows before the cast; None without.
        self.pooling = plan.pooling()
        self.pooled_shape = (
            None if self.pooling is None else self.pooling.shape(plan.selection.row_shape(encoder.output_dim))
        )
        if self.codec.training_vectors is not None:  # trained before any row is written
            from elmo_cache.builder.staged_codebooks import staged_codebooks
            from elmo_cache.errors import CacheFormatError
            from elmo_cache.store.format import staging_path

            trained = staged_codebooks(staging_path(plan.output), self.codec)
            if trained is None:
                raise CacheFormatError(
                    f"{staging_path(plan.output)}: no staged codebooks (trained as the build starts)"
                )
            self.codec = trained
        self.batches = BatchEncoder(encoder, self.selection, self.codec, self.pooling, self.token_rows)

    def _problem(self, batch: EncodedBatch) -> tuple[int, str] | None:
        """The first sentence of an encoded batch that would be stored with a value that is not finite (its place in
        the batch), and why in the build's options; None when all is finite."""
        if batch.nonfinite is None:
            return None
        k, row = batch.nonfinite
        if row is not None:
            return k, self._why(batch.flat[:, row], batch.out[row], "its vectors")
        assert self.pooling is not None and batch.pooled is not None  # only a pooled vector is blamed without a row
        what = f"its pooled vector (--pool {self.pooling.method})"
        if np.isfinite(batch.pooled[k]).all():
            return k, f"{what} overflows when stored as {self.storage}; {self.fix}"
        return k, f"{what} overflows float32; {self.fix}"

    def _why(self, layers: torch.Tensor, row: torch.Tensor, what: str) -> str:
        """Why a token's stored values are not finite: the model's own layers, the mix, or the storage cast."""
        import torch

        if not bool(torch.isfinite(layers).all()):
            return "the model's vectors for it are not finite (a broken model: check --model and its weights)"
        if not bool(torch.isfinite(row).all()):
            return f"{what} overflow float32 ({self.selection_option}); {self.fix}"
        return f"{what} overflow when stored as {self.storage}; {self.fix}"

    def encode(
        self,
        tokens: list[list[str]],
        lengths: np.ndarray,
        offsets: np.ndarray,
        new: np.ndarray,
        rows_before: int,
        progress: Callable[[int], None] | None = None,
        *,
        first_line: int,
    ) -> tuple[np.ndarray, np.ndarray | None, int]:
        """The rows of one window's ``new`` sentences from row ``rows_before`` on, with --pool the pooled
        vector of each of its sentences (zeros for empty ones, and for repeats until the store's finish
        copies their first occurrence's: ``store.pooled.copy_repeats``), and the tokens encoded.

        ``progress(n)`` is called after each encoder batch with the sentences it finished, and once
        at the end with the window's sentences that needed no encoding (repeats, empty lines), so a
        progress bar moves while a long window is encoded, not only when it is written.
        """
        import torch

        # The encoder caches char-CNN vectors per word, and a word's vector carries the last-bit
        # rounding of the batch it was first computed in. Starting every window with an empty
        # cache makes each window's vectors a function of the window alone, so a resumed build
        # is bit-identical to an uninterrupted one, and so is a distributed build (costs ~4% of
        # an Original-size encode).
        self.encoder.clear_word_cache()
        shape = (int(lengths[new].sum(dtype=np.int64)), *self.row_shape)
        vectors = np.empty(shape, self.np_dtype) if self.buffers is None else self.buffers.empty(shape, self.np_dtype)
        pooled = None
        if self.pooling is not None and self.pooled_shape is not None:
            pooled = np.zeros((len(lengths), *self.pooled_shape), dtype=self.pooling.dtype)
        # Shortest first, ties in line order (a stable sort): the batches, and so the last bits of every vector,
        # depend on this order, which caches built before keep.
        todo_array = np.flatnonzero(np.asarray(new, dtype=bool) & (np.asarray(lengths) > 0))
        todo_array = todo_array[np.argsort(np.asarray(lengths)[todo_array], kind="stable")]
        todo, todo_lengths = todo_array.tolist(), np.asarray(lengths)[todo_array].tolist()
        encoded = 0
        batches = []
        start = 0
        while start < len(todo):
            stop, cost = start, 0
            while stop < len(todo) and (stop == start or cost + todo_lengths[stop] + 2 <= self.batch_tokens):
                cost += todo_lengths[stop] + 2
                stop += 1
            batches.append(todo[start:stop])
            start = stop
        on_device = self._window_on_device(vectors.nbytes) if batches else False
        window = None  # the window's rows on the device, put together there (on_device), else None
        # One batch queued ahead: the device encodes it while the host stores the one before.
        submit = self.batches.submit
        submitted = submit([tokens[i] for i in batches[0]], not on_device) if batches else None
        for number, batch in enumerate(batches):
            current = submitted
            assert current is not None
            following = batches[number + 1] if number + 1 < len(batches) else None
            submitted = None if following is None else submit([tokens[i] for i in following], not on_device)
            done = self.batches.collect(current)
            problem = self._problem(done)
            if problem is not None:
                # Raised before this window reaches a writer: nothing of it is stored, what was committed stays.
                k, why = problem
                raise InvalidParameterError(
                    f"{self.corpus}, {self.unit} {first_line + batch[k] + 1}: not finite once stored: {why}. "
                    "Nothing was published; the lines committed before are kept"
                )
            # Each row to its sentence's place in the window, in one call: row r of sentence k goes to
            # offsets[k] - rows_before + (r - starts[k]).
            batch_lengths = np.asarray(lengths)[batch].astype(np.int64)
            starts = done.offsets[:-1]
            shift = np.asarray(offsets)[batch].astype(np.int64) - rows_before - starts.astype(np.int64)
            places = np.repeat(shift, batch_lengths) + np.arange(int(current.offsets[-1]))
            if done.rows is not None:
                vectors[places] = done.rows
            else:
                rows = current.rows
                if window is None:
                    window = torch.empty(vectors.shape, dtype=rows.dtype, device=rows.device)
                window.index_copy_(0, to_device(places, rows.device), rows)
            encoded += int(batch_lengths.sum())
            if pooled is not None and done.pooled_stored is not None:
                pooled[batch] = done.pooled_stored  # in the stored dtype, as the rows are
            if progress is not None:
                progress(len(batch))
        if window is not None:  # one copy of the whole window to the host, instead of one per batch plus a scatter
            torch.from_numpy(vectors).copy_(window)
        if progress is not None and len(lengths) > len(todo):
            progress(len(lengths) - len(todo))
        # What this window's batches freed goes back to the system now, so the heap cannot creep from window to
        # window (elmo_cache.builder.alloc).
        trim_heap()
        return vectors, pooled, encoded

    def _window_on_device(self, nbytes: int) -> bool:
        """Whether a window of ``nbytes`` stored bytes is put together on the device: on CUDA, with a codec that
        makes its rows there, when the device has room for it three times over. Each batch's rows then go to
        their places in the window on the device, and the window crosses to the host in one copy at its end: on
        an H100 machine the host's scatter of every batch's rows into the window (~3 GB/s) was the largest item of
        the build's main thread (2.6 s of 7, benchmarks/RESULTS.md "third lease"; the build then waited on the
        disk instead). Otherwise (a CPU, or a device short of memory) each batch crosses on its own and the host
        places its rows."""
        import torch

        if self.encoder.device.type != "cuda" or getattr(self.codec, "encode_rows", None) is None:
            return False
        free, _ = torch.cuda.mem_get_info(self.encoder.device)
        reusable = torch.cuda.memory_reserved(self.encoder.device) - torch.cuda.memory_allocated(self.encoder.device)
        return 3 * nbytes <= free + reusable
