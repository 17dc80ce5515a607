"""The codebooks of a product-quantised build (``--quantize pq:M``, ``opq:M``): trained once, before any row is
written. An opq build's rotations are trained with them and staged, stored and checked as their tail.

Both engines call :func:`ensure_codebooks` when their run starts: the codebooks staged by an
interrupted build are reused (checked against their CRC-32 and the build's quantisation), else they
are trained and staged (``.build/codebooks.f32`` and ``.build/codebooks.json``, the JSON last, so
a half-written pair is never taken). Every encoder then reads them from the staging folder
(:func:`staged_codebooks`): the local one, and each Ray worker, which sees the staging at the same path.

The training sample is a function of the corpus, the model and the options alone: the first
``training.vectors`` token rows of the corpus in line order (repeats included), encoded window by
window exactly as the build encodes them (:class:`~elmo_cache.builder.encoding.WindowEncoder`, float32,
before quantisation), so the local engine and a Ray task on the same device type see the same floats.
faiss k-means then runs with a fixed seed and one OpenMP thread (its results may change with the
thread count), so the same sample gives the same codebooks, byte for byte, in any process. For opq, faiss's
OPQMatrix first learns each slot's rotation (its random start and inner k-means are seeded too), then the
codebooks are trained as for pq on the rotated sample.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.builder.staged_codebooks import stage_codebooks, staged_codebooks
from elmo_cache.errors import CacheFormatError
from elmo_cache.progress import progress_bar
from elmo_cache.rows.codecs import FLOAT32, RowCodec, codec_for_option
from elmo_cache.store.format import BUILD_DIR

if TYPE_CHECKING:
    from elmo_cache.builder.encoding import Window
    from elmo_cache.builder.firstpass import FirstPass
    from elmo_cache.builder.plan import Plan
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.text.corpus import Corpus

__all__ = [
    "Int8Comparison",
    "compare_with_int8",
    "corpus_windows",
    "larger_than_int8",
    "ensure_codebooks",
    "final_arrays",
    "first_pass_windows",
    "training_sample",
    "train_in_process",
    "train_on_ray",
]


@dataclasses.dataclass(frozen=True)
class Int8Comparison:
    """What a trained codec's cache of ``rows`` token rows takes against ``--quantize int8``'s, in bytes."""

    # The scheme, as --quantize names it (pq:16).
    name: str
    rows: int
    # The rows' codes plus the codec's trained values (pq: codebooks; opq: and rotations).
    own_bytes: int
    # Of which the trained values: paid once per cache, however few rows there are.
    parameter_bytes: int
    # The same rows in int8: codes and a float32 scale per vector.
    int8_bytes: int
    # Fewest rows at which the codec takes no more than int8 (None: it never does).
    break_even_rows: int | None

    def warning(self) -> str:
        return (
            f"--quantize {self.name}: this corpus's {self.rows:,} token rows take {self.own_bytes:,} bytes as "
            f"{self.name} codes and codebooks ({self.parameter_bytes:,} bytes of codebooks, stored once), more than "
            f"--quantize int8 would take ({self.int8_bytes:,} bytes of codes and scales)"
            + (f"; {self.name} is smaller only from {self.break_even_rows:,} rows on" if self.break_even_rows else "")
            + ". For a corpus this small, --quantize int8 gives a smaller cache and closer vectors"
        )


def compare_with_int8(plan: Plan, rows: int) -> Int8Comparison:
    """The bytes of ``rows`` rows of ``plan`` (bound to the model: :meth:`Plan.with_model`) against int8's. The
    codec's trained values are counted from :meth:`~elmo_cache.rows.codecs.RowCodec.parameters`'s float32 layout:
    ``parameter_count`` where the codec has one (opq's rotations follow the centroids), else ``parameter_shape``."""
    codec = plan.bound_codec()
    dim = plan._dim(None)
    selection_row = plan.selection.row_shape(dim)
    slots = selection_row[0] if len(selection_row) == 2 else 1
    int8 = codec_for_option("int8").bind(dim, slots)

    def row_bytes(c: RowCodec) -> int:
        return int(np.prod(c.stored_shape(selection_row))) * np.dtype(c.dtype).itemsize

    values = getattr(codec, "parameter_count", None)
    values = int(np.prod(codec.parameter_shape)) if values is None else int(values)
    parameter_bytes = values * np.dtype("<f4").itemsize
    own_row, int8_row = row_bytes(codec), row_bytes(int8)
    saved = int8_row - own_row
    break_even = -(-parameter_bytes // saved) if saved > 0 else None
    return Int8Comparison(
        codec.name, rows, rows * own_row + parameter_bytes, parameter_bytes, rows * int8_row, break_even
    )


def larger_than_int8(plan: Plan, source: Corpus) -> Int8Comparison | None:
    """The comparison with int8 when ``plan``'s trained codec (pq, opq) makes a larger cache of ``source`` than
    int8 would, else None (and for codecs that train nothing, and corpora read once: stdin, pipes).

    The rows are the corpus's tokens (with --dedupe a cache has fewer rows, which only widens the gap: the
    codebooks stay, the codes' savings shrink), counted only as far as the break-even: a corpus that passes it
    is not read further."""
    codec = plan.bound_codec()
    if codec.training_vectors is None:
        return None
    at_zero = compare_with_int8(plan, 0)
    if at_zero.parameter_bytes == 0:
        return None
    limit = at_zero.break_even_rows if at_zero.break_even_rows is not None else codec.training_vectors
    rows = source.count_tokens(max(0, limit - 1))
    if rows is None:
        return None
    comparison = compare_with_int8(plan, rows)
    return comparison if comparison.own_bytes > comparison.int8_bytes else None


def corpus_windows(source: Corpus, window_tokens: int) -> Iterator[Window]:
    """The local build's windows of ``source`` from line 0 (the reader thread's cuts)."""
    from elmo_cache.builder.encoding import WindowCutter
    from elmo_cache.text.tokenize import sentence_hash

    cutter = WindowCutter(0, window_tokens)
    for _, sentence in source.sentences():
        window = cutter.add(sentence, sentence_hash(sentence))
        if window is not None:
            yield window
    window = cutter.flush()
    if window is not None:
        yield window


def first_pass_windows(first: FirstPass) -> Iterator[Window]:
    """The ray build's windows, read back from its first pass (the same cuts as :func:`corpus_windows`)."""
    for w in range(len(first.windows)):
        yield first.window(w)[0]


def training_sample(
    windows: Iterable[Window], encoder: Encoder, plan: Plan, batch_tokens: int, n: int, show_progress: bool = False
) -> np.ndarray:
    """The first ``n`` token rows (fewer when the corpus has fewer) of ``windows``, every sentence, as float32
    rows in the stored layout before quantisation: ``(n, slots, dim)``."""
    import torch

    from elmo_cache.builder.encoding import WindowEncoder

    # The float32 rows as the build selects or mixes them: no cast, no quantisation, no pooling.
    plain = dataclasses.replace(plan, codec=FLOAT32, dim=None, dtype="float32", pool=None, pool_only=False)
    floats = WindowEncoder(encoder, plain, batch_tokens)
    rows: list[np.ndarray] = []
    have = 0
    bar = progress_bar(desc="encoding the codebook sample", unit=" row", total=n, disable=not show_progress)
    with torch.inference_mode(), bar:
        for window in windows:
            lengths = window.lengths
            offsets = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]).astype(np.int64)
            vectors, _, _ = floats.encode(
                window.tokens, lengths, offsets, np.ones(len(lengths), bool), 0, first_line=window.first_line
            )
            rows.append(vectors)
            have += len(vectors)
            bar.update(min(len(vectors), max(n - bar.n, 0)))
            if have >= n:
                break
    sample = np.concatenate(rows)[:n] if rows else np.empty((0, *floats.row_shape), np.float32)
    return sample.reshape(len(sample), -1, encoder.output_dim)


