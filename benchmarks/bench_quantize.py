"""``build --quantize int8`` against float16 and float32: bytes, reconstruction error, perplexity, speed.

    python benchmarks/bench_quantize.py --heldout /work/data/corpus/heldout.txt --lines 600    # bundled model
    python benchmarks/bench_quantize.py --size original --tokens 1500                         # Original-size random
    python benchmarks/bench_quantize.py --heldout ... --quantize pq:64                        # also product-quantised
    python benchmarks/bench_quantize.py --heldout ... --train-text /work/data/corpus/train.txt --train-lines 4000 \
        --quantize pq:64 --quantize opq:64                                                 # held-out rows out of sample

For one corpus (the first ``--lines`` lines of ``--heldout``, or a generated corpus of ``--tokens``
tokens) it builds zarr caches of all three layers with the same encoder: float32 (the reference),
``--fp16``, ``--quantize int8`` and each ``--quantize pq:M`` or ``opq:M`` asked for (codebooks trained on
the corpus's own first 65,536 rows, so on a small corpus every vector read back was in the training
sample). With ``--train-text FILE --train-lines N`` the corpus is the first N non-empty lines of FILE
followed by the held-out lines, and the errors and perplexities are of the held-out sentences alone: with
N lines of at least 65,536 tokens, vectors outside the codebooks' training sample. It reports


* **bytes per token** of the stored vectors (the ``vectors`` array: rows x row bytes / tokens) and the
  caches' size on disk (a pq cache's codebooks included), against float16;
* **reconstruction error** per layer against float32: max abs error, mean and min cosine, relative RMS;
* **perplexity** (bundled model only: it ships a softmax): layer 2's forward and backward halves of each
  cache through the model's full softmax, every sentence from the zero state as the encoder runs it. A
  cache holds no vector for ``<S>``, so each direction scores n predictions per sentence of n tokens
  (the forward half at token t predicts token t+1 or ``</S>``; the backward half token t-1 or ``<S>``),
  one fewer than ``elmo-cache perplexity`` scores: compare the rows of this table with each other;
* **build throughput** (tokens/s of each build, encoder included), the codebooks' training time (faiss
  alone, the sample's encoding excluded) and the cost of the storage step alone (quantise vs cast on the same
  encoder output);
* **read latency**: random ``cache[i]`` (float16: a zero-copy view; int8: decoded to float32), the same
  followed by a float32 copy (what a model consumes), and ``collate`` of 32 random sentences into float32.

The machine is printed; on a shared box run it twice and read the spread.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import describe_machine

import elmo_cache
from elmo_cache import CacheDataset, Encoder, collate, store
from elmo_cache.builder import BuildOptions, build
from elmo_cache.rows.quantize import Quantization

STORAGE = {"float32": {}, "float16": {"fp16": True}, "int8": {"quantize": "int8"}}
PRODUCT = ("pq:", "opq:")
# Seconds faiss spent training each product-quantised build's codebooks (train_codebooks, timed by a wrapper).
TRAINING_SECONDS: dict[str, float] = {}


def heldout_from(args: argparse.Namespace) -> int:
    """The first sentence of the held-out text in the corpus (0 without --train-text)."""
    return 0 if args.train_text is None else args.train_lines


def _nonempty(path: Path, n: int) -> list[str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if line][:n]


def corpus_lines(args: argparse.Namespace) -> list[str]:
    if args.heldout is not None:
        train = [] if args.train_text is None else _nonempty(args.train_text, args.train_lines)
        if len(train) != heldout_from(args):
            raise SystemExit(f"--train-text has {len(train)} non-empty lines, fewer than --train-lines")
        return train + _nonempty(args.heldout, args.lines)
    from _corpus import make_corpus

    return [" ".join(sentence) for sentence in make_corpus(args.tokens, seed=0)]


def load_encoder(args: argparse.Namespace) -> tuple[Encoder, Path | None]:
    """The encoder, and the model directory holding a softmax (the bundled model's) or None."""
    if args.size is None:
        from elmo_cache.model.hub import BUNDLED_DIR

        return Encoder.load("bundled", device="cpu"), BUNDLED_DIR
    from bench_encoder import cached_model

    return Encoder.load(cached_model(args.size), device="cpu"), None


def build_all(
    lines: list[str], encoder: Encoder, work: Path, pq: list[str], sample: int | None = None
) -> dict[str, tuple[Path, float]]:
    """Each cache built once; ``sample``: the pq/opq builds' ``--codebook-sample`` (None: the default)."""
    from elmo_cache.rows import pq_training

    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = {}
    train = pq_training.train_codebooks
    for name, extra in {**STORAGE, **{m: {"quantize": m, "codebook_sample": sample} for m in pq}}.items():

        def timed_training(sample, quantization, name=name):
            start = time.perf_counter()
            trained = train(sample, quantization)
            TRAINING_SECONDS[name] = time.perf_counter() - start
            return trained

        pq_training.train_codebooks = timed_training  # looked up by name when a build trains its codebooks
        options = BuildOptions(output=work / f"{name.replace(':', '')}.zarr", progress=False, device="cpu", **extra)
        start = time.perf_counter()
        try:
            summary = build(corpus, options, encoder=encoder)
        finally:
            pq_training.train_codebooks = train
        out[name] = (summary.path, summary.n_tokens / (time.perf_counter() - start))
    return out


def fewer_rotation_iterations(rotation_iterations: int) -> None:
    """Train opq builds with fewer OPQ iterations (recorded in their metadata as usual; no build option sets it)."""
    import dataclasses

    from elmo_cache.builder import plan

    make = plan.codec_for_option

    def smaller(value: str | None, *, fp16: bool = False):
        q = make(value, fp16=fp16)
        if not (value or "").startswith(PRODUCT):
            return q
        return dataclasses.replace(q, training=dataclasses.replace(q.training, rotation_iterations=rotation_iterations))

    plan.codec_for_option = smaller


def sizes(caches: dict[str, tuple[Path, float]]) -> None:
    print("\nbytes per token (stored vectors, 3 layers) and on disk")
    base = None
    for name, (path, _) in caches.items():
        with elmo_cache.open(path) as cache:
            row = math.prod(store.open_arrays(path, ("vectors",))[2]["vectors"].shape[1:])
            per_token = row * cache.stored_dtype.itemsize * cache.metadata["n_rows"] / cache.n_tokens
        disk = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        base = per_token if name == "float16" else base
        ratio = "" if base is None else f"  ({base / per_token:5.2f}x smaller than float16)"
        print(f"  {name:8s} {per_token:8.1f} B/token   disk {disk / 2**20:8.2f} MiB{ratio}")
    int8 = caches["int8"][0]
    with elmo_cache.open(int8) as cache:
        q = cache.quantization
        assert q is not None
        print(f"  int8 / float16 (rows): {(q.stored_dim) / (2 * q.dim):.4f}  (dim {q.dim}: codes + 4-byte scale)")
    for name in [n for n in caches if n.startswith(PRODUCT)]:
        with elmo_cache.open(caches[name][0]) as cache:
            q = cache.quantization
            print(
                f"  {name}: codebooks array {q.parameter_count * 4 / 2**20:.2f} MiB per cache "
                f"(centroids {np.prod(q.codebook_shape) * 4 / 2**20:.2f} MiB"
                + (f", rotations {np.prod(q.rotation_shape) * 4 / 2**20:.2f} MiB)" if q.rotated else ")")
            )


def errors(caches: dict[str, tuple[Path, float]], first: int) -> None:
    print(f"\nreconstruction error against float32, per layer (sentences {first:,} on)")
    ref = elmo_cache.open(caches["float32"][0])
    kept = [i for i in range(first, len(ref)) if ref[i].shape[1]]
    for name in [n for n in caches if n != "float32"]:
        cache = elmo_cache.open(caches[name][0])
        for layer in range(3):
            a = np.concatenate([ref[i][layer] for i in kept])
            b = np.concatenate([np.asarray(cache[i], np.float32)[layer] for i in kept])
            cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-30)
            rel = np.sqrt(((a - b) ** 2).sum() / (a**2).sum())
            print(
                f"  {name:8s} layer {layer}: max abs {np.abs(a - b).max():.3e}  mean cosine {cos.mean():.7f}  "
                f"min cosine {cos.min():.7f}  relative RMS {rel:.3e}"
            )


