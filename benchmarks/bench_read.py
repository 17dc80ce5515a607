"""Read speed of elmo_cache.open beside a raw numpy.memmap of the same bytes.

For each layout (layered fp16, mixed fp16) and container (HDF5, zarr uncompressed, zarr
zstd) it writes a synthetic cache with the build's own writer (``elmo_cache.store``; random
vectors, since the reader does not care where they came from), then measures

* random-sentence read latency, warm page cache and cold (``posix_fadvise(DONTNEED)`` on
  every file of the cache and a fresh reader before each read), each read materialised (its bytes in
  the process: a view of a mapping copied out, which touches every byte; elmo_cache's reads are
  already copies, one ``pread`` each) and, warm, also as returned ("view");
* sequential read throughput over every sentence, warm;

and the same reads through a raw ``numpy.memmap`` of the HDF5 file's bytes (offsets,
lengths and vectors mapped at their dataset offsets). It also opens a sparse
100M-sentence cache of each container to time ``open`` and its memory.

    python benchmarks/bench_read.py                       # ~2 GB of temporary files
    python benchmarks/bench_read.py --sentences 2000 --dim 256   # quick
"""

from __future__ import annotations

import argparse
import gc
import json
import mmap
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import zarr

import elmo_cache
from elmo_cache.builder import DEFAULT_CHUNK_ROWS, default_shard_rows
from elmo_cache.store.format import FORMAT_VERSION
from elmo_cache.text.tokenize import sentence_hash


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            mem = next(int(line.split()[1]) for line in f if line.startswith("MemTotal")) / 2**20
    except OSError:
        mem = float("nan")
    return (
        f"{cpu}, {os.cpu_count()} cores, {mem:.1f} GiB RAM, {platform.system()} {platform.release()}\n"
        f"python {platform.python_version()}, numpy {np.__version__}, zarr {zarr.__version__}, "
        f"h5py {h5py.__version__}, "
        f"elmo_cache {elmo_cache.__version__}"
    )


# -- synthetic caches, written by the real store writer -----------------------------------------


