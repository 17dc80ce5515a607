"""Data-parallel training throughput: tokens/s of ``elmo-cache train`` with 1 and N processes.

    python benchmarks/bench_train_distributed.py [--preset base] [--nproc 2] [--batch-size 64] [--steps 10]

Three runs over one synthetic corpus (see ``_corpus.py``), each warmed up for ``--warmup`` steps
then resumed for ``--steps`` more (the resumed run's rate excludes process start, tokenizing and
the launcher's rendezvous):

* one process, ``--nproc`` threads, batch ``batch_size x nproc``: the same global batch on the same
  cores (one of the baselines the scaling ratio divides by);
* one process, one thread, batch ``batch_size x nproc``: the same global batch on one core (the other);
* one process, one thread, batch ``batch_size``: what each rank computes, alone;
* ``--nproc`` processes of one thread, batch ``batch_size`` each (global ``batch_size x nproc``).

It also times gloo's all-reduce of a buffer the size of the model's gradient between ``--nproc``
processes (what DDP adds to every step). A token is one forward-direction prediction.
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
from elmo_cache.train.bilm import TrainableBiLM
from elmo_cache.train.presets import train_preset


def _run(corpus: Path, output: Path, options: TrainOptions, warmup: int, steps: int) -> float:
    """Tokens/s of ``steps`` steps resumed after ``warmup``."""
    train(corpus, output, replace(options, max_steps=warmup))
    return train(corpus, output, replace(options, max_steps=warmup + steps)).tokens_per_second


def _all_reduce_seconds(numel: int, repeats: int) -> float:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    buffer = torch.ones(numel)
    dist.all_reduce(buffer)  # connect
    started = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(buffer)
    seconds = (time.perf_counter() - started) / repeats
    dist.destroy_process_group()
    return seconds


def _probe_all_reduce(nproc: int, numel: int) -> float:
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id="bench-all-reduce",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
    )
    return max(elastic_launch(config, _all_reduce_seconds)(numel, 5).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64, help="rows per process")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=300_000, help="size of the synthetic corpus")
    parser.add_argument("--num-sampled", type=int, default=8192)
    args = parser.parse_args()
    print(describe_machine("cpu"))
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_corpus(make_corpus(args.tokens, seed=0), Path(tmp) / "corpus.txt")
        base = TrainOptions(preset=args.preset, num_sampled=args.num_sampled, min_count=2, device="cpu", progress=False)
        runs = {
            f"1 process x {args.nproc} threads, batch {args.batch_size * args.nproc}": replace(
                base, batch_size=args.batch_size * args.nproc, threads=args.nproc
            ),
            f"1 process x 1 thread, batch {args.batch_size * args.nproc}": replace(
                base, batch_size=args.batch_size * args.nproc, threads=1
            ),
            f"1 process x 1 thread, batch {args.batch_size} (one rank's work)": replace(
                base, batch_size=args.batch_size, threads=1
            ),
            f"{args.nproc} processes x 1 thread, batch {args.batch_size} each (global "
            f"{args.batch_size * args.nproc})": replace(base, batch_size=args.batch_size, threads=1, nproc=args.nproc),
        }
        rates = {}
        for k, (name, options) in enumerate(runs.items()):
            rate = _run(corpus, Path(tmp) / f"run{k}", options, args.warmup, args.steps)
            rates[name] = rate
            tokens_per_step = args.batch_size * (1 if "one rank" in name else args.nproc) * 20
            print(f"{name}: {rate:,.0f} tokens/s per direction, {tokens_per_step / rate * 1000:.0f} ms/step")
        threaded, single_core, alone, many = rates.values()
        vocab = len((Path(tmp) / "run0" / "vocab.txt").read_text().splitlines())
    with torch.device("meta"):
        numel = sum(p.numel() for p in TrainableBiLM(train_preset(args.preset), vocab).parameters())
    reduce_s = _probe_all_reduce(args.nproc, numel)
    print(
        f"scaling, same global batch: {args.nproc} processes / 1 process of 1 thread = {many / single_core:.2f}x, "
        f"/ 1 process of {args.nproc} threads = {many / threaded:.2f}x (ideal {args.nproc}x); "
        f"{args.nproc} processes / one rank's work alone = {many / alone:.2f}x"
    )
    print(
        f"gradient: {numel:,} floats ({numel * 4 / 2**20:.1f} MiB, vocabulary {vocab:,}); gloo all-reduce "
        f"among {args.nproc} processes: {reduce_s * 1000:.0f} ms"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
