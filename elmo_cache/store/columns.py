"""The per-sentence columns of a cache, declared as data: what the staging :class:`~elmo_cache.store.staging.Writer`
creates, appends, syncs, cuts back on resume and finishes, and what both containers write.

A build stages one append-only file per declared :class:`Column` in ``.build/``; the writer takes the list
from :func:`sentence_columns` (and :attr:`Layout.columns <elmo_cache.store.staging.Layout>`), not from fields
of its own, so a new per-sentence array is one :class:`Column` here (or in the layout) plus the code that
computes its values and hands them to :meth:`Writer.append <elmo_cache.store.staging.Writer.append>` by name.

Two of the built-in columns become arrays of another shape when the cache is finished, by code of the
writer's own: ``hashes`` gives ``index/hashes`` and ``index/rows`` (sorted; FORMAT.md) and ``text_ends``
gives ``tokens/offsets``. Every other column with an :attr:`Column.array` is written as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from elmo_cache.store.format import (
    ARRAYS,
    OPTIONAL_ARRAYS,
    POOLED_ARRAY,
    POOLED_CHUNK_BLOCKS,
    SMALL_BLOCK_ROWS,
    block_sums_name,
    pooled_block_rows,
)

__all__ = [
    "Column",
    "sentence_columns",
    "pooled_column_spec",
    "declared_arrays",
    "cache_arrays",
    "optional_arrays",
    "with_block_sums",
    "HASHES",
    "TEXT",
    "TEXT_ENDS",
    "DERIVED_ARRAYS",
]

# The built-in columns the writer derives arrays from (see the module docstring).
HASHES = "hashes"
TEXT = "text"
TEXT_ENDS = "text_ends"

DERIVED_ARRAYS = {HASHES: ("index/hashes", "index/rows"), TEXT_ENDS: ("tokens/offsets",)}
"""The arrays the writer derives from a built-in column without an :attr:`Column.array` (FORMAT.md)."""

# What a declared array may be called: lower-case path segments. A name from a cache's metadata is used as a
# path inside a zarr group, so nothing else (``..``, absolute paths) is ever opened.
_ARRAY_NAME = re.compile(r"[a-z0-9_]+(/[a-z0-9_]+)*")


@dataclass(frozen=True)
class Column:
    """One per-sentence column: how it is staged, cut back on resume, and written into the finished cache."""

    # Staging file ``.build/<name>.bin`` and the key of its values in Writer.append.
    name: str
    # Storage dtype name of one value.
    dtype: str
    # Shape of one value (() for a scalar per sentence).
    row_shape: tuple[int, ...] = ()
    # The array of the finished cache it is written as, unchanged (None: the writer derives arrays from it).
    array: str | None = None
    # Whether only some caches hold it (their metadata says so): listed in checksums.blocks.rows, as
    # store.format.OPTIONAL_ARRAYS are, and never required by readers of caches without it.
    optional: bool = False
    # How it is cut back on resume: None, one value per committed sentence; else the name of the column
    # whose value at the last committed sentence is this column's length (variable-size values, the text).
    sized_by: str | None = None
    # Rows per checked block in ``blocksums/<array>`` (FORMAT.md, "Block checksums").
    block_rows: int = SMALL_BLOCK_ROWS
    # zarr rows per chunk file of the array (None: the 1-D arrays' chunking, store.zarr.write); with
    # ``staged_in_chunks`` the staging keeps one file per chunk so that the finish publishes them by renaming.
    chunk_rows: int | None = None
    staged_in_chunks: bool = False
    # Whether a deduplicated repeat's value is a copy of its first occurrence's, filled at the finish
    # (the engines leave repeats' values as zeros while encoding: store.pooled.copy_repeats).
    copies_repeats: bool = False

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def pooled_column_spec(row_shape: tuple[int, ...], dtype: str) -> Column:
    """The ``pooled`` column (``build --pool``): one pooled vector of ``row_shape`` per sentence."""
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    block = pooled_block_rows(row_bytes)
    return Column(
        POOLED_ARRAY,
        dtype,
        tuple(row_shape),
        array=POOLED_ARRAY,
        optional=True,
        block_rows=block,
        # Whole checked blocks per file (a block lies in one file), about 256 MiB as vectors shards are; an
        # array of fewer rows is one chunk of its length (store.pooled.pooled_chunk_rows).
        chunk_rows=block * POOLED_CHUNK_BLOCKS,
        # A pool-only cache is mostly this column: staged as its chunk files, it is never copied, so a build
        # needs little more disk than the cache it ends with.
        staged_in_chunks=True,
        copies_repeats=True,
    )


def sentence_columns(
    pooled_shape: tuple[int, ...] | None = None,
    pooled_dtype: str | None = None,
    extra: tuple[Column, ...] = (),
) -> tuple[Column, ...]:
    """Every per-sentence column of a build: the built-in ones (FORMAT.md's arrays), ``pooled`` with
    ``pooled_shape`` (``--pool``), then ``extra`` in the order given."""
    columns = [
        Column("offsets", "int64", array="offsets"),
        Column("lengths", "int32", array="lengths"),
        Column(HASHES, "uint64"),
        # Each sentence's tokens: where its key's UTF-8 bytes end in ``text``, and those bytes.
        Column(TEXT_ENDS, "int64"),
        Column(TEXT, "uint8", array="tokens/bytes", sized_by=TEXT_ENDS),
    ]
    if pooled_shape is not None:
        assert pooled_dtype is not None, "a pooled column has a dtype"
        columns.append(pooled_column_spec(pooled_shape, pooled_dtype))
    names = [c.name for c in columns]
    for column in extra:
        if column.name in names:
            raise ValueError(f"column {column.name!r} is declared twice")
        names.append(column.name)
        columns.append(column)
    return tuple(columns)


def declared_arrays(columns: tuple[Column, ...]) -> tuple[str, ...]:
    """The arrays of a finished cache that ``columns`` become (``vectors`` aside), in declaration order."""
    names: list[str] = []
    for column in columns:
        names.extend((column.array,) if column.array is not None else DERIVED_ARRAYS.get(column.name, ()))
    return tuple(names)


def optional_arrays(meta: Any) -> tuple[str, ...]:
    """The optional arrays a cache with metadata ``meta`` may hold: the built-in ones
    (:data:`~elmo_cache.store.format.OPTIONAL_ARRAYS`, which readers look for whatever the metadata says), then
    each further declared column's array that the metadata lists in ``checksums.blocks.rows`` (the writers list
    every optional column they write there). Metadata that is not a dict, or lists nothing, adds none."""
    rows = _block_rows(meta)
    known = (*ARRAYS, *OPTIONAL_ARRAYS)
    extra = (name for name in rows if name not in known and _ARRAY_NAME.fullmatch(name))
    return (*OPTIONAL_ARRAYS, *extra)


def cache_arrays(meta: Any) -> tuple[str, ...]:
    """Every array a cache with metadata ``meta`` may hold, in order: FORMAT.md's
    (:data:`~elmo_cache.store.format.ARRAYS`; a version-1 cache lacks some, which the readers decide), then
    :func:`optional_arrays`. The one list the readers' open-time checks and ``verify`` open."""
    return (*ARRAYS, *optional_arrays(meta))


def with_block_sums(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` followed by the block-sum array of each (FORMAT.md, "Block checksums")."""
    return (*names, *(block_sums_name(name) for name in names))


def _block_rows(meta: Any) -> dict[str, Any]:
    """``checksums.blocks.rows`` of ``meta``, or an empty dict where the metadata has none (or is damaged:
    the readers name that themselves)."""
    checksums = meta.get("checksums") if isinstance(meta, dict) else None
    blocks = checksums.get("blocks") if isinstance(checksums, dict) else None
    rows = blocks.get("rows") if isinstance(blocks, dict) else None
    return {k: v for k, v in rows.items() if isinstance(k, str)} if isinstance(rows, dict) else {}
