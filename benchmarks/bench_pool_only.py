"""``build --pool mean --pool-only`` against the same build with the token vectors: bytes per sentence on disk.

    python benchmarks/bench_pool_only.py --heldout /work/data/corpus/heldout.txt     # bundled model, fp16 layers

For both containers it builds the corpus three times with the same model (``--fp16``, all three layers): without
``--pool``, with ``--pool mean`` (the pooled vectors beside the token vectors) and with ``--pool mean --pool-only``,
and prints each cache's size on disk in bytes per sentence (the figures in docs/FORMAT.md, "Pool-only caches").
Build times are printed too, but a pool-only build runs the full build first: its time is the ``--pool`` build's
plus the copy.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.options import disk_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", type=Path, required=True, help="corpus, one sentence per line")
    parser.add_argument("--model", default=None, help="model name or directory (default: the bundled model)")
    args = parser.parse_args()
    variants = (
        ("no pool", {}),
        ("--pool mean", {"pool": "mean"}),
        ("--pool-only", {"pool": "mean", "pool_only": True}),
    )
    with tempfile.TemporaryDirectory() as tmp:
        for suffix in (".h5", ".zarr"):
            for name, extra in variants:
                output = Path(tmp) / f"{name.strip('-').replace(' ', '_')}{suffix}"
                began = time.monotonic()
                options = BuildOptions(output=output, model=args.model, fp16=True, progress=False, **extra)
                summary = build(args.heldout, options)
                size = disk_bytes(summary.path)
                print(
                    f"{suffix:6} {name:12} {summary.n_sentences:,} sentences, {summary.n_tokens:,} tokens, "
                    f"{summary.n_rows:,} rows: {size:,} bytes, {size / summary.n_sentences:,.1f} per sentence "
                    f"({time.monotonic() - began:.1f} s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
