"""Why the cache exists, measured: training a probe on cached vectors against encoding them live.

    python benchmarks/bench_cache_vs_live.py --wordnet /usr/share/wordnet            # bundled model
    python benchmarks/bench_cache_vs_live.py --model DIR --wordnet DIR --epochs 5

The task is the noun-vs-verb probe of ``probe_quality.py`` (WordNet example sentences of lemmas
with both noun and verb synsets, split by a seeded hash of each example). The classifier is a
learned :class:`~elmo_cache.ScalarMix` over the three layers of the target word's vectors and a
linear layer, trained with Adam for ``--epochs`` epochs twice, from the same initial weights and
with the same batches in the same order:

* **cache**: the sentences are built once into a cache with ``elmo_cache.build`` (float32), and
  every epoch reads them memory-mapped through ``CacheDataset`` + ``collate``;
* **live**: every epoch encodes each batch with the same :class:`~elmo_cache.Encoder`
  (``encode_padded``, as a training loop without a cache would; its word cache stays warm).

The two runs alternate epoch by epoch (cache, live, cache, ...), so load from other jobs on a
shared machine falls on both alike. Before training, every target vector read from the cache is
compared with the live one (they must agree to float32 rounding); after it, the two final test
accuracies must agree (a differing prediction or two at most, from that rounding).
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import describe_machine
from _wordnet import Example, WordNetMissingError, check_wordnet_dir, collect_examples, split_of
from probe_quality import select_pos

import elmo_cache
from elmo_cache import CacheDataset, Encoder, ScalarMix, collate
from elmo_cache.builder import BuildOptions, build
from elmo_cache.model.random_model import write_random_model

VECTOR_ATOL = 1e-4  # cache (fp32) against live encoding: both are the same fp32 arithmetic, batched differently


class TargetProbe(nn.Module):
    """ScalarMix over the layers of one token's vectors, then a linear layer."""

    def __init__(self, n_layers: int, dim: int, n_classes: int = 2):
        super().__init__()
        self.mix = ScalarMix(tuple(range(n_layers)))
        self.out = nn.Linear(dim, n_classes)

    def forward(self, vectors: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """``vectors`` (batch, layers, tokens, dim) padded, ``index`` (batch,): the target token of each row."""
        rows = torch.arange(vectors.shape[0])
        target = vectors[rows, :, index].unsqueeze(2)  # (batch, layers, 1, dim): the mix's layer axis stays -3
        return self.out(self.mix(target).squeeze(1))


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The same shuffled batches for both runs."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch)).tolist()
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def build_cache(examples: list[Example], path: Path, encoder: Encoder) -> tuple[Path, float]:
    corpus = path.with_suffix(".txt")
    corpus.write_text("".join(" ".join(ex.tokens) + "\n" for ex in examples), encoding="utf-8")
    start = time.perf_counter()
    summary = build(corpus, BuildOptions(output=path, progress=False, overwrite=True), encoder=encoder)
    return summary.path, time.perf_counter() - start


class CacheRun:
    """Batches read from a cache through CacheDataset + collate (one process: no DataLoader workers)."""

    def __init__(self, path: Path, examples: list[Example]):
        index = torch.tensor([ex.index for ex in examples])
        labels = torch.tensor([int(ex.pos == "v") for ex in examples])
        self.dataset = CacheDataset(path, index, labels)

    def batches(self, batches: list[list[int]]):
        loader = DataLoader(self.dataset, batch_sampler=batches, collate_fn=collate, num_workers=0)
        for batch in loader:
            yield batch.vectors, batch.fields[0], batch.fields[1]


class LiveRun:
    """The same batches encoded by the encoder every time they are asked for."""

    def __init__(self, encoder: Encoder, examples: list[Example]):
        self.encoder = encoder
        self.sentences = [list(ex.tokens) for ex in examples]
        self.index = torch.tensor([ex.index for ex in examples])
        self.labels = torch.tensor([int(ex.pos == "v") for ex in examples])

    def batches(self, batches: list[list[int]]):
        for rows in batches:
            with torch.no_grad():
                vectors, _ = self.encoder.encode_padded([self.sentences[i] for i in rows])
            yield vectors, self.index[rows], self.labels[rows]


def train_epoch(model: TargetProbe, optimiser: torch.optim.Optimizer, run, batches: list[list[int]]) -> float:
    model.train()
    start = time.perf_counter()
    for vectors, index, labels in run.batches(batches):
        loss = nn.functional.cross_entropy(model(vectors, index), labels)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return time.perf_counter() - start


@torch.no_grad()
def predict(model: TargetProbe, run, n: int, batch_size: int) -> tuple[np.ndarray, float]:
    model.eval()
    start = time.perf_counter()
    out = [
        model(v, i).argmax(1)
        for v, i, _ in run.batches([list(range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)])
    ]
    return torch.cat(out).numpy(), time.perf_counter() - start


@torch.no_grad()
def check_vectors(path: Path, encoder: Encoder, examples: list[Example]) -> float:
    """Largest |cache - live| over every layer of every target vector; raises above VECTOR_ATOL."""
    worst = 0.0
    with elmo_cache.open(path) as cache:
        for start in range(0, len(examples), 64):
            chunk = examples[start : start + 64]
            live, _ = encoder.encode_padded([list(ex.tokens) for ex in chunk])
            for k, ex in enumerate(chunk):
                cached = np.asarray(cache[start + k][:, ex.index], dtype=np.float32)
                worst = max(worst, float(np.abs(cached - live[k, :, ex.index].numpy()).max()))
    if worst > VECTOR_ATOL:
        raise AssertionError(f"{path}: cached vectors differ from live ones by {worst:.2e} (> {VECTOR_ATOL})")
    return worst


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model name or directory (default: the bundled model)")
    parser.add_argument("--random-size", default=None, help="a random model of this preset instead (tests: tiny)")
    parser.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="WordNet dict directory")
    parser.add_argument("--max-examples", type=int, default=2000, help="examples in all (whole lemmas)")
    parser.add_argument("--test-share", type=float, default=0.3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: shared machines)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the caches go (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"command  {' '.join(sys.argv)}")
    print(f"date     {datetime.datetime.now().isoformat(timespec='seconds')}")
    for line in describe_machine("cpu").lines():
        print(line)
    try:
        wordnet = check_wordnet_dir(args.wordnet)
    except WordNetMissingError as error:
        raise SystemExit(f"error: {error}") from None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_cache_vs_live_"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.random_size:
        encoder = Encoder.load(write_random_model(workdir / "model", args.random_size), device="cpu")
    else:
        encoder = Encoder.load(args.model, device="cpu")
    print(f"model    {encoder!r}")

    examples, _ = select_pos(collect_examples(wordnet)[0], args.seed, args.max_examples)
    train = [ex for ex in examples if split_of(ex.key, args.test_share, args.seed) == "train"]
    test = [ex for ex in examples if split_of(ex.key, args.test_share, args.seed) == "test"]
    if not train or not test:
        raise SystemExit(f"error: {len(train)} train and {len(test)} test examples: too few for the probe")
    train_path, train_build = build_cache(train, workdir / "train.zarr", encoder)
    test_path, test_build = build_cache(test, workdir / "test.zarr", encoder)
    worst = max(check_vectors(train_path, encoder, train), check_vectors(test_path, encoder, test))
    n_tokens = sum(len(ex.tokens) for ex in examples)
    print(
        f"data     {len(train)} train / {len(test)} test sentences ({n_tokens} tokens); build {train_build:.1f} s "
        f"+ {test_build:.1f} s; cached vs live target vectors: max |diff| {worst:.1e}"
    )

    runs = {
        "cache": (CacheRun(train_path, train), CacheRun(test_path, test)),
        "live": (LiveRun(encoder, train), LiveRun(encoder, test)),
    }
    models, optimisers, seconds = {}, {}, {name: [] for name in runs}
    for name in runs:
        torch.manual_seed(args.seed)  # the same initial weights for both
        models[name] = TargetProbe(encoder.n_layers, encoder.output_dim)
        optimisers[name] = torch.optim.Adam(models[name].parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        batches = epoch_batches(len(train), args.batch_size, args.seed, epoch)
        for name in runs:  # alternate: each epoch of one run is followed by the same epoch of the other
            seconds[name].append(train_epoch(models[name], optimisers[name], runs[name][0], batches))
        print(f"epoch {epoch + 1}: cache {seconds['cache'][-1]:.2f} s, live {seconds['live'][-1]:.2f} s")

    gold = np.array([int(ex.pos == "v") for ex in test])
    result: dict = {
        "argv": sys.argv,
        "machine": describe_machine("cpu").__dict__,
        "max_vector_diff": worst,
        "build_seconds": train_build + test_build,
        "n_train": len(train),
        "n_test": len(test),
    }
    predictions = {}
    for name in runs:
        predictions[name], eval_s = predict(models[name], runs[name][1], len(test), 256)
        result[name] = {
            "epoch_seconds": seconds[name],
            "median_epoch_s": statistics.median(seconds[name]),
            "accuracy": float(np.mean(predictions[name] == gold)),
            "eval_seconds": eval_s,
            "mix": [round(w, 3) for w in models[name].mix.weights] + [round(models[name].mix.gamma_value, 3)],
        }
    disagree = int((predictions["cache"] != predictions["live"]).sum())
    result["disagreements"] = disagree
    speedup = result["live"]["median_epoch_s"] / result["cache"]["median_epoch_s"]
    saved = result["live"]["median_epoch_s"] - result["cache"]["median_epoch_s"]
    print(f"\n| run | s/epoch (median of {args.epochs}) | epochs (s) | test accuracy | eval s |\n|---|---|---|---|---|")
    for name in runs:
        r = result[name]
        each = ", ".join(f"{s:.2f}" for s in r["epoch_seconds"])
        print(f"| {name} | {r['median_epoch_s']:.2f} | {each} | {100 * r['accuracy']:.1f} | {r['eval_seconds']:.2f} |")
    print(
        f"speed-up per epoch: {speedup:.1f}x; the build ({result['build_seconds']:.1f} s, once) is repaid after "
        f"{result['build_seconds'] / saved:.1f} epochs"
        if saved > 0
        else f"speed-up per epoch: {speedup:.2f}x"
    )
    print(
        f"mix weights s_0, s_1, s_2, gamma: cache {result['cache']['mix']}, live {result['live']['mix']}; "
        f"{disagree} of {len(test)} test predictions differ"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    # Same model, same vectors (to 1e-4), same batches: a prediction may flip on rounding, no more.
    if disagree > max(2, len(test) // 100):
        raise AssertionError(f"cache and live runs disagree on {disagree} of {len(test)} test predictions")
    return result


if __name__ == "__main__":
    main()
