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
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.rows.pq import CENTROIDS, ProductQuantization
from elmo_cache.store.durable import atomic_write_json, fsync_path
from elmo_cache.store.format import BUILD_DIR, CODEBOOKS, checksum

if TYPE_CHECKING:
    from elmo_cache.builder.encoding import Window
    from elmo_cache.builder.firstpass import FirstPass
    from elmo_cache.builder.plan import Plan
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.text.corpus import Corpus

__all__ = [
    "CODEBOOKS_FILE",
    "corpus_windows",
    "ensure_codebooks",
    "final_arrays",
    "first_pass_windows",
    "staged_codebooks",
    "train_codebooks",
    "training_sample",
    "train_in_process",
    "train_on_ray",
]

CODEBOOKS_FILE = "codebooks"
"""Base name of the staged codebooks in the staging's build folder (``.f32``: the values, ``.json``: what they are)."""


def _paths(staging: Path) -> tuple[Path, Path]:
    build = staging / BUILD_DIR
    return build / f"{CODEBOOKS_FILE}.f32", build / f"{CODEBOOKS_FILE}.json"


def staged_codebooks(staging: Path, quantization: ProductQuantization) -> ProductQuantization | None:
    """``quantization`` with the codebooks staged in ``staging`` (None when none are staged); an error when
    they belong to another quantisation or fail their CRC-32."""
    values, info_path = _paths(staging)
    if not info_path.is_file():
        return None
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
        data = np.fromfile(values, dtype="<f4")
    except (OSError, ValueError) as exc:
        raise CacheFormatError(f"{info_path}: unreadable staged codebooks ({exc}); rerun with --overwrite") from None
    if info.get("quantization") != quantization.to_metadata() or info.get("shape") != list(quantization.codebook_shape):
        raise CacheFormatError(
            f"{info_path}: staged codebooks of another quantisation ({info.get('quantization')!r}); "
            "rerun with --overwrite"
        )
    if checksum(np.ascontiguousarray(data)) != info.get("crc32"):
        raise CacheFormatError(f"{values}: the staged codebooks fail their CRC-32 (damaged); rerun with --overwrite")
    return quantization.with_codebooks(data, str(values))


def _stage(staging: Path, trained: ProductQuantization) -> None:
    values, info_path = _paths(staging)
    data = trained.parameters()
    tmp = values.with_suffix(".tmp")
    data.tofile(tmp)
    fsync_path(tmp)
    os.replace(tmp, values)
    info = {"quantization": trained.to_metadata(), "shape": list(trained.codebook_shape), "crc32": checksum(data)}
    atomic_write_json(info_path, info)  # last: its presence means the values are whole


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


def training_sample(windows: Iterable[Window], encoder: Encoder, plan: Plan, batch_tokens: int, n: int) -> np.ndarray:
    """The first ``n`` token rows (fewer when the corpus has fewer) of ``windows``, every sentence, as float32
    rows in the stored layout before quantisation: ``(n, slots, dim)``."""
    import torch

    from elmo_cache.builder.encoding import WindowEncoder

    # The float32 rows as the build selects or mixes them: no cast, no quantisation, no pooling.
    plain = dataclasses.replace(plan, quantize=None, dtype="float32", pool=None, pool_only=False)
    floats = WindowEncoder(encoder, plain, batch_tokens)
    rows: list[np.ndarray] = []
    have = 0
    with torch.inference_mode():
        for window in windows:
            lengths = window.lengths
            offsets = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]).astype(np.int64)
            vectors, _, _ = floats.encode(window.tokens, lengths, offsets, np.ones(len(lengths), bool), 0)
            rows.append(vectors)
            have += len(vectors)
            if have >= n:
                break
    sample = np.concatenate(rows)[:n] if rows else np.empty((0, *floats.row_shape), np.float32)
    return sample.reshape(len(sample), -1, encoder.output_dim)


def require_faiss() -> Any:
    """The faiss module, or the error saying what to install (checked when a pq build is planned, so that a
    build that cannot train its codebooks leaves nothing behind)."""
    try:
        import faiss
    except ImportError:
        raise InvalidParameterError(
            'quantize: pq codebooks are trained with faiss: pip install "elmo-cache[pq]" (reading needs no faiss)'
        ) from None
    return faiss


