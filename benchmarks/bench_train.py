"""Training throughput of ``elmo-cache train``: tokens per second (per direction) on a synthetic corpus.

    python benchmarks/bench_train.py [--preset base] [--steps 20] [--threads 2] [--device cpu]

Writes a synthetic corpus (realistic word shapes and Zipf frequencies, see ``_corpus.py``),
trains ``--warmup`` steps (allocator and caches settle), then resumes for ``--steps`` more
from that checkpoint and reports the resumed run's rate, so start-up is not counted. A
token is one forward-direction prediction; the backward direction does as many again.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _corpus import make_corpus, write_corpus
from _machine import describe_machine

from elmo_cache.train import TrainOptions, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=400_000, help="size of the synthetic corpus")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--num-sampled", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(describe_machine(args.device))
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(make_corpus(args.tokens, seed=0), Path(tmp) / "corpus.txt")
        options = TrainOptions(
            preset=args.preset,
            batch_size=args.batch_size,
            num_sampled=args.num_sampled,
            min_count=2,
            device=args.device,
            threads=args.threads,
            progress=False,
        )
        train(corpus, Path(tmp) / "model", replace(options, max_steps=args.warmup))
        started = time.process_time(), time.monotonic()
        result = train(corpus, Path(tmp) / "model", replace(options, max_steps=args.warmup + args.steps))
        cpu_share = (time.process_time() - started[0]) / (time.monotonic() - started[1]) / torch.get_num_threads()
    print(
        f"preset {args.preset}, batch {args.batch_size} x unroll 20, {args.num_sampled} negatives, "
        f"{args.steps} steps: {result.tokens_per_second:,.0f} tokens/s per direction on {args.device} "
        f"(cpu share {cpu_share:.2f}, load average after {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()
