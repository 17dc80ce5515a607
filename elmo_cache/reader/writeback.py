"""A cache's write-back journal from the reader's side: its record layout, and opening it for a cache.

The journal (:mod:`elmo_cache.store.journal`) holds sentences ``serve --write-back`` encoded live; lookups
by text (``Cache.get``, the server) consult it after the cache.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.rows.codecs import codec_of_metadata
from elmo_cache.rows.pooling import pool_of, pooled_shape
from elmo_cache.rows.selection import Selection
from elmo_cache.store.journal import DEFAULT_COMMIT_MS, DEFAULT_MAX_BYTES, Journal, RecordLayout, encoding_identity
from elmo_cache.store.journal import journal_path as journal_path

# A cache here is an open elmo_cache.reader.cache.Cache (not imported: it imports this module).
Cache = Any

__all__ = ["record_layout", "layout_of_metadata", "open_journal", "read_journal", "journal_path"]


def record_layout(cache: Cache) -> RecordLayout:
    """The bytes a journal record of ``cache`` holds: its stored rows, and its pooled vector when it has one."""
    return layout_of_metadata(cache.metadata)


def layout_of_metadata(meta: Mapping[str, Any]) -> RecordLayout:
    """:func:`record_layout` of the cache whose metadata is ``meta``: a ``--pool-only`` cache's records hold rows of
    no values (row shape ``(0,)``: the sentence's token count and its pooled vector), as it stores no token rows."""
    row = Selection.from_metadata(meta).row_shape(int(meta["dim"]))
    codec = codec_of_metadata(meta)
    pool = pool_of(meta)
    return RecordLayout(
        row_dtype=np.dtype(codec.dtype).str,
        row_shape=(0,) if pool is not None and pool.only else tuple(codec.stored_shape(row)),
        pooled_dtype=None if pool is None else np.dtype(pool.dtype).str,
        pooled_shape=None if pool is None else tuple(pooled_shape(row, pool.method)),
    )


def open_journal(
    cache: Cache,
    path: Any = None,
    *,
    writable: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
    commit_ms: float = DEFAULT_COMMIT_MS,
    listener: Any = None,
) -> Journal:
    """The journal of ``cache`` (at ``path``, default ``<cache>.writeback``), checked to be this cache's kind:
    one written for another model or other options is a :class:`~elmo_cache.errors.CacheFormatError`."""
    return Journal(
        journal_path(cache.path) if path is None else path,
        encoding_identity(cache.metadata),
        record_layout(cache),
        writable=writable,
        max_bytes=max_bytes,
        commit_ms=commit_ms,
        listener=listener,
    )


def read_journal(cache: Cache) -> Journal | None:
    """The journal beside ``cache`` opened for reading, or None when there is none, or (with a warning) when it
    was written for another cache or cannot be read: a reader goes on with the cache alone."""
    path = journal_path(cache.path)
    if not path.is_file():
        return None
    try:
        return open_journal(cache, path)
    except (CacheFormatError, OSError, ValueError) as exc:
        warnings.warn(f"{exc}; lookups use the cache alone", stacklevel=3)
        return None
