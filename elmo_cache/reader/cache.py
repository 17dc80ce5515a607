"""Reading a cache: ``elmo_cache.open(path)`` for training loops, lookups and the server.

Both containers of FORMAT.md open through the same :class:`Cache`. The arrays stay on disk:
HDF5 datasets and uncompressed zarr files are read by position (:mod:`elmo_cache.store.positioned`,
which says why not mapped), so opening costs the same for ten sentences and for a hundred million,
and reading a sentence is one ``pread`` from the page cache. A file truncated or replaced under an
open cache is a :class:`~elmo_cache.errors.CacheCorruptError`, never a crash. Nothing is
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
from elmo_cache.errors import CacheFormatError, CacheReplacedError, IncompleteCacheError, InvalidParameterError
from elmo_cache.reader.checks import check_arrays
from elmo_cache.reader.pooled import PooledVectors, choose_pool, pool_of_sentence, pool_only_refusal
from elmo_cache.rows.codecs import RowCodec, codec_for_reading, quantization_problem
from elmo_cache.rows.pooling import Pool, pool_of
from elmo_cache.store.blocksums import BlockGuard, guards
from elmo_cache.store.format import (
    FORMAT_VERSIONS,
    OPTIONAL_ARRAYS,
    POOLED_ARRAY,
    TEXT_ENCODING,
    WINDOW_FILES_FORMAT_VERSION,
    metadata_checksum,
    parse_metadata,
)
from elmo_cache.store.staging import decode_tokens
from elmo_cache.text.tokenize import WHITESPACE, is_storable, key_hash, sentence_key, tokenizer_for

__all__ = ["open", "Cache", "FORMAT_VERSIONS"]


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
    a mixed one, in the stored dtype (float32 decoded from a quantised cache; :meth:`quantized` gives
    the codes). Slices and integer (or boolean) index arrays return lists of such arrays; any other
    index (a bool, a float, a string: :meth:`get` looks sentences up by text) is a TypeError. The
    arrays stay valid after :meth:`close`.

    A cache pickles as its path, so it can be handed to worker processes; each reopens it (and refuses, with
    :class:`~elmo_cache.errors.CacheReplacedError`, another cache published there since).
    """

    def __init__(self, path: str | os.PathLike[str], *, allow_incomplete: bool = False):
        self.path = Path(path)
        self._allow_incomplete = allow_incomplete
        # The write-back journal beside the cache, opened by the first lookup that misses (written_back).
        self._journal: Any = None
        self._journal_checked = False
        self.format, raw, arrays, sums = store.open_cache_arrays(self.path)
        meta = parse_metadata(self.path, raw, quantization_problem)
        self._metadata = meta
        self.complete: bool = meta["complete"]
        """False for a cache whose build has not finished (only with ``allow_incomplete``)."""
        if not self.complete and not allow_incomplete:
            raise IncompleteCacheError(
                f"{self.path}: the build of this cache has not finished (complete: false); resume it by running "
                "the same build command again, or open it with allow_incomplete=True to read what is there"
            )
        self._allow_missing_files(meta, arrays, sums)
        self._describe(meta, arrays, sums)
        check_arrays(self, arrays)
        self._check_metadata_checksum(meta)
        self._bind_rows(arrays)
        self._bind_tokens(arrays)
        self._bind_guards(meta, arrays, sums)
        pooled = arrays.get(POOLED_ARRAY)
        self._pooled = (
            None
            if pooled is None or self.pool is None
            else PooledVectors(pooled, self.pool, self._guards.get(POOLED_ARRAY))
        )

    def _allow_missing_files(self, meta: dict[str, Any], arrays: dict[str, Any], sums: dict[str, Any]) -> None:
        # zarr: an absent file is an error in a finished cache. Caches written before block sums may
        # legitimately lack an all-zero chunk of a 1-D array (zarr skipped writing it): there those read
        # as zeros, as zarr specifies; their vectors files were always all written.
        with_sums = isinstance(meta.get("checksums"), dict) and "blocks" in meta["checksums"]
        for name, array in (*arrays.items(), *sums.items()):
            if hasattr(array, "allow_missing"):
                array.allow_missing = not self.complete or (name != "vectors" and not with_sums)

    def _describe(self, meta: dict[str, Any], arrays: dict[str, Any], sums: dict[str, Any]) -> None:
        """What the cache holds, from its metadata (and, for a codec that needs them, its optional arrays)."""
        self.kind: str = meta["kind"]
        self.layers: tuple[int, ...] | None = tuple(meta["layers"]) if self.kind == "layers" else None
        self.dim: int = meta["dim"]
        # An optional array and its block sums by name (a pq cache's codebooks are read and checked at open).
        optional = {name: (arrays.get(name), sums.get(name)) for name in OPTIONAL_ARRAYS}
        # How the rows are stored (with what decoding needs, e.g. a pq cache's codebooks); dtype is what
        # cache[i] returns, stored_dtype the array's.
        self.codec: RowCodec = codec_for_reading(self.path, meta, optional)
        # The codec of a quantised cache, None for floats (the attribute older code tests).
        self.quantization: Any = self.codec if self.codec.quantized else None
        self.stored_dtype: np.dtype = np.dtype(meta["dtype"])
        self.dtype: np.dtype = self.codec.read_dtype
        self.format_version: int = meta["format_version"]
        self.tokenization: str = str(meta.get("tokenization", WHITESPACE))
        """How the build split its lines (metadata ``tokenization``); :meth:`find` splits a text query the same way."""
        self._split = tokenizer_for(self.tokenization)
        # The pool of the stored sentence vectors (build --pool); None for a cache without them.
        self.pool: Pool | None = pool_of(meta, self.path)

    def _check_metadata_checksum(self, meta: dict[str, Any]) -> None:
        # A few microseconds: metadata edited or bit-flipped after the build (a mix, a layer list) is caught
        # here, after the structure checks, which name a disagreement with the arrays more precisely.
        recorded = meta.get("checksums")
        if self.complete and isinstance(recorded, dict) and "metadata" in recorded:
            actual = metadata_checksum(meta)
            if recorded["metadata"] != actual:
                raise CacheFormatError(
                    f"{self.path}: the metadata fails its CRC-32 (recorded {recorded['metadata']!r}, actual {actual}): "
                    "it was edited or damaged after the build; rebuild or re-copy the cache"
                )

    def _bind_rows(self, arrays: dict[str, Any]) -> None:
        """The arrays every read touches, and the hot path's accessors (the same calls for numpy maps (HDF5)
        and chunked zarr arrays)."""
        self._vectors = arrays["vectors"]
        self._offsets = arrays["offsets"]
        self._lengths = arrays["lengths"]
        self._hashes = arrays["index/hashes"]
        self._rows = arrays["index/rows"]
        self._offset_at = self._offsets.item
        self._length_at = self._lengths.item
        vectors = self._vectors
        self._read_stored: Any = vectors.rows if hasattr(vectors, "rows") else (lambda start, stop: vectors[start:stop])
        # Decoded as read (a quantised cache's cache[i] is float32; quantized(i) gives the codes).
        self._read_rows: Any = self.codec.decoder(self._read_stored)
        self._n = int(self._offsets.shape[0])
        self._n_rows = int(self._vectors.shape[0])
        # A --pool-only cache has no token rows: -1 makes every read fail the bounds test, whose error
        # branch explains it, so the hot path of other caches pays nothing for the case.
        self.pool_only: bool = self.pool is not None and self.pool.only
        if self.pool_only:
            self._n_rows = -1
        self._layered = self.kind == "layers"
        self._lengths_array: np.ndarray | None = None

    def _bind_tokens(self, arrays: dict[str, Any]) -> None:
        self.stores_tokens: bool = arrays.get("tokens/offsets") is not None
        """Whether each sentence's tokens are stored (format 2); lookups by text then confirm them."""
        self._token_bytes: Any = arrays.get("tokens/bytes")
        self._token_offsets: Any = arrays.get("tokens/offsets")
        self._token_at: Any = getattr(self._token_offsets, "item", None)
        text = self._token_bytes
        self._read_text: Any = (
            None if text is None else text.rows if hasattr(text, "rows") else (lambda start, stop: text[start:stop])
        )

    def _bind_guards(self, meta: dict[str, Any], arrays: dict[str, Any], sums: dict[str, Any]) -> None:
        # Block checksums (FORMAT.md, "What is checked where"): each block of rows is checked against its
        # CRC-32C the first time a read touches it; caches built before them have none (empty dict).
        self._guards: dict[str, BlockGuard] = guards(self.path, meta, arrays, sums) if self.complete else {}
        self._vector_guard = self._guards.get("vectors")
        self._vector_ok = None if self._vector_guard is None else self._vector_guard.ok
        self._vector_block = 0 if self._vector_guard is None else self._vector_guard.block_rows
        # offsets and lengths share their block size: one flag per block for the pair, set once both passed.
        pair = (self._guards.get("offsets"), self._guards.get("lengths"))
        self._pair_guards: tuple[BlockGuard, BlockGuard] | None = (
            (pair[0], pair[1]) if pair[0] is not None and pair[1] is not None else None
        )
        self._pair_block = 0 if self._pair_guards is None else pair[0].block_rows  # type: ignore[union-attr]
        self._pair_ok = None if self._pair_guards is None else bytearray(pair[0].n_blocks)  # type: ignore[union-attr]
        # Without dedupe the sentences' rows are consecutive: sentence i ends where sentence i+1 starts,
        # a check of one more offset per read that catches a damaged offset or length in a cache without
        # block sums (with them, the sums of 'offsets' and 'lengths' already do, at no cost per read).
        # With dedupe a repeat points back at earlier rows, and in a version-5 cache a window's rows start a vectors
        # file past the rows before: only the bounds hold.
        self._consecutive = (
            self.complete
            and meta.get("dedupe") is False
            and self._pair_guards is None
            and meta.get("format_version") != WINDOW_FILES_FORMAT_VERSION
        )

    # -- properties ---------------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, Any]:
        """A copy of the cache's metadata (FORMAT.md, "Metadata")."""
        return copy.deepcopy(self._metadata)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sentence (int32), read whole on first access (4 bytes per sentence)."""
        if self._lengths_array is None:
            lengths = self._require()._lengths
            if "lengths" in self._guards:
                self._guards["lengths"].check_all()  # read whole anyway (4 bytes a sentence): check it whole
            array = np.asarray(lengths)  # a copy of our own (positioned reads), kept read-only like the rows
            array.setflags(write=False)
            self._lengths_array = array
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

    def _check_pair(self, i: int) -> None:
        """Check the blocks of 'offsets' and 'lengths' holding sentence ``i``. (The next sentence's offset,
        read by the consecutive-rows check, may lie in an unchecked block: damage there raises, never passes.)"""
        assert self._pair_guards is not None and self._pair_ok is not None
        b = i // self._pair_block
        for guard in self._pair_guards:
            if not guard.ok[b]:
                guard.check(b)
        self._pair_ok[b] = 1
        if all(guard.remaining == 0 for guard in self._pair_guards):
            self._pair_ok = None  # every block passed: reads skip the test from now on

    def _sentence(self, i: int, stored: bool = False) -> np.ndarray:
        pair_ok = self._pair_ok
        if pair_ok is not None and not pair_ok[i // self._pair_block]:
            self._check_pair(i)
        start = self._offset_at(i)
        length = self._length_at(i)
        stop = start + length
        if start < 0 or length < 0 or stop > self._n_rows:
            if self.pool_only:
                raise InvalidParameterError(pool_only_refusal(self.path, self.pool))
            raise CacheFormatError(
                f"{self.path}: sentence {i} spans rows {start}..{stop} (arrays 'offsets'/'lengths') but array "
                f"'vectors' has {self._n_rows} rows; the cache is corrupt"
            )
        if self._consecutive and stop != (self._offset_at(i + 1) if i + 1 < self._n else self._n_rows):
            raise CacheFormatError(
                f"{self.path}: sentence {i} ends at row {stop} but the next one starts at row "
                f"{self._offset_at(i + 1) if i + 1 < self._n else self._n_rows} in a cache without dedupe "
                "(arrays 'offsets'/'lengths' are damaged); run `elmo-cache verify`, then rebuild or re-copy it"
            )
        ok = self._vector_ok
        if ok is not None and length:
            size = self._vector_block
            first, last = start // size, (stop - 1) // size
            # The first and last blocks decide on the hot path; a sentence over more than two blocks has middle
            # ones, which check_rows tests too (one that no other read passed must not go unchecked).
            if not (ok[first] and ok[last]) or last - first > 1:
                guard = self._vector_guard
                guard.check_rows(start, stop)  # type: ignore[union-attr]
                if guard.remaining == 0:  # type: ignore[union-attr]
                    self._vector_ok = None  # every block passed: reads skip the test from now on
        block = (self._read_stored if stored else self._read_rows)(start, stop)
        return block.transpose(1, 0, 2) if self._layered else block

    def quantized(self, i: int) -> Any:
        """Sentence ``i`` of a quantised cache undecoded: int8 ``codes`` and float32 ``scales``, views of the
        rows read (``codes * scales[..., None]`` is ``cache[i]``); for a pq cache a
        :class:`~elmo_cache.rows.pq.PQSentence` of uint8 codes. An error for a cache of floats."""
        if not self._require().codec.quantized:
            raise InvalidParameterError(f"{self.path}: this cache stores {self.stored_dtype} vectors, not quantised")
        return self.codec.raw(self._sentence(self._position(i), stored=True))

    def _position(self, key: Any) -> int:
        """Sentence number ``key`` checked: an int or numpy integer, never a bool (``True`` is not
        sentence 1), a float or a string (``int("3")`` would read sentence 3)."""
        if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
            raise TypeError(f"sentence numbers are integers, not {type(key).__name__}")
        return self._in_range(key)

    def _in_range(self, key: Any) -> int:
        """``key`` (an integer) as a sentence number from 0, or IndexError."""
        i = int(key)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"sentence {int(key)} out of range: cache {self.path} has {self._n} sentences")
        return i

    def __getitem__(self, key: Any) -> Any:
        if self._vectors is None:
            self._require()
        # The hot path: a type test that excludes bool (an int subclass) costs one class comparison more.
        if isinstance(key, (int, np.integer)) and key.__class__ is not bool:
            return self._sentence(self._in_range(key))
        if isinstance(key, slice):
            return [self._sentence(i) for i in range(*key.indices(self._n))]
        if isinstance(key, (str, bytes)):
            raise TypeError(f"cache indices are sentence numbers; use cache.get({key!r}) to look a sentence up by text")
        index = np.asarray(key)
        if index.dtype != bool and isinstance(key, (list, tuple)) and any(isinstance(k, (bool, np.bool_)) for k in key):
            # numpy reads [True, 2] as [1, 2]: a bool among numbers is no sentence number
            raise TypeError(f"cache indices must be integers, slices or integer/boolean arrays, got {key!r}")
        if index.dtype == bool:
            if index.ndim == 0:  # True, np.True_: a mask needs one value per sentence, and a bool is no number
                raise TypeError(f"cache indices must be integers, slices or integer/boolean arrays, got {key!r}")
            if index.shape != (self._n,):
                raise IndexError(
                    f"boolean index of shape {index.shape} does not match the {self._n} sentences of {self.path}"
                )
            index = np.flatnonzero(index)
        elif index.size and index.dtype.kind not in "iu":
            raise TypeError(f"cache indices must be integers, slices or integer/boolean arrays, got {index.dtype}")
        return [self._sentence(self._in_range(i)) for i in index.reshape(-1).tolist()]  # ints from an int array

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(self._n):
            yield self[i]

    def find(self, sentence: str | Sequence[str]) -> int | None:
        """Sentence number of ``sentence`` (a text, split as the build split its lines: ``tokenization``; or a
        token list, taken as it is), or None.

        With ``dedupe`` or repeated lines, this is the first occurrence. The index holds 64-bit
        hashes; a hit is then confirmed against the stored tokens (format 2), so two sentences
        whose hashes collide never answer for each other. A format-1 cache stores no text: there
        a hit is only checked against the stored token count.
        """
        self._require()
        tokens = self._split(sentence) if isinstance(sentence, str) else list(sentence)
        if not all(isinstance(t, str) for t in tokens):
            raise InvalidParameterError("sentence: expected a string or a list of string tokens")
        if not is_storable(tokens):
            return None  # no cache holds a token with a newline
        key = sentence_key(tokens).encode(*TEXT_ENCODING)  # hashed, then confirmed against the stored key
        value = np.uint64(key_hash(key))
        hashes, guards = self._hashes, self._guards
        if "index/hashes" in guards:
            pos = guards["index/hashes"].searchsorted(value)
        elif isinstance(hashes, np.ndarray):
            pos = int(np.searchsorted(hashes, value))
        else:
            pos = hashes.searchsorted(value)
        if pos >= hashes.shape[0] or hashes[pos] != value:
            return None
        self._touch("index/rows", pos, pos + 1)
        row = int(self._rows[pos])
        if not 0 <= row < self._n:
            raise CacheFormatError(f"{self.path}: array 'index/rows' points at sentence {row} of {self._n}; corrupt")
        self._touch("lengths", row, row + 1)
        if self._length_at(row) != len(tokens):
            return None  # a hash collision with a different sentence
        if self.stores_tokens and self._text(row) != key:
            return None  # a hash collision with a sentence of the same length
        return row

    def _touch(self, name: str, start: int, stop: int) -> None:
        """Check the blocks of array ``name`` holding entries ``start:stop`` (cold paths: lookups, text)."""
        guard = self._guards.get(name)
        if guard is not None:
            guard.check_rows(start, stop)

    def _text(self, i: int) -> bytes:
        self._touch("tokens/offsets", i, i + 2)
        start, stop = self._token_at(i), self._token_at(i + 1)
        if not 0 <= start <= stop <= self._token_bytes.shape[0]:
            raise CacheFormatError(
                f"{self.path}: sentence {i} spans bytes {start}..{stop} of array 'tokens/bytes' (array "
                f"'tokens/offsets'), which holds {self._token_bytes.shape[0]}; the cache is corrupt"
            )
        self._touch("tokens/bytes", start, stop)
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
        return decode_tokens(self._text(self._position(i)))

    def get(self, sentence: str | Sequence[str], default: Any = None) -> np.ndarray | None:
        """The vectors of ``sentence`` (text or token list), or ``default`` (None) when it is not cached.

        Like ``dict.get``: absence is not an error. Use :meth:`find` for the sentence number. A sentence
        missing from the cache is looked up in its write-back journal (``<cache>.writeback``, kept by
        ``serve --write-back``; :meth:`written_back`).
        """
        row = self.find(sentence)
        if row is not None:
            return self._sentence(row)
        found = self.written_back(sentence)
        return default if found is None else found

    def written_back(self, sentence: str | Sequence[str]) -> np.ndarray | None:
        """The vectors of ``sentence`` from the cache's write-back journal (sentences ``serve --write-back``
        encoded live, stored as a build of them stores them), as :meth:`get` gives a cached one, or None.

        The journal is opened on the first call (a journal written for another model or other options is
        ignored, with a warning) and re-read when it has grown; its sentences have no number."""
        self._require()
        found = self._written_back_record(sentence)
        if found is not None and self.pool_only:  # its records hold the pooled vector alone, as the cache does
            raise InvalidParameterError(pool_only_refusal(self.path, self.pool))
        return None if found is None else self.sentence_from_rows(found[0])

    def _written_back_record(self, sentence: str | Sequence[str]) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The stored rows and pooled vector (None without) of ``sentence`` in the write-back journal, or None."""
        tokens = self._split(sentence) if isinstance(sentence, str) else list(sentence)
        if not tokens or not is_storable(tokens):
            return None
        journal = self._journal
        if journal is None:
            if self._journal_checked:
                return None
            from elmo_cache.reader.writeback import read_journal

            self._journal_checked = True
            journal = self._journal = read_journal(self)
            if journal is None:
                return None
        key = sentence_key(tokens).encode(*TEXT_ENCODING)
        if key not in journal:
            journal.refresh()
        found: tuple[np.ndarray, np.ndarray | None] | None = journal.get(key)
        return found

    def sentence_from_rows(self, rows: np.ndarray) -> np.ndarray:
        """One sentence's stored rows ``(n_tokens, *stored row)`` as ``cache[i]`` returns a sentence: decoded
        (a quantised cache's codes as float32), ``(n_layers, n_tokens, dim)`` for a layered cache."""
        block = self.codec.decoder(lambda start, stop: rows[start:stop])(0, rows.shape[0])
        return block.transpose(1, 0, 2) if self._layered else block

    def sentence_vector(self, sentence: Any, pool: str | None = None) -> np.ndarray | None:
        """One vector for a whole sentence: by number (negative counts from the end), or by text or token
        list (None when it is not cached, as :meth:`get`, which also looks in the write-back journal).

        ``pool`` is ``"mean"``, ``"max"`` or ``"first-last"`` (docs/FORMAT.md, "Pooled sentence vectors"); None:
        the cache's own (``build --pool``). The cache's own pool is read from its ``pooled`` array (its
        dtype); any other, or any pool of a cache built without one, is computed from the sentence's token
        vectors by the same function in float32 (from the stored, possibly float16 or int8, values), and is
        float32. Shape ``(n_layers, dim)``, or ``(dim,)`` for a mixed cache; ``first-last`` doubles ``dim``; an
        empty sentence gives zeros.
        """
        self._require()
        method = choose_pool(pool, self.pool, self.path)
        if isinstance(sentence, (int, np.integer)):
            i: int | None = self._position(sentence)
        elif isinstance(sentence, (str, list, tuple)):
            i = self.find(sentence)
        else:
            raise TypeError(f"sentence: expected a number, a text or a token list, got {type(sentence).__name__}")
        if i is None:
            kept = None if isinstance(sentence, (int, np.integer)) else self._written_back_record(sentence)
            if kept is None:
                return None
            rows, pooled = kept  # a written-back sentence: its stored pooled vector, or a pool of its rows
            if pooled is not None and self.pool is not None and self.pool.method == method:
                return pooled
            if self.pool_only:
                raise InvalidParameterError(pool_only_refusal(self.path, self.pool, method))
            return pool_of_sentence(self.sentence_from_rows(rows), self._layered, method)
        if self._pooled is not None and self._pooled.pool.method == method:
            return self._pooled.row(i)
        if self.pool_only:
            raise InvalidParameterError(pool_only_refusal(self.path, self.pool, method))
        return pool_of_sentence(self._sentence(i), self._layered, method)

    def __contains__(self, sentence: object) -> bool:
        if isinstance(sentence, (str, list, tuple)):
            return self.find(sentence) is not None
        return False

    # -- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Drop the mappings (arrays already returned stay valid). Idempotent."""
        self._vectors = self._offsets = self._lengths = self._hashes = self._rows = None
        self._offset_at = self._length_at = self._read_rows = self._read_stored = None
        self._token_bytes = self._token_offsets = self._token_at = self._read_text = None
        self._lengths_array = self._pooled = None
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self._guards, self._vector_guard, self._vector_ok, self._pair_guards, self._pair_ok = {}, None, None, None, None

    @property
    def closed(self) -> bool:
        return self._vectors is None

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[str, bool, str | None]]:
        return (_reopen, (str(self.path), self._allow_incomplete, self._generation()))

    def _generation(self) -> str | None:
        """What tells this cache from another one published at its path since: its metadata's CRC-32 (the
        metadata records the build's corpus digest and times), None for a cache without one."""
        recorded = self._metadata.get("checksums")
        return str(recorded["metadata"]) if isinstance(recorded, dict) and "metadata" in recorded else None

    def __repr__(self) -> str:
        what = f"layers={list(self.layers)}" if self.layers is not None else "mix"
        state = "" if self.complete else ", incomplete"
        return (
            f"<Cache {str(self.path)!r} {self.format}, {self._n} sentences, {what}, dim={self.dim}, "
            f"{self.dtype}{state}>"
        )


def _reopen(path: str, allow_incomplete: bool, generation: str | None = None) -> Cache:
    """A pickled cache opened again (a DataLoader worker's): the same cache, or an error when another one was
    published at its path since it was pickled (a worker must not read other rows than its parent indexed)."""
    cache = Cache(path, allow_incomplete=allow_incomplete)
    if generation is not None and cache._generation() != generation:
        cache.close()
        raise CacheReplacedError(
            f"{path}: the cache was replaced (build --update or a rebuild published a new one there) after the "
            "process that handed it over opened it; its row numbers would not be this cache's: open the cache "
            "again in that process and hand it over again"
        )
    return cache
