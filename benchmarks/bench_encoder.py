"""Encoder throughput against the machine's measured matmul peak and a reference ELMo.

    python benchmarks/bench_encoder.py                      # Original size, fp32 + bf16, CPU
    python benchmarks/bench_encoder.py --size small --tokens 20000
    python benchmarks/bench_encoder.py --device cuda --precision fp32,bf16,fp16 --json out.json

For each precision it prints real tokens per second (no <S>/</S>, no padding), the model's
FLOPs per token (matmul and convolution multiply-adds x 2, from the options), the achieved
GFLOP/s, the best matmul GFLOP/s of the same dtype measured in the same run, and their ratio
(utilisation); the reference path's tokens/s on a slice of the corpus and the speed-up; the
error of every precision against fp32 and of the encoder against the reference; the machine.

The model is random, in the original weight-file layout (``elmo_cache.model.random_model``), and
cached under ``~/.cache/elmo-cache-bench/`` (or ``$ELMO_CACHE_BENCH_DIR``): speed does not
depend on the values of the weights, only on their shapes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _corpus import corpus_stats, make_corpus, take_tokens
from _machine import DTYPES, MatmulPeak, describe_machine, measure_matmul_peak
from _reference import ReferenceElmo

from elmo_cache.model.options import ModelOptions

SIZES = ("original", "medium", "small")
# Timed corpus per size on a CPU: a few minutes for the whole run at the expected speeds.
_DEFAULT_TOKENS_CPU = {"original": 16_000, "medium": 30_000, "small": 40_000}
_DEFAULT_TOKENS_CUDA = 2_000_000
_WARMUP_TOKENS = 2_000

from _encoder_timing import (  # noqa: E402
    _load_average,
    _profile,
    _reference_slice,
    best_of,
    cached_model,
    compare,
    flops_per_token,
    time_encoder,
    time_reference,
)

# -- the run ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    from elmo_cache import Encoder

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch sees no CUDA device")
    if args.threads:
        torch.set_num_threads(args.threads)
    precisions = args.precision
    machine = describe_machine(device)
    print("== machine")
    for line in machine.lines():
        print("  " + line)
    load_before = _load_average()
    print(f"  load average {load_before} before the run (other jobs on these cores slow every figure)")

    options_path, weights_path = cached_model(args.size, args.seed)
    options = ModelOptions.from_file(options_path)
    flops = flops_per_token(options)
    print(
        f"== model: random {args.size} ({options.n_layers}x{options.lstm_dim}_{options.projection_dim}, "
        f"{options.n_filters} cnn filters, {options.n_highway} highway)"
    )
    parts = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in flops.items() if k != "total")
    print(f"  {flops['total'] / 1e6:.1f} MFLOP per token ({parts})")

    n_tokens = args.tokens or (_DEFAULT_TOKENS_CUDA if device.type == "cuda" else _DEFAULT_TOKENS_CPU[args.size])
    # Warm-up and every timed pass get text of their own: the encoder may cache per word
    # type, and re-running the same sentences would turn every word into a cache hit. Like a
    # long streaming build, later passes profit from the words earlier text brought in.
    corpus = make_corpus(args.warmup_tokens + args.repeats * n_tokens, seed=args.seed)
    warmup = take_tokens(corpus, args.warmup_tokens)
    rest = corpus[len(warmup) :]
    passes = []
    for _ in range(args.repeats):
        passes.append(take_tokens(rest, n_tokens))
        rest = rest[len(passes[-1]) :]
    passes = [p for p in passes if p]
    stats = corpus_stats(passes[0])
    print(f"== corpus (seed {args.seed}), each of {len(passes)} timed passes about: {stats.line()}")
    ref_sentences = _reference_slice(passes[0], args.reference_tokens, 64)
    ref_stats = corpus_stats(ref_sentences)

    shapes = [
        *([] if args.quick_peak else [(4096, 4096, 4096)]),
        (256, options.projection_dim, 4 * options.lstm_dim),
        (256, options.lstm_dim, options.projection_dim),
    ]
    results: dict = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "machine": machine.__dict__ | {"cpu_flags": list(machine.cpu_flags)},
        "model": {"size": args.size, "seed": args.seed, "options": options.as_json_dict(), "flops_per_token": flops},
        "corpus": stats.__dict__,
        "reference_corpus": ref_stats.__dict__,
        "batch_tokens": args.batch_tokens,
        "repeats": args.repeats,
        "word_cache_size": args.word_cache_size,
        "precisions": {},
    }
    outputs_on_slice: dict[str, list[np.ndarray]] = {}
    ref_outputs: dict[str, list[np.ndarray]] = {}
    enc_kwargs = {} if args.word_cache_size is None else {"word_cache_size": args.word_cache_size}
    wanted = list(dict.fromkeys(["fp32", *precisions]))  # fp32 always: errors are against it
    for precision in wanted:
        timed_run = precision in precisions
        load_start = time.perf_counter()
        enc = Encoder.load((options_path, weights_path), device=device, precision=precision, **enc_kwargs)
        load_seconds = time.perf_counter() - load_start
        entry: dict = {"load_seconds": load_seconds}
        print(f"== {precision} on {device}" + ("" if timed_run else " (only for the error reference)"))
        print(f"  encoder loaded in {load_seconds:.1f} s")
        time_encoder(enc, warmup, args.batch_tokens, device)
        if timed_run:
            # Peak measured right before and right after the timed pass; the best of the two
            # counts, so a burst of load from other jobs cannot flatter the utilisation.
            before = measure_matmul_peak(precision, device, shapes)
            timings = [(lambda text=text: time_encoder(enc, text, args.batch_tokens, device)) for text in passes]  # noqa: B023, F821 - run at once
            watch, n, _ = best_of(timings)
            after = measure_matmul_peak(precision, device, shapes)
            peak = MatmulPeak(
                precision, str(device), {s: max(before.by_shape[s], after.by_shape[s]) for s in before.by_shape}
            )
            tps = n / watch.seconds
            achieved = tps * flops["total"] / 1e9
            by_shape = ", ".join(f"{s} {g:.0f}" for s, g in peak.by_shape.items())
            entry |= {
                "tokens": n,
                "seconds": watch.seconds,
                "cpu_share": watch.cpu_share,
                "tokens_per_s": tps,
                "achieved_gflops": achieved,
                "matmul_peak": peak.to_dict(),
                "matmul_peak_before": before.peak_gflops,
                "matmul_peak_after": after.peak_gflops,
                "utilisation": achieved / peak.peak_gflops,
                "utilisation_lstm_only": tps * flops["lstm"] / 1e9 / peak.peak_gflops,
            }
            print(f"  {tps:10.0f} tokens/s  ({n} tokens in {watch.seconds:.1f} s, cpu share {watch.cpu_share:.2f})")
            print(
                f"  {achieved:10.1f} GFLOP/s achieved; matmul peak {peak.peak_gflops:.1f} GFLOP/s "
                f"(best of before {before.peak_gflops:.0f} / after {after.peak_gflops:.0f}; by shape "
                f"{by_shape})"
            )
            # A per-word cache skips the char-CNN/highway FLOPs of repeated words while the count
            # above still charges them per token; the LSTM-only share is then the lower bound.
            print(
                f"  utilisation {100 * entry['utilisation']:.1f}% of the {precision} matmul peak "
                f"(LSTM FLOPs only: {100 * entry['utilisation_lstm_only']:.1f}%)"
            )
        # The slice the reference runs on: the encoder's speed there and its outputs for errors.
        # Twice, best counts: the slice's batch shapes are new, and a compiled encoder may
        # compile for them on first sight. The text itself was seen in the first timed pass.
        watch, n, outputs = best_of(
            [lambda: time_encoder(enc, ref_sentences, args.batch_tokens, device, keep=True)] * 2  # noqa: B023, F821
        )
        entry["slice_tokens_per_s"] = n / watch.seconds
        outputs_on_slice[precision] = outputs
        if timed_run and args.profile:
            print(_profile(enc, ref_sentences, args.batch_tokens))
        del enc
        if timed_run and args.reference:
            ref = ReferenceElmo(options_path, weights_path, precision=precision, device=device)
            ref.embed_batch(ref_sentences[:4])  # warm-up
            r_watch, r_n, r_out = best_of([lambda: time_reference(ref, ref_sentences)] * args.repeats)  # noqa: B023
            ref_outputs[precision] = r_out
            r_tps = r_n / r_watch.seconds
            entry["reference"] = {
                "tokens": r_n,
                "sentences": len(ref_sentences),
                "seconds": r_watch.seconds,
                "cpu_share": r_watch.cpu_share,
                "tokens_per_s": r_tps,
                "speedup": entry["tokens_per_s"] / r_tps,
                "speedup_same_slice": entry["slice_tokens_per_s"] / r_tps,
                "encoder_vs_reference": compare(outputs_on_slice[precision], r_out),
            }
            del ref
            err = entry["reference"]["encoder_vs_reference"]
            print(
                f"  reference: {r_tps:8.1f} tokens/s ({r_n} tokens, {len(ref_sentences)} sentences in "
                f"batches of 64, {r_watch.seconds:.1f} s, cpu share {r_watch.cpu_share:.2f})"
            )
            print(
                f"  speed-up {entry['tokens_per_s'] / r_tps:.1f}x "
                f"(encoder on the same slice, seen before: {entry['slice_tokens_per_s']:.0f} tokens/s, "
                f"{entry['slice_tokens_per_s'] / r_tps:.1f}x)"
            )
            print(
                f"  encoder vs reference ({precision}): max abs {err['max_abs']:.2e}, "
                f"mean cosine {err['mean_cosine']:.7f} (min {err['min_cosine']:.7f})"
            )
        if timed_run:
            results["precisions"][precision] = entry

    results["load_average"] = {"before": load_before, "after": _load_average()}
    print(f"== load average {results['load_average']['after']} after the run")
    print(f"== error against fp32 ({ref_stats.tokens} tokens, {ref_stats.sentences} sentences)")
    for precision in precisions:
        if precision == "fp32":
            continue
        err = compare(outputs_on_slice[precision], outputs_on_slice["fp32"])
        results["precisions"][precision]["error_vs_fp32"] = err
        line = (
            f"  {precision} encoder vs fp32 encoder: max abs {err['max_abs']:.3e} "
            f"(layers {', '.join(f'{x:.2e}' for x in err['max_abs_by_layer'])}), "
            f"mean cosine {err['mean_cosine']:.6f} (min {err['min_cosine']:.6f})"
        )
        print(line)
        if precision in ref_outputs and "fp32" in ref_outputs:
            rerr = compare(ref_outputs[precision], ref_outputs["fp32"])
            results["precisions"][precision]["reference_error_vs_fp32"] = rerr
            print(
                f"  {precision} reference vs fp32 reference: max abs {rerr['max_abs']:.3e}, "
                f"mean cosine {rerr['mean_cosine']:.6f} (min {rerr['min_cosine']:.6f})"
            )
    return results


def _precisions(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in DTYPES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"precisions must be among {list(DTYPES)}, got {text!r}")
    return list(dict.fromkeys(names))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default="original", help="model dimensions (default original)")
    parser.add_argument(
        "--precision",
        type=_precisions,
        default=["fp32", "bf16"],
        help="comma-separated list from fp32,bf16,fp16 (default fp32,bf16)",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    parser.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="real tokens per timed pass (default: per size, a few minutes in all on a CPU)",
    )
    parser.add_argument(
        "--batch-tokens", type=int, default=None, help="passed to Encoder.embed_sentences (default: the encoder's own)"
    )
    parser.add_argument(
        "--word-cache-size",
        type=int,
        default=None,
        help="passed to Encoder.load (0: no per-word char-CNN cache; default: the encoder's)",
    )
    parser.add_argument(
        "--reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also time the reference path (default on)",
    )
    parser.add_argument(
        "--reference-tokens",
        type=int,
        default=3000,
        help="tokens of the slice the reference and the error checks run on, "
        "rounded to whole batches of 64 sentences (default 3000: two batches)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="timed passes of the encoder (each on new text) and of the reference; the best counts (default 2)",
    )
    parser.add_argument(
        "--warmup-tokens", type=int, default=_WARMUP_TOKENS, help=f"untimed tokens first (default {_WARMUP_TOKENS})"
    )
    parser.add_argument(
        "--quick-peak",
        action="store_true",
        help="matmul peak on the model's own LSTM shapes only, without 4096^3 (minutes where bf16 is emulated)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random model and the corpus")
    parser.add_argument(
        "--profile", action="store_true", help="print a torch.profiler table of the encoder on the reference slice"
    )
    parser.add_argument("--json", metavar="PATH", default=None, help="also write the results as JSON ('-': stdout)")
    args = parser.parse_args(argv)
    for name in ("tokens", "repeats", "reference_tokens", "threads", "batch_tokens", "warmup_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.device not in ("cpu",) and not args.device.startswith("cuda"):
        parser.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if args.device == "cpu" and "fp16" in args.precision:
        # Asked for by name: measure it (the encoder refuses it on CPUs by default, as a trap).
        os.environ.setdefault("ELMO_CACHE_ALLOW_SLOW_FP16", "1")
        print("note: fp16 on a CPU has no fast matmul path; expect it to be slow", file=sys.stderr)
    results = run(args)
    if args.json:
        text = json.dumps(results, indent=2)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n", encoding="utf-8")
            print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
