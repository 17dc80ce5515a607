"""How many rows a zarr ``vectors`` chunk and file (shard) hold when a build asks for none: rules in bytes,
measured (the docstrings say where), so that reads stay fast and corpora of billions of tokens stay a
manageable number of files."""

from __future__ import annotations

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_CHUNK_ROWS",
    "DEFAULT_SHARD_BYTES",
    "default_chunk_rows",
    "default_shard_rows",
]

DEFAULT_CHUNK_BYTES = 3 * 2**20
"""Largest zarr ``vectors`` chunk the default allows (see :func:`default_chunk_rows`)."""


DEFAULT_CHUNK_ROWS = 512
"""What :func:`default_chunk_rows` gives Original-size layered float16 rows (6 KiB each)."""


def default_chunk_rows(row_bytes: int) -> int:
    """Rows per zarr chunk when none is asked for: the largest power of two within 3 MiB.

    Measured with ``benchmarks/bench_build.py chunks`` (Original-size rows, 3 x 1024 fp16, 6 KiB
    each; 2-core VM): a random sentence read through zarr decodes whole chunks and cost 0.94 ms
    at 128 rows (0.75 MiB), 0.95 ms at 256, 1.01 ms at 512 (3 MiB), 1.62 ms at 1024, 2.65 ms at
    2048 and 4.74 ms at 4096 (24 MiB). Below ~3 MiB zarr's fixed per-read cost dominates, so
    smaller chunks only multiply files (a 2.5G-token corpus at 256 rows is ~10M files). The
    memory-mapped reader is 0.01-0.1 ms whatever the size. Latency follows bytes, not rows, so
    the rule is in bytes: 512 rows for Original fp16 layers, 256 for fp32, 1024 for a fp16 mix.
    """
    rows = 16
    while rows * 2 * row_bytes <= DEFAULT_CHUNK_BYTES and rows < 65536:
        rows *= 2
    return rows


DEFAULT_SHARD_BYTES = 256 * 2**20
"""Largest zarr ``vectors`` file (shard) the default allows (see :func:`default_shard_rows`)."""


def default_shard_rows(chunk_rows: int, row_bytes: int) -> int:
    """Rows per zarr ``vectors`` file when none is asked for: the most whole chunks within 256 MiB.

    zarr keeps each chunk in its own file unless chunks are grouped into shards. At 3 MiB chunks a
    100M-sentence corpus (2.5G tokens, Original layers in float16: 15 TB) would be 5M files, more
    than many file systems and object stores handle well; in 256 MiB shards it is 57,000. A
    memory-mapped reader maps a shard as one block, so lookups cost the same
    (``benchmarks/bench_scale.py``), while compressed caches still decode one 3 MiB chunk per read.
    """
    return max(1, DEFAULT_SHARD_BYTES // (chunk_rows * row_bytes)) * chunk_rows
