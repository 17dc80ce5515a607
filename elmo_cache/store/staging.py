"""Crash-safe staging shared by both containers.

A build writes into ``<output>.partial/``. Its ``.build/`` folder holds append-only raw
files (one per per-sentence array) and ``progress.json``. Data files are flushed and
fsync'ed *before* ``progress.json`` is replaced atomically (write a temporary file, fsync,
``os.replace``), so ``progress.json`` never claims bytes that are not on disk. Whatever a
``kill -9`` leaves beyond the committed sizes is garbage and is cut off on resume.
"""

from __future__ import annotations

import json
import mmap
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store.columns import HASHES, TEXT, TEXT_ENDS, Column, sentence_columns
from elmo_cache.store.durable import ChunkedColumn, RawColumn, atomic_write_json
from elmo_cache.store.format import BUILD_DIR, POOLED_ARRAY, PROGRESS_FILE, TEXT_ENCODING, staging_path
from elmo_cache.store.lock import check_held
from elmo_cache.store.pooled import rows_with_repeats
from elmo_cache.store.sentence_index import index_in_memory, sort_index
from elmo_cache.text.tokenize import sentence_key, split_key

# Bytes per read when a staging file is copied or read in pieces.
_COPY_BLOCK = 16 * 2**20

__all__ = [
    "Layout",
    "Progress",
    "SentenceColumns",
    "Writer",
    "encode_tokens",
    "decode_tokens",
    "stored_key",
    "sentence_index",
    "offsets_after_zero",
    "array_blocks",
    "load_progress",
    "staged_column",
]


def stored_key(tokens: Sequence[str]) -> bytes:
    """One sentence as ``tokens/bytes`` stores it: its key (:func:`elmo_cache.text.tokenize.sentence_key`),
    encoded."""
    return sentence_key(tokens).encode(*TEXT_ENCODING)


def decode_tokens(stored: bytes) -> list[str]:
    """The tokens of one sentence as ``tokens/bytes`` stores it (the inverse of :func:`stored_key`)."""
    return split_key(stored.decode(*TEXT_ENCODING))


def encode_tokens(token_lists: Sequence[Sequence[str]]) -> tuple[np.ndarray, np.ndarray]:
    """``tokens/bytes`` of consecutive sentences (uint8) and each sentence's byte count (int64).

    A sentence is stored as its key (:func:`stored_key`).
    """
    keys = [stored_key(tokens) for tokens in token_lists]
    sizes = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
    return np.frombuffer(b"".join(keys), dtype=np.uint8), sizes


