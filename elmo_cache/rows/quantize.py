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
sentence is still one contiguous run of bytes (one read), and everything the store already guarantees
for ``vectors`` (shards, the CRC-32 of every file, CRC-32C block sums checked on first read, resume
cut-backs, the Ray engine's parts and stitching) covers the scales with no code of their own.

Quantisation happens in float32 after the layers are selected or mixed, on the encoder's device,
before anything is cast (``--fp16`` does not combine with it: the codes are the storage).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.rows.codecs import (
    CodecEntry,
    QuantizedCodec,
    UndecodedSentence,
    UntrainedCodec,
    invalid_option,
    nonfinite_rows,
    register_builtin,
)
from elmo_cache.store.format import QUANTIZED_DTYPE, SCALE_BYTES

if TYPE_CHECKING:
    import torch

    from elmo_cache.rows.selection import Selection

__all__ = [
    "INT8",
    "Quantization",
    "QuantizedSentence",
    "pad_quantized",
]

INT8 = "int8"
"""The scheme name (``--quantize int8`` and metadata ``quantization.scheme``)."""

# The largest code: symmetric, so -128 is never used and negation is exact.
_QMAX = 127.0
# Codes and scales are little-endian in the format; the packing below views native floats as bytes.
assert sys.byteorder == "little", "quantised caches are written on little-endian machines only"


@dataclass(frozen=True)
class Quantization(UntrainedCodec, QuantizedCodec):
    """How a cache's vectors are quantised to int8, and the code that writes and reads them (FORMAT.md): the
    int8 :class:`~elmo_cache.rows.codecs.RowCodec`."""

    # Scheme name: "int8" (per-vector absmax, float32 scale).
    scheme: str = INT8
    # Values per vector (the model's output width): the codes that precede each scale; 0 until bound.
    dim: int = 0

    @property
    def name(self) -> str:
        return self.scheme

    @property
    def dtype(self) -> str:
        return QUANTIZED_DTYPE

    def rounding_step(self, scale: float) -> float | None:
        # The vector's scale is its largest magnitude over 127 (a code step; rounding is half of it).
        return scale / _QMAX

    def with_training_vectors(self, vectors: int) -> Quantization:
        raise InvalidParameterError("codebook_sample: int8 rows are not trained")

    def bind(self, dim: int, slots: int) -> Quantization:
        # Every vector has its own scale: the slots change nothing.
        return replace(self, dim=int(dim))

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

    def quantize_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Rows ``(..., dim)`` of float32 (on any device) as stored int8 rows ``(..., dim + 4)`` on that device.

        A vector of zeros gets scale 0 and codes 0; a non-finite vector keeps a non-finite scale, so
        it reads back non-finite (and the server refuses it) rather than as wrong numbers.
        """
        import torch

        x = x.float()
        scale = x.abs().amax(dim=-1, keepdim=True) / _QMAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.nan_to_num(torch.round(x / safe), nan=0.0).clamp_(-_QMAX, _QMAX).to(torch.int8)
        # The scale's float32 bytes follow its codes, little-endian as the format says: a tensor's bytes are the
        # machine's order, which is little-endian on every device torch runs on but a big-endian host's CPU.
        if sys.byteorder == "little":
            scale_bytes = scale.reshape(-1).contiguous().view(torch.int8).reshape(*scale.shape[:-1], SCALE_BYTES)
            return torch.cat([codes, scale_bytes], dim=-1)
        little = torch.from_numpy(scale.cpu().numpy().astype("<f4").view(np.int8)).to(x.device)
        return torch.cat([codes, little], dim=-1)

    def nonfinite(self, x: torch.Tensor, stored: np.ndarray) -> np.ndarray | None:
        # A row reads back as codes times its float32 scale: the codes are bounded, so the scale decides
        # (inf or NaN for a non-finite vector, or one whose largest magnitude overflows the division).
        return nonfinite_rows(self.split(stored)[1])

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

    def raw(self, rows: np.ndarray) -> QuantizedSentence:
        """Stored rows (any leading axes, e.g. one sentence's ``(n_layers, n_tokens, dim + 4)``) as their codes
        and scales, zero-copy views."""
        codes, scales = self.split(rows)
        return QuantizedSentence(codes, scales)

    def pad(self, items: Sequence[Any], max_tokens: int) -> torch.Tensor:
        return pad_quantized(items, max_tokens)

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        """``x`` (float, ``(..., dim)``) as a cache of this scheme would return it: quantised, then read back."""
        import torch

        codes, scales = self.split(self.quantize(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))))
        return np.multiply(codes, scales[..., None], dtype=np.float32)

    def live_as_cached(
        self, acts: np.ndarray, selection: Selection, stored: Selection, dtype: Any = None
    ) -> np.ndarray:
        """A live encoding rounded as this cache rounds its hits.

        A layered int8 cache quantises each (layer, token) vector alone, so every layer is rounded before the
        selection (a mix of stored layers is then computed from rounded layers, as from the cache); a mixed
        cache rounds its mix, so only that mix is rounded (any other is not in the cache anyway).
        """
        if stored.layers is not None:
            return selection.apply_array(self.roundtrip(acts), dtype)
        out = selection.apply_array(acts, np.float32)
        return np.ascontiguousarray(self.roundtrip(out) if selection.same_as(stored) else out, dtype=dtype)

    # -- verify -----------------------------------------------------------------------------------

    def sample_problem(
        self, stored: np.ndarray, expected: np.ndarray, atol: float, rtol: float
    ) -> tuple[str | None, float]:
        """Each value may be off by half its vector's scale, on top of the encoder's own tolerance."""
        half_step = self.split(stored)[1][..., None] * (0.5 + 1e-4)
        error = np.abs(self.dequantize(stored) - expected)
        worst = float(error.max())
        if (error > atol + rtol * np.abs(expected) + half_step).any():
            return (
                f"stored vectors differ from a fresh encoding by up to {worst:.3g} (tolerance {atol:g} + {rtol:g} "
                "x |value| + half the vector's quantisation step)"
            ), worst
        return None, worst


@dataclass(frozen=True)
class QuantizedSentence(UndecodedSentence):
    """One sentence of an int8 cache, undecoded: ``Cache.quantized(i)`` and ``CacheDataset`` items.

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

    def collate(self, items: Sequence[Any], max_tokens: int) -> torch.Tensor:
        return pad_quantized(items, max_tokens)


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


def _parse(value: str) -> Quantization:
    if value != INT8:
        raise invalid_option(value)
    return Quantization(INT8)


def _from_metadata(raw: Mapping[str, Any], dim: int, slots: int) -> Quantization:
    if raw.get("scale") != "float32":
        raise CacheFormatError(
            f"metadata quantization {raw!r} is not one this elmo-cache reads "
            f"(int8 with float32 scales, pq or opq); upgrade elmo-cache"
        )
    return Quantization(INT8, dim)


register_builtin(
    CodecEntry(
        schemes=(INT8,),
        parse=_parse,
        from_metadata=_from_metadata,
        choices=(INT8,),
        expected="'int8' with 'scale': 'float32' and dtype 'int8'",
        valid_metadata=lambda raw, dtype: dtype == QUANTIZED_DTYPE and raw.get("scale") == "float32",
    )
)
