"""Reading a cache: ``elmo_cache.open(path)`` for training loops, lookups and the server.

Both containers of FORMAT.md open through the same :class:`Cache`. The arrays stay on disk:
HDF5 datasets and uncompressed zarr chunks are ``numpy.memmap`` views (see
:mod:`elmo_cache.store.hdf5` and :mod:`elmo_cache.store.zarr` for how), so opening costs the same for ten sentences and
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

from elmo_cache import store
from elmo_cache.errors import CacheFormatError, IncompleteCacheError, InvalidParameterError
from elmo_cache.store.format import (
    ARRAYS,
    FORMAT_VERSIONS,
    INDEX_DTYPES,
    TEXT_ENCODING,
    TOKEN_ARRAYS,
    arrays_of,
    parse_metadata,
)
from elmo_cache.text.tokenize import sentence_hash, tokenize

__all__ = ["open", "Cache", "FORMAT_VERSIONS"]

_INDEX_DTYPES = {name: np.dtype(dtype) for name, dtype in INDEX_DTYPES.items()}


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
        self.format, raw, arrays = store.open_arrays(self.path, ARRAYS)
        meta = parse_metadata(self.path, raw)
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
        self.format_version: int = meta["format_version"]
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
        self.stores_tokens: bool = arrays.get("tokens/offsets") is not None
        """Whether each sentence's tokens are stored (format 2); lookups by text then confirm them."""
        self._token_bytes: Any = arrays.get("tokens/bytes")
        self._token_offsets: Any = arrays.get("tokens/offsets")
        self._token_at: Any = getattr(self._token_offsets, "item", None)
        text = self._token_bytes
        self._read_text: Any = (
            None if text is None else text.rows if hasattr(text, "rows") else (lambda start, stop: text[start:stop])
        )

    def _check_arrays(self, arrays: dict[str, Any]) -> None:
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
        expected = {"vectors": self.dtype, **_INDEX_DTYPES}
        for name, dtype in expected.items():
            if name not in required:
                continue
            got = np.dtype(arrays[name].dtype)
            if got.kind != dtype.kind or got.itemsize != dtype.itemsize:
                raise CacheFormatError(f"{self.path}: array {name!r} has dtype {got}, expected {dtype}")
        vectors = arrays["vectors"]
        want = (len(self.layers), self.dim) if self.layers is not None else (self.dim,)
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
        for name in required:
            # zarr: the first and last chunk files have the size the array's shape requires.
            check = getattr(arrays[name], "check_files", None)
            if check is not None:
                check()

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
                raise IndexError(
                    f"boolean index of shape {index.shape} does not match the {self._n} sentences of {self.path}"
                )
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
        hashes; a hit is then confirmed against the stored tokens (format 2), so two sentences
        whose hashes collide never answer for each other. A format-1 cache stores no text: there
        a hit is only checked against the stored token count.
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
        if self.stores_tokens and self._text(row) != " ".join(tokens).encode(*TEXT_ENCODING):
            return None  # a hash collision with a sentence of the same length
        return row

    def _text(self, i: int) -> bytes:
        start, stop = self._token_at(i), self._token_at(i + 1)
        if not 0 <= start <= stop <= self._token_bytes.shape[0]:
            raise CacheFormatError(
                f"{self.path}: sentence {i} spans bytes {start}..{stop} of array 'tokens/bytes' (array "
                f"'tokens/offsets'), which holds {self._token_bytes.shape[0]}; the cache is corrupt"
            )
        return self._read_text(start, stop).tobytes()

    def tokens(self, i: int) -> list[str]:
        """The tokens of sentence ``i`` (as the build split line ``i``; negative ``i`` counts from the end).

        Raises :class:`~elmo_cache.errors.CacheFormatError` for a format-1 cache, which stores no text.
        """
        self._require()
        if not self.stores_tokens:
            raise CacheFormatError(
                f"{self.path}: a format-{self.format_version} cache stores no tokens; rebuild it with this "
                "elmo-cache to read sentences back as text (or read them from its corpus)"
            )
        text = self._text(self._position(i)).decode(*TEXT_ENCODING)
        return text.split(" ") if text else []

    def get(self, sentence: str | Sequence[str], default: Any = None) -> np.ndarray | None:
        """The vectors of ``sentence`` (text or token list), or ``default`` (None) when it is not cached.

        Like ``dict.get``: absence is not an error. Use :meth:`find` for the sentence number.
        """
        row = self.find(sentence)
        return default if row is None else self._sentence(row)

    def __contains__(self, sentence: object) -> bool:
        if isinstance(sentence, (str, list, tuple)):
            return self.find(sentence) is not None
        return False

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the mappings (arrays already returned stay valid). Idempotent."""
        self._vectors = self._offsets = self._lengths = self._hashes = self._rows = None
        self._offset_at = self._length_at = self._read_rows = None
        self._token_bytes = self._token_offsets = self._token_at = self._read_text = None
        self._lengths_array = None

    @property
    def closed(self) -> bool:
        return self._vectors is None

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[str, bool]]:
        return (_reopen, (str(self.path), self._allow_incomplete))

    def __repr__(self) -> str:
        what = f"layers={list(self.layers)}" if self.layers is not None else "mix"
        state = "" if self.complete else ", incomplete"
        return (
            f"<Cache {str(self.path)!r} {self.format}, {self._n} sentences, {what}, dim={self.dim}, "
            f"{self.dtype}{state}>"
        )


def _reopen(path: str, allow_incomplete: bool) -> Cache:
    return Cache(path, allow_incomplete=allow_incomplete)
