"""Quantised vectors (``build --quantize int8``): one int8 code per value and one float32 scale per vector.

Scheme (``int8``): every stored vector ``x`` (one layer of one token, or one mixed vector) of ``dim``
values gets the scale ``s = max|x| / 127`` and the codes ``q = round(x / s)`` in ``[-127, 127]``; it
reads back as ``q * s``, so ``|x - q * s| <= s / 2`` for every value (up to float32 round-off of the
division and the product). Symmetric per-vector absmax is deterministic (no statistics over the
corpus, so a window's rows depend on the window alone, like every other stored byte) and costs
``dim + 4`` bytes per vector instead of ``2 * dim`` in float16.

Layout (docs/FORMAT.md, "Quantised caches"): the scale's four bytes (float32, little-endian) follow
the ``dim`` codes of its vector inside the ``vectors`` array, whose dtype is then int8 and whose last
axis is ``dim + 4``. Keeping the scale in the row, rather than in an array of its own, means one
sentence is still one contiguous run of mapped bytes, and everything the store already guarantees
for ``vectors`` (shards, the CRC-32 of every file, CRC-32C block sums checked on first read, resume
cut-backs, the Ray engine's parts and stitching) covers the scales with no code of their own.

Quantisation happens in float32 after the layers are selected or mixed, on the encoder's device,
before anything is cast (``--fp16`` does not combine with it: the codes are the storage).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.store.format import PRODUCT_SCHEMES, QUANTIZED_DTYPES, SCALE_BYTES

if TYPE_CHECKING:
    import torch

    from elmo_cache.rows.selection import Selection

__all__ = [
    "QUANTIZE_CHOICES",
    "Quantization",
    "QuantizedSentence",
    "parse_quantize",
    "quantization_of",
    "quantization_for_reading",
    "make_quantization",
    "stored_row_shape",
    "pad_quantized",
    "live_as_cached",
]

QUANTIZE_CHOICES = ("none", "int8", "pq:M", "opq:M")
"""Valid ``--quantize`` values ("none": float vectors, as before; "pq:M", "opq:M": elmo_cache.rows.pq, M a number)."""

# The largest code: symmetric, so -128 is never used and negation is exact.
_QMAX = 127.0
# Codes and scales are little-endian in the format; the packing below views native floats as bytes.
assert sys.byteorder == "little", "quantised caches are written on little-endian machines only"


def parse_quantize(value: str | None) -> str | None:
    """``--quantize`` as a scheme name (``int8``, ``pq:M``, ``opq:M``), or None for float vectors; anything else is
    an error listing the choices (whether M divides the model's width is checked once the model is known)."""
    from elmo_cache.rows.pq import parse_product, pq_choices

    if value is None or value == "none":
        return None
    if value != "int8" and parse_product(value) is None:
        raise InvalidParameterError(
            f"quantize: {value!r} is not valid; choose from {list(QUANTIZE_CHOICES)} ({pq_choices()})"
        )
    return value


def make_quantization(name: str, dim: int, slots: int, sample: int | None = None) -> Any:
    """The quantisation ``name`` (:func:`parse_quantize`'s) of rows of ``slots`` vectors of ``dim`` values:
    a :class:`Quantization`, or an untrained :class:`elmo_cache.rows.pq.ProductQuantization` (pq or opq) whose
    codebooks will be trained on ``sample`` token rows (None: the default of :class:`elmo_cache.rows.pq.Training`)."""
    from elmo_cache.rows.pq import ProductQuantization, Training, parse_product

    product = parse_product(name)
    if product is None:
        return Quantization(name, dim)
    scheme, m = product
    training = Training() if sample is None else Training(vectors=sample)
    return ProductQuantization(dim, m, slots, training, scheme=scheme)


@dataclass(frozen=True)
class Quantization:
    """How a cache's vectors are quantised, and the code that writes and reads them (FORMAT.md)."""

    # Scheme name: "int8" (per-vector absmax, float32 scale); product quantisation is elmo_cache.rows.pq's.
    scheme: str
    # Values per vector (the model's output width): the codes that precede each scale.
    dim: int

    # -- metadata ---------------------------------------------------------------------------------

    def to_metadata(self) -> dict[str, Any]:
        """The metadata's ``quantization`` object."""
        return {"scheme": self.scheme, "scale": "float32"}

    @property
    def stored_dim(self) -> int:
        """Bytes per stored vector: the codes, then the scale."""
        return self.dim + SCALE_BYTES

    def stored_shape(self, row_shape: Sequence[int]) -> tuple[int, ...]:
        """The stored row of a float row of ``row_shape`` (its last axis gains the scale's bytes)."""
        return (*tuple(row_shape)[:-1], self.stored_dim)

    # -- writing ----------------------------------------------------------------------------------

    def quantize(self, x: torch.Tensor) -> np.ndarray:
        """Rows ``(..., dim)`` of float32 (on any device) as stored int8 rows ``(..., dim + 4)`` (host numpy).

        A vector of zeros gets scale 0 and codes 0; a non-finite vector keeps a non-finite scale, so
        it reads back non-finite (and the server refuses it) rather than as wrong numbers.
        """
        import torch

        x = x.float()
        scale = x.abs().amax(dim=-1, keepdim=True) / _QMAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.nan_to_num(torch.round(x / safe), nan=0.0).clamp_(-_QMAX, _QMAX).to(torch.int8)
        # Only the stored bytes cross to the host; the scale's float32 bytes are appended to its codes.
        out = np.empty((*x.shape[:-1], self.stored_dim), dtype=np.int8)
        out[..., : self.dim] = codes.cpu().numpy()
        out[..., self.dim :] = scale.cpu().numpy().astype("<f4").view(np.int8)
        return out

    # -- reading ----------------------------------------------------------------------------------

    def split(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(codes, scales)`` of stored rows ``(..., dim + 4)``: int8 ``(..., dim)`` and float32 ``(...)``, views."""
        if rows.shape[-1] != self.stored_dim:
            raise ValueError(f"stored rows end in {rows.shape[-1]} bytes, expected {self.stored_dim}")
        codes = rows[..., : self.dim]
        tail = rows[..., self.dim :]
        if tail.strides[-1] != 1:  # a view of bytes as float32 needs them consecutive
            tail = np.ascontiguousarray(tail)
        return codes, tail.view("<f4")[..., 0]

    def dequantize(self, rows: np.ndarray) -> np.ndarray:
        """Floats of stored rows ``(..., dim + 4)``: ``(..., dim)`` float32, one vectorised multiply."""
        codes, scales = self.split(rows)
        out = np.empty(codes.shape, dtype=np.float32)
        np.multiply(codes, scales[..., None], out=out, dtype=np.float32)
        return out

    def decoder(self, read: Callable[[int, int], np.ndarray]) -> Callable[[int, int], np.ndarray]:
        """A row reader ``read(start, stop)`` of stored rows turned into one of decoded float32 rows."""
        dequantize = self.dequantize
        return lambda start, stop: dequantize(read(start, stop))

    def raw(self, rows: np.ndarray) -> QuantizedSentence:
        """Stored rows (any leading axes, e.g. one sentence's ``(n_layers, n_tokens, dim + 4)``) as their codes
        and scales, zero-copy views."""
        codes, scales = self.split(rows)
        return QuantizedSentence(codes, scales)

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        """``x`` (float, ``(..., dim)``) as a cache of this scheme would return it: quantised, then read back."""
        import torch

        codes, scales = self.split(self.quantize(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))))
        return np.multiply(codes, scales[..., None], dtype=np.float32)


class UndecodedSentence:
    """What an undecoded sentence of either quantised kind shares: numpy sees its decoded float32 values
    (``np.asarray(item)`` is ``cache[i]``); a subclass says how it decodes and what shape that gives."""

    codes: np.ndarray

    @property
    def ndim(self) -> int:
        return self.codes.ndim

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the decoded floats."""
        return np.dtype(np.float32)

    def dequantize(self) -> np.ndarray:
        raise NotImplementedError

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.dequantize()
        return out if dtype is None else out.astype(dtype, copy=False)


@dataclass(frozen=True)
class QuantizedSentence(UndecodedSentence):
    """One sentence of a quantised cache, undecoded: ``Cache.quantized(i)`` and ``CacheDataset`` items.

    ``np.asarray(item)`` gives the floats (as ``cache[i]`` does); :func:`elmo_cache.collate` pads the
    codes and scales of a whole batch and decodes it with one multiply.
    """

    # int8 codes, (n_layers, n_tokens, dim) for a layered cache, (n_tokens, dim) for a mixed one.
    codes: np.ndarray
    # float32 scale of each vector: (n_layers, n_tokens) or (n_tokens,); value = code * scale.
    scales: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    def dequantize(self) -> np.ndarray:
        """The floats ``codes * scales`` (float32)."""
        return np.multiply(self.codes, self.scales[..., None], dtype=np.float32)


def quantization_of(meta: Mapping[str, Any], codebooks: Any = None) -> Any:
    """The quantisation a cache's metadata records (None: float vectors, as in every older cache): a
    :class:`Quantization`, or a :class:`elmo_cache.rows.pq.ProductQuantization` holding ``codebooks`` (the
    cache's :data:`~elmo_cache.store.format.CODEBOOKS` array, checked; None: shapes only, no decoding)."""
    raw = meta.get("quantization")
    if raw is None:
        return None
    scheme = raw.get("scheme") if isinstance(raw, Mapping) else None
    dim = int(meta.get("dim") or 0)
    if scheme in PRODUCT_SCHEMES:
        from elmo_cache.rows.pq import ProductQuantization

        slots = len(meta.get("layers") or []) if meta.get("kind") == "layers" else 1
        pq = ProductQuantization.from_metadata(raw, dim, slots)
        return pq if codebooks is None else pq.with_codebooks(codebooks, "array 'quantization/codebooks'")
    if scheme not in QUANTIZED_DTYPES or raw.get("scale") != "float32":
        raise CacheFormatError(
            f"metadata quantization {raw!r} is not one this elmo-cache reads "
            f"(int8 with float32 scales, pq or opq); upgrade elmo-cache"
        )
    return Quantization(scheme, dim)


def quantization_for_reading(where: Any, meta: Mapping[str, Any], optional: Mapping[str, tuple[Any, Any]]) -> Any:
    """:func:`quantization_of` for a reader: a pq or opq cache's codebooks (and rotations) read from ``optional``
    (the cache's optional arrays and their block sums, by name) and checked now, so decoding needs nothing more."""
    quantization = quantization_of(meta)
    if getattr(quantization, "scheme", None) not in PRODUCT_SCHEMES:
        return quantization
    from elmo_cache.rows.pq import load_codebooks
    from elmo_cache.store.format import CODEBOOKS

    return load_codebooks(where, meta, quantization, *optional.get(CODEBOOKS, (None, None)))


def stored_row_shape(meta: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape of one row of ``vectors`` that a cache's metadata implies (quantised rows included)."""
    dim = int(meta.get("dim") or 0)
    row: tuple[int, ...] = (dim,) if meta.get("kind") == "mix" else (len(meta.get("layers") or []), dim)
    quantization = quantization_of(meta)
    return row if quantization is None else quantization.stored_shape(row)


def pad_quantized(items: Sequence[QuantizedSentence], max_tokens: int) -> torch.Tensor:
    """A zero-padded float32 batch of quantised sentences, decoded by one multiply over the whole batch:
    ``(batch, n_layers, max_tokens, dim)`` or ``(batch, max_tokens, dim)``."""
    import torch

    first = items[0]
    layered = first.ndim == 3
    token_axis = 1 if layered else 0
    per_token = first.shape[:token_axis] + first.shape[token_axis + 1 :]
    shape = (len(items), *first.shape[:token_axis], max_tokens, first.shape[-1])
    codes = np.zeros(shape, dtype=np.int8)
    scales = np.zeros(shape[:-1], dtype=np.float32)
    for b, item in enumerate(items):
        if item.shape[:token_axis] + item.shape[token_axis + 1 :] != per_token:
            raise InvalidParameterError(f"collate: item {b} has shape {item.shape}, unlike item 0 {first.shape}")
        n = item.shape[token_axis]
        if layered:
            codes[b, :, :n] = item.codes
            scales[b, :, :n] = item.scales
        else:
            codes[b, :n] = item.codes
            scales[b, :n] = item.scales
    # numpy, one thread: torch's multi-threaded kernels were 10-30x slower than this on a busy 2-core
    # box (OpenMP threads waiting on each other; benchmarks/RESULTS.md, "Quantised caches").
    return torch.from_numpy(np.multiply(codes, scales[..., None], dtype=np.float32))  # padding stays 0


def live_as_cached(
    acts: np.ndarray, selection: Selection, stored: Selection, quantization: Any, dtype: Any = None
) -> np.ndarray:
    """A live encoding ``(3, n_tokens, dim)`` float32 in the form ``selection`` asks, rounded as a quantised
    cache storing ``stored`` rounds it, so that a server's live answers equal its cache hits.

    A layered int8 cache quantises each (layer, token) vector alone, so every layer is rounded before the
    selection (a mix of stored layers is then computed from rounded layers, as from the cache); a mixed
    cache rounds its mix, so only that mix is rounded (any other is not in the cache anyway).
    """
    if quantization.scheme in PRODUCT_SCHEMES:
        from elmo_cache.rows.pq import pq_live_as_cached

        return pq_live_as_cached(acts, selection, stored, quantization, dtype)
    if stored.layers is not None:
        return selection.apply_array(quantization.roundtrip(acts), dtype)
    out = selection.apply_array(acts, np.float32)
    return np.ascontiguousarray(quantization.roundtrip(out) if selection.same_as(stored) else out, dtype=dtype)
