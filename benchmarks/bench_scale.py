"""A real 100M-sentence zarr cache: how many files it is, how fast it opens, how fast lookups are.

Writes a synthetic cache of ``--sentences`` sentences (1-4 tokens each, every sentence distinct,
real sentence hashes, stored tokens and index; fp16 mixed vectors of ``--dim`` values whose rows
hold their row number, so every read is checked) through the store's own primitives
(``create_group``, ``write_vectors_file``, ``finish_group``: what a build writes, without the
encoder), then measures

* the files of the cache (count and bytes, per array);
* ``elmo_cache.open``: cold (every file dropped from the page cache first) and warm, and the
  memory it takes;
* random lookups by sentence number (``cache[i]``, copied out) and by text (``cache.find``, a
  hash, a binary search of the index and the stored tokens compared), each checked, cold (pages
  dropped, then read as the lookups touch them) and warm (every file read once first); and
  misses (sentences not in the cache).

    python benchmarks/bench_scale.py                        # 100M sentences, ~12 GB of files, ~15 min
    python benchmarks/bench_scale.py --sentences 1000000    # quick
    # the same rows as Original-size caches would be cut: one 3 MiB chunk per file, then 256 MiB shards (old default)
    python benchmarks/bench_scale.py --layout 512:512 --layout 512:43520
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_read import drop_page_cache, machine, metadata, rss_mib

import elmo_cache
from elmo_cache.builder import default_chunk_rows, default_shard_rows
from elmo_cache.store import Layout
from elmo_cache.store import zarr as zarr_store

WORDS = ["the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "was", "on", "with", "as", "he"]
BLOCK = 1_000_000


def key(i: int, length: int) -> str:
    """Sentence i's text: a unique first token, then common words."""
    return " ".join([f"s{i}", *(WORDS[(i + j) % len(WORDS)] for j in range(1, length))])


