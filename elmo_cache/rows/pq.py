"""Product-quantised vectors (``build --quantize pq:M``): M uint8 codes per vector, codebooks in the cache.

Scheme (``pq``, docs/FORMAT.md "Product-quantised caches"): every stored vector ``x`` (one layer of one
token, or one mixed vector) of ``dim`` values is cut into ``M`` consecutive sub-vectors of ``dim / M``
values; sub-vector ``j`` is stored as the number (uint8) of its nearest of the 256 centroids of
sub-quantiser ``j``. A cache holds one set of ``M x 256`` centroids per stored layer (layers differ
widely in scale and spread) or one for a mix: the codebooks, an array of their own
(``quantization/codebooks``). Reading gathers each code's centroid: numpy only, no faiss.

Scheme ``opq`` (``build --quantize opq:M``): the same codes of ``y = x @ A.T``, ``A`` an orthonormal
``dim x dim`` rotation per stored layer (faiss's ``OPQMatrix.A``) learned with the codebooks so that the
sub-vectors quantise better (benchmarks/RESULTS.md); reading gathers ``y``'s centroids, then ``x = y @ A`` (torch, the
rows rounded up as the encoder's: :func:`_rotate_back`).
The rotations follow the centroids in the same codebooks array, so that staging, stitching and the block
sums carry them as they carry the centroids.

The codebooks are trained on the corpus's own vectors before any row is written
(:mod:`elmo_cache.builder.codebooks`: faiss k-means, fixed seed, one thread), so the codes are
as deterministic as the floats: the same on resume and in every Ray worker. Codes are assigned on
the encoder's device by :meth:`ProductQuantization.quantize` (torch, the first of equal minima), not by
faiss, so that a build needs faiss only to train.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import CacheCorruptError, CacheFormatError, InvalidParameterError
from elmo_cache.rows.codecs import (
    CodecEntry,
    QuantizedCodec,
    UndecodedSentence,
    invalid_option,
    nonfinite_rows,
    register_builtin,
)
from elmo_cache.store.format import CODEBOOKS as CODEBOOKS_ARRAY
from elmo_cache.store.format import OPQ_ROTATION

if TYPE_CHECKING:
    import torch

    from elmo_cache.rows.selection import Selection

__all__ = [
    "CENTROIDS",
    "load_codebooks",
    "PQ_DTYPE",
    "PQSentence",
    "ProductQuantization",
    "Training",
    "pad_pq",
    "PRODUCT_SCHEMES",
    "parse_product",
    "pq_choices",
]

CENTROIDS = 256
"""Centroids per sub-quantiser: one uint8 code per sub-vector."""

PQ_DTYPE = "uint8"
"""Storage dtype of ``vectors`` in a product-quantised cache."""

PRODUCT_SCHEMES = ("pq", "opq")
"""The product-quantised schemes: codes of sub-vectors, codebooks in the cache's codebooks array."""

_PQ = re.compile(r"(o?pq):(\d+)")
# Elements of the (slots * M, rows, 256) distance tensor computed at once while assigning codes (128 MiB):
# smaller chunks cost more per row (341 rows of bundled pq:64: +15%, 64 rows: +70%; 2-core CPU).
_CHUNK_ELEMENTS = 1 << 25


def pq_choices() -> str:
    """How a valid ``pq`` or ``opq`` value is written (for error messages)."""
    return (
        "pq:M, M sub-quantisers of 256 centroids (M bytes a vector; M a positive divisor of the model's width); "
        "opq:M, the same after a learned rotation (more accurate at the same size)"
    )


def parse_product(value: str) -> tuple[str, int] | None:
    """The scheme and ``M`` of ``pq:M`` or ``opq:M`` (None when ``value`` is neither, or M is not positive)."""
    match = _PQ.fullmatch(value)
    if match is None or int(match.group(2)) < 1:
        return None
    return match.group(1), int(match.group(2))


