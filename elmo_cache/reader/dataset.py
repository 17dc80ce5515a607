"""A PyTorch ``Dataset`` over a cache, and ``collate``, which pads a batch and masks it.

Worker processes: the dataset holds only the cache *path*. Each process (the main one, every
forked or spawned DataLoader worker) opens its own :class:`~elmo_cache.reader.cache.Cache` on first
use, so no file handle is pickled or crosses a fork; the cache's pages themselves
are shared by all workers through the kernel's page cache.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, default_collate

from elmo_cache.errors import InvalidParameterError
from elmo_cache.reader.cache import Cache
from elmo_cache.reader.cache import open as open_cache
from elmo_cache.rows.codecs import UndecodedSentence, pad_floats

__all__ = ["CacheDataset", "collate", "Batch"]


class CacheDataset(Dataset):
    """Sentence ``i`` of a cache, optionally zipped with the user's per-sentence fields.

    ``CacheDataset(path)[i]`` is the array ``cache[i]``; ``CacheDataset(path, labels, ids)[i]``
    is the tuple ``(cache[i], labels[i], ids[i])``. For a quantised cache the array is
    ``cache.quantized(i)`` (codes and scales; ``np.asarray`` of it gives the floats), which
    :func:`collate` decodes a whole batch at a time. Every extra field must have one item per
    sentence. Pair it with :func:`collate`::

        loader = DataLoader(CacheDataset("train.zarr", labels), batch_size=32, collate_fn=collate, num_workers=4)
    """

    def __init__(self, path: str | os.PathLike[str], *fields: Sequence[Any], allow_incomplete: bool = False):
        self.path = Path(path)
        self.allow_incomplete = allow_incomplete
        with open_cache(self.path, allow_incomplete=allow_incomplete) as cache:
            if cache.pool_only:  # refused here, not at the first batch in a DataLoader worker
                raise InvalidParameterError(
                    f"path: {self.path} stores only pooled sentence vectors (--pool-only), no token vectors; "
                    "read them with elmo_cache.open(path).sentence_vector(i)"
                )
            self._length = len(cache)
            self.kind = cache.kind
            self.layers = cache.layers
            self.dim = cache.dim
        for k, field in enumerate(fields):
            if len(field) != self._length:
                raise InvalidParameterError(
                    f"extra field {k} has {len(field)} items but cache {self.path} has {self._length} sentences"
                )
        self.fields = fields
        self._cache: Cache | None = None
        self._pid: int | None = None

    @property
    def cache(self) -> Cache:
        """This process's cache, opened on first use (reopened after a fork)."""
        if self._cache is None or self._pid != os.getpid():
            self._cache = open_cache(self.path, allow_incomplete=self.allow_incomplete)
            self._pid = os.getpid()
        return self._cache

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, i: int) -> Any:
        # Checked here, not only by the cache: the extra fields are indexed too, and a label list would
        # answer dataset[True] with its item 1, or a numpy field dataset[[1, 2]] with two labels.
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"CacheDataset indices are sentence numbers (int), not {type(i).__name__}")
        cache = self.cache
        # Quantised: the codes and scales travel (a quarter of the floats' bytes); collate decodes the batch.
        vectors = cache.quantized(i) if cache.codec.quantized else cache[i]
        if not self.fields:
            return vectors
        return (vectors, *(field[i] for field in self.fields))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # never pickle mappings: each process opens its own
        state["_pid"] = None
        return state


class Batch(NamedTuple):
    """What :func:`collate` returns."""

    # float32 (batch, n_layers, max_tokens, dim) for layered caches, (batch, max_tokens, dim) for mixed; zero padded
    vectors: torch.Tensor
    # bool (batch, max_tokens): True where a real token is
    mask: torch.Tensor
    # int64 (batch,): tokens per sentence
    lengths: torch.Tensor
    # one entry per extra field: stacked with torch's default_collate when possible, else a list
    fields: tuple[Any, ...]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with its tensors (and tensor fields) moved to ``device``."""

        def move(x: Any) -> Any:
            return x.to(device, non_blocking=non_blocking) if isinstance(x, torch.Tensor) else x

        return Batch(move(self.vectors), move(self.mask), move(self.lengths), tuple(move(f) for f in self.fields))


def _collate_field(values: list[Any]) -> Any:
    try:
        return default_collate(values)
    except (TypeError, RuntimeError):  # ragged or foreign items: hand them back as they came
        return values


def collate(batch: Sequence[Any]) -> Batch:
    """Pad a list of ``CacheDataset`` items into a :class:`Batch` of float32 tensors plus a mask."""
    if not batch:
        raise InvalidParameterError("collate: empty batch")
    tupled = isinstance(batch[0], tuple)
    arrays = [item[0] for item in batch] if tupled else list(batch)
    first = arrays[0]
    layered = first.ndim == 3
    token_axis = 1 if layered else 0
    lengths = [a.shape[token_axis] for a in arrays]
    max_tokens = max(lengths)
    # A quantised sentence decodes its batch at once, as its codec does (int8: one multiply; pq: one gather).
    vectors = (
        first.collate(arrays, max_tokens) if isinstance(first, UndecodedSentence) else pad_floats(arrays, max_tokens)
    )
    return _batch(vectors, lengths, batch, tupled)


def _batch(vectors: torch.Tensor, lengths: list[int], batch: Sequence[Any], tupled: bool) -> Batch:
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    mask = torch.arange(max(lengths)).unsqueeze(0) < lengths_t.unsqueeze(1)
    fields: tuple[Any, ...] = ()
    if tupled:
        fields = tuple(_collate_field([item[k] for item in batch]) for k in range(1, len(batch[0])))
    return Batch(vectors, mask, lengths_t, fields)