def train_codebooks(sample: np.ndarray, quantization: ProductQuantization) -> ProductQuantization:
    """``quantization`` with codebooks trained on ``sample`` ``(n, slots, dim)``: per slot, faiss's
    ProductQuantizer (k-means of 256 centroids per sub-space, ``training.seed``, ``training.iterations``),
    on one OpenMP thread; for opq, on the sample rotated by the slot's rotation, learned first by faiss's
    OPQMatrix (``training.rotation_iterations``). A sample of fewer than 256 vectors is repeated up to 256
    (k-means needs as many points as centroids): its vectors then become centroids and are stored almost exactly."""
    faiss = require_faiss()
    if len(sample) == 0:
        sample = np.zeros((1, quantization.slots, quantization.dim), np.float32)  # an empty corpus: any codebooks
    if len(sample) < CENTROIDS:
        sample = np.resize(sample, (CENTROIDS, *sample.shape[1:]))
    out = np.empty(quantization.codebook_shape, np.float32)
    rotations = np.empty(quantization.rotation_shape, np.float32) if quantization.rotated else None
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        for slot in range(quantization.slots):
            x = np.ascontiguousarray(sample[:, slot], dtype=np.float32)
            if rotations is not None:
                rotations[slot] = _train_rotation(faiss, x, quantization)
                x = np.ascontiguousarray(x @ rotations[slot].T)  # y = x A^T, the vectors the codes are of
            pq = _product_quantizer(faiss, quantization, quantization.training.iterations)
            pq.train(x)
            out[slot] = faiss.vector_to_array(pq.centroids).reshape(quantization.m, CENTROIDS, quantization.dsub)
    finally:
        faiss.omp_set_num_threads(threads)
    return quantization.with_codebooks(out) if rotations is None else quantization.with_rotation(out, rotations)


def _product_quantizer(faiss: Any, quantization: ProductQuantization, iterations: int) -> Any:
    pq = faiss.ProductQuantizer(quantization.dim, quantization.m, 8)
    pq.cp.seed = quantization.training.seed
    pq.cp.niter = iterations
    pq.verbose = False
    pq.cp.min_points_per_centroid = 1  # a small sample is expected (a small corpus): no warning on stderr
    return pq


def _train_rotation(faiss: Any, x: np.ndarray, quantization: ProductQuantization) -> np.ndarray:
    """One slot's OPQ rotation ``A`` (dim x dim, float32) learned on ``x`` by faiss's OPQMatrix: alternately a
    PQ of the rotated vectors (its k-means seeded with ``training.seed``) and the orthogonal Procrustes
    rotation best mapping the vectors onto their PQ reconstructions."""
    opq = faiss.OPQMatrix(quantization.dim, quantization.m)
    opq.niter = quantization.training.rotation_iterations
    opq.max_train_points = len(x)  # the whole sample (faiss would otherwise subsample above 65,536)
    opq.verbose = False
    # OPQMatrix sets its PQ's iterations itself; ours carries the seed and the quiet small-sample setting.
    inner = _product_quantizer(faiss, quantization, quantization.training.iterations)
    opq.pq = inner
    opq.train(x)
    return faiss.vector_to_array(opq.A).reshape(quantization.dim, quantization.dim).astype(np.float32)


def ensure_codebooks(
    staging: Path, quantization: Any, train: Callable[[ProductQuantization], ProductQuantization]
) -> ProductQuantization | None:
    """The build's trained codebooks: those staged in ``staging`` (resume), else ``train(quantization)``'s,
    staged now. None for a build that is not product-quantised (``quantization`` None or int8)."""
    if not isinstance(quantization, ProductQuantization):
        return None
    staged = staged_codebooks(staging, quantization)
    if staged is not None:
        return staged
    trained = train(quantization)
    (staging / BUILD_DIR).mkdir(parents=True, exist_ok=True)
    _stage(staging, trained)
    return trained


def train_in_process(
    staging: Path, plan: Plan, encoder: Encoder, windows: Iterable[Window], batch_tokens: int
) -> ProductQuantization | None:
    """:func:`ensure_codebooks` with the training done here, on ``encoder`` (the local engine; a Ray task)."""
    quantization = plan.quantization(encoder.output_dim)

    def train(q: ProductQuantization) -> ProductQuantization:
        return train_codebooks(training_sample(windows, encoder, plan, batch_tokens, q.training.vectors), q)

    return ensure_codebooks(staging, quantization, train)


def final_arrays(staging: Path, plan: Plan, dim: int) -> dict[str, np.ndarray]:
    """The arrays a finished cache of ``plan`` holds beyond the usual ones: a pq cache's codebooks (from the
    staging, checked), flattened into :data:`~elmo_cache.store.format.CODEBOOKS` (an opq cache's rotations
    after them); else none."""
    quantization = plan.quantization(dim)
    if not isinstance(quantization, ProductQuantization):
        return {}
    staged = staged_codebooks(staging, quantization)
    if staged is None or staged.codebooks is None:
        raise CacheFormatError(f"{staging}: the build's codebooks are missing; rerun with --overwrite")
    return {CODEBOOKS: staged.parameters()}


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
    quantization = job.plan.quantization(dim)
    if not isinstance(quantization, ProductQuantization) or staged_codebooks(job.staging, quantization) is not None:
        return
    task = ray.remote(num_cpus=cpus, num_gpus=1 if gpu else 0, max_retries=0)(_train_for_part_job)
    ray.get(task.remote(job))
    if staged_codebooks(job.staging, quantization) is None:
        raise CacheFormatError(f"{job.staging}: the codebooks task ended without staging its codebooks")