def perplexities(caches: dict[str, tuple[Path, float]], model_dir: Path, first: int) -> None:
    from elmo_cache.train.files import load_trained_model
    from elmo_cache.train.softmax import full_softmax_loss
    from elmo_cache.train.vocab import BOS, EOS

    model, vocab = load_trained_model(model_dir)
    weight, bias = model.softmax_weight.detach(), model.softmax_bias.detach()
    half = weight.shape[1]
    print(
        f"\nheld-out perplexity, layer-2 halves through the bundled softmax ({len(vocab):,} words; "
        f"sentences {first:,} on)"
    )
    results = {}
    for name, (path, _) in caches.items():
        cache = elmo_cache.open(path)
        hidden_f, hidden_b, target_f, target_b = [], [], [], []
        for i in range(first, len(cache)):
            tokens = cache.tokens(i)
            if not tokens:
                continue
            top = np.asarray(cache[i], np.float32)[2]  # (n, 2 * half): forward half, then backward half
            ids = [vocab.id(t) for t in tokens]
            hidden_f.append(top[:, :half])
            hidden_b.append(top[:, half:])
            target_f.extend([*ids[1:], vocab.id(EOS)])
            target_b.extend([vocab.id(BOS), *ids[:-1]])
        nll = []
        for hidden, targets in ((hidden_f, target_f), (hidden_b, target_b)):
            h = torch.from_numpy(np.concatenate(hidden))
            nll.append(float(full_softmax_loss(h, torch.tensor(targets), weight, bias).double().mean()))
        results[name] = (math.exp(nll[0]), math.exp(nll[1]), math.exp(sum(nll) / 2), len(target_f))
    base = results["float32"][2]
    for name, (fwd, bwd, mean, n) in results.items():
        print(
            f"  {name:8s} forward {fwd:8.3f}  backward {bwd:8.3f}  mean {mean:8.3f}  "
            f"({100 * (mean / base - 1):+.3f}% vs float32; {n:,} predictions per direction)"
        )


