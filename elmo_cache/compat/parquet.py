"""``export --format parquet``: a cache as one Parquet file that pyarrow and Hugging Face ``datasets`` read.

One row per sentence, in line order: ``line`` (int64, the sentence's number), ``tokens`` (list of strings:
the tokens the cache stores; null for a format-1 cache, which stores none) and ``vectors``, float32 nested
lists of the sentence's shape: ``(n_layers, n_tokens, dim)`` for a layered cache, ``(n_tokens, dim)`` for a
mixed one, as ``cache[i]`` reads them (a float16 cache widened exactly, a quantised one decoded). Nested
lists rather than one flat column because ``datasets`` maps them to ``Sequence`` features whose
``with_format("torch")`` rows have the sentence's shape. The cache's metadata (model, layers, dim, ...)
is kept in the file's schema metadata under ``elmo_cache``.

Rows are written in row groups of at most :data:`ROW_GROUP_VALUES` floats, so memory stays bounded
whatever the cache's size; the file is written beside ``output`` and renamed once complete.
Needs pyarrow (``pip install "elmo-cache[parquet]"``; reading the cache does not).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import InvalidParameterError

if TYPE_CHECKING:
    from elmo_cache.reader.cache import Cache

__all__ = ["ROW_GROUP_VALUES", "write_parquet", "require_pyarrow"]

ROW_GROUP_VALUES = 32 * 1024 * 1024
"""Floats per row group at most (128 MiB of float32; a longer sentence gets a row group of its own)."""


def require_pyarrow() -> Any:
    """pyarrow and pyarrow.parquet, or an error saying what to install."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise InvalidParameterError(
            'format: parquet needs pyarrow, which is not installed: pip install "elmo-cache[parquet]"'
        ) from None
    return pa, pq


def _offsets(counts: list[int], pa: Any) -> Any:
    return pa.array(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int32), pa.int32())


def _vectors_column(arrays: list[np.ndarray], layered: bool, dim: int, pa: Any) -> Any:
    """The nested list column of ``arrays`` built from one flat float32 buffer (no Python lists)."""
    flat = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.empty(0, np.float32)
    values = pa.array(flat.astype(np.float32, copy=False), pa.float32())
    n_vectors = len(flat) // dim if dim else 0
    column = pa.ListArray.from_arrays(_offsets([dim] * n_vectors, pa), values)
    if layered:
        per_layer = [a.shape[1] for a in arrays for _ in range(a.shape[0])]
        column = pa.ListArray.from_arrays(_offsets(per_layer, pa), column)
        return pa.ListArray.from_arrays(_offsets([a.shape[0] for a in arrays], pa), column)
    return pa.ListArray.from_arrays(_offsets([a.shape[0] for a in arrays], pa), column)


def write_parquet(cache: Cache, output: Path, advance: Callable[[int], Any] | None = None) -> int:
    """Write every sentence of ``cache`` to ``output`` (see the module docstring); returns the sentences written.
    ``advance(n)`` is told of every ``n`` sentences read (a progress bar's ``update``)."""
    pa, pq = require_pyarrow()
    layered = cache.kind == "layers"
    dim = int(cache.dim)
    vector_type = pa.list_(pa.list_(pa.list_(pa.float32()))) if layered else pa.list_(pa.list_(pa.float32()))
    schema = pa.schema(
        [("line", pa.int64()), ("tokens", pa.list_(pa.string())), ("vectors", vector_type)],
        metadata={"elmo_cache": json.dumps(cache.metadata, sort_keys=True, default=str)},
    )
    tmp = output.with_name(output.name + ".tmp")
    try:
        with pq.ParquetWriter(tmp, schema) as writer:
            lines: list[int] = []
            arrays: list[np.ndarray] = []
            held = 0

            def flush() -> None:
                tokens = [cache.tokens(i) for i in lines] if cache.stores_tokens else [None] * len(lines)
                table = pa.table(
                    [
                        pa.array(lines, pa.int64()),
                        pa.array(tokens, pa.list_(pa.string())),
                        _vectors_column(arrays, layered, dim, pa),
                    ],
                    schema=schema,
                )
                writer.write_table(table)

            for i in range(len(cache)):
                vectors = np.asarray(cache[i], dtype=np.float32)
                if arrays and held + vectors.size > ROW_GROUP_VALUES:
                    flush()
                    lines, arrays, held = [], [], 0
                lines.append(i)
                arrays.append(vectors)
                held += vectors.size
                if advance is not None:
                    advance(1)
            if arrays or len(cache) == 0:
                flush()
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return len(cache)
