"""A PyTorch ``Dataset`` over a cache; ``collate``, which pads a batch and masks it; and
``BucketBatchSampler``, which batches sentences of similar length so that little is padding.

Worker processes: the dataset holds only the cache *path*. Each process (the main one, every
forked or spawned DataLoader worker) opens its own :class:`~elmo_cache.reader.cache.Cache` on first
use, so no file handle is pickled or crosses a fork; the cache's pages themselves
are shared by all workers through the kernel's page cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler, default_collate

from elmo_cache.errors import InvalidParameterError
from elmo_cache.reader.cache import Cache
from elmo_cache.reader.cache import open as open_cache
from elmo_cache.rows.codecs import UndecodedSentence, pad_floats

__all__ = ["CacheDataset", "collate", "Batch", "Fields", "BucketBatchSampler"]


# Names a field may not take: Batch's own attributes, which batch.<name> must keep meaning.
_RESERVED = ("vectors", "mask", "lengths", "fields", "to", "count", "index")


class CacheDataset(Dataset):
    """Sentence ``i`` of a cache, optionally zipped with the user's per-sentence fields.

    ``CacheDataset(path)[i]`` is the array ``cache[i]``; ``CacheDataset(path, labels, ids)[i]``
    is the tuple ``(cache[i], labels[i], ids[i])``; with fields by name,
    ``CacheDataset(path, labels=labels, ids=ids)[i]`` is the dict
    ``{"vectors": cache[i], "labels": labels[i], "ids": ids[i]}`` and :func:`collate` gives
    ``batch.labels`` and ``batch.fields["labels"]``. For a quantised cache the array is
    ``cache.quantized(i)`` (codes and scales; ``np.asarray`` of it gives the floats), which
    :func:`collate` decodes a whole batch at a time. Every extra field must have one item per
    sentence. Pair it with :func:`collate` (and :class:`BucketBatchSampler` for less padding)::

        loader = DataLoader(CacheDataset("train.zarr", labels=y), batch_size=32, collate_fn=collate, num_workers=4)
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *fields: Sequence[Any],
        allow_incomplete: bool = False,
        **named: Sequence[Any],
    ):
        if fields and named:
            raise InvalidParameterError(
                "fields: give the extra fields by position or by name, not both (by name: "
                f"CacheDataset(path, {', '.join(f'{n}=...' for n in named)}, ...))"
            )
        for name in named:
            if name in _RESERVED or name.startswith("_"):
                raise InvalidParameterError(
                    f"fields: {name!r} cannot name a field: it is a Batch attribute or private; the reserved names "
                    f"are {list(_RESERVED)} and names starting with '_'"
                )
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
        for k, field in [*enumerate(fields), *named.items()]:
            if len(field) != self._length:
                raise InvalidParameterError(
                    f"extra field {k} has {len(field)} items but cache {self.path} has {self._length} sentences"
                )
        self.fields = fields
        self.named = dict(named)
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
        if self.named:
            return {"vectors": vectors, **{name: field[i] for name, field in self.named.items()}}
        if not self.fields:
            return vectors
        return (vectors, *(field[i] for field in self.fields))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = None  # never pickle mappings: each process opens its own
        state["_pid"] = None
        return state


class Fields(tuple):
    """A batch's extra fields in order (``batch.fields[0]``); those given by name also by name
    (``batch.fields["labels"]``, ``batch.labels``)."""

    names: tuple[str, ...]

    def __new__(cls, values: Sequence[Any] = (), names: Sequence[str] = ()) -> Fields:
        made = super().__new__(cls, values)
        made.names = tuple(names)
        return made

    def __getnewargs__(self) -> tuple[tuple[Any, ...], tuple[str, ...]]:  # pickled back from DataLoader workers
        return tuple(self), self.names

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            if key not in self.names:
                raise KeyError(f"{key!r}: not a field of this batch; its named fields are {list(self.names)}")
            key = self.names.index(key)
        return super().__getitem__(key)

    def as_dict(self) -> dict[str, Any]:
        """The named fields as a dict (empty when the fields were given by position)."""
        return dict(zip(self.names, self))