def speed(caches: dict[str, tuple[Path, float]], encoder: Encoder, lines: list[str], reads: int, threads: int) -> None:
    print("\nbuild throughput (whole build, encoder included; tokens/s)")
    for name, (_, rate) in caches.items():
        trained = f"   codebooks trained in {TRAINING_SECONDS[name]:.1f} s (faiss)" if name in TRAINING_SECONDS else ""
        print(f"  {name:8s} {rate:10.0f}{trained}")
    tokens = [line.split() for line in lines[:64]]
    with torch.inference_mode():
        flat, _ = encoder.encode_flat(tokens)
    rows = flat.transpose(0, 1).contiguous()
    q = Quantization("int8", encoder.output_dim)
    steps = {"cast to float16": lambda: rows.to(torch.float16).numpy(), "quantise int8": lambda: q.quantize(rows)}
    for name in [n for n in caches if n.startswith(PRODUCT)]:
        pq = elmo_cache.open(caches[name][0]).quantization
        steps[f"quantise {name} (nearest centroids)"] = lambda pq=pq: pq.quantize(rows)
    for label, step in steps.items():
        best = min(_timed(step) for _ in range(20))
        print(f"  storage step alone, {label}: {best / rows.shape[0] * 1e6:.3f} us/token ({rows.shape[0]} tokens)")
    torch.set_num_threads(threads)  # as in a DataLoader worker (torch gives each one thread)
    print(f"\nrandom reads ({reads:,} each, warm page cache, torch threads {threads}; p50 / mean in us)")
    rng = np.random.default_rng(0)
    for name in [n for n in caches if n != "float32"]:
        for label, p50, mean in _reads(caches[name][0], reads, rng):
            print(f"  {name:8s} {label:22s} p50 {p50:8.1f}   mean {mean:8.1f}")


