"""How many rows a zarr ``vectors`` chunk and file (shard) hold when a build asks for none: rules in bytes,
measured (the docstrings say where), so that reads stay fast and corpora of billions of tokens stay a
manageable number of files; and a corpus of a few such chunks or less gets chunks cut to its size, since zarr
pads the last chunk to full size (a 5-token cache would otherwise take 3 MiB)."""

from __future__ import annotations

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_CHUNK_ROWS",
    "DEFAULT_SHARD_BYTES",
    "MAX_CHUNK_ROWS",
    "MAX_SHARD_ROWS",
    "MIN_CHUNK_ROWS",
    "SMALL_CORPUS_CHUNKS",
    "default_chunk_rows",
    "default_shard_rows",
]

DEFAULT_CHUNK_BYTES = 3 * 2**20
"""Largest zarr ``vectors`` chunk the default allows (see :func:`default_chunk_rows`)."""


DEFAULT_CHUNK_ROWS = 512
"""What :func:`default_chunk_rows` gives Original-size layered float16 rows (6 KiB each)."""


MAX_CHUNK_ROWS = 1024
"""Most rows a default chunk holds, however small its rows: each window's rows start a vectors file of their own
(``Layout.window_rows``), so a window's last chunk is padded, half a chunk on average; at 1,024 rows that is under
1% of a window of the CPU's default ~60,000 rows (8,192 tokens x 8 batches), where the byte rule alone gave
small rows (pq codes: 192 bytes) chunks of 16,384 rows, 13%."""


MIN_CHUNK_ROWS = 16
"""Fewest rows a default chunk holds, however small the corpus (the byte rule's own floor too); a small
corpus's chunk is a multiple of it."""


SMALL_CORPUS_CHUNKS = 4
"""A build counts its corpus's tokens up to this many default chunks (and no further: the count reads the
corpus): a corpus that fits is chunked to its size. Past it, one chunk's padding is under a quarter of the rows."""


def default_chunk_rows(row_bytes: int, corpus_rows: int | None = None) -> int:
    """Rows per zarr chunk when none is asked for: the largest power of two within 3 MiB; when the corpus's
    rows are known (``corpus_rows``), its rows cut into that many chunks or fewer, of equal size rounded up to a
    multiple of :data:`MIN_CHUNK_ROWS` (never more rows than the byte rule's).

    The corpus rule: zarr stores every chunk whole, the last one padded, so a corpus of 5 tokens in one 3 MiB
    chunk takes 3 MiB on disk (in 16 rows: 16 rows), and one of 2,110 int8 rows in 2,048-row chunks takes
    4,096 (in two chunks of 1,056: 2,112). Equal chunks rounded to 16 rows, not powers of two, so that the
    padding stays under 16 rows a chunk; the floor keeps tiny corpora from chunks of a row or two. A corpus
    edited by a few tokens may change its chunking: a rebuild adopts the chunking of the cache there
    (:func:`elmo_cache.builder.output.adopt_chunking`), and then names the corpus change.

    Measured with ``benchmarks/bench_build.py chunks`` (Original-size rows, 3 x 1024 fp16, 6 KiB
    each; 2-core VM): a random sentence read through zarr decodes whole chunks and cost 0.94 ms
    at 128 rows (0.75 MiB), 0.95 ms at 256, 1.01 ms at 512 (3 MiB), 1.62 ms at 1024, 2.65 ms at
    2048 and 4.74 ms at 4096 (24 MiB). Below ~3 MiB zarr's fixed per-read cost dominates, so
    smaller chunks only multiply files (a 2.5G-token corpus at 256 rows is ~10M files). The
    memory-mapped reader is 0.01-0.1 ms whatever the size. Latency follows bytes, not rows, so
    the rule is in bytes: 512 rows for Original fp16 layers, 256 for fp32, 1024 for a fp16 mix, and never more
    than :data:`MAX_CHUNK_ROWS` (a window's padding).
    """
    rows = MIN_CHUNK_ROWS
    while rows * 2 * row_bytes <= DEFAULT_CHUNK_BYTES and rows < MAX_CHUNK_ROWS:
        rows *= 2
    if corpus_rows is not None:
        chunks = max(1, -(-corpus_rows // rows))
        per_chunk = -(-corpus_rows // chunks)
        rows = min(rows, max(MIN_CHUNK_ROWS, -(-per_chunk // MIN_CHUNK_ROWS) * MIN_CHUNK_ROWS))
    return rows


DEFAULT_SHARD_BYTES = 64 * 2**20
"""Largest zarr ``vectors`` file (shard) the default allows (see :func:`default_shard_rows`)."""


MAX_SHARD_ROWS = 16 * MAX_CHUNK_ROWS
"""Most rows a default vectors file holds, however small its rows (16,384: the Original's float16 layers fill
64 MiB at 10,752): the rows between a window's end and the next file belong to no sentence, about half a file per
window of the CPU's default ~60,000 rows."""


def default_shard_rows(chunk_rows: int, row_bytes: int, corpus_rows: int | None = None) -> int:
    """Rows per zarr ``vectors`` file when none is asked for: the most whole chunks within 64 MiB, and, when
    the corpus's rows are known (``corpus_rows``), no more chunks than hold them (a shard's index has an
    entry per chunk it could hold: a 24 KiB chunk's 64 MiB shard would carry a 43 KiB index).

    zarr keeps each chunk in its own file unless chunks are grouped into shards. At 3 MiB chunks a
    100M-sentence corpus (2.5G tokens, Original layers in float16: 15 TB) would be 5M files, more
    than many file systems and object stores handle well; in 64 MiB shards it is 230,000. A
    memory-mapped reader maps a shard as one block, so lookups cost the same
    (``benchmarks/bench_scale.py``), while compressed caches still decode one 3 MiB chunk per read.

    Why not larger (it was 256 MiB, 57,000 files there): ``build --update`` keeps the files wholly before the
    first changed row and writes the one holding it again from its start, so a file is the most an update writes
    beyond the rows that changed. At 256 MiB that was 8.8% of a 1M-token cache of the bundled model's float32
    layers (3 GB), and a 1% append wrote 5.005% of a full build's bytes (issue 32's bound is 5%); at 64 MiB it is
    at most 2.2% (``benchmarks/bench_update.py``: benchmarks/RESULTS.md, "Updating a cache in place").

    And never more than :data:`MAX_SHARD_ROWS` rows: each window's rows start a file of their own, so the rows
    from a window's end to the next file's start belong to no sentence (no bytes on disk, but ``n_rows`` counts
    them, and so does a whole-array read through zarr).
    """
    chunks = max(1, min(DEFAULT_SHARD_BYTES // (chunk_rows * row_bytes), MAX_SHARD_ROWS // chunk_rows))
    if corpus_rows is not None:
        chunks = min(chunks, max(1, -(-corpus_rows // chunk_rows)))
    return chunks * chunk_rows