def sentence_index(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``index/hashes`` and ``index/rows`` of FORMAT.md from every line's hash: the sorted distinct
    hashes and the line of each one's first occurrence, sorted in memory (about 33 bytes per line;
    :func:`elmo_cache.store.sentence_index.sort_index` does it in bounded memory)."""
    return index_in_memory(hashes)


def offsets_after_zero(ends: Path, n: int, dest: Path) -> np.ndarray:
    """``[0, *ends[:n]]`` (int64) written to ``dest`` and memory-mapped: ``tokens/offsets`` from the
    ``text_ends`` column, copied file to file instead of built in memory (8 bytes a line)."""
    with open(ends, "rb") as source, open(dest, "wb") as out:
        out.write(bytes(8))
        left = n * 8
        while left:
            chunk = source.read(min(left, _COPY_BLOCK))
            if not chunk:
                raise CacheFormatError(f"{ends}: shorter than its {n} committed items")
            out.write(chunk)
            left -= len(chunk)
    return np.memmap(dest, dtype=np.int64, mode="r", shape=(n + 1,))


def array_blocks(data: np.ndarray, step: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, copy of data[start:start + step])`` over an array's rows. Pages of a whole-file map
    (``RawColumn.read``) are dropped from the process once copied: left mapped, every page read
    would stay resident, a corpus-sized share of the process by the end of a build. (The file's
    pages stay in the page cache; only this process's hold on them goes.)"""
    n = len(data)
    whole_map = isinstance(data, np.memmap) and isinstance(data.base, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED")
    if whole_map:
        base = data.base
        assert isinstance(base, mmap.mmap)
        where = data.ctypes.data - np.frombuffer(base, dtype=np.uint8).ctypes.data  # the array's start in the map
    row_bytes = max(1, data.itemsize * int(np.prod(data.shape[1:], dtype=np.int64)))
    # Within a block, pages are dropped a piece at a time as they are copied: dropped only after the
    # whole block, a block's worth of mapped pages sat beside its copy (64 MiB of text in a zarr finish).
    piece = max(1, _COPY_BLOCK // row_bytes)
    for start in range(0, n, step):
        stop = min(n, start + step)
        if not whole_map:
            yield start, np.array(data[start:stop])
            continue
        block = np.empty((stop - start, *data.shape[1:]), dtype=data.dtype)
        for a in range(start, stop, piece):
            b = min(stop, a + piece)
            block[a - start : b - start] = data[a:b]
            lo = (where + a * row_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
            hi = min(len(base), where + b * row_bytes)
            if hi > lo:
                base.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        yield start, block


@dataclass(frozen=True)
class Layout:
    """What one row of ``vectors`` looks like and how the container stores it."""

    # "zarr" or "hdf5".
    format: str
    # Shape of one row: (n_layers, dim) for layered caches, (dim,) for mixed ones.
    row_shape: tuple[int, ...]
    # Storage dtype name: "float16", "float32", or "int8" for quantised rows (codes and scale,
    # elmo_cache.rows.quantize).
    dtype: str
    # zarr rows per chunk (None for HDF5).
    chunk_rows: int | None = None
    # zarr compressor name from store.COMPRESSIONS (None: raw bytes).
    compression: str | None = None
    # zarr rows per vectors file (a shard of whole chunks; a multiple of chunk_rows). None for HDF5.
    shard_rows: int | None = None
    # Shape of one pooled sentence vector (the per-sentence array ``pooled``); None: built without --pool.
    pooled_shape: tuple[int, ...] | None = None
    # Storage dtype name of the pooled vectors ("float16" or "float32"); None without --pool.
    pooled_dtype: str | None = None
    # Whether the rows of ``vectors`` are stored: False for --pool-only (``vectors`` of 0 rows; the offsets
    # still address the rows a build with them would have).
    token_rows: bool = True
    # Per-sentence columns declared beyond the built-in ones and ``pooled`` (store.columns.sentence_columns).
    columns: tuple[Column, ...] = ()

    @property
    def sentence_columns(self) -> tuple[Column, ...]:
        """Every per-sentence column the writer stages and finishes, in order."""
        return sentence_columns(self.pooled_shape, self.pooled_dtype or self.dtype, self.columns)

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape)) * np.dtype(self.dtype).itemsize

    @property
    def window_rows(self) -> int:
        """Where a window's stored rows may start: at a multiple of this. zarr: a vectors file's rows, so that each
        window's rows fill files of their own, which an update of a corpus edited before them keeps whatever
        moved (docs/FORMAT.md, "Windows"), also in a --pool-only cache, whose offsets address the rows a build
        with them would have; 1 for HDF5 (one file whatever the rows)."""
        if self.shard_rows is not None:
            return int(self.shard_rows)
        return 1


@dataclass
class Progress:
    """What is durably on disk: the first ``lines`` sentences, their ``rows`` and ``tokens``."""

    identity: dict[str, Any]
    lines: int = 0
    rows: int = 0
    tokens: int = 0
    # True once the corpus was read to its end and every sentence committed.
    done: bool = False
    # Seconds spent encoding over all runs of this build (for the metadata's throughput).
    seconds: float = 0.0
    # Tokens encoded (not deduplicated away) over all runs.
    encoded_tokens: int = 0
    started: str | None = None
    # Container-specific state (the zarr tail file, for example).
    extra: dict[str, Any] = field(default_factory=dict)
    # How the build cuts the corpus into windows (the metadata's ``windows``), so that a resume knows the rule
    # the committed lines were cut by; None in a build started before windows were cut by content.
    windows: dict[str, Any] | None = None
    # An update (build --update): the digest of the metadata of the cache it replaces (store.format.metadata_digest),
    # whose rows and files it takes from the output; a resume goes on only while that cache is still there. None: a
    # build, or an update begun by an elmo-cache that did not record it.
    updating: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any], where: Path) -> Progress:
        try:
            return cls(**data)
        except TypeError as exc:
            raise CacheFormatError(f"{where}: unreadable build progress ({exc})") from None


def staged_column(build_dir: Path, spec: Column) -> RawColumn:
    """The staging file of declared column ``spec`` in ``build_dir``: one raw file, or one per chunk of the
    finished array (``spec.staged_in_chunks``), which a container then moves into place instead of copying."""
    path = build_dir / f"{spec.name.replace('/', '_')}.bin"  # one flat folder
    if spec.staged_in_chunks and spec.chunk_rows:
        return ChunkedColumn(path, spec.dtype, spec.row_shape, spec.chunk_rows)
    return RawColumn(path, spec.dtype, spec.row_shape)