def make_sentences(n: int, seed: int, directory: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Lengths and every 1-D array of the cache (tokens in ``directory / "text.bin"``)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 5, size=n, dtype=np.int32)
    offsets = np.zeros(n, np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    t0 = time.perf_counter()
    hashes = np.empty(n, np.uint64)
    text_offsets = np.zeros(n + 1, np.int64)
    text_path = directory / "text.bin"
    with open(text_path, "wb") as text:
        for start in range(0, n, BLOCK):
            stop = min(n, start + BLOCK)
            keys = [key(i, length).encode() for i, length in enumerate(lengths[start:stop].tolist(), start)]
            hashes[start:stop] = [int.from_bytes(hashlib.blake2b(k, digest_size=8).digest(), "little") for k in keys]
            text_offsets[start + 1 : stop + 1] = text_offsets[start] + np.cumsum([len(k) for k in keys])
            text.write(b"".join(keys))
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    assert (ordered[1:] != ordered[:-1]).all(), "a 64-bit collision among the synthetic sentences: change --seed"
    print(f"  keys, hashes and index of {n:,} sentences: {time.perf_counter() - t0:.0f} s")
    return lengths, {
        "offsets": offsets,
        "lengths": lengths,
        "index/hashes": ordered,
        "index/rows": order.astype(np.int64),
        "tokens/bytes": np.memmap(text_path, dtype=np.uint8, mode="r"),
        "tokens/offsets": text_offsets,
    }


def write_cache(path: Path, arrays: dict[str, np.ndarray], dim: int, chunk_rows: int | None, shard_rows: int | None):
    """The cache of ``arrays`` with vectors whose rows hold their row number (mod 2048)."""
    n, n_rows = len(arrays["lengths"]), int(arrays["lengths"].sum())
    row_bytes = dim * 2
    chunk_rows = chunk_rows or default_chunk_rows(row_bytes)
    shard_rows = shard_rows or default_shard_rows(chunk_rows, row_bytes)
    layout = Layout("zarr", (dim,), "float16", chunk_rows, None, shard_rows)
    staging = path.with_name(path.name + ".partial")
    meta = metadata("mix", dim, "zarr", None, chunk_rows) | {"shard_rows": shard_rows}
    zarr_store.create_group(staging, layout, n_rows, meta)
    t0 = time.perf_counter()
    sums = {}
    for k in range(-(-n_rows // shard_rows)):
        first, last = k * shard_rows, min(n_rows, (k + 1) * shard_rows)
        rows = np.broadcast_to((np.arange(first, last) % 2048).astype(np.float16)[:, None], (last - first, dim))
        sums[k] = zarr_store.write_vectors_file(staging, layout, n_rows, k, rows)
    written = time.perf_counter() - t0
    t0 = time.perf_counter()
    meta.update(complete=True, n_sentences=n, n_tokens=n_rows, n_rows=n_rows, n_unique=n)
    zarr_store.finish_group(staging, path, arrays, meta, sums)
    print(
        f"  chunk_rows {chunk_rows}, shard_rows {shard_rows}: vectors written in {written:.0f} s, "
        f"finished (small arrays, checksums) in {time.perf_counter() - t0:.0f} s"
    )


def describe_files(path: Path) -> None:
    per_array: dict[str, list[int]] = {}
    for file in path.rglob("*"):
        if file.is_file():
            parts = file.relative_to(path).parts
            name = "/".join(parts[:2]) if parts[0] in ("index", "tokens") and len(parts) > 2 else parts[0]
            per_array.setdefault(name, []).append(file.stat().st_size)
    total = sum(len(sizes) for sizes in per_array.values())
    print(f"  {total:,} files, {sum(map(sum, per_array.values())) / 2**30:.2f} GiB")
    for name, sizes in sorted(per_array.items()):
        print(f"    {name:15s} {len(sizes):>7,} files, largest {max(sizes) / 2**20:8.1f} MiB")


def read_everything(path: Path) -> None:
    """Bring every file of the cache into the page cache (what "warm" means below)."""
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as f:
                while f.read(1 << 24):
                    pass


def stats(times: list[float]) -> str:
    ordered = sorted(times)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return f"median {statistics.median(times) * 1e6:7.1f} us, p99 {p99 * 1e6:8.1f} us"


def lookups(path: Path, lengths: np.ndarray, count: int, seed: int, *, cold: bool) -> None:
    offsets = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(lengths), size=count).tolist()
    label = "cold" if cold else "warm"
    if cold:
        os.sync()  # dirty pages cannot be dropped
        drop_page_cache(path)
    else:
        read_everything(path)
    with elmo_cache.open(path) as cache:
        times = []
        for i in picks:
            t0 = time.perf_counter()
            vectors = np.array(cache[i])
            times.append(time.perf_counter() - t0)
            assert vectors.shape == (lengths[i], cache.dim) and vectors[0, 0] == offsets[i] % 2048, i
        print(f"  cache[i], {label}:      {stats(times)}  ({count:,} random sentences)")
        if cold:
            drop_page_cache(path)
        texts = [key(i, int(lengths[i])) for i in picks]
        times = []
        for i, text in zip(picks, texts, strict=True):
            t0 = time.perf_counter()
            found = cache.find(text)
            times.append(time.perf_counter() - t0)
            assert found == i, (i, found)
        print(f"  find(text), {label}:    {stats(times)}")
        times = []
        for i in picks:
            t0 = time.perf_counter()
            found = cache.find(f"not cached {i}")
            times.append(time.perf_counter() - t0)
            assert found is None
        print(f"  find(miss), {label}:    {stats(times)}")


def layout_arg(text: str) -> tuple[int | None, int | None]:
    if text == "default":
        return None, None
    chunk, _, shard = text.partition(":")
    return int(chunk), int(shard or chunk)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=100_000_000)
    parser.add_argument("--dim", type=int, default=8, help="fp16 values per row (mixed cache)")
    parser.add_argument(
        "--layout",
        type=layout_arg,
        action="append",
        help="CHUNK_ROWS:SHARD_ROWS of a cache to write and measure, or 'default' (repeatable; default: default)",
    )
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary folder)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(machine())
    directory = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        print(f"{args.sentences:,} sentences in {directory}")
        lengths, arrays = make_sentences(args.sentences, args.seed, directory)
        print(f"  {int(lengths.sum()):,} rows of {args.dim} float16")
        for chunk_rows, shard_rows in args.layout or [(None, None)]:
            path = directory / "cache.zarr"
            write_cache(path, arrays, args.dim, chunk_rows, shard_rows)
            measure(path, lengths, args.lookups, args.seed)
            shutil.rmtree(path)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def measure(path: Path, lengths: np.ndarray, count: int, seed: int) -> None:
    describe_files(path)
    os.sync()
    drop_page_cache(path)
    gc.collect()
    rss0 = rss_mib()
    t0 = time.perf_counter()
    cache = elmo_cache.open(path)
    cold_open = time.perf_counter() - t0
    rss = rss_mib() - rss0
    cache.close()
    warm = []
    for _ in range(20):
        t0 = time.perf_counter()
        elmo_cache.open(path).close()
        warm.append(time.perf_counter() - t0)
    print(
        f"  open: cold {cold_open * 1000:.1f} ms, warm median {statistics.median(warm) * 1000:.2f} ms, "
        f"RSS growth {rss:.1f} MiB"
    )
    lookups(path, lengths, count, seed + 1, cold=True)
    lookups(path, lengths, count, seed + 2, cold=False)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