def ensure_codebooks(staging: Path, quantization: RowCodec, train: Callable[[RowCodec], RowCodec]) -> RowCodec | None:
    """The build's trained codec (pq: its codebooks): the one staged in ``staging`` (resume), else
    ``train(quantization)``'s, staged now. None for a codec that is not trained (floats, int8)."""
    if quantization.training_vectors is None:
        return None
    staged = staged_codebooks(staging, quantization)
    if staged is not None:
        return staged
    trained = train(quantization)
    (staging / BUILD_DIR).mkdir(parents=True, exist_ok=True)
    stage_codebooks(staging, trained)
    return trained


def train_in_process(
    staging: Path,
    plan: Plan,
    encoder: Encoder,
    windows: Iterable[Window],
    batch_tokens: int,
    show_progress: bool = False,
) -> RowCodec | None:
    """:func:`ensure_codebooks` with the training done here, on ``encoder`` (the local engine; a Ray task).
    ``show_progress``: a bar for the sample's encoding and one for the training (faiss reports nothing
    while it trains: that bar says what runs, and its time when done)."""
    quantization = plan.bound_codec(encoder.output_dim)

    def train(q: RowCodec) -> RowCodec:
        sample = training_sample(windows, encoder, plan, batch_tokens, q.training_vectors or 0, show_progress)
        with progress_bar(desc=f"training {q.name} codebooks", unit=" step", total=1, disable=not show_progress) as bar:
            trained = q.train(sample)
            bar.update(1)
        return trained

    return ensure_codebooks(staging, quantization, train)


