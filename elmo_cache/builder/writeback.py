"""A sentence encoded on its own, as a build stores it: what ``serve --write-back`` keeps of a miss.

A vector's last bits depend on the batch it was encoded in and on the word cache's history
(:mod:`elmo_cache.builder.encoding`), so a live batch's vectors are not a build's. A build of a corpus
of one line encodes that line alone with an empty word cache, then selects or mixes the layers, stores
them through the cache's codec and pools them in float32 (:class:`~elmo_cache.builder.encoding.WindowEncoder`).
:class:`AloneEncoder` does exactly that, so a written-back sentence holds the bytes a fresh build of it
(with the cache's options, on the same kind of device) holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.rows.codecs import RowCodec, stored_rows_on_device
from elmo_cache.rows.pooling import Pool, pool_batch
from elmo_cache.rows.selection import Selection

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder

__all__ = ["AloneEncoder", "Alone"]


@dataclass(frozen=True)
class Alone:
    """One sentence encoded alone: the encoder's float32 output, its stored rows and pooled vector."""

    # (3, n_tokens, dim) float32, as Encoder.embed_batch gives it (what live answers are made from).
    acts: np.ndarray
    # (n_tokens, *stored row) in the codec's dtype, as the cache stores them.
    rows: np.ndarray
    # The stored pooled vector (the cache's pool and its dtype), or None for a cache without one.
    pooled: np.ndarray | None
    # Whether every stored value reads back finite (a build refuses a sentence that does not).
    finite: bool


class AloneEncoder:
    """Encodes sentences one at a time as a build of a one-line corpus with a cache's options would."""

    def __init__(self, encoder: Encoder, selection: Selection, codec: RowCodec, pool: Pool | None) -> None:
        self.encoder = encoder
        self.selection = selection
        self.codec = codec
        self.pool = pool

    @classmethod
    def for_cache(cls, encoder: Encoder, cache: Any) -> AloneEncoder:
        """The encoder of what ``cache`` (an open :class:`~elmo_cache.reader.cache.Cache`) stores."""
        return cls(encoder, Selection.from_metadata(cache.metadata), cache.codec, cache.pool)

    def encode(self, tokens: list[str]) -> Alone:
        """``tokens`` (not empty) encoded alone, with an empty word cache."""
        import torch

        with torch.inference_mode():
            self.encoder.clear_word_cache()
            flat, offsets = self.encoder.encode_flat([tokens])
            out = self.selection.apply(flat, layer_dim=0)
            if self.selection.layers is not None:
                out = out.transpose(0, 1)  # token-major (tokens, L, D), as the build stores rows
            stored_tensor = stored_rows_on_device(self.codec, out)
            rows = stored_tensor.cpu().numpy()
            finite = self.codec.nonfinite(out, rows) is None
            pooled = None
            if self.pool is not None:
                pooled_rows = pool_batch(out.cpu().numpy(), offsets[:-1], np.diff(offsets), self.pool.method)[0]
                with np.errstate(over="ignore"):
                    pooled = pooled_rows.astype(self.pool.dtype)
                finite = finite and bool(np.isfinite(pooled).all())
            acts = flat.cpu().numpy()
        return Alone(acts=acts, rows=rows, pooled=pooled, finite=finite)