class Batch(NamedTuple):
    """What :func:`collate` returns; a field given by name is also an attribute (``batch.labels``)."""

    # (batch, n_layers, max_tokens, dim) for layered caches, (batch, max_tokens, dim) for mixed; zero padded;
    # the dtype cache[i] reads in (float16 for a --fp16 cache, float32 for a float32 or quantised one) unless
    # collate was asked for another
    vectors: torch.Tensor
    # bool (batch, max_tokens): True where a real token is
    mask: torch.Tensor
    # int64 (batch,): tokens per sentence
    lengths: torch.Tensor
    # one entry per extra field: stacked with torch's default_collate when possible, else a list (a Fields:
    # named fields by name too)
    fields: tuple[Any, ...]

    def __getattr__(self, name: str) -> Any:
        names = getattr(self.fields, "names", ())
        if name in names:
            return self.fields[names.index(name)]
        known = f"; its named fields are {list(names)}" if names else ""
        raise AttributeError(f"'Batch' object has no attribute {name!r}{known}")

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with its tensors (and tensor fields) moved to ``device``."""

        def move(x: Any) -> Any:
            return x.to(device, non_blocking=non_blocking) if isinstance(x, torch.Tensor) else x

        fields = Fields([move(f) for f in self.fields], getattr(self.fields, "names", ()))
        return Batch(move(self.vectors), move(self.mask), move(self.lengths), fields)


def _collate_field(values: list[Any]) -> Any:
    try:
        return default_collate(values)
    except (TypeError, RuntimeError):  # ragged or foreign items: hand them back as they came
        return values


_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def collate(batch: Sequence[Any], dtype: torch.dtype | str = "stored") -> Batch:
    """Pad a list of ``CacheDataset`` items into a :class:`Batch` of tensors plus a mask.

    ``dtype``: the vectors' dtype. The default, ``"stored"``, is the dtype ``cache[i]`` reads in: a
    ``--fp16`` cache's float16 stays float16 (half the bytes to copy and to move to the GPU), a float32
    cache gives float32, and a quantised cache (int8, pq, opq) decodes to float32. Any floating torch dtype
    may be asked for instead; a float32 model fed from a ``--fp16`` cache either casts the batch itself
    (``batch.vectors.float()``, after the move to the GPU: half the bytes moved) or asks here, with a
    DataLoader as ``collate_fn=functools.partial(collate, dtype=torch.float32)``.
    """
    if not batch:
        raise InvalidParameterError("collate: empty batch")
    first_item = batch[0]
    if isinstance(first_item, Mapping):
        arrays = [item["vectors"] for item in batch]
    elif isinstance(first_item, tuple):
        arrays = [item[0] for item in batch]
    else:
        arrays = list(batch)
    first = arrays[0]
    layered = first.ndim == 3
    token_axis = 1 if layered else 0
    lengths = [a.shape[token_axis] for a in arrays]
    max_tokens = max(lengths)
    if isinstance(first, UndecodedSentence):
        # A quantised sentence decodes its batch at once, as its codec does (int8: one multiply; pq: one gather).
        vectors = first.collate(arrays, max_tokens)
        target = torch.float32 if dtype == "stored" else _dtype(dtype)
        vectors = vectors if target == torch.float32 else vectors.to(target)
    else:
        target = torch.from_numpy(np.zeros(0, dtype=first.dtype)).dtype if dtype == "stored" else _dtype(dtype)
        vectors = pad_floats(arrays, max_tokens, target)
    return _batch(vectors, lengths, batch)


def _dtype(dtype: Any) -> torch.dtype:
    if dtype not in _FLOATS:
        raise InvalidParameterError(
            f"dtype: {dtype!r} is not a choice; use 'stored' (the cache's own float dtype) or one of "
            f"{[str(d) for d in _FLOATS]}"
        )
    return dtype


def _batch(vectors: torch.Tensor, lengths: list[int], batch: Sequence[Any]) -> Batch:
    lengths_t = torch.tensor(lengths, dtype=torch.int64)
    mask = torch.arange(max(lengths)).unsqueeze(0) < lengths_t.unsqueeze(1)
    first = batch[0]
    fields = Fields()
    if isinstance(first, Mapping):
        names = [name for name in first if name != "vectors"]
        fields = Fields([_collate_field([item[name] for item in batch]) for name in names], names)
    elif isinstance(first, tuple):
        fields = Fields([_collate_field([item[k] for item in batch]) for k in range(1, len(first))])
    return Batch(vectors, mask, lengths_t, fields)


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of sentences of similar length, in a random order: far less padding than random batches.

    The sampler of allennlp's ``BucketBatchSampler`` and of Hugging Face's ``group_by_length``, with the
    latter's recipe: each epoch the sentences are shuffled, cut into pools of ``batch_size * pool_batches``,
    each pool sorted by length and cut into batches, and the batches shuffled. Smaller pools mix lengths
    more (more padding, more randomness); ``pool_batches=1`` is plain random batching. Every sentence is in
    exactly one batch per epoch (the last pool's may be short; ``drop_last`` drops it).

    ``lengths``: a :class:`CacheDataset` (its cache's stored lengths are read, not its vectors), a cache
    path, or tokens per item. Use it as ``DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)``.
    The order depends on ``seed`` and the epoch only: each ``iter()`` moves to the next epoch, and
    ``set_epoch(n)`` (as with torch's ``DistributedSampler``) sets it, so a resumed run batches as before.
    """

    def __init__(
        self,
        lengths: CacheDataset | str | os.PathLike[str] | Sequence[int] | np.ndarray,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        pool_batches: int = 50,
        seed: int = 0,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("pool_batches", pool_batches)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidParameterError(f"{name}: must be a positive integer, got {value!r}")
        self.lengths = _lengths_of(lengths)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.pool_batches = pool_batches
        self.seed = seed
        self.epoch = 0
        self._next_epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Batch as in epoch ``epoch`` at the next ``iter()``."""
        self._next_epoch = epoch

    def __iter__(self) -> Iterator[list[int]]:
        if self._next_epoch is not None:
            self.epoch, self._next_epoch = self._next_epoch, None
        epoch = self.epoch
        self.epoch += 1
        rng = np.random.default_rng([self.seed, epoch])
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        pool = self.batch_size * self.pool_batches
        batches: list[np.ndarray] = []
        for start in range(0, n, pool):
            members = order[start : start + pool]
            # Stable: equal lengths keep the shuffled order, so ties are batched at random too.
            members = members[np.argsort(self.lengths[members], kind="stable")]
            batches += [members[i : i + self.batch_size] for i in range(0, len(members), self.batch_size)]
        if self.drop_last:
            batches = [b for b in batches if len(b) == self.batch_size]
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        for members in batches:
            yield members.tolist()

    def __len__(self) -> int:
        # Every full pool gives pool_batches batches; the last, partial pool the rest.
        full, rest = divmod(len(self.lengths), self.batch_size * self.pool_batches)
        last = rest // self.batch_size if self.drop_last else -(-rest // self.batch_size)
        return full * self.pool_batches + last


def _lengths_of(source: Any) -> np.ndarray:
    if isinstance(source, CacheDataset):
        return np.asarray(source.cache.lengths, dtype=np.int64)
    if isinstance(source, str | os.PathLike):
        with open_cache(source) as cache:
            return np.array(cache.lengths, dtype=np.int64)
    lengths = np.asarray(source)
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or (lengths < 0).any():
        raise InvalidParameterError(
            "lengths: expected a CacheDataset, a cache path or one non-negative token count per item"
        )
    return lengths.astype(np.int64)
