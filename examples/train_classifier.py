"""Train a small sentence classifier on cached ELMo vectors with a learned scalar mix.

The expensive part (the biLM) runs once, in ``build``; every epoch after that reads the
vectors memory-mapped through ``CacheDataset`` (DataLoader workers share the page cache).
The classifier learns the layer weights ``s_j`` and ``gamma`` of a :class:`ScalarMix` beside
its own weights and prints them in the form ``elmo-cache build --mix`` takes, so the mix can
later be frozen into a cache a third of the size.

Runs end to end without downloads (the bundled model and a generated corpus; the caches go to a
temporary folder removed at the end, or to ``--workdir``, kept)::

    python examples/train_classifier.py
    python examples/train_classifier.py --model original --train my_train.tsv   # real data: "label<TAB>sentence"
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from elmo_cache import BucketBatchSampler, CacheDataset, Encoder, ScalarMix, collate
from elmo_cache.builder import BuildOptions, build

# Two classes told apart by their vocabulary, with shared filler words in between.
_WORDS = {
    0: ["cat", "dog", "bird", "horse", "cow", "sheep", "goat", "mouse", "fish", "frog"],
    1: ["car", "bus", "train", "plane", "boat", "truck", "bike", "tram", "ship", "van"],
}
_FILLER = ["the", "a", "on", "in", "with", "near", "and", "then", "some", "big", "small", "red"]


def generate_corpus(n: int, seed: int) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randrange(2)
        words = [
            rng.choice(_WORDS[label]) if rng.random() < 0.4 else rng.choice(_FILLER) for _ in range(rng.randint(3, 12))
        ]
        rows.append((label, " ".join(words)))
    return rows


def read_tsv(path: Path) -> list[tuple[int, str]]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        label, _, sentence = line.partition("\t")
        rows.append((int(label), sentence))
    return rows


class Classifier(nn.Module):
    """ScalarMix over the cached layers, masked mean over tokens, layer norm, then a linear layer."""

    def __init__(self, layers: tuple[int, ...], dim: int, n_classes: int):
        super().__init__()
        self.mix = ScalarMix(layers)
        self.norm = nn.LayerNorm(dim)  # scale-free features train faster whatever the model's vector sizes
        self.dropout = nn.Dropout(0.1)
        self.out = nn.Linear(dim, n_classes)

    def forward(self, vectors: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # The caches are --fp16 and collate keeps their float16 (half the bytes from the workers and to a GPU):
        # cast here, where the float32 weights are.
        mixed = self.mix(vectors.float())  # (batch, tokens, dim)
        weights = mask.unsqueeze(-1).float()
        pooled = (mixed * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return self.out(self.dropout(self.norm(pooled)))


def cache_corpus(rows: list[tuple[int, str]], path: Path, encoder: Encoder) -> tuple[Path, torch.Tensor]:
    corpus = path.with_suffix(".txt")
    corpus.write_text("".join(sentence + "\n" for _, sentence in rows), encoding="utf-8")
    summary = build(corpus, BuildOptions(output=path, fp16=True, progress=False), encoder=encoder)
    print(f"  cached {summary.n_sentences} sentences, {summary.n_tokens} tokens -> {summary.path}")
    return summary.path, torch.tensor([label for label, _ in rows])


def accuracy(model: nn.Module, loader: DataLoader) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for batch in loader:
            predicted = model(batch.vectors, batch.mask).argmax(-1)
            right += int((predicted == batch.labels).sum())
            total += len(predicted)
    return right / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bundled", help="model name or directory (default: the bundled model)")
    parser.add_argument("--train", type=Path, default=None, help="label<TAB>sentence file (default: generated)")
    parser.add_argument("--test", type=Path, default=None, help="label<TAB>sentence file (default: generated)")
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers reading the cache")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where caches go, kept (default: a temporary folder, removed)"
    )
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        run(args, args.workdir)
        return
    with tempfile.TemporaryDirectory(prefix="elmo_cache_example_") as folder:
        run(args, Path(folder))


def run(args: argparse.Namespace, workdir: Path) -> None:
    encoder = Encoder.load(args.model)
    train_rows = read_tsv(args.train) if args.train else generate_corpus(600, seed=args.seed)
    test_rows = read_tsv(args.test) if args.test else generate_corpus(200, seed=args.seed + 1)
    print(f"building caches in {workdir} with {encoder!r}")
    train_cache, train_labels = cache_corpus(train_rows, workdir / "train.zarr", encoder)
    test_cache, test_labels = cache_corpus(test_rows, workdir / "test.zarr", encoder)

    train_set = CacheDataset(train_cache, labels=train_labels)
    test_set = CacheDataset(test_cache, labels=test_labels)
    train_loader = DataLoader(
        train_set,
        batch_sampler=BucketBatchSampler(train_set, batch_size=32, seed=args.seed),  # similar lengths: less padding
        collate_fn=collate,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
    )
    test_loader = DataLoader(test_set, batch_size=64, collate_fn=collate)
    n_classes = int(max(train_labels.max(), test_labels.max())) + 1
    model = Classifier(train_set.layers, train_set.dim, n_classes)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    print(
        f"chance: {max(float((test_labels == c).float().mean()) for c in range(n_classes)):.3f}, "
        f"before training: {accuracy(model, test_loader):.3f}"
    )
    for epoch in range(1, args.epochs + 1):
        model.train()
        total = 0.0
        for batch in train_loader:
            loss = nn.functional.cross_entropy(model(batch.vectors, batch.mask), batch.labels)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * len(batch.lengths)
        print(f"epoch {epoch}: loss {total / len(train_set):.4f}  test accuracy {accuracy(model, test_loader):.3f}")
    print(f"learned mix: {model.mix}")
    print("freeze it into a mixed cache with:  elmo-cache build CORPUS " + " ".join(model.mix.build_args()))


if __name__ == "__main__":
    main()
