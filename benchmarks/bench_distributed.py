"""Scaling of the distributed build (``--engine ray``) from 1 to N workers, against the local build.

    python benchmarks/bench_distributed.py --size small --tokens 40000 --workers 1,2

Starts a local Ray cluster with every CPU of this machine (``--address`` joins a running one),
writes the deterministic benchmark corpus (``_corpus.make_corpus``) and a random-weight model of
the given size, then builds the same cache with the local engine (1 torch thread, then all the
CPUs) and with the ray engine at each worker count (``--cpus-per-worker`` CPUs and torch threads
per actor, 1 by default: going from 1 to 2 workers doubles the compute, the scaling a cluster gets
from more GPUs). It prints the machine, each run's wall time and tokens/s end to end (first pass,
actor start-up, encoding, stitching and finishing included), and checks that every cache equals
the local one byte for byte. Each ray run starts fresh (``overwrite``); the model loads once per actor.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _compare import cache_difference
from _corpus import make_corpus, write_corpus
from _machine import describe_machine


def load() -> str:
    return f"load average {os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="small", help="random model preset (default: small)")
    parser.add_argument("--tokens", type=int, default=40_000, help="corpus size in tokens")
    parser.add_argument("--workers", default="1,2", help="worker counts to time, comma-separated")
    parser.add_argument("--parts-per-worker", type=int, default=4)
    parser.add_argument(
        "--cpus-per-worker",
        type=int,
        default=1,
        help="CPUs (torch threads) per actor; 0: the cluster's CPUs split among the workers",
    )
    parser.add_argument(
        "--batch-tokens", type=int, default=2048, help="small batches and windows, so a small corpus has many parts"
    )
    parser.add_argument("--window-batches", type=int, default=2)
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start a local one)")
    parser.add_argument("--fp16", action="store_true", help="store float16")
    args = parser.parse_args()

    import ray
    import torch

    from elmo_cache.builder import BuildOptions, build
    from elmo_cache.builder.ray.engine import build_distributed
    from elmo_cache.model.random_model import write_random_model

    cpus = len(os.sched_getaffinity(0))
    print("\n".join(describe_machine("cpu").lines()))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sentences = make_corpus(args.tokens)
        corpus = write_corpus(sentences, work / "corpus.txt")
        tokens = sum(map(len, sentences))
        options_file, weight_file = write_random_model(work / "model", args.size, seed=0)
        print(f"corpus {len(sentences):,} sentences, {tokens:,} tokens; model {args.size} (random weights), fp32 CPU")

        def options(name: str) -> BuildOptions:
            return BuildOptions(
                output=work / name,
                options_file=options_file,
                weight_file=weight_file,
                device="cpu",
                fp16=args.fp16,
                batch_tokens=args.batch_tokens,
                window_batches=args.window_batches,
                overwrite=True,
                progress=False,
            )

        local = 0.0
        for threads in sorted({1, cpus}):
            torch.set_num_threads(threads)
            start = time.perf_counter()
            build(corpus, options("local.zarr"))
            wall = time.perf_counter() - start
            local = local or wall  # the one-thread build is the baseline
            print(f"local engine, {threads} torch thread(s): {wall:.1f} s, {tokens / wall:,.0f} tokens/s; {load()}")

        ray.init(address=args.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        try:
            total_cpus = int(ray.cluster_resources().get("CPU", cpus))
            first = 0.0
            for n in (int(w) for w in args.workers.split(",")):
                name = f"ray{n}.zarr"
                cpus_each = args.cpus_per_worker or total_cpus // n
                start = time.perf_counter()
                summary = build_distributed(
                    corpus, options(name), workers=n, parts=n * args.parts_per_worker, cpus_per_worker=cpus_each
                )
                wall = time.perf_counter() - start
                first = first or wall
                equal = cache_difference(work / name, work / "local.zarr") is None
                log = json.loads((work / name / "zarr.json").read_text())["attributes"]["elmo_cache"]["build"]
                print(
                    f"ray engine, {n} worker(s) x {cpus_each} CPU: {wall:.1f} s, {tokens / wall:,.0f} tokens/s, "
                    f"{first / wall:.2f}x the first ray run, {local / wall:.2f}x the 1-thread local engine; "
                    f"first pass {log['first_pass_seconds']:.1f} s, actors (start, load, encode, write) "
                    f"{log['parts_seconds']:.1f} s = {log['parts_tokens_per_s']:,.0f} tokens/s; "
                    f"{summary.parts} parts; byte-equal to local: {equal}; {load()}"
                )
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
