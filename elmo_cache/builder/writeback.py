"""A sentence encoded on its own, as a build stores it: what ``serve --write-back`` keeps of a miss.

On a device whose rows are not batch-free (:mod:`elmo_cache.encoder.batch_free`), a vector's last bits depend on
the batch it was encoded in and on the word cache's history (:mod:`elmo_cache.builder.encoding`), so a live
batch's vectors are not a build's. A build of a corpus of one line encodes that line alone with an empty word
cache, as a batch of one sentence through the build's per-batch path
(:class:`~elmo_cache.builder.encoding.BatchEncoder`: the selection or mix, the cache's codec, the pool in float32).
:class:`AloneEncoder` does exactly that, so a written-back sentence holds the bytes a fresh build of it (with the
cache's options, on the same kind of device) holds; where rows are batch-free, several misses share one batch and
still hold those bytes (:meth:`AloneEncoder.encode_many`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.builder.encoding import BatchEncoder, EncodedBatch
from elmo_cache.rows.codecs import RowCodec
from elmo_cache.rows.pooling import Pool
from elmo_cache.rows.selection import Selection

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder

__all__ = ["AloneEncoder", "Alone"]


@dataclass(frozen=True)
class Alone:
    """One sentence encoded alone: the encoder's float32 output, its stored rows and pooled vector."""

    # (n_layers, n_tokens, dim) float32, as Encoder.embed_batch gives it (what live answers are made from):
    # 3 layers for ELMo, the embeddings and every block for a Transformer model.
    acts: np.ndarray
    # (n_tokens, *stored row) in the codec's dtype, as the cache stores them ((n_tokens, 0) for a pool-only cache).
    rows: np.ndarray
    # The stored pooled vector (the cache's pool and its dtype), or None for a cache without one.
    pooled: np.ndarray | None
    # Whether every stored value reads back finite (a build refuses a sentence that does not).
    finite: bool


class AloneEncoder:
    """Encodes sentences one at a time as a build of a one-line corpus with a cache's options would."""

    def __init__(
        self, encoder: Encoder, selection: Selection, codec: RowCodec, pool: Pool | None, token_rows: bool = True
    ) -> None:
        self.encoder = encoder
        # A --pool-only cache (token_rows false) keeps no token rows: its rows are (n_tokens, 0), and only its
        # pooled vector must read back finite, as its build checks.
        self.token_rows = token_rows
        self.batch = BatchEncoder(encoder, selection, codec, pool, token_rows)

    @classmethod
    def for_cache(cls, encoder: Encoder, cache: Any) -> AloneEncoder:
        """The encoder of what ``cache`` (an open :class:`~elmo_cache.reader.cache.Cache`) stores."""
        return cls(encoder, Selection.from_metadata(cache.metadata), cache.codec, cache.pool, not cache.pool_only)

    def encode_many(self, batch: list[list[str]]) -> list[Alone]:
        """Each sentence of ``batch`` (none empty) as :meth:`encode` gives it. Where the encoder's rows are batch-free
        on its device (:func:`~elmo_cache.encoder.batch_free.rows_batch_free`), a sentence holds the same bits in a
        batch of others as alone, so the batch is encoded in one go (from an empty word cache); elsewhere, and for a
        batch holding a sentence that would not read back finite (a batch reports only its first), one by one."""
        import torch

        from elmo_cache.encoder.batch_free import rows_batch_free

        if len(batch) > 1 and rows_batch_free(self.encoder):
            with torch.inference_mode():
                self.encoder.clear_word_cache()
                done = self.batch.encode(batch)
                acts = done.flat.cpu().numpy()
            if done.nonfinite is None:
                return [self._alone(done, acts, k, finite=True) for k in range(len(batch))]
        return [self.encode(tokens) for tokens in batch]

    def encode(self, tokens: list[str]) -> Alone:
        """``tokens`` (not empty) encoded alone, with an empty word cache."""
        import torch

        with torch.inference_mode():
            self.encoder.clear_word_cache()
            done = self.batch.encode([tokens])
            acts = done.flat.cpu().numpy()
        return self._alone(done, acts, 0, finite=done.nonfinite is None)

    def _alone(self, done: EncodedBatch, acts: np.ndarray, k: int, finite: bool) -> Alone:
        """Sentence ``k`` of an encoded batch (``acts``: its float32 output on the host)."""
        assert done.rows is not None  # BatchEncoder.encode copies them to the host
        a, b = int(done.offsets[k]), int(done.offsets[k + 1])
        rows = done.rows[a:b] if self.token_rows else np.empty((b - a, 0), dtype=done.rows.dtype)
        pooled = None if done.pooled_stored is None else done.pooled_stored[k]
        return Alone(acts=acts[:, a:b], rows=rows, pooled=pooled, finite=finite)