def synthetic_lines(n_sentences: int, mean_tokens: int, seed: int):
    """Per-line lengths and sentence hashes of a made-up corpus."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.poisson(mean_tokens, n_sentences), 1, None).astype(np.int32)
    hashes = np.array([sentence_hash(synthetic_tokens(i, n)) for i, n in enumerate(lengths.tolist())], np.uint64)
    return lengths, hashes


def synthetic_tokens(i: int, length: int) -> list[str]:
    """The tokens of line ``i`` of the made-up corpus ("sentence", its number, then filler)."""
    return (["sentence", str(i)] + ["w"] * length)[:length]


def metadata(kind: str, dim: int, fmt: str, compression, chunk_rows) -> dict:
    return {
        "format": "elmo-cache",
        "format_version": FORMAT_VERSION,
        "complete": False,
        "kind": kind,
        "layers": [0, 1, 2] if kind == "layers" else None,
        "mix": None if kind == "layers" else {"weights": [1 / 3] * 3, "gamma": 1.0, "raw": None, "softmax": False},
        "dim": dim,
        "dtype": "float16",
        "dedupe": False,
        "compression": compression,
        "chunk_rows": chunk_rows if fmt == "zarr" else None,
        "shard_rows": None,
        "model": {"name": "synthetic"},
        "tokenization": "whitespace",
        "sentence_hash": "blake2b-64-le",
        "elmo_cache_version": elmo_cache.__version__,
        "build": {"synthetic": True},
    }


def write_cache(path: Path, fmt: str, kind: str, dim: int, lengths, hashes, *, chunk_rows, compression) -> Path:
    """Random fp16 vectors for the synthetic corpus, through elmo_cache.store (the build's writer)."""
    from elmo_cache.store import Layout, Progress, writer_class

    row_shape = (3, dim) if kind == "layers" else (dim,)
    meta = metadata(kind, dim, fmt, compression, chunk_rows)
    row_bytes = int(np.prod(row_shape)) * 2
    shard_rows = default_shard_rows(chunk_rows, row_bytes) if fmt == "zarr" else None
    layout = Layout(fmt, row_shape, "float16", chunk_rows if fmt == "zarr" else None, compression, shard_rows)
    meta["shard_rows"] = shard_rows
    writer = writer_class(fmt).create(path, layout, Progress(identity={"synthetic": True}), meta)
    rng = np.random.default_rng(1)
    offsets = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    step = 500
    for start in range(0, len(lengths), step):
        stop = min(start + step, len(lengths))
        n_rows = int(lengths[start:stop].sum())
        vectors = rng.standard_normal((n_rows, *row_shape), dtype=np.float32).astype(np.float16)
        tokens = [synthetic_tokens(i, int(lengths[i])) for i in range(start, stop)]
        writer.append(vectors, offsets[start:stop], lengths[start:stop], hashes[start:stop], tokens)
        writer.commit()
    writer.commit(done=True)
    unique, _ = writer.index()
    n_tokens = int(lengths.sum())
    meta.update(complete=True, n_sentences=len(lengths), n_tokens=n_tokens, n_rows=n_tokens, n_unique=len(unique))
    return writer.finalize(meta)


def cache_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else [Path(d) / f for d, _, fs in os.walk(path) for f in fs]


def drop_page_cache(path: Path) -> None:
    for file in cache_files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- readers ------------------------------------------------------------------------------------


class RawMemmap:
    """The baseline: the HDF5 file's bytes as numpy.memmaps, indexed by hand, as fast as numpy
    allows (plain ndarray views of the maps and ``.item``, since np.memmap's own ``__getitem__``
    runs Python code and would flatter the reader)."""

    def __init__(self, path: Path):
        with h5py.File(path, "r") as f:
            spec = {n: (f[n].dtype, f[n].shape, f[n].id.get_offset()) for n in ("vectors", "offsets", "lengths")}
        self.vectors, self.offsets, self.lengths = (
            np.memmap(path, dtype=d, mode="r", offset=o, shape=s).view(np.ndarray) for d, s, o in spec.values()
        )
        self.layered = self.vectors.ndim == 3

    def __getitem__(self, i: int) -> np.ndarray:
        start = self.offsets.item(i)
        block = self.vectors[start : start + self.lengths.item(i)]
        return block.transpose(1, 0, 2) if self.layered else block


def in_memory(x: np.ndarray) -> np.ndarray:
    """``x`` with its bytes in process memory: a view of a file mapping is copied out (every byte touched);
    an array that owns its memory already (elmo_cache's reads since issue 33: one pread each) is not copied
    again, so both readers are timed up to the same point, the vectors in the process."""
    base = x
    while base is not None:
        if isinstance(base, mmap.mmap):
            return np.array(x)
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return x


def time_reads(reader, order, *, materialise: bool) -> list[float]:
    times = []
    clock = time.perf_counter_ns
    for i in order:
        t0 = clock()
        x = reader[i]
        if materialise:
            in_memory(x)
        times.append((clock() - t0) / 1000)
    return times


def time_cold(factory, source: Path, order) -> list[float]:
    """Each read from a fresh reader after evicting every page of the cache: offsets, lengths and
    vectors all come from the disk (reopening is not timed)."""
    times = []
    for i in order:
        gc.collect()  # no mapping of an earlier reader may keep pages resident
        drop_page_cache(source)
        reader = factory()
        t0 = time.perf_counter_ns()
        in_memory(reader[i])
        times.append((time.perf_counter_ns() - t0) / 1000)
        del reader
    return times


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def summary(times: list[float]) -> str:
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return f"p50 {statistics.median(times):8.1f} us  mean {statistics.fmean(times):8.1f} us  p99 {p99:8.1f} us"


def sequential(reader, n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    nbytes = 0
    for i in range(n):
        nbytes += in_memory(reader[i]).nbytes
    seconds = time.perf_counter() - t0
    return n / seconds, nbytes / seconds / 2**20


def bench_one(label: str, path: Path, raw_path: Path, n: int, reads: int, cold_reads: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    order = rng.integers(0, n, reads).tolist()
    cold_order = rng.integers(0, n, cold_reads).tolist()
    results = {}
    for name, factory in (
        ("elmo_cache.open", lambda: elmo_cache.open(path)),
        ("raw numpy.memmap", lambda: RawMemmap(raw_path)),
    ):
        source = path if name == "elmo_cache.open" else raw_path
        reader = factory()
        sequential(reader, n)  # warm the page cache
        warm = time_reads(reader, order, materialise=True)
        view = time_reads(reader, order, materialise=False)
        seq = sequential(reader, n)
        del reader
        gc.collect()
        cold = time_cold(factory, source, cold_order)
        results[name] = (warm, view, cold, seq)
        print(f"  {label:28s} {name:17s} warm  {summary(warm)}")
        print(f"  {'':28s} {'':17s} view  {summary(view)}")
        print(f"  {'':28s} {'':17s} cold  {summary(cold)}")
        print(f"  {'':28s} {'':17s} seq   {seq[0]:10.0f} sentences/s  {seq[1]:8.0f} MiB/s")
    ratio = statistics.median(results["elmo_cache.open"][0]) / statistics.median(results["raw numpy.memmap"][0])
    print(f"  {label:28s} warm random read p50 ratio vs raw memmap: {ratio:.2f}x")
    return {"ratio": ratio}


def bench_open_huge(directory: Path, n: int) -> None:
    """Open a sparse n-sentence cache of each container: time and memory do not grow with n."""
    arrays = {"offsets": np.int64, "lengths": np.int32, "index/hashes": np.uint64, "index/rows": np.int64}
    # Zero-filled like the others: tokens/offsets then says every sentence holds no text (an empty tokens/bytes).
    sizes = dict.fromkeys(arrays, n) | {"tokens/offsets": n + 1}
    arrays["tokens/offsets"] = np.int64
    meta = metadata("layers", 1024, "hdf5", None, None)
    meta.update(complete=True, n_sentences=n, n_tokens=0, n_rows=0, n_unique=n)
    h5 = directory / "huge.h5"
    with h5py.File(h5, "w") as f:
        for name, dtype in arrays.items():
            # allocated but never written: a sparse file of n entries (zeros), created instantly
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            if "/" in name:
                f.require_group(name.split("/")[0])
            space = h5py.h5s.create_simple((sizes[name],))
            h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(np.dtype(dtype)), space, dcpl=dcpl)
        f.create_dataset("vectors", shape=(0, 3, 1024), dtype=np.float16)
        f.create_dataset("tokens/bytes", shape=(0,), dtype=np.uint8)
        f.attrs["elmo_cache"] = json.dumps(meta)
    zpath = directory / "huge.zarr"
    group = zarr.open_group(str(zpath), mode="w")
    for name, dtype in arrays.items():  # no chunk written: every chunk reads as the fill value
        group.create_array(name, shape=(sizes[name],), dtype=dtype, chunks=(1 << 16,), compressors=None)
    group.create_array("tokens/bytes", shape=(0,), dtype=np.uint8, chunks=(1 << 22,), compressors=None)
    group.create_array("vectors", shape=(0, 3, 1024), dtype=np.float16, chunks=(4096, 3, 1024), compressors=None)
    zmeta = dict(meta, chunk_rows=4096)
    group.attrs["elmo_cache"] = zmeta
    for path in (h5, zpath):
        gc.collect()
        rss0 = rss_mib()
        t0 = time.perf_counter()
        cache = elmo_cache.open(path)
        opened = time.perf_counter() - t0
        t1 = time.perf_counter()
        found = cache.find("sentence 12345")
        cache[n - 1]
        lookup = time.perf_counter() - t1
        rss = rss_mib() - rss0
        print(
            f"  {path.name:10s} {len(cache):,} sentences: open {opened * 1000:.1f} ms, find + cache[-1] "
            f"{lookup * 1000:.2f} ms (found={found}), RSS growth {rss:.1f} MiB"
        )
        cache.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=6000)
    parser.add_argument("--mean-tokens", type=int, default=25)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument(
        "--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS, help="zarr rows per vectors chunk (default: build's)"
    )
    parser.add_argument("--reads", type=int, default=3000, help="warm random reads per reader")
    parser.add_argument("--cold-reads", type=int, default=100, help="cold reads (each evicts the whole cache first)")
    parser.add_argument("--huge", type=int, default=100_000_000, help="sentences of the sparse cache opened (0: skip)")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the caches (default: a temp dir)")
    args = parser.parse_args()

    print(machine())
    directory = Path(tempfile.mkdtemp(prefix="bench_read_", dir=args.dir))
    try:
        lengths, hashes = synthetic_lines(args.sentences, args.mean_tokens, seed=0)
        n_rows = int(lengths.sum())
        print(
            f"{args.sentences} sentences, {n_rows} tokens, dim {args.dim}, zarr chunk {args.chunk_rows} rows; "
            f"{args.reads} warm / {args.cold_reads} cold random reads (materialised = bytes in the process)"
        )
        for kind, row_shape in (("layers", (3, args.dim)), ("mix", (args.dim,))):
            size = n_rows * int(np.prod(row_shape)) * 2 / 2**20
            print(f"\n{kind} fp16, vectors {size:.0f} MiB")
            h5 = write_cache(
                directory / f"{kind}.h5", "hdf5", kind, args.dim, lengths, hashes, chunk_rows=None, compression=None
            )
            bench_one(f"{kind} fp16 hdf5", h5, h5, args.sentences, args.reads, args.cold_reads, seed=1)
            for compression in (None, "zstd"):
                zpath = write_cache(
                    directory / f"{kind}-{compression}.zarr",
                    "zarr",
                    kind,
                    args.dim,
                    lengths,
                    hashes,
                    chunk_rows=args.chunk_rows,
                    compression=compression,
                )
                stored = sum(f.stat().st_size for f in cache_files(zpath / "vectors")) / 2**20
                label = f"{kind} fp16 zarr {compression or 'raw'}"
                print(f"  {label}: vectors on disk {stored:.0f} MiB ({stored / size:.3f} of raw)")
                bench_one(label, zpath, h5, args.sentences, args.reads, args.cold_reads, seed=1)
                shutil.rmtree(zpath)
            h5.unlink()
        if args.huge:
            print(
                f"\nopening a sparse {args.huge:,}-sentence cache "
                f"(offsets, lengths, index: {args.huge * 28 / 2**30:.1f} GiB)"
            )
            bench_open_huge(directory, args.huge)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
