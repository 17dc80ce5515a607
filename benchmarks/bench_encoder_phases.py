"""Where the encoder's time goes: the encoder alone (outputs left on the device) against the same batches
carried to host arrays, per batch size, with the process's CPU share, the compilations the timed passes
triggered, and optionally a profile of one setting.

    python benchmarks/bench_encoder_phases.py --device cuda --precision bf16,fp32 --batch-tokens 8192,32768,131072
    python benchmarks/bench_encoder_phases.py --size small --tokens 20000 --batch-tokens 4096,8192   # CPU, quick

A CPU share near 1.0 on CUDA means the host is the limit (Python, launches, copies), not the device. Each
setting runs once untimed on the same sentences first, so the compiled LSTM cell has met every shape.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _corpus import corpus_stats, make_corpus, take_tokens
from _encoder_timing import cached_model, flops_per_token
from _machine import describe_machine, synchronize

from elmo_cache import Encoder
from elmo_cache.model.options import ModelOptions


def _compilations() -> int:
    try:
        from torch._dynamo.utils import counters

        return int(sum(counters["frames"].values()))
    except Exception:  # a torch without dynamo's counters: the column reads -1
        return -1


def _timed(device: torch.device, run) -> tuple[float, float]:
    """Wall seconds and the process's CPU seconds over them (one thread's worth = 1.0 per second)."""
    synchronize(device)
    cpu, wall = time.process_time(), time.perf_counter()
    run()
    synchronize(device)
    seconds = time.perf_counter() - wall
    return seconds, (time.process_time() - cpu) / seconds


def on_device(enc: Encoder, sentences: list[list[str]], batch_tokens: int) -> None:
    for batch in enc._plan_batches(sentences, batch_tokens):
        enc.encode_flat([sentences[i] for i in batch])


def to_host(enc: Encoder, sentences: list[list[str]], batch_tokens: int) -> None:
    n = 0
    for array in enc.embed_sentences(sentences, batch_tokens=batch_tokens):
        n += array.shape[1]
    assert n == sum(map(len, sentences)), (n, sum(map(len, sentences)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="original", choices=["original", "medium", "small"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="bf16,fp32")
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--batch-tokens", default="8192,32768,131072")
    parser.add_argument("--fuse", default="default", choices=["default", "on", "off", "both"])
    parser.add_argument("--profile", type=int, default=0, help="profile the setting with this batch size")
    parser.add_argument("--json", default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = torch.device(args.device)
    machine = describe_machine(device)
    print("\n".join(machine.lines()))
    options_path, weights_path = cached_model(args.size, args.seed)
    options = ModelOptions.from_file(options_path)
    flops = flops_per_token(options)["total"]
    sentences = take_tokens(make_corpus(args.tokens * 2, seed=args.seed), args.tokens)
    n_tokens = sum(map(len, sentences))
    print(f"== {args.size} model, {flops / 1e6:.1f} MFLOP per token; {corpus_stats(sentences).line()}")
    fuses = {"default": [None], "on": [True], "off": [False], "both": [True, False]}[args.fuse]
    rows = []
    for precision in args.precision.split(","):
        for fuse in fuses:
            enc = Encoder.load((options_path, weights_path), device=device, precision=precision, fuse_cell=fuse)
            label = f"{precision} fused={enc.bilm.fused}"
            for batch_tokens in map(int, args.batch_tokens.split(",")):
                for name, run in (("device", on_device), ("host", to_host)):
                    run(enc, sentences, batch_tokens)  # untimed: compiles, allocator warm
                    before = _compilations()
                    seconds, cpu = _timed(device, lambda run=run, e=enc, bt=batch_tokens: run(e, sentences, bt))
                    row = {
                        "precision": precision,
                        "fused": enc.bilm.fused,
                        "batch_tokens": batch_tokens,
                        "output": name,
                        "tokens_per_s": n_tokens / seconds,
                        "tflops": n_tokens * flops / seconds / 1e12,
                        "cpu_share": cpu,
                        "compilations": _compilations() - before,
                    }
                    rows.append(row)
                    print(
                        f"{label:22s} batch {batch_tokens:7d} {name:6s} {row['tokens_per_s']:10,.0f} tok/s "
                        f"{row['tflops']:7.1f} TFLOP/s  cpu share {cpu:4.2f}  compilations {row['compilations']}",
                        flush=True,
                    )
                if batch_tokens == args.profile:
                    from torch.profiler import ProfilerActivity, profile

                    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                    with profile(activities=activities) as prof:
                        on_device(enc, sentences, batch_tokens)
                        synchronize(device)
                    table = prof.key_averages()
                    print(table.table(sort_by="self_cpu_time_total", row_limit=18))
                    if device.type == "cuda":
                        print(table.table(sort_by="self_cuda_time_total", row_limit=12))
            del enc
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine.__dict__, "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    main()
