"""The per-word cache of token vectors (char-CNN, highway, projection) an encoder keeps.

A token's vector depends on the word alone, never on its context, so serving a word's vector
from a cache is exact; only the float rounding of the batch it was first computed in (~1e-7)
travels with it, which is why the build clears the cache at fixed points.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from elmo_cache.encoder.transfer import to_device

__all__ = ["WordVectorCache"]


class WordVectorCache:
    """Token vectors of up to ``capacity`` distinct words; words past it are computed every time."""

    def __init__(self, capacity: int, dim: int, device: torch.device, compute: Callable[[list[str]], torch.Tensor]):
        # compute(words) -> (len(words), dim) vectors of words not cached yet.
        self._compute = compute
        self._capacity = capacity
        self._device = device
        self._slots: dict[str, int] = {}
        self._table = torch.empty(0, dim, device=device)

    def __len__(self) -> int:
        return len(self._slots)

    def clear(self) -> None:
        """Forget every cached vector."""
        self._slots = {}
        self._table = self._table[:0]

    def vectors(self, words: list[str]) -> torch.Tensor:
        """``(len(words), dim)``: the vector of each of ``words`` (distinct), cached or computed now."""
        slots = self._slots
        missing = [w for w in words if w not in slots]
        if not missing:
            index = to_device(np.fromiter((slots[w] for w in words), np.int64, len(words)), self._device)
            return self._table.index_select(0, index)
        new_vectors = self._compute(missing)
        room = self._capacity - len(slots)
        if room > 0:
            keep = missing[:room]
            base = len(slots)
            self._table = torch.cat([self._table, new_vectors[: len(keep)]])
            for k, word in enumerate(keep):
                slots[word] = base + k
        # Words just cached and words past the capacity both read from the new vectors.
        table = torch.cat([self._table, new_vectors])
        fresh = {w: len(self._table) + k for k, w in enumerate(missing)}
        index = to_device(
            np.fromiter((slots[w] if w in slots else fresh[w] for w in words), np.int64, len(words)), self._device
        )
        return table.index_select(0, index)
