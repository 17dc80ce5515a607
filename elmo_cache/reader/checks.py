"""The cheap checks :func:`elmo_cache.open` makes on a cache's arrays (FORMAT.md, "What is checked where"):
presence, dtypes, shapes, counts and the first and last zarr files, whatever the cache's size."""

from __future__ import annotations

from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.rows.codecs import stored_row_shape
from elmo_cache.rows.pooling import pooled_shape
from elmo_cache.store.columns import optional_arrays
from elmo_cache.store.format import ARRAYS, INDEX_DTYPES, OPTIONAL_ARRAYS, POOLED_ARRAY, TOKEN_ARRAYS, arrays_of

__all__ = ["check_arrays"]

_INDEX_DTYPES = {name: np.dtype(dtype) for name, dtype in INDEX_DTYPES.items()}


def check_arrays(cache: Any, arrays: dict[str, Any]) -> None:
    """The checks of :func:`elmo_cache.open` on the arrays of ``cache`` (a :class:`~elmo_cache.reader.cache.Cache`
    being opened: its path, metadata, completeness, version, kind, dim and dtype are set); arrays a version
    does not hold are set to None in ``arrays``. Raises :class:`CacheFormatError` naming the array at fault."""
    self = cache  # the checks moved here from Cache._check_arrays unchanged: they read the cache's attributes
    meta = self._metadata
    required = arrays_of(self.format_version)
    if not self.complete:
        # An interrupted build may not have written its index and tokens yet: read the index as empty.
        for name in ("index/hashes", "index/rows"):
            if arrays[name] is None:
                arrays[name] = np.empty(0, dtype=_INDEX_DTYPES[name])
        required = tuple(name for name in required if name not in TOKEN_ARRAYS or arrays[name] is not None)
    for name in ARRAYS:
        if name not in required:
            arrays[name] = None  # a version-1 cache: whatever else is there is not ours to read
    for name in required:
        if arrays[name] is None:
            raise CacheFormatError(f"{self.path}: array {name!r} is missing; the cache is corrupt (rebuild it)")
    expected = {"vectors": self.stored_dtype, **_INDEX_DTYPES}
    for name, dtype in expected.items():
        if name not in required:
            continue
        got = np.dtype(arrays[name].dtype)
        if got.kind != dtype.kind or got.itemsize != dtype.itemsize:
            raise CacheFormatError(f"{self.path}: array {name!r} has dtype {got}, expected {dtype}")
    vectors = arrays["vectors"]
    want = stored_row_shape(meta)
    if tuple(vectors.shape[1:]) != want:
        raise CacheFormatError(
            f"{self.path}: array 'vectors' has shape {tuple(vectors.shape)}, "
            f"expected (n_rows, {', '.join(map(str, want))})"
            f" for a {self.kind!r} cache of dim {self.dim}"
        )
    for a, b in (("offsets", "lengths"), ("index/hashes", "index/rows")):
        if arrays[a].ndim != 1 or arrays[b].ndim != 1 or arrays[a].shape != arrays[b].shape:
            raise CacheFormatError(
                f"{self.path}: arrays {a!r} {tuple(arrays[a].shape)} and {b!r} {tuple(arrays[b].shape)} "
                "must be 1-D and of the same length"
            )
    if self.complete:
        counts = {
            "n_sentences": ("offsets", arrays["offsets"].shape[0]),
            "n_rows": ("vectors", vectors.shape[0]),
            "n_unique": ("index/hashes", arrays["index/hashes"].shape[0]),
        }
        for key, (name, actual) in counts.items():
            if key in meta and meta[key] != actual:
                raise CacheFormatError(
                    f"{self.path}: metadata says {key} = {meta[key]} but array {name!r} has {actual} entries"
                )
    if "tokens/offsets" in required:
        starts, text = arrays["tokens/offsets"], arrays["tokens/bytes"]
        n = arrays["offsets"].shape[0]
        if starts.ndim != 1 or text.ndim != 1 or starts.shape[0] != n + 1:
            raise CacheFormatError(
                f"{self.path}: array 'tokens/offsets' has shape {tuple(starts.shape)}, expected ({n + 1},) "
                f"(one more than the {n} sentences), and 'tokens/bytes' must be 1-D"
            )
        first, last = starts.item(0), starts.item(n)
        if first != 0 or last != text.shape[0]:
            raise CacheFormatError(
                f"{self.path}: array 'tokens/offsets' runs from {first} to {last} but 'tokens/bytes' holds "
                f"{text.shape[0]} bytes; the cache is corrupt"
            )
    _check_pooled(self, arrays)
    _check_declared(self, arrays)
    for name in (*required, *(name for name in optional_arrays(meta) if arrays.get(name) is not None)):
        # zarr: the first and last chunk files have the size the array's shape requires.
        check = getattr(arrays[name], "check_files", None)
        if check is not None:
            check()


def _check_pooled(cache: Any, arrays: dict[str, Any]) -> None:
    """``pooled`` is read only when the metadata announces it (``pool``), with the dtype and shape it implies."""
    meta = cache._metadata
    pool = meta.get("pool")
    pooled = arrays.get(POOLED_ARRAY)
    if pool is None or (pooled is None and not cache.complete):  # unfinished builds write it last
        arrays[POOLED_ARRAY] = None
        return
    if pooled is None:
        raise CacheFormatError(
            f"{cache.path}: array {POOLED_ARRAY!r} is missing but the metadata says the cache pools "
            f"({pool['method']}); the cache is corrupt (rebuild it)"
        )
    row = (len(meta["layers"]), cache.dim) if cache.kind == "layers" else (cache.dim,)
    want = (int(arrays["offsets"].shape[0]), *pooled_shape(row, pool["method"]))
    got = np.dtype(pooled.dtype)
    if got.kind != "f" or got.itemsize != np.dtype(pool["dtype"]).itemsize or tuple(pooled.shape) != want:
        raise CacheFormatError(
            f"{cache.path}: array {POOLED_ARRAY!r} is {got} {tuple(pooled.shape)}, expected {pool['dtype']} {want} "
            f"(one {pool['method']} vector per sentence); the cache is corrupt"
        )


def _check_declared(cache: Any, arrays: dict[str, Any]) -> None:
    """A column declared beyond the built-in ones (its array named by the metadata, store.columns.optional_arrays)
    holds one value per sentence; an unfinished build writes it last, so only a finished cache must have it."""
    n = int(arrays["offsets"].shape[0])
    for name in optional_arrays(cache._metadata):
        if name in OPTIONAL_ARRAYS:
            continue
        array = arrays.get(name)
        if array is None and cache.complete:
            raise CacheFormatError(
                f"{cache.path}: array {name!r} is missing but the metadata lists its block sums; "
                "the cache is corrupt (rebuild it)"
            )
        if array is not None and (array.ndim < 1 or int(array.shape[0]) != n):
            raise CacheFormatError(
                f"{cache.path}: array {name!r} has shape {tuple(array.shape)}, expected one row for each of the "
                f"{n} sentences; the cache is corrupt"
            )
