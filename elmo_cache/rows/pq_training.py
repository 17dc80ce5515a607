"""Training product-quantisation codebooks (and opq's rotations) with faiss: k-means with a fixed seed on
one OpenMP thread, so the same sample gives the same codebooks, byte for byte, in any process. faiss is
needed only here (the ``pq`` extra); reading a product-quantised cache needs none."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import numpy as np

from elmo_cache.errors import InvalidParameterError


class Trainable(Protocol):
    """What training reads of a product quantisation (elmo_cache.rows.pq.ProductQuantization, which calls into
    this module to train and so is not imported here)."""

    @property
    def dim(self) -> int: ...

    @property
    def m(self) -> int: ...

    @property
    def slots(self) -> int: ...

    @property
    def training(self) -> Any: ...

    @property
    def rotated(self) -> bool: ...

    @property
    def codebook_shape(self) -> tuple[int, int, int, int]: ...

    @property
    def rotation_shape(self) -> tuple[int, int, int]: ...

    def with_codebooks(self, codebooks: Any, where: str = ...) -> Any: ...

    def with_rotation(self, codebooks: np.ndarray, rotation: Any) -> Any: ...


_Q = TypeVar("_Q", bound=Trainable)

__all__ = ["require_faiss", "train_codebooks"]


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


def train_codebooks(sample: np.ndarray, quantization: _Q) -> _Q:
    """``quantization`` with codebooks trained on ``sample`` ``(n, slots, dim)``: per slot, faiss's
    ProductQuantizer (k-means of 256 centroids per sub-space, ``training.seed``, ``training.iterations``),
    on one OpenMP thread; for opq, on the sample rotated by the slot's rotation, learned first by faiss's
    OPQMatrix (``training.rotation_iterations``). A sample of fewer than 256 vectors is repeated up to 256
    (k-means needs as many points as centroids): its vectors then become centroids and are stored almost exactly."""
    faiss = require_faiss()
    if len(sample) == 0:
        sample = np.zeros((1, quantization.slots, quantization.dim), np.float32)  # an empty corpus: any codebooks
    centroids = quantization.codebook_shape[2]
    if len(sample) < centroids:
        sample = np.resize(sample, (centroids, *sample.shape[1:]))
    out = np.empty(quantization.codebook_shape, np.float32)
    rotations = np.empty(quantization.rotation_shape, np.float32) if quantization.rotated else None
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        for slot in range(quantization.slots):
            x = np.ascontiguousarray(sample[:, slot], dtype=np.float32)
            if rotations is not None:
                rotations[slot], x = _train_rotation(faiss, x, quantization)
            pq = _product_quantizer(faiss, quantization, quantization.training.iterations)
            pq.train(x)
            out[slot] = faiss.vector_to_array(pq.centroids).reshape(quantization.codebook_shape[1:])
    finally:
        faiss.omp_set_num_threads(threads)
    return quantization.with_codebooks(out) if rotations is None else quantization.with_rotation(out, rotations)


def _product_quantizer(faiss: Any, quantization: Trainable, iterations: int) -> Any:
    pq = faiss.ProductQuantizer(quantization.dim, quantization.m, 8)
    pq.cp.seed = quantization.training.seed
    pq.cp.niter = iterations
    pq.verbose = False
    pq.cp.min_points_per_centroid = 1  # a small sample is expected (a small corpus): no warning on stderr
    return pq


def _train_rotation(faiss: Any, x: np.ndarray, quantization: Trainable) -> tuple[np.ndarray, np.ndarray]:
    """One slot's OPQ rotation ``A`` (dim x dim, float32) learned on ``x`` by faiss's OPQMatrix: alternately a
    PQ of the rotated vectors (its k-means seeded with ``training.seed``) and the orthogonal Procrustes
    rotation best mapping the vectors onto their PQ reconstructions; and ``x`` rotated, ``y = x A^T``, the vectors
    the codes are of.

    The rotated sample is faiss's product, on the one OpenMP thread training runs on, not numpy's: numpy's BLAS
    splits a product by its own thread count, and the last bits followed it (a 2-core Zen 5: 2 threads against 1
    gave other bits, so a Ray worker on one CPU trained other codebooks than a local build)."""
    opq = faiss.OPQMatrix(quantization.dim, quantization.m)
    opq.niter = quantization.training.rotation_iterations
    opq.max_train_points = len(x)  # the whole sample (faiss would otherwise subsample above 65,536)
    opq.verbose = False
    # OPQMatrix sets its PQ's iterations itself; ours carries the seed and the quiet small-sample setting.
    inner = _product_quantizer(faiss, quantization, quantization.training.iterations)
    opq.pq = inner
    opq.train(x)
    rotation = faiss.vector_to_array(opq.A).reshape(quantization.dim, quantization.dim).astype(np.float32)
    return rotation, np.ascontiguousarray(opq.apply(x), dtype=np.float32)