@dataclass(frozen=True)
class Training:
    """How the codebooks are trained (recorded in the metadata: a resume with other settings is refused)."""

    # Vectors per stored layer (token rows) in the training sample: the first rows of the corpus, in line
    # order, encoded window by window as the build encodes them (repeats included).
    vectors: int = 65536
    # faiss k-means seed and iterations per sub-quantiser.
    seed: int = 0
    iterations: int = 25
    # opq: iterations of faiss's OPQMatrix (each retrains its own PQ and solves for the rotation); 10 met the
    # 5% perplexity target in the prototype (benchmarks/RESULTS.md). Not recorded for pq.
    rotation_iterations: int = 10

    def to_metadata(self, rotated: bool = False) -> dict[str, Any]:
        """The metadata's ``quantization.training`` object (an opq one names its rotation's iterations)."""
        if rotated:
            return {"sample": "first-rows", "vectors": self.vectors, "seed": self.seed,
                    "iterations": self.iterations, "rotation_iterations": self.rotation_iterations,
                    "algorithm": "faiss-opq+kmeans"}  # fmt: skip
        return {"sample": "first-rows", "vectors": self.vectors, "seed": self.seed, "iterations": self.iterations,
                "algorithm": "faiss-kmeans"}  # fmt: skip


@dataclass(frozen=True)
class ProductQuantization(QuantizedCodec):
    """How a cache's vectors are product-quantised, and the code that writes and reads them (FORMAT.md): the
    pq and opq :class:`~elmo_cache.rows.codecs.RowCodec`."""

    # Values per vector (the model's output width); 0 until bound.
    dim: int
    # Sub-quantisers per vector: codes (bytes) per stored vector; divides dim.
    m: int
    # Vectors per stored row, each with its own codebooks: the stored layers, or 1 for a mix; 0 until bound.
    slots: int
    # How the codebooks are trained.
    training: Training = Training()
    # float32 centroids (slots, m, 256, dim // m); None until trained or read (shapes need none).
    codebooks: np.ndarray | None = None
    # "pq", or "opq": codes of each vector rotated by its slot's ``rotation`` first.
    scheme: str = "pq"
    # opq: float32 orthonormal rotations (slots, dim, dim), faiss's OPQMatrix.A (``y = x @ A.T``, ``x = y @ A``);
    # None for pq, and until trained or read.
    rotation: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.scheme not in PRODUCT_SCHEMES:
            raise InvalidParameterError(f"quantize: scheme {self.scheme!r} is not one of {list(PRODUCT_SCHEMES)}")
        if self.m < 1 or self.dim % self.m:
            divisors = [d for d in range(1, self.dim + 1) if self.dim % d == 0]
            raise InvalidParameterError(
                f"quantize: {self.scheme}:{self.m} does not divide the model's width {self.dim} into equal "
                f"sub-vectors; use {pq_choices()}: here M in {divisors}"
            )

    @property
    def name(self) -> str:
        return f"{self.scheme}:{self.m}"

    @property
    def dtype(self) -> str:
        return PQ_DTYPE

    @property
    def training_vectors(self) -> int | None:
        return self.training.vectors

    def rounding_step(self, scale: float) -> float | None:
        # Nearest centroids: no bound a pool recomputed from them could be held to.
        return None

    def require(self) -> None:
        """Codebooks are trained with faiss: checked when a build is planned, so that one that cannot train
        leaves nothing behind."""
        from elmo_cache.rows.pq_training import require_faiss

        require_faiss()

    def with_training_vectors(self, vectors: int) -> ProductQuantization:
        return replace(self, training=replace(self.training, vectors=int(vectors)))

    def bind(self, dim: int, slots: int) -> ProductQuantization:
        """This quantisation of rows of ``slots`` vectors of ``dim`` values (an error when M does not divide dim)."""
        return replace(self, dim=int(dim), slots=int(slots))

    @property
    def rotated(self) -> bool:
        """Whether vectors are rotated before they are cut into sub-vectors (opq)."""
        return self.scheme == "opq"

    @property
    def dsub(self) -> int:
        """Values per sub-vector."""
        return self.dim // self.m

    # -- metadata ---------------------------------------------------------------------------------

    def to_metadata(self) -> dict[str, Any]:
        """The metadata's ``quantization`` object (a pq cache's exactly as before opq existed)."""
        out = {"scheme": self.scheme, "m": self.m, "centroids": CENTROIDS, "codebooks": CODEBOOKS_ARRAY}
        if self.rotated:
            out["rotation"] = OPQ_ROTATION
        return {**out, "training": self.training.to_metadata(self.rotated)}

    @classmethod
    def from_metadata(cls, raw: Mapping[str, Any], dim: int, slots: int) -> ProductQuantization:
        scheme = raw.get("scheme")
        try:
            training = raw["training"]
            spec = Training(int(training["vectors"]), int(training["seed"]), int(training["iterations"]))
            if scheme == "opq":
                spec = replace(spec, rotation_iterations=int(training["rotation_iterations"]))
            m = int(raw["m"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CacheFormatError(f"metadata quantization {dict(raw)!r} is not a pq description ({exc})") from None
        if raw.get("centroids") != CENTROIDS:
            raise CacheFormatError(f"metadata quantization: {raw.get('centroids')!r} centroids; this reads {CENTROIDS}")
        try:
            return cls(dim, m, slots, spec, scheme=str(scheme))
        except InvalidParameterError as exc:
            raise CacheFormatError(f"metadata quantization: {exc}") from None

    @property
    def codebook_shape(self) -> tuple[int, int, int, int]:
        return (self.slots, self.m, CENTROIDS, self.dsub)

    @property
    def stored_dim(self) -> int:
        """Bytes per stored vector: its codes."""
        return self.m

    def stored_shape(self, row_shape: Sequence[int]) -> tuple[int, ...]:
        """The stored row of a float row of ``row_shape`` (its last axis becomes the codes)."""
        return (*tuple(row_shape)[:-1], self.m)

    @property
    def parameter_shape(self) -> tuple[int, ...]:
        """The shape recorded beside the staged codebooks: the centroids' (opq's rotations follow them)."""
        return self.codebook_shape

    def with_parameters(self, values: Any, where: str) -> ProductQuantization:
        """:meth:`with_codebooks`."""
        return self.with_codebooks(values, where)

    def final_arrays(self) -> dict[str, np.ndarray]:
        """The codebooks array, flattened (an opq cache's rotations after the centroids)."""
        return {CODEBOOKS_ARRAY: self.parameters()}

    def train(self, sample: np.ndarray) -> ProductQuantization:
        """This quantisation with codebooks trained by faiss on ``sample`` ``(n, slots, dim)``."""
        from elmo_cache.rows.pq_training import train_codebooks

        return train_codebooks(sample, self)

    @property
    def rotation_shape(self) -> tuple[int, int, int]:
        """The shape of the rotations (opq): one ``dim x dim`` matrix per slot."""
        return (self.slots, self.dim, self.dim)

    @property
    def parameter_count(self) -> int:
        """float32 values in the codebooks array: the centroids, then (opq) the rotations."""
        rotations = int(np.prod(self.rotation_shape)) if self.rotated else 0
        return int(np.prod(self.codebook_shape)) + rotations

    def parameters(self) -> np.ndarray:
        """The codebooks array's values (1-D little-endian float32): the centroids, then (opq) the rotations."""
        parts = [self._table()] + ([self._rotation()] if self.rotated else [])
        return np.concatenate([np.asarray(p, dtype="<f4").reshape(-1) for p in parts])

    def with_codebooks(self, codebooks: Any, where: str = "codebooks") -> ProductQuantization:
        """This quantisation with its codebooks array's values (any float32 array of ``parameter_count``
        values: the centroids, then for opq the rotations)."""
        flat = np.asarray(codebooks)
        if flat.dtype != np.float32 or flat.size != self.parameter_count:
            expected = f"{self.codebook_shape}" + (f" then {self.rotation_shape}" if self.rotated else "")
            raise CacheFormatError(f"{where}: {flat.dtype} array of {flat.size} values, expected float32 {expected}")
        values = np.ascontiguousarray(flat, dtype=np.float32).reshape(-1)
        n_centroids = int(np.prod(self.codebook_shape))
        table = values[:n_centroids].reshape(self.codebook_shape)
        table.setflags(write=False)
        if not self.rotated:
            return replace(self, codebooks=table)
        return self.with_rotation(table, values[n_centroids:])

    def with_rotation(self, codebooks: np.ndarray, rotation: Any) -> ProductQuantization:
        """This opq quantisation with its centroids and rotations (float32, ``rotation_shape``'s size)."""
        matrices = np.ascontiguousarray(rotation, dtype=np.float32).reshape(self.rotation_shape)
        matrices.setflags(write=False)
        return replace(self, codebooks=codebooks, rotation=matrices)

    def _table(self) -> np.ndarray:
        if self.codebooks is None:
            raise CacheCorruptError("pq: the codebooks are not loaded (a cache without its codebooks array?)")
        return self.codebooks

    def _rotation(self) -> np.ndarray:
        if self.rotation is None:
            raise CacheCorruptError("opq: the rotations are not loaded (a cache without its codebooks array?)")
        return self.rotation

    @functools.cached_property
    def _rotation_tensor(self) -> torch.Tensor:
        """The rotations as a CPU tensor for decoding: a copy, made once (ours are read-only, and a tensor over a
        read-only array draws torch's warning)."""
        import torch

        return torch.tensor(self._rotation())

    # -- writing ----------------------------------------------------------------------------------

    def nonfinite(self, x: torch.Tensor, stored: np.ndarray) -> np.ndarray | None:
        # Codes are always finite, but a vector with a NaN or inf gets arbitrary ones: the floats decide. One
        # reduction on the device, and a copy to the host only when something is wrong.
        import torch

        if bool(torch.isfinite(x).all()):
            return None
        return nonfinite_rows(x.float().cpu().numpy())

    def quantize_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Rows ``(..., slots, dim)`` (or ``(..., dim)`` for a mix) of float32, on any device, as stored
        uint8 rows ``(..., slots, m)`` on that device: each sub-vector's nearest centroid, the first of equals.

        Distances as ``|c|^2 - 2 x.c`` with one batched matrix product per chunk of rows (``|x|^2`` is the
        same for every centroid): an elementwise ``(x - c)^2`` moved ~16x the bytes and made a bundled
        build 8x slower (benchmarks/RESULTS.md). A vector with a NaN gets arbitrary codes (a pq cache cannot
        hold a non-finite value; int8 can). Each dot product has ``dim / m`` terms, too few for a
        BLAS to split between threads, and both engines encode the same windows in the same batches, so
        the codes are the same in every process (tests/builder/test_distributed.py compares the bytes). On CUDA the
        products run in IEEE float32, as the encoder's do, not in TF32 (a process-wide setting a user may have).
        """
        from elmo_cache.model.float32 import ieee_float32

        with ieee_float32(x.device):
            return self._assign(x)

    def _assign(self, x: torch.Tensor) -> torch.Tensor:
        """The codes; every product's rows a multiple of the encoder's ``ROW_MULTIPLE`` (zero rows added, their
        codes thrown away), so that a vector's codes do not follow the size of its batch (see
        :mod:`elmo_cache.model.bilm`): an update copies a sentence's stored codes where a fresh build encodes
        it in another batch."""
        import torch

        from elmo_cache.model.bilm import ROW_MULTIPLE, round_up

        table = torch.tensor(self._table(), device=x.device)  # (slots, m, 256, dsub); a copy: ours is read-only
        books = table.reshape(self.slots * self.m, CENTROIDS, self.dsub)
        norms = (books * books).sum(-1)[:, None, :]  # (slots * m, 1, 256)
        rows = x.float().reshape(-1, self.slots, self.dim)
        n = rows.shape[0]
        if round_up(n) > n:
            rows = torch.cat([rows, rows.new_zeros(round_up(n) - n, self.slots, self.dim)])
        if self.rotated:  # y = x @ A.T, one product per slot: (slots, n, dim) @ (slots, dim, dim)
            rotation = torch.tensor(self._rotation(), device=x.device)
            rows = torch.bmm(rows.transpose(0, 1), rotation.transpose(1, 2)).transpose(0, 1)
        flat = rows.reshape(-1, self.slots * self.m, self.dsub).transpose(0, 1)  # (slots * m, rows, dsub)
        out = torch.empty(flat.shape[:2], dtype=torch.uint8, device=x.device)
        step = max(1, _CHUNK_ELEMENTS // (self.slots * self.m * CENTROIDS * ROW_MULTIPLE)) * ROW_MULTIPLE
        books_t = books.transpose(1, 2).contiguous()
        for start in range(0, flat.shape[1], step):
            dist = torch.baddbmm(norms, flat[:, start : start + step], books_t, alpha=-2)
            out[:, start : start + step] = dist.argmin(dim=-1).to(torch.uint8)
        return out[:, :n].transpose(0, 1).reshape(*x.shape[:-1], self.m)

    # -- reading ----------------------------------------------------------------------------------

    def for_reading(
        self, where: Any, meta: Mapping[str, Any], optional: Mapping[str, tuple[Any, Any]]
    ) -> ProductQuantization:
        """This quantisation with the cache's codebooks (and rotations) read and checked now, so decoding
        needs nothing more."""
        return load_codebooks(where, meta, self, *optional.get(CODEBOOKS_ARRAY, (None, None)))

    def with_arrays(self, arrays: Mapping[str, Any], where: Any) -> ProductQuantization:
        """This quantisation with the codebooks array of ``arrays`` as the library read it (none: shapes only)."""
        array = arrays.get(CODEBOOKS_ARRAY)
        if array is None:
            return self
        return self.with_codebooks(np.asarray(array[...]), f"array {CODEBOOKS_ARRAY!r}")

    def pad(self, items: Sequence[Any], max_tokens: int) -> torch.Tensor:
        return pad_pq(items, max_tokens)

    def live_as_cached(
        self, acts: np.ndarray, selection: Selection, stored: Selection, dtype: Any = None
    ) -> np.ndarray:
        """A live encoding in the form ``selection`` asks, its stored layers (or its mix, when it is the stored
        one) rounded through the cache's codebooks, as the cache's hits are."""
        if stored.layers is not None:
            layers = list(stored.layers)
            rounded = np.array(acts, dtype=np.float32)
            # Token-major (n, layers, dim): each stored layer through its own codebooks, as the build does.
            rounded[layers] = self.roundtrip(rounded[layers].transpose(1, 0, 2)).transpose(1, 0, 2)
            return selection.apply_array(rounded, dtype)
        out = selection.apply_array(acts, np.float32)
        return np.ascontiguousarray(self.roundtrip(out) if selection.same_as(stored) else out, dtype=dtype)

    def sample_problem(
        self, stored: np.ndarray, expected: np.ndarray, atol: float, rtol: float
    ) -> tuple[str | None, float]:
        """A pq code is right when its centroid is (within the encoder's tolerance) a nearest one; an opq code
        the same of the rotated vector (:meth:`nearest_problem` rotates the fresh floats and their tolerance)."""
        problem = self.nearest_problem(stored, expected, atol + rtol * np.abs(expected))
        return problem, float(np.abs(self.dequantize(stored) - expected).max())

    def dequantize(self, rows: np.ndarray) -> np.ndarray:
        """Floats of stored rows ``(..., slots, m)`` (or ``(..., m)`` with one slot): one gather, float32; for
        opq then one matrix product per slot over all the rows (``x = y @ A``), the same bits for a row whatever
        the other rows (:func:`_rotate_back`)."""
        table = self._table()
        if rows.shape[-1] != self.m:
            raise ValueError(f"stored rows end in {rows.shape[-1]} codes, expected {self.m}")
        codes = rows.reshape(-1, self.slots, self.m).astype(np.intp)
        # Row (slot, j, code) of the flattened table: one take for every sub-vector of every vector.
        base = (np.arange(self.slots)[:, None] * self.m + np.arange(self.m)[None, :]) * CENTROIDS
        out = np.take(table.reshape(-1, self.dsub), codes + base, axis=0).reshape(-1, self.slots, self.dim)
        if self.rotated:
            out = _rotate_back(out, self._rotation_tensor)
        return out.reshape(*rows.shape[:-1], self.dim)

    def raw(self, rows: np.ndarray) -> PQSentence:
        """Stored rows (e.g. one sentence's ``(n_layers, n_tokens, m)``) as their codes, undecoded."""
        return PQSentence(rows, self)

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        """``x`` (float, ``(..., slots, dim)`` or ``(..., dim)``) as a cache of these codebooks returns it."""
        import torch

        return self.dequantize(self.quantize(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))))

    def nearest_problem(self, rows: np.ndarray, fresh: np.ndarray, tolerance: np.ndarray) -> str | None:
        """Whether stored codes ``rows`` are nearest centroids of ``fresh`` floats (same leading shape), up to
        each value moving by ``tolerance`` (the encoder's, broadcast to ``fresh``): verify's sample check."""
        table = self._table()
        x = np.asarray(fresh, np.float32).reshape(-1, self.slots, self.dim)
        slack = np.asarray(np.broadcast_to(tolerance, fresh.shape), np.float32).reshape(-1, self.slots, self.dim)
        if self.rotated:
            # Codes are of y = x @ A.T: a value of y moves by at most sum_d |A[e, d]| slack_d, plus the rounding
            # of a float32 dot product (the build rotated with torch, this with numpy).
            magnitude = np.abs(self._rotation())
            slack = np.einsum("nsd,sed->nse", slack, magnitude) + 1e-5 * np.einsum("nsd,sed->nse", np.abs(x), magnitude)
            x = np.einsum("nsd,sed->nse", x, self._rotation())
        subs = x.reshape(-1, self.slots, self.m, 1, self.dsub)
        sub_slack = slack.reshape(-1, self.slots, self.m, self.dsub)
        dist = ((subs - table[None]) ** 2).sum(-1)  # (n, slots, m, 256)
        codes = rows.reshape(-1, self.slots, self.m).astype(np.intp)
        got = np.take_along_axis(dist, codes[..., None], -1)[..., 0]
        best = dist.min(-1)
        err = np.sqrt((sub_slack**2).sum(-1))  # how far a sub-vector may have moved
        allowed = best + 2 * err * (np.sqrt(got) + np.sqrt(best)) + err**2 + 1e-6 * best
        bad = np.flatnonzero(got > allowed)
        if not len(bad):
            return None
        k = int(bad[0])
        return (f"a stored code is {np.sqrt(got.flat[k]):.4g} from its sub-vector where the nearest centroid is "
                f"{np.sqrt(best.flat[k]):.4g} (not the code of a fresh encoding)")  # fmt: skip


@dataclass(frozen=True)
class PQSentence(UndecodedSentence):
    """One sentence of a product-quantised cache, undecoded: ``Cache.quantized(i)`` and ``CacheDataset`` items.

    ``np.asarray(item)`` gives the floats (as ``cache[i]`` does); :func:`elmo_cache.collate` pads the
    codes of a whole batch and decodes it with one gather.
    """

    # uint8 codes, (n_layers, n_tokens, m) for a layered cache, (n_tokens, m) for a mixed one.
    codes: np.ndarray
    # The cache's quantisation, codebooks loaded (shared, not copied).
    quantization: ProductQuantization

    def collate(self, items: Sequence[Any], max_tokens: int) -> torch.Tensor:
        """One gather for the whole batch."""
        return pad_pq(items, max_tokens)

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the decoded floats."""
        return (*self.codes.shape[:-1], self.quantization.dim)

    def dequantize(self) -> np.ndarray:
        """The floats of the codes' centroids (float32)."""
        if self.codes.ndim == 3:  # (layers, tokens, m): decode token-major, as stored
            return self.quantization.dequantize(self.codes.transpose(1, 0, 2)).transpose(1, 0, 2)
        return self.quantization.dequantize(self.codes)


def _rotate_back(rotated: np.ndarray, rotation: torch.Tensor) -> np.ndarray:
    """``x = y @ A`` per slot: ``rotated`` ``(n, slots, dim)``, ``rotation`` ``(slots, dim, dim)``, float32.

    One torch product per slot, its rows rounded up to the encoder's multiple (the rows past ``n`` zeros, thrown
    away): a row's bits then do not follow the rows read with it, nor the process's threads, as the encoder's own
    products (:mod:`elmo_cache.model.bilm`). numpy's BLAS gave a row other bits by the size of the
    product and the row's place in it (a 2-core Zen 5: over half of 2,000 rows changed when the rows were
    permuted), so a sentence read alone and the same sentence in a collated batch differed."""
    import torch

    from elmo_cache.model.bilm import round_up

    n, slots, dim = rotated.shape
    padded = torch.zeros(round_up(n), slots, dim)
    padded[:n] = torch.from_numpy(rotated)
    out = torch.empty_like(padded)
    for slot in range(slots):  # strided views, read and written in place (a batched product ran 1.3x longer)
        torch.mm(padded[:, slot], rotation[slot], out=out[:, slot])
    return out[:n].numpy()


def pad_pq(items: Sequence[PQSentence], max_tokens: int) -> torch.Tensor:
    """A zero-padded float32 batch of product-quantised sentences, decoded by one gather over the batch:
    ``(batch, n_layers, max_tokens, dim)`` or ``(batch, max_tokens, dim)``."""
    import torch

    first = items[0]
    q = first.quantization
    layered = first.ndim == 3
    token_axis = 1 if layered else 0
    per_token = first.codes.shape[:token_axis]
    mask = np.zeros((len(items), max_tokens), dtype=bool)
    pieces = []
    for b, item in enumerate(items):
        if item.codes.shape[:token_axis] != per_token or item.quantization is not q:
            raise InvalidParameterError(f"collate: item {b} has shape {item.shape}, unlike item 0 {first.shape}")
        pieces.append(item.codes.transpose(1, 0, 2) if layered else item.codes)  # token-major, as stored
        mask[b, : item.codes.shape[token_axis]] = True
    # Only the tokens are decoded (a row decodes to the same bits in any batch), then placed; padding stays zero,
    # as in float batches.
    out = np.zeros((len(items), max_tokens, *per_token, q.dim), dtype=np.float32)  # (batch, tokens, [layers,] dim)
    out[mask] = q.dequantize(np.concatenate(pieces))
    if layered:
        out = out.transpose(0, 2, 1, 3)
    return torch.from_numpy(np.ascontiguousarray(out))


def load_codebooks(
    where: Any, meta: Mapping[str, Any], quantization: ProductQuantization, array: Any, sums: Any
) -> ProductQuantization:
    """``quantization`` with the cache's codebooks ``array`` read whole (15 MiB for opq of the Original model's three
    layers, rotations included) and checked against their block sums ``sums`` when the cache has block sums: a
    flipped bit is an error at open, not wrong vectors."""
    from elmo_cache.store.blocksums import block_sums
    from elmo_cache.store.format import SMALL_BLOCK_ROWS

    if array is None:
        raise CacheCorruptError(f"{where}: array {CODEBOOKS_ARRAY!r} is missing; the cache is corrupt (rebuild it)")
    data = np.ascontiguousarray(array[0 : int(array.shape[0])])
    checksums = meta.get("checksums")
    if meta.get("complete") and isinstance(checksums, dict) and "blocks" in checksums:
        want = None if sums is None else np.asarray(sums[0 : int(sums.shape[0])])
        if want is None or not np.array_equal(block_sums(data.astype("<f4"), SMALL_BLOCK_ROWS), want):
            raise CacheCorruptError(
                f"{where}: array {CODEBOOKS_ARRAY!r} fails its CRC-32C block sums (damaged, or a partial copy); "
                "rebuild or re-copy the cache"
            )
    return quantization.with_codebooks(data, f"{where}: array {CODEBOOKS_ARRAY!r}")


def _parse(value: str) -> ProductQuantization:
    product = parse_product(value)
    if product is None:
        raise invalid_option(value)
    scheme, m = product
    # Unbound (dim 0, no slots) until the model's width is known; bind checks that M divides it.
    return ProductQuantization(0, m, 0, Training(), scheme=scheme)


def _valid_metadata(raw: Mapping[str, Any], dtype: Any) -> bool:
    return (
        dtype == PQ_DTYPE
        and raw.get("codebooks") == CODEBOOKS_ARRAY
        and (raw.get("scheme") != "opq" or raw.get("rotation") == OPQ_ROTATION)
    )


register_builtin(
    CodecEntry(
        schemes=PRODUCT_SCHEMES,
        parse=_parse,
        from_metadata=ProductQuantization.from_metadata,
        choices=("pq:M", "opq:M"),
        expected=(
            f"'pq' or 'opq' with 'codebooks': {CODEBOOKS_ARRAY!r} (opq: and 'rotation': {OPQ_ROTATION!r}) "
            "and dtype 'uint8'"
        ),
        valid_metadata=_valid_metadata,
        help=pq_choices(),
    )
)
