"""What the machine lets a build's writer do: filling memory, writing files, syncing them.

    python benchmarks/bench_disk.py --gib 4 --threads 1,2,4 [--dir DIR]

A GPU build of two float16 layers writes ~4 KB per token: 2 GB/s at 500k tokens/s. Before blaming (or tuning)
the writer, this prints the ceilings it works under, on the folder a cache would go to:

* filling memory: numpy writes into a fresh ``numpy.empty`` array (every 4 KiB page faulted in and zeroed by
  the kernel first) against the same array filled again (pages already there): what a window buffer that is
  used again saves (``elmo_cache.builder.alloc.WindowBuffers``);
* writing: ``--gib`` GiB in 64 MiB ``write`` calls into the page cache, from 1..N threads each into its own file
  (one file's buffered writes are serialised by the kernel), then the ``fsync`` of them all (what reaches the
  device).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import machine

PIECE = 64 << 20


def fill_rates(gib: float) -> tuple[float, float]:
    """GB/s of filling fresh memory and of filling the same memory again."""
    n = int(gib * (1 << 30))
    source = np.ones(PIECE, dtype=np.uint8)
    start = time.perf_counter()
    fresh = np.empty(n, dtype=np.uint8)
    for at in range(0, n, PIECE):
        fresh[at : at + PIECE] = source[: min(PIECE, n - at)]
    first = n / (time.perf_counter() - start) / 1e9
    start = time.perf_counter()
    for at in range(0, n, PIECE):
        fresh[at : at + PIECE] = source[: min(PIECE, n - at)]
    again = n / (time.perf_counter() - start) / 1e9
    return first, again


def write_rates(folder: Path, gib: float, threads: int) -> tuple[float, float]:
    """GB/s into the page cache from ``threads`` threads (own files), and with the final fsyncs counted."""
    n = int(gib * (1 << 30)) // threads
    data = np.random.default_rng(0).integers(0, 255, size=PIECE, dtype=np.uint8).data
    paths = [folder / f"write-{threads}-{i}.bin" for i in range(threads)]
    handles = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for p in paths]

    def fill(fd: int) -> None:
        done = 0
        while done < n:
            done += os.write(fd, data[: min(PIECE, n - done)])

    start = time.perf_counter()
    workers = [threading.Thread(target=fill, args=(fd,)) for fd in handles]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    written = time.perf_counter() - start
    for fd in handles:
        os.fsync(fd)
        os.close(fd)
    synced = time.perf_counter() - start
    for path in paths:
        path.unlink()
    total = n * threads
    return total / written / 1e9, total / synced / 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=4.0, help="GiB written per setting (default 4)")
    parser.add_argument("--threads", default="1,2,4", help="thread counts to try (default 1,2,4)")
    parser.add_argument("--dir", default=None, help="folder to write in (default: the temporary folder)")
    args = parser.parse_args()
    print(machine())
    first, again = fill_rates(min(args.gib, 2.0))
    print(f"filling memory: fresh {first:.2f} GB/s, used again {again:.2f} GB/s")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        print(f"writing {args.gib:g} GiB into {tmp}")
        for threads in (int(t) for t in args.threads.split(",")):
            cached, synced = write_rates(Path(tmp), args.gib, threads)
            print(f"  {threads} thread(s): page cache {cached:.2f} GB/s, with fsync {synced:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
