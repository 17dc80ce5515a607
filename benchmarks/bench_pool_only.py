"""``build --pool mean --pool-only`` against the same build with the token vectors: bytes per sentence on disk,
and the disk a pool-only build holds while it runs against the cache it ends with.

    python benchmarks/bench_pool_only.py --heldout /work/data/corpus/heldout.txt     # bundled model, fp16 layers
    python benchmarks/bench_pool_only.py --lines 2000                                 # a generated corpus

For both containers it builds the corpus three times with the same model (``--fp16``, all three layers): without
``--pool``, with ``--pool mean`` (the pooled vectors beside the token vectors) and with ``--pool mean --pool-only``,
and prints each cache's size on disk in bytes per sentence (the figures in docs/FORMAT.md, "Pool-only caches"),
its build time, and the peak disk of the build: the bytes of every file in its folder (output, staging, lock),
sampled every few milliseconds while it runs, divided by the finished cache's size; both as the files' apparent
sizes (``st_size``) and as the blocks they hold (``st_blocks``: what fills a disk; it differs for sparse files).
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import threading
import time
from pathlib import Path

from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.options import disk_bytes

# Seconds between two samples of the build folder's size.
_SAMPLE_SECONDS = 0.002


def folder_bytes(folder: Path) -> tuple[int, int]:
    """Apparent bytes (``st_size``) and allocated bytes (``st_blocks``) of every regular file under ``folder``
    (files vanishing meanwhile count as gone)."""
    size = blocks = 0
    for directory, _, names in os.walk(folder):
        for name in names:
            try:
                st = os.stat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            size += st.st_size
            blocks += st.st_blocks * 512
    return size, blocks


def allocated_bytes(path: Path) -> int:
    """Bytes of disk the files at ``path`` (a file or a folder) hold."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return folder_bytes(path)[1]


class PeakDisk:
    """The largest :func:`folder_bytes` of ``folder`` seen while the ``with`` block runs (a sampling thread):
    ``peak`` apparent, ``peak_blocks`` allocated (each its own maximum)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.peak = 0
        self.peak_blocks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._update()
            time.sleep(_SAMPLE_SECONDS)

    def _update(self) -> None:
        size, blocks = folder_bytes(self.folder)
        self.peak, self.peak_blocks = max(self.peak, size), max(self.peak_blocks, blocks)

    def __enter__(self) -> PeakDisk:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._update()


def generated_corpus(path: Path, lines: int, seed: int = 0) -> Path:
    """``lines`` sentences of 1 to 40 words drawn from the bundled model's vocabulary (some empty, some repeated)."""
    from elmo_cache.model.hub import BUNDLED_DIR

    words = [w for w in (BUNDLED_DIR / "vocab.txt").read_text(encoding="utf-8").split() if w.isalpha()]
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        if i and rng.random() < 0.05:
            out.append(out[rng.randrange(i)])
        else:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(0, 40))))
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", type=Path, default=None, help="corpus, one sentence per line")
    parser.add_argument("--lines", type=int, default=2000, help="without --heldout: sentences generated")
    parser.add_argument("--model", default=None, help="model name or directory (default: the bundled model)")
    parser.add_argument("--only", action="store_true", help="build only the --pool-only caches")
    args = parser.parse_args()
    variants = (
        ("no pool", {}),
        ("--pool mean", {"pool": "mean"}),
        ("--pool-only", {"pool": "mean", "pool_only": True}),
    )
    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.heldout or generated_corpus(Path(tmp) / "corpus.txt", args.lines)
        for suffix in (".h5", ".zarr"):
            for name, extra in variants:
                if args.only and not extra.get("pool_only"):
                    continue
                folder = Path(tmp) / f"{name.strip('-').replace(' ', '_')}{suffix}.d"
                folder.mkdir()
                output = folder / f"cache{suffix}"
                began = time.monotonic()
                options = BuildOptions(output=output, model=args.model, fp16=True, progress=False, **extra)
                with PeakDisk(folder) as peak:
                    summary = build(corpus, options)
                size = disk_bytes(summary.path)
                allocated = allocated_bytes(summary.path)
                print(
                    f"{suffix:6} {name:12} {summary.n_sentences:,} sentences, {summary.n_tokens:,} tokens, "
                    f"{summary.n_rows:,} rows: {size:,} bytes, {size / summary.n_sentences:,.1f} per sentence "
                    f"({time.monotonic() - began:.1f} s); peak disk while building {peak.peak:,} bytes, "
                    f"{peak.peak / size:.3f}x the cache (allocated: peak {peak.peak_blocks:,} bytes, "
                    f"{peak.peak_blocks / allocated:.3f}x the cache's {allocated:,})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