def _reads(path: Path, reads: int, rng: np.random.Generator) -> list[tuple[str, float, float]]:
    cache = elmo_cache.open(path)
    order = [int(i) for i in rng.integers(0, len(cache), reads)]
    for i in order[:1000]:
        cache[i]  # first touch: block checks, page faults
    out = []
    for label, read in (
        ("cache[i]", lambda i: cache[i]),
        ("cache[i] as float32", lambda i: np.asarray(cache[i], np.float32) + 0),
    ):
        times = np.array([_timed(read, i) for i in order])
        out.append((label, np.median(times) * 1e6, times.mean() * 1e6))
    dataset = CacheDataset(path)
    batches = [rng.integers(0, len(cache), 32) for _ in range(200)]
    # float32 asked for, as a float32 model consumes it (collate keeps a float16 cache's float16 by default):
    # the figures stay comparable across storages and with earlier runs.
    as_float32 = functools.partial(collate, dtype=torch.float32)
    times = np.array([_timed(lambda b: as_float32([dataset[int(i)] for i in b]), b) for b in batches])
    out.append(("collate(32 sentences)", np.median(times) * 1e6, times.mean() * 1e6))
    return out


def _timed(step, *args) -> float:
    start = time.perf_counter()
    step(*args)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--heldout", type=Path, default=None, help="text to encode (bundled model), one sentence a line"
    )
    parser.add_argument("--lines", type=int, default=600, help="first N non-empty lines of --heldout")
    parser.add_argument("--read-threads", type=int, default=1, help="torch threads while reading (DataLoader: 1)")
    parser.add_argument("--size", default=None, help="a random model of this size (original, medium, small) instead")
    parser.add_argument("--tokens", type=int, default=1500, help="generated corpus size with --size")
    parser.add_argument("--reads", type=int, default=20000, help="random reads per cache")
    parser.add_argument("--keep", type=Path, default=None, help="build the caches here and keep them")
    parser.add_argument("--quantize", action="append", default=[], help="also a pq:M or opq:M cache (repeatable)")
    parser.add_argument("--train-text", type=Path, default=None, help="text before the held-out lines (with --heldout)")
    parser.add_argument("--train-lines", type=int, default=4000, help="first N non-empty lines of --train-text")
    parser.add_argument("--training-vectors", type=int, default=None, help="pq/opq builds' --codebook-sample (65,536)")
    parser.add_argument("--rotation-iterations", type=int, default=None, help="opq: OPQ iterations (10)")
    args = parser.parse_args()
    if (args.heldout is None) == (args.size is None):
        parser.error("give --heldout (bundled model) or --size (a random model)")
    if args.train_text is not None and args.heldout is None:
        parser.error("--train-text needs --heldout")
    if args.rotation_iterations:
        fewer_rotation_iterations(args.rotation_iterations)
    print(f"{datetime.datetime.now().isoformat(timespec='seconds')}  {' '.join(sys.argv)}")
    print("\n".join(describe_machine("cpu").lines()))
    encoder, model_dir = load_encoder(args)
    lines = corpus_lines(args)
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_quantize_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        caches = build_all(lines, encoder, work, args.quantize, args.training_vectors)
        reference = elmo_cache.open(caches["float32"][0])
        first = heldout_from(args)
        held = sum(reference[i].shape[1] for i in range(first, len(reference)))
        print(
            f"\n{len(lines):,} sentences, {reference.n_tokens:,} tokens, dim {encoder.output_dim}; "
            f"evaluated: sentences {first:,} on, {held:,} tokens"
        )
        sizes(caches)
        errors(caches, first)
        if model_dir is not None:
            perplexities(caches, model_dir, first)
        speed(caches, encoder, lines, args.reads, args.read_threads)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
