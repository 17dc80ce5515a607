"""Reading a cache: ``elmo_cache.open(path)`` for training loops, lookups and the server.

Both containers of FORMAT.md open through the same :class:`Cache`. The arrays stay on disk:
HDF5 datasets and uncompressed zarr chunks are ``numpy.memmap`` views (see
``_read_hdf5`` and ``_read_zarr`` for how), so opening costs the same for ten sentences and
for a hundred million, and reading a sentence is one slice of the page cache. Nothing is
loaded whole: the sentence index is binary-searched in place.

    with elmo_cache.open("corpus.zarr") as cache:
        vectors = cache[0]                      # (n_layers, n_tokens, dim), or (n_tokens, dim) if mixed
        row = cache.find("The cat sat .")       # sentence number or None
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError, CacheNotFoundError, IncompleteCacheError, InvalidParameterError
from elmo_cache.tokenize import sentence_hash, tokenize

__all__ = ["open", "Cache", "FORMAT_VERSIONS"]

FORMAT_VERSIONS = (1,)
"""Store format versions this reader understands."""

_ARRAYS = ("vectors", "offsets", "lengths", "index/hashes", "index/rows")
# dtype kind and size FORMAT.md prescribes for each array (vectors: from the metadata)
_INDEX_DTYPES = {"offsets": np.dtype("int64"), "lengths": np.dtype("int32"), "index/hashes": np.dtype("uint64"), "index/rows": np.dtype("int64")}


def open(path: str | os.PathLike[str], *, allow_incomplete: bool = False) -> Cache:  # noqa: A001 - public API name
    """Open a cache (zarr v3 directory or HDF5 file) read-only.

    Raises :class:`~elmo_cache.errors.CacheNotFoundError` when ``path`` does not exist,
    :class:`~elmo_cache.errors.CacheFormatError` when it is not a valid elmo-cache store
    (the message names the path and the array at fault) and
    :class:`~elmo_cache.errors.IncompleteCacheError` when its build has not finished, unless
    ``allow_incomplete`` (then ``cache.complete`` is False and unwritten sentences may read
    as empty or zero).
    """
    return Cache(path, allow_incomplete=allow_incomplete)


def _unfinished(path: Path) -> IncompleteCacheError:
    return IncompleteCacheError(
        f"{path}: the build of this cache was interrupted before it finished; resume it by running the same "
        "build command again (its sentences become readable when the build completes)"
    )


def _detect(path: Path) -> str:
    if not path.exists():
        # A build writes into "<output>.partial/" and renames it to the output when done.
        if path.with_name(path.name + ".partial").is_dir():
            raise _unfinished(path)
        raise CacheNotFoundError(f"cache not found: {path}")
    if path.is_dir():
        if (path / ".build").is_dir():  # the staging folder of a running or interrupted build
            raise _unfinished(path)
        if (path / "zarr.json").is_file():
            return "zarr"
        if (path / ".zgroup").exists() or (path / ".zattrs").exists():
            raise CacheFormatError(f"{path}: a zarr v2 store; elmo-cache caches are zarr v3 (zarr.json) or HDF5")
        raise CacheFormatError(f"{path}: a directory without zarr.json, not a zarr v3 cache")
    from elmo_cache._read_hdf5 import is_hdf5

    if is_hdf5(path):
        return "hdf5"
    raise CacheFormatError(f"{path}: neither a zarr v3 directory nor an HDF5 file; not an elmo-cache store")


def _parse_metadata(path: Path, raw: Any) -> dict[str, Any]:
    import json

    if raw is None:
        raise CacheFormatError(f"{path}: no 'elmo_cache' metadata attribute; not an elmo-cache store")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CacheFormatError(f"{path}: the 'elmo_cache' metadata attribute is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != "elmo-cache":
        raise CacheFormatError(f"{path}: metadata 'format' is not 'elmo-cache'; not an elmo-cache store")
    version = raw.get("format_version")
    if version not in FORMAT_VERSIONS:
        raise CacheFormatError(
            f"{path}: unsupported format_version {version!r}; this elmo-cache reads {list(FORMAT_VERSIONS)} "
            "(upgrade elmo-cache or rebuild the cache)"
        )
    problems = []
    if raw.get("kind") not in ("layers", "mix"):
        problems.append(f"kind {raw.get('kind')!r} (expected 'layers' or 'mix')")
    if raw.get("dtype") not in ("float16", "float32"):
        problems.append(f"dtype {raw.get('dtype')!r} (expected 'float16' or 'float32')")
    if not isinstance(raw.get("dim"), int) or raw["dim"] <= 0:
        problems.append(f"dim {raw.get('dim')!r} (expected a positive integer)")
    layers = raw.get("layers")
    if raw.get("kind") == "layers" and (
        not isinstance(layers, list) or not layers or layers != sorted(set(layers)) or not set(layers) <= {0, 1, 2}
    ):
        problems.append(f"layers {layers!r} (expected a sorted non-empty subset of [0, 1, 2])")
    if not isinstance(raw.get("complete"), bool):
        problems.append(f"complete {raw.get('complete')!r} (expected true or false)")
    if problems:
        raise CacheFormatError(f"{path}: invalid metadata: " + "; ".join(problems))
    return raw


class Cache:
    """A read-only cache of sentence embeddings; use :func:`elmo_cache.open` to get one.

    ``cache[i]`` is sentence ``i`` (line ``i`` of the corpus; negative indices count from the
    end) as a read-only array: ``(n_layers, n_tokens, dim)`` for a layered cache (a transposed,
    zero-copy view of the token-major rows where the format allows) or ``(n_tokens, dim)`` for
    a mixed one, in the stored dtype. Slices and integer (or boolean) index arrays return lists
    of such arrays. The arrays stay valid after :meth:`close`.

    A cache pickles as its path, so it can be handed to worker processes; each reopens it.
    """

    def __init__(self, path: str | os.PathLike[str], *, allow_incomplete: bool = False):
        self.path = Path(path)
        self._allow_incomplete = allow_incomplete
        self.format = _detect(self.path)
        if self.format == "zarr":
            from elmo_cache._read_zarr import open_zarr

            raw, arrays = open_zarr(self.path, _ARRAYS)
        else:
            from elmo_cache._read_hdf5 import open_hdf5

            raw, arrays = open_hdf5(self.path, _ARRAYS)
        meta = _parse_metadata(self.path, raw)
        self._metadata = meta
        self.complete: bool = meta["complete"]
        """False for a cache whose build has not finished (only with ``allow_incomplete``)."""
        if not self.complete and not allow_incomplete:
            raise IncompleteCacheError(
                f"{self.path}: the build of this cache has not finished (complete: false); resume it by running "
                "the same build command again, or open it with allow_incomplete=True to read what is there"
            )
        self.kind: str = meta["kind"]
        self.layers: tuple[int, ...] | None = tuple(meta["layers"]) if self.kind == "layers" else None
        self.dim: int = meta["dim"]
        self.dtype: np.dtype = np.dtype(meta["dtype"])
        self._check_arrays(arrays)
        self._vectors = arrays["vectors"]
        self._offsets = arrays["offsets"]
        self._lengths = arrays["lengths"]
        self._hashes = arrays["index/hashes"]
        self._rows = arrays["index/rows"]
        # Hot-path accessors, the same calls for numpy maps (HDF5) and chunked zarr arrays.
        self._offset_at = self._offsets.item
        self._length_at = self._lengths.item
        vectors = self._vectors
        self._read_rows = vectors.rows if hasattr(vectors, "rows") else (lambda start, stop: vectors[start:stop])
        self._n = int(self._offsets.shape[0])
        self._n_rows = int(self._vectors.shape[0])
        self._layered = self.kind == "layers"
        self._lengths_array: np.ndarray | None = None

    def _check_arrays(self, arrays: dict[str, Any]) -> None:
        meta = self._metadata
        if not self.complete:
            # An interrupted build may not have written its index yet: read it as empty.
            for name in ("index/hashes", "index/rows"):
                if arrays[name] is None:
                    arrays[name] = np.empty(0, dtype=_INDEX_DTYPES[name])
        for name in _ARRAYS:
            if arrays[name] is None:
                raise CacheFormatError(f"{self.path}: array {name!r} is missing; the cache is corrupt (rebuild it)")
        expected = {"vectors": self.dtype, **_INDEX_DTYPES}
        for name, dtype in expected.items():
            got = np.dtype(arrays[name].dtype)
            if got.kind != dtype.kind or got.itemsize != dtype.itemsize:
                raise CacheFormatError(f"{self.path}: array {name!r} has dtype {got}, expected {dtype}")
        vectors = arrays["vectors"]
        want = (len(self.layers), self.dim) if self.layers is not None else (self.dim,)
        if tuple(vectors.shape[1:]) != want:
            raise CacheFormatError(
                f"{self.path}: array 'vectors' has shape {tuple(vectors.shape)}, expected (n_rows, {', '.join(map(str, want))})"
                f" for a {self.kind!r} cache of dim {self.dim}"
            )
        for a, b in (("offsets", "lengths"), ("index/hashes", "index/rows")):
            if arrays[a].ndim != 1 or arrays[b].ndim != 1 or arrays[a].shape != arrays[b].shape:
                raise CacheFormatError(
                    f"{self.path}: arrays {a!r} {tuple(arrays[a].shape)} and {b!r} {tuple(arrays[b].shape)} "
                    "must be 1-D and of the same length"
                )
        if self.complete:
            counts = {"n_sentences": ("offsets", arrays["offsets"].shape[0]), "n_rows": ("vectors", vectors.shape[0]),
                      "n_unique": ("index/hashes", arrays["index/hashes"].shape[0])}
            for key, (name, actual) in counts.items():
                if key in meta and meta[key] != actual:
                    raise CacheFormatError(
                        f"{self.path}: metadata says {key} = {meta[key]} but array {name!r} has {actual} entries"
                    )

    # -- properties ---------------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of the cache's metadata (FORMAT.md, "Metadata")."""
        return copy.deepcopy(self._metadata)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sentence (int32). Memory-mapped when the container allows one view of it
        (HDF5, or a zarr array stored as one uncompressed chunk); otherwise assembled from the
        chunks on first access (4 bytes per sentence)."""
        if self._lengths_array is None:
            lengths = self._require()._lengths
            if isinstance(lengths, np.ndarray):
                self._lengths_array = lengths
            else:
                view = lengths.contiguous()
                self._lengths_array = view if view is not None else np.asarray(lengths)
        return self._lengths_array

    @property
    def n_tokens(self) -> int:
        """Total tokens over all sentences, from the metadata (or summed for an incomplete cache)."""
        if self.complete and isinstance(self._metadata.get("n_tokens"), int):
            return self._metadata["n_tokens"]
        return int(np.sum(self.lengths, dtype=np.int64))

    # -- reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    def _require(self) -> Cache:
        if self._vectors is None:
            raise ValueError(f"cache {self.path} is closed")
        return self

    def _sentence(self, i: int) -> np.ndarray:
        start = self._offset_at(i)
        length = self._length_at(i)
        stop = start + length
        if start < 0 or length < 0 or stop > self._n_rows:
            raise CacheFormatError(
                f"{self.path}: sentence {i} spans rows {start}..{stop} (arrays 'offsets'/'lengths') but array "
                f"'vectors' has {self._n_rows} rows; the cache is corrupt"
            )
        block = self._read_rows(start, stop)
        return block.transpose(1, 0, 2) if self._layered else block

    def _position(self, key: Any) -> int:
        i = int(key)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"sentence {int(key)} out of range: cache {self.path} has {self._n} sentences")
        return i

    def __getitem__(self, key: Any) -> Any:
        if self._vectors is None:
            self._require()
        if isinstance(key, (int, np.integer)):
            return self._sentence(self._position(key))
        if isinstance(key, slice):
            return [self._sentence(i) for i in range(*key.indices(self._n))]
        if isinstance(key, (str, bytes)):
            raise TypeError(f"cache indices are sentence numbers; use cache.get({key!r}) to look a sentence up by text")
        index = np.asarray(key)
        if index.dtype == bool:
            if index.shape != (self._n,):
                raise IndexError(f"boolean index of shape {index.shape} does not match the {self._n} sentences of {self.path}")
            index = np.flatnonzero(index)
        elif index.size and index.dtype.kind not in "iu":
            raise TypeError(f"cache indices must be integers, slices or integer/boolean arrays, got {index.dtype}")
        return [self._sentence(self._position(i)) for i in index.reshape(-1).tolist()]

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(self._n):
            yield self[i]

    def find(self, sentence: str | Sequence[str]) -> int | None:
        """Sentence number of ``sentence`` (text, tokenised like the build, or a token list), or None.

        With ``dedupe`` or repeated lines, this is the first occurrence. The index holds 64-bit
        hashes, not text; a hit is also checked against the stored token count.
        """
        self._require()
        tokens = tokenize(sentence) if isinstance(sentence, str) else list(sentence)
        if not all(isinstance(t, str) for t in tokens):
            raise InvalidParameterError("sentence: expected a string or a list of string tokens")
        value = np.uint64(sentence_hash(tokens))
        hashes = self._hashes
        if isinstance(hashes, np.ndarray):
            pos = int(np.searchsorted(hashes, value))
        else:
            pos = hashes.searchsorted(value)
        if pos >= hashes.shape[0] or hashes[pos] != value:
            return None
        row = int(self._rows[pos])
        if not 0 <= row < self._n:
            raise CacheFormatError(f"{self.path}: array 'index/rows' points at sentence {row} of {self._n}; corrupt")
        if self._length_at(row) != len(tokens):
            return None  # a hash collision with a different sentence
        return row

    def get(self, sentence: str | Sequence[str], default: Any = None) -> np.ndarray | None:
        """The vectors of ``sentence`` (text or token list), or ``default`` (None) when it is not cached.

        Like ``dict.get``: absence is not an error. Use :meth:`find` for the sentence number.
        """
        row = self.find(sentence)
        return default if row is None else self._sentence(row)

    def __contains__(self, sentence: object) -> bool:
        if isinstance(sentence, (str, list, tuple)):
            return self.find(sentence) is not None  # type: ignore[arg-type]
        return False

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the mappings (arrays already returned stay valid). Idempotent."""
        self._vectors = self._offsets = self._lengths = self._hashes = self._rows = None
        self._offset_at = self._length_at = self._read_rows = None
        self._lengths_array = None

    @property
    def closed(self) -> bool:
        return self._vectors is None

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self):
        return (_reopen, (str(self.path), self._allow_incomplete))

    def __repr__(self) -> str:
        what = f"layers={list(self.layers)}" if self.layers is not None else "mix"
        state = "" if self.complete else ", incomplete"
        return f"<Cache {str(self.path)!r} {self.format}, {self._n} sentences, {what}, dim={self.dim}, {self.dtype}{state}>"


def _reopen(path: str, allow_incomplete: bool) -> Cache:
    return Cache(path, allow_incomplete=allow_incomplete)