class SentenceColumns:
    """The staged values of every declared per-sentence column (:mod:`elmo_cache.store.columns`) of a build's
    first ``lines`` sentences, and the arrays of the finished cache derived from them.

    The one derivation of FORMAT.md's per-sentence arrays: the single :class:`Writer` finishes from its own
    staging files, a container's ``ParallelWriter.finish`` from the files a distributed build's driver names
    (its first pass's, and the columns its parts wrote, joined), so both give the same bytes. Work files go
    under ``work``, which must outlive the arrays (some are memory-mapped there).
    """

    def __init__(self, specs: Iterable[Column], files: Mapping[str, RawColumn], lines: int, work: Path):
        self.specs: dict[str, Column] = {spec.name: spec for spec in specs}
        missing = [name for name in self.specs if name not in files]
        if missing:
            raise ValueError(f"no staged file for the declared columns {missing}")
        self.files = dict(files)
        self.lines = lines
        self.work = work
        self._index: tuple[np.ndarray, np.ndarray] | None = None

    def committed(self, spec: Column) -> int:
        """Values of column ``spec`` for the ``lines`` sentences: one each, or what its sizing column says."""
        lines = self.lines
        if spec.sized_by is None:
            return lines
        return int(self.files[spec.sized_by].read(lines)[lines - 1]) if lines else 0

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """The sorted distinct hashes and the line of each one's first occurrence.

        Sorted in runs on disk (:func:`~elmo_cache.store.sentence_index.sort_index`): memory does not grow
        with the corpus.
        """
        if self._index is None:
            self._index = sort_index(self.files[HASHES].read_range, self.lines, self.work / "index")
        return self._index

    def read_keys(self, start: int, stop: int) -> np.ndarray:
        """The ``hashes`` column (each line's key) for lines ``[start, stop)``, read into memory."""
        return self.files[HASHES].read_range(start, stop)

    def array_columns(self) -> dict[str, Column]:
        """The declared column behind each array written as it is (block rows, chunking, optional)."""
        return {spec.array: spec for spec in self.specs.values() if spec.array is not None}

    def arrays(self, extra: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Every array but ``vectors``, in the order the containers write them (FORMAT.md's, then ``extra``, the
        optional arrays such as a pq cache's codebooks, then the other declared ones): the declared columns'
        values (repeats given their copies where declared), and the index and token offsets derived."""
        n = self.lines
        hashes, rows = self.index()
        starts = offsets_after_zero(self.files[TEXT_ENDS].path, n, self.work / "token_offsets.bin")
        offsets, lengths = self.files["offsets"].read(n), self.files["lengths"].read(n)
        written: dict[str, Any] = {}
        for array, spec in self.array_columns().items():
            column = self.files[spec.name]
            if spec.copies_repeats:
                written[array] = rows_with_repeats(column, n, offsets, lengths)
            else:
                written[array] = column.read(self.committed(spec))
        return {
            "offsets": written.pop("offsets"),
            "lengths": written.pop("lengths"),
            "index/hashes": hashes,
            "index/rows": rows,
            "tokens/bytes": written.pop("tokens/bytes"),
            "tokens/offsets": starts,
            **(extra or {}),
            **written,
        }

    def staged_chunks(self, arrays: Mapping[str, Any]) -> dict[str, list[tuple[Path, int]]]:
        """``(path, rows)`` of each staged chunk file of the arrays whose column is staged in chunks (a container
        that can moves them into the cache instead of copying them)."""
        return {
            array: column.files(len(arrays[array]))
            for array, spec in self.array_columns().items()
            if isinstance(column := self.files[spec.name], ChunkedColumn)
        }


class Writer:
    """Common part of the container writers: staging folder, per-sentence columns, progress.

    The per-sentence columns are the layout's declared ones (:attr:`Layout.sentence_columns`,
    :mod:`elmo_cache.store.columns`): each is a raw file of the staging, appended, synced before every commit,
    cut back to the commit on resume, and finished into its array. Subclasses store ``vectors``
    (:meth:`_open_vectors`, :meth:`_append_vectors`, :meth:`_sync_vectors`; never called for a layout
    without token rows) and produce the final container (:meth:`finalize`).
    """

    def __init__(self, output: Path, layout: Layout, progress: Progress):
        self.output = output
        self.layout = layout
        self.staging = staging_path(output)
        self.build_dir = self.staging / BUILD_DIR
        self.progress = progress
        self.specs: dict[str, Column] = {spec.name: spec for spec in layout.sentence_columns}
        self.columns: dict[str, RawColumn] = {name: self._column(spec) for name, spec in self.specs.items()}
        # Values of each variable-size column (sized_by) committed and appended: the text's bytes.
        self._sizes = dict.fromkeys((name for name, spec in self.specs.items() if spec.sized_by), 0)
        # rows appended since the last commit, beyond progress.rows
        self._pending_lines = 0
        self._pending_rows = 0
        self._pending_tokens = 0
        self.initial_metadata: dict[str, Any] = {}
        # Arrays of store.format.OPTIONAL_ARRAYS the finished cache holds (a pq cache's codebooks), set by the build.
        self.extra_arrays: dict[str, np.ndarray] = {}

    def _column(self, spec: Column) -> RawColumn:
        """The staging file of ``spec`` (a container may stage a column its own way)."""
        return staged_column(self.build_dir, spec)

    # The built-in columns by name (store.columns.sentence_columns).
    @property
    def offsets(self) -> RawColumn:
        return self.columns["offsets"]

    @property
    def lengths(self) -> RawColumn:
        return self.columns["lengths"]

    @property
    def hashes(self) -> RawColumn:
        return self.columns[HASHES]

    @property
    def text(self) -> RawColumn:
        return self.columns[TEXT]

    @property
    def text_ends(self) -> RawColumn:
        return self.columns[TEXT_ENDS]

    @property
    def pooled(self) -> RawColumn | None:
        """The pooled vectors' column (``--pool``), else None."""
        return self.columns.get(POOLED_ARRAY)

    @property
    def stored_rows(self) -> int:
        """Committed rows of ``vectors``: ``progress.rows``, or none when the layout stores no token rows
        (``--pool-only``: ``progress.rows`` then counts the rows the offsets address, none of them written)."""
        return self.progress.rows if self.layout.token_rows else 0

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def create(cls, output: Path, layout: Layout, progress: Progress, metadata: dict[str, Any]) -> Writer:
        """Start a fresh staging folder (the caller removed any earlier one); ``metadata`` has complete=false."""
        writer = cls(output, layout, progress)
        writer.initial_metadata = metadata
        writer.build_dir.mkdir(parents=True)
        writer._create_container()
        atomic_write_json(writer.build_dir / PROGRESS_FILE, progress.to_json())
        writer._open()
        return writer

    @classmethod
    def resume(cls, output: Path, layout: Layout, progress: Progress) -> Writer:
        """Reopen a staging folder at its last commit, dropping anything written after it."""
        writer = cls(output, layout, progress)
        writer._open()
        return writer

    def _open(self) -> None:
        self._recover_columns()
        for name, spec in self.specs.items():  # declared in order: a sizing column is cut before what it sizes
            committed = self.sentences().committed(spec)
            self.columns[name].open(committed)
            if name in self._sizes:
                self._sizes[name] = committed
        self._open_vectors()

    def close(self) -> None:
        for column in self.columns.values():
            column.close()
        self._close_vectors()

    # -- writing ------------------------------------------------------------------------------

    def append(
        self,
        vectors: np.ndarray,
        offsets: np.ndarray,
        lengths: np.ndarray,
        hashes: np.ndarray,
        tokens: Sequence[Sequence[str]],
        pooled: np.ndarray | None = None,
        *,
        first_row: int | None = None,
        **values: np.ndarray,
    ) -> None:
        """Append the rows, per-sentence entries and tokens of consecutive sentences (not yet durable);
        ``pooled``: their pooled vectors, when the layout has them; ``first_row``: the row ``vectors`` starts at
        (None: right after the rows before), a start of a vectors file where the rows before end short of one (a
        window's rows: :attr:`Layout.window_rows`); ``values``: one array per sentence for each other column the
        layout declares, by name. A layout without token rows counts ``vectors`` (the rows the offsets address)
        but does not store them."""
        if len(tokens) != len(lengths) or any(len(t) != n for t, n in zip(tokens, lengths.tolist())):
            raise ValueError("append: tokens must hold one token list per sentence, of the sentence's length")
        if (pooled is None) != (self.pooled is None) or (pooled is not None and len(pooled) != len(lengths)):
            raise ValueError("append: pooled must hold one vector per sentence exactly when the layout pools")
        given = {"offsets": offsets, "lengths": lengths, HASHES: hashes, **values}
        if pooled is not None:
            given[POOLED_ARRAY] = pooled
        text, sizes = encode_tokens(tokens)
        given[TEXT], given[TEXT_ENDS] = text, self._sizes[TEXT] + np.cumsum(sizes)
        for name, spec in self.specs.items():
            if name not in given or (spec.sized_by is None and len(given[name]) != len(lengths)):
                raise ValueError(f"append: the layout declares column {name!r}: one value per sentence is needed")
        unknown = set(given) - set(self.specs)
        if unknown:
            raise ValueError(f"append: no column {sorted(unknown)} is declared by the layout")
        rows_before = self.progress.rows + self._pending_rows
        gap = 0 if first_row is None else int(first_row) - rows_before
        if gap and (gap < 0 or len(vectors) == 0 or (rows_before + gap) % self.layout.window_rows):
            raise ValueError(
                f"append: rows may start only after the rows before ({rows_before}) or at the next multiple of "
                f"{self.layout.window_rows} (a window's first row), not at {first_row}"
            )
        if self.layout.token_rows:
            self._append_vectors(vectors, gap)
        for name, column in self.columns.items():
            column.append(given[name])
            if name in self._sizes:
                self._sizes[name] += len(given[name])
        self._pending_lines += len(lengths)
        self._pending_rows += gap + len(vectors)
        self._pending_tokens += int(np.sum(lengths, dtype=np.int64))

    def commit(self, *, done: bool = False, seconds: float = 0.0, encoded_tokens: int = 0) -> None:
        """Make everything appended durable, then record it in ``progress.json``."""
        # Before anything is synced or recorded: a build whose lock was lost to another stops here, and its
        # uncommitted appends stay garbage that a resume cuts off.
        check_held(self.output)
        extra = self._sync_vectors()
        for column in self.columns.values():
            column.sync()
        p = self.progress
        p.lines += self._pending_lines
        p.rows += self._pending_rows
        p.tokens += self._pending_tokens
        p.done = done
        p.seconds += seconds
        p.encoded_tokens += encoded_tokens
        p.extra = extra
        atomic_write_json(self.build_dir / PROGRESS_FILE, p.to_json())
        self._pending_lines = self._pending_rows = self._pending_tokens = 0
        self._after_commit()

    # -- finishing ----------------------------------------------------------------------------

    def sentences(self) -> SentenceColumns:
        """The committed values of the declared columns, from which the finish derives the per-sentence arrays."""
        cached = getattr(self, "_sentences", None)
        if cached is None or cached.lines != self.progress.lines:
            cached = self._sentences = SentenceColumns(
                self.specs.values(), self.columns, self.progress.lines, self.build_dir
            )
        return cached

    def index(self) -> tuple[np.ndarray, np.ndarray]:
        """The sorted distinct hashes and the line of each one's first occurrence (:meth:`SentenceColumns.index`)."""
        return self.sentences().index()

    def array_columns(self) -> dict[str, Column]:
        """The declared column behind each array written as it is (block rows, chunking, optional)."""
        return self.sentences().array_columns()

    def small_arrays(self) -> dict[str, np.ndarray]:
        """Every array but ``vectors``, in the order the containers write them (:meth:`SentenceColumns.arrays`,
        with the build's :attr:`extra_arrays`)."""
        return self.sentences().arrays(self.extra_arrays)

    def committed_key(self, i: int) -> bytes:
        """The stored key (UTF-8 tokens joined by one space) of committed line ``i``."""
        lines = self.progress.lines
        cached = getattr(self, "_keys", None)
        if cached is None or cached[0] != lines:
            ends = self.text_ends.read(lines)
            cached = self._keys = (lines, ends, self.text.read(int(ends[-1]) if lines else 0))
        _, ends, text = cached
        start = int(ends[i - 1]) if i else 0
        return text[start : int(ends[i])].tobytes()

    def remove_staging(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    # -- container hooks ----------------------------------------------------------------------

    def _create_container(self) -> None:
        raise NotImplementedError

    def _recover_columns(self) -> None:
        """Hook run before the columns are reopened: take back column files a finish that did not complete
        had already moved into the container."""

    def _open_vectors(self) -> None:
        raise NotImplementedError

    def _append_vectors(self, vectors: np.ndarray, gap: int = 0) -> None:
        raise NotImplementedError

    def _sync_vectors(self) -> dict[str, Any]:
        raise NotImplementedError

    def _after_commit(self) -> None:
        """Hook run once progress.json names the new state (drop superseded files)."""

    def _close_vectors(self) -> None:
        raise NotImplementedError

    def finalize(self, metadata: dict[str, Any]) -> Path:
        """Write the final container at ``self.output`` (complete=true) and remove the staging."""
        raise NotImplementedError


def load_progress(output: Path) -> Progress | None:
    """The committed progress of an interrupted build of ``output``, or None when there is none."""
    path = staging_path(output) / BUILD_DIR / PROGRESS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheFormatError(f"{path}: unreadable build progress ({exc}); rerun with --overwrite") from None
    return Progress.from_json(data, path)