def final_arrays(staging: Path, plan: Plan, dim: int | None = None) -> dict[str, np.ndarray]:
    """The arrays a finished cache of ``plan`` holds beyond the usual ones, as its codec says (pq: the
    codebooks from the staging, checked, flattened into :data:`~elmo_cache.store.format.CODEBOOKS`, an opq
    cache's rotations after them); else none."""
    quantization = plan.bound_codec(dim)
    if quantization.training_vectors is None:
        return quantization.final_arrays()
    staged = staged_codebooks(staging, quantization)
    if staged is None:
        raise CacheFormatError(f"{staging}: the build's codebooks are missing; rerun with --overwrite")
    return staged.final_arrays()


def _train_for_part_job(job: Any) -> None:
    """In a Ray task: load the workers' encoder and train (or find) the codebooks from the first pass's windows."""
    import torch

    from elmo_cache.builder.firstpass import PLAN_DIR, load_first_pass
    from elmo_cache.encoder.encoder import Encoder

    torch.set_num_threads(job.torch_threads)
    first = load_first_pass(job.staging / BUILD_DIR / PLAN_DIR)
    if first is None:
        raise CacheFormatError(f"{job.staging}: the build plan is missing on this worker (is the folder shared?)")
    encoder = Encoder.load(job.model_files, device=job.device, precision=job.precision, initial_state=job.initial_state)
    train_in_process(job.staging, job.plan, encoder, first_pass_windows(first), job.batch_tokens)


def train_on_ray(ray: Any, job: Any, dim: int, *, gpu: bool, cpus: float) -> None:
    """The ray engine's codebooks: unless already staged (a resumed build), trained by one Ray task with a
    worker's resources and encoder (``job``: the parts' :class:`~elmo_cache.builder.ray.parts.PartJob`), so
    that the driver loads no model and the sample is encoded on the workers' device type."""
    quantization = job.plan.bound_codec(dim)
    if quantization.training_vectors is None or staged_codebooks(job.staging, quantization) is not None:
        return
    task = ray.remote(num_cpus=cpus, num_gpus=1 if gpu else 0, max_retries=0)(_train_for_part_job)
    ray.get(task.remote(job))
    if staged_codebooks(job.staging, quantization) is None:
        raise CacheFormatError(f"{job.staging}: the codebooks task ended without staging its codebooks")
