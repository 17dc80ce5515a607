"""Quality probes of an ELMo model, offline: word sense, noun-vs-verb, perplexity.

    python benchmarks/probe_quality.py --wordnet /usr/share/wordnet                   # bundled model
    python benchmarks/probe_quality.py --model DIR --wordnet DIR --heldout heldout.txt
    python benchmarks/probe_quality.py --wordnet DIR --probes wsd,pos --quantize int8 --quantize opq:64 \
        --train-text train.txt       # as quantised caches return the vectors

(a) **wsd**: word sense disambiguation by 1-nearest-neighbour, as in the ELMo paper (Peters et
    al. 2018, sec. 5.3): for each sense of a lemma, the mean of the target word's vectors in
    that sense's training examples; a test occurrence gets the sense whose mean is nearest by
    cosine. Data: the example sentences of WordNet synsets of polysemous single-word lemmas.
    Baseline: the most frequent sense in the training split (ties: WordNet's order).
(b) **pos**: noun or verb, for lemmas that have both noun and verb synsets, by logistic
    regression on the target word's vector; split by example, and by lemma (no test lemma in
    training, so memorising the word cannot score).
(c) **ppl**: perplexity per direction from the zero state (every sentence alone), the warm
    state, and the state carried across sentences (``elmo_cache.train.evaluate.perplexity``
    modes sentence, warm, stream) on ``--heldout``; needs a trained model directory (with
    softmax.hdf5 and vocab.txt), skipped without ``--heldout``.

(a) and (b) run per layer 0 (char-CNN), 1, 2 on the model and on a random-weights model of the
same shape (``write_random_model``), the floor a trained model must clear.

Leakage: train/test fall by a seeded hash of each example (or lemma), the same on every run;
an example is kept only where the lemma (or a regular or irregular inflection of it) is found
in its tokens. WordNet's glosses are part of the bundled model's *language-model* training text
(MODEL_CARD.md): it has read these sentences, though never a sense or POS label.

The WordNet files: ``apt-get download wordnet-base && dpkg-deb -x wordnet-base_*.deb DIR``,
then ``--wordnet DIR/usr/share/wordnet``.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _machine import describe_machine
from _probe_quantize import quantizations
from _wordnet import Example, WordNetMissingError, check_wordnet_dir, collect_examples, split_of

from elmo_cache import Encoder
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model import sources
from elmo_cache.model.files import ModelFiles
from elmo_cache.model.random_model import write_random_model
from elmo_cache.rows.codecs import codec_for_option
from elmo_cache.rows.pq import Training

LAYERS = (0, 1, 2)
L2 = 1e-2  # logistic-regression penalty, fixed in advance (never tuned on a test split)


# ------------------------------------------------------------------ choosing examples
def _ordered_groups(groups: dict[str, list], seed: int) -> list[str]:
    """Group keys in a seeded-hash order, so a smaller --max-examples takes a prefix of a larger one."""

    def rank(key: str) -> tuple[bytes, str]:
        return hashlib.blake2b(f"order{seed}:{key}".encode(), digest_size=8).digest(), key

    return sorted(groups, key=rank)


def select_wsd(
    examples: list[Example], test_share: float, seed: int, max_examples: int
) -> tuple[list[Example], list[Example], dict[str, int]]:
    """Train and test examples of the lemmas (per POS) the sense probe can score, and counts.

    A lemma counts when at least two of its senses have training examples and at least one test
    example has a sense seen in training; test examples of an unseen sense are dropped (counted):
    1-NN cannot name a sense it has no mean for.
    """
    groups: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        groups[f"{ex.lemma}|{ex.pos}"].append(ex)
    train: list[Example] = []
    test: list[Example] = []
    counts = {"lemmas": 0, "test_unseen_sense": 0}
    for key in _ordered_groups(groups, seed):
        tr = [ex for ex in groups[key] if split_of(ex.key, test_share, seed) == "train"]
        senses = {ex.offset for ex in tr}
        te_all = [ex for ex in groups[key] if split_of(ex.key, test_share, seed) == "test"]
        te = [ex for ex in te_all if ex.offset in senses]
        if len(senses) < 2 or not te:
            continue
        if len(train) + len(test) + len(tr) + len(te) > max_examples and train:
            break
        counts["lemmas"] += 1
        counts["test_unseen_sense"] += len(te_all) - len(te)
        train += tr
        test += te
    counts["train"], counts["test"] = len(train), len(test)
    return train, test, counts


def select_pos(examples: list[Example], seed: int, max_examples: int) -> tuple[list[Example], dict[str, int]]:
    """Examples of lemmas found in both noun and verb examples (at most about ``max_examples``)."""
    groups: dict[str, list[Example]] = defaultdict(list)
    for ex in examples:
        groups[ex.lemma].append(ex)
    chosen: list[Example] = []
    n_lemmas = 0
    for key in _ordered_groups(groups, seed):
        if {ex.pos for ex in groups[key]} != {"n", "v"}:
            continue
        if len(chosen) + len(groups[key]) > max_examples and chosen:
            break
        chosen += groups[key]
        n_lemmas += 1
    return chosen, {"lemmas": n_lemmas, "examples": len(chosen)}


# ------------------------------------------------------------------ vectors and classifiers
def target_vectors(encoder: Encoder, examples: list[Example]) -> np.ndarray:
    """``(n, 3, dim)`` float32: every layer's vector of each example's target token."""
    out = np.empty((len(examples), encoder.n_layers, encoder.output_dim), dtype=np.float32)
    for k, vectors in enumerate(encoder.embed_sentences([list(ex.tokens) for ex in examples])):
        out[k] = vectors[:, examples[k].index]
    return out


def nearest_sense(
    train_x: np.ndarray, train_word: list[str], train_sense: list[int], test_x: np.ndarray, test_word: list[str]
) -> np.ndarray:
    """1-NN over sense means: for each test row, the sense (of its own word) whose mean is nearest by cosine."""
    means: dict[str, tuple[list[int], np.ndarray]] = {}
    by_word: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for row, (word, sense) in enumerate(zip(train_word, train_sense)):
        by_word[word][sense].append(row)
    for word, senses in by_word.items():
        labels = sorted(senses)
        centroids = np.stack([train_x[senses[s]].mean(0) for s in labels])
        centroids /= np.maximum(np.linalg.norm(centroids, axis=1, keepdims=True), 1e-12)
        means[word] = (labels, centroids)
    predicted = np.empty(len(test_word), dtype=np.int64)
    for row, word in enumerate(test_word):
        labels, centroids = means[word]
        predicted[row] = labels[int(np.argmax(centroids @ test_x[row]))]  # norm of the query does not change argmax
    return predicted


def most_frequent_sense(
    train_word: list[str], train_sense: list[int], train_rank: list[int], test_word: list[str]
) -> np.ndarray:
    """Each word's most frequent training sense; ties go to WordNet's order (lower rank)."""
    counts: dict[str, Counter] = defaultdict(Counter)
    rank_of: dict[int, int] = {}
    for word, sense, rank in zip(train_word, train_sense, train_rank):
        counts[word][sense] += 1
        rank_of[sense] = rank
    best = {word: min(c, key=lambda s: (-c[s], rank_of[s])) for word, c in counts.items()}
    return np.array([best[word] for word in test_word], dtype=np.int64)


def fit_logreg(x: np.ndarray, y: np.ndarray, *, l2: float = L2, steps: int = 100, seed: int = 0):
    """Binary/multiclass logistic regression on standardised features (torch, L-BFGS); returns predict(x)."""
    torch.manual_seed(seed)
    xt = torch.from_numpy(np.asarray(x, dtype=np.float32))
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64))
    mean, std = xt.mean(0), xt.std(0).clamp(min=1e-6)  # the random model's layers differ in scale by 100x
    xs = (xt - mean) / std
    n_classes = int(yt.max()) + 1
    weight = torch.zeros(xs.shape[1], max(n_classes, 2), requires_grad=True)
    bias = torch.zeros(max(n_classes, 2), requires_grad=True)
    optimiser = torch.optim.LBFGS([weight, bias], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(xs @ weight + bias, yt) + l2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    w, b = weight.detach(), bias.detach()

    def predict(z: np.ndarray) -> np.ndarray:
        zt = (torch.from_numpy(np.asarray(z, dtype=np.float32)) - mean) / std
        return (zt @ w + b).argmax(1).numpy()

    return predict


def _accuracy(predicted: np.ndarray, gold) -> float:
    return float(np.mean(np.asarray(predicted) == np.asarray(gold))) if len(gold) else float("nan")


# ------------------------------------------------------------------ the probes
def run_wsd(vectors: dict[str, np.ndarray], train: list[Example], test: list[Example]) -> dict[str, dict]:
    """Accuracy per model and layer; ``vectors[name]`` holds the train rows, then the test rows."""
    tw = [f"{e.lemma}|{e.pos}" for e in train]
    sw = [f"{e.lemma}|{e.pos}" for e in test]
    gold = [e.offset for e in test]
    results = {"mfs": _accuracy(most_frequent_sense(tw, [e.offset for e in train], [e.rank for e in train], sw), gold)}
    results["wordnet_first"] = _accuracy([e.rank == 0 for e in test], [True] * len(test))
    for name, x in vectors.items():
        xtr, xte = x[: len(train)], x[len(train) :]
        results[name] = {
            j: _accuracy(nearest_sense(xtr[:, j], tw, [e.offset for e in train], xte[:, j], sw), gold) for j in LAYERS
        }
    return results


def run_pos(vectors: dict[str, np.ndarray], examples: list[Example], test_share: float, seed: int) -> dict[str, dict]:
    """Noun-vs-verb accuracy per split, model and layer, with the majority and memorised-word baselines."""
    y = np.array([e.pos == "v" for e in examples], dtype=np.int64)
    splits = {
        "by_example": np.array([split_of(e.key, test_share, seed) == "test" for e in examples]),
        "by_lemma": np.array([split_of(f"lemma:{e.lemma}", test_share, seed) == "test" for e in examples]),
    }
    results: dict[str, dict] = {}
    for split, is_test in splits.items():
        tr, te = ~is_test, is_test
        majority = int(np.mean(y[tr]) >= 0.5)
        # Memorising the word: each training lemma's majority POS (unseen lemmas: the overall majority).
        word_votes: dict[str, Counter] = defaultdict(Counter)
        for ex, label in zip(np.array(examples, dtype=object)[tr], y[tr]):
            word_votes[ex.lemma][int(label)] += 1
        memo = [word_votes[e.lemma].most_common(1)[0][0] if e.lemma in word_votes else majority for e in examples]
        row: dict = {
            "n_train": int(tr.sum()),
            "n_test": int(te.sum()),
            "majority": _accuracy(np.full(int(te.sum()), majority), y[te]),
            "memorised_word": _accuracy(np.array(memo)[te], y[te]),
        }
        for name, x in vectors.items():
            row[name] = {j: _accuracy(fit_logreg(x[tr, j], y[tr], seed=seed)(x[te, j]), y[te]) for j in LAYERS}
        results[split] = row
    return results


def run_perplexity(model: str | None, heldout: Path, max_lines: int | None) -> dict[str, dict] | str:
    """Perplexities per mode, or why they were skipped."""
    from elmo_cache.train.evaluate import perplexity

    files = sources.resolve(model)
    directory = files.directory or files.options_file.parent
    if not (directory / "softmax.hdf5").is_file() or not (directory / "vocab.txt").is_file():
        return f"skipped: {directory} has no softmax.hdf5 + vocab.txt (not a model trained by elmo-cache train)"
    text = heldout
    if max_lines:
        lines = heldout.read_text(encoding="utf-8").splitlines(keepends=True)[:max_lines]
        text = Path(tempfile.mkdtemp(prefix="probe_ppl_")) / "heldout.txt"
        text.write_text("".join(lines), encoding="utf-8")
    out = {}
    for mode, label in (("sentence", "zero"), ("warm", "warm"), ("stream", "carried")):
        start = time.perf_counter()
        result = perplexity(directory, text, mode=mode, device="cpu")
        out[label] = {**result.as_dict(), "seconds": time.perf_counter() - start}
    return out


# ------------------------------------------------------------------ printing
def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def _interval(n: int) -> str:
    """The binomial 95% half-width at the worst case p = 0.5: how far apart two figures must be to mean much."""
    return f"95% interval at most +-{196 * (0.25 / max(n, 1)) ** 0.5:.1f} points (n = {n} test examples)"


def print_wsd(results: dict, counts: dict) -> None:
    if not counts["lemmas"]:
        print("\n(a) WSD: no lemma has two senses with training examples and a test example; nothing to score")
        return
    print(
        f"\n(a) WSD, 1-NN over sense means (cosine): {counts['lemmas']} lemma-POS pairs, "
        f"{counts['train']} train / {counts['test']} test examples "
        f"({counts['test_unseen_sense']} test examples of senses without training examples dropped)"
    )
    print("| vectors | layer 0 | layer 1 | layer 2 |\n|---|---|---|---|")
    for name in _vector_names(results):
        print(f"| {name} | " + " | ".join(_pct(results[name][j]) for j in LAYERS) + " |")
    print(f"| most frequent training sense | {_pct(results['mfs'])} | | |")
    print(f"| WordNet first sense | {_pct(results['wordnet_first'])} | | |")
    print(_interval(counts["test"]))


def _vector_names(results: dict) -> list[str]:
    """The rows of vectors in a result, in print order: the model, its quantised forms, the random floor."""
    quantised = sorted(name for name in results if name.startswith("model "))
    return [name for name in ("model", *quantised, "random") if name in results]


def print_pos(results: dict, counts: dict) -> None:
    print(
        f"\n(b) noun vs verb, logistic regression (L2 {L2}): {counts['lemmas']} lemmas, {counts['examples']} examples"
    )
    print("| split | train / test | vectors | layer 0 | layer 1 | layer 2 |\n|---|---|---|---|---|---|")
    for split, row in results.items():
        sizes = f"{row['n_train']} / {row['n_test']}"
        for name in _vector_names(row):
            print(f"| {split} | {sizes} | {name} | " + " | ".join(_pct(row[name][j]) for j in LAYERS) + " |")
        print(f"| {split} | {sizes} | majority class | {_pct(row['majority'])} | | |")
        print(f"| {split} | {sizes} | memorised word | {_pct(row['memorised_word'])} | | |")
    print(", ".join(_interval(row["n_test"]) + f" ({split})" for split, row in results.items()))


def print_ppl(results: dict | str) -> None:
    print("\n(c) held-out perplexity (full softmax)")
    if isinstance(results, str):
        print(results)
        return
    first = next(iter(results.values()))
    print(
        f"{first['sentences']} sentences, {first['tokens']} tokens, {first['predictions']} predictions "
        f"per direction, OOV {100 * first['oov_rate']:.2f}%"
    )
    print("| initial state | forward | backward | mean | seconds |\n|---|---|---|---|---|")
    for label, r in results.items():
        print(f"| {label} | {r['forward']:.1f} | {r['backward']:.1f} | {r['mean']:.1f} | {r['seconds']:.0f} |")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model name or directory (default: the bundled model)")
    parser.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"), help="WordNet dict directory")
    parser.add_argument("--heldout", type=Path, default=None, help="held-out text for (c), one sentence a line")
    parser.add_argument("--heldout-lines", type=int, default=None, help="use only the first N lines of it")
    parser.add_argument("--probes", default="wsd,pos,ppl", help="comma list of wsd, pos, ppl")
    parser.add_argument("--max-examples", type=int, default=2000, help="examples per probe (whole lemmas)")
    parser.add_argument("--test-share", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0, help="of the split hashes and the random model")
    parser.add_argument("--no-random", action="store_true", help="skip the random-weights floor")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: shared machines)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--quantize",
        action="append",
        default=[],
        metavar="SCHEME",
        help="also probe the model's vectors as a cache quantised so returns them: int8, pq:M or opq:M (repeatable)",
    )
    parser.add_argument(
        "--train-text",
        type=Path,
        default=None,
        help="pq/opq: text whose first token rows train the codebooks, as a build of it would (one sentence a line)",
    )
    parser.add_argument(
        "--train-vectors", type=int, default=Training().vectors, help="pq/opq: token rows of the training sample"
    )
    args = parser.parse_args(argv)
    try:
        args.quantize = [codec_for_option(name).name for name in args.quantize]
    except InvalidParameterError as error:
        parser.error(str(error))
    if any(name != "int8" for name in args.quantize) and args.train_text is None:
        parser.error("--quantize pq:M / opq:M needs --train-text (the text its codebooks are trained on)")
    torch.set_num_threads(args.threads)
    probes = set(args.probes.split(","))
    print(f"command  {' '.join(sys.argv)}")
    print(f"date     {datetime.datetime.now().isoformat(timespec='seconds')}")
    for line in describe_machine("cpu").lines():
        print(line)
    report: dict = {"argv": sys.argv, "machine": describe_machine("cpu").__dict__}

    if probes & {"wsd", "pos"}:
        try:
            wordnet = check_wordnet_dir(args.wordnet)
        except WordNetMissingError as error:
            raise SystemExit(f"error: {error}") from None
        examples, found = collect_examples(wordnet)
        print(
            f"wordnet  {wordnet}: {found['examples']} lemma-example pairs, {found['not_found']} without the lemma "
            f"in the tokens (skipped), {found['duplicates']} duplicates, {found['short_lemmas']} short lemmas "
            f"skipped; {len(examples)} located"
        )
        report["wordnet_counts"] = found
        encoders = {"model": Encoder.load(args.model, device="cpu")}
        print(f"model    {encoders['model']!r}")
        if not args.no_random:
            folder = Path(tempfile.mkdtemp(prefix="probe_random_"))
            options, weights = write_random_model(folder, encoders["model"].options, seed=args.seed)
            random_files = ModelFiles("random", options, weights, "files")
            encoders["random"] = Encoder.load(random_files, device="cpu")
        wsd = select_wsd(examples, args.test_share, args.seed, args.max_examples) if "wsd" in probes else None
        pos = select_pos(examples, args.seed, args.max_examples) if "pos" in probes else None
        rows = (wsd[0] + wsd[1] if wsd else []) + (pos[0] if pos else [])
        start = time.perf_counter()
        vectors = {name: target_vectors(enc, rows) for name, enc in encoders.items()}
        for name, quantization in quantizations(encoders["model"], args).items():
            # The vectors a cache of this quantisation returns: each (layer, token) vector quantised and decoded.
            vectors[f"model {name}"] = quantization.roundtrip(vectors["model"])
        print(f"encoded  {len(rows)} examples with {len(encoders)} models in {time.perf_counter() - start:.0f} s")
        n_wsd = len(wsd[0]) + len(wsd[1]) if wsd else 0
        if wsd:
            report["wsd"] = run_wsd({k: v[:n_wsd] for k, v in vectors.items()}, wsd[0], wsd[1])
            report["wsd_counts"] = wsd[2]
            print_wsd(report["wsd"], wsd[2])
        if pos:
            report["pos"] = run_pos({k: v[n_wsd:] for k, v in vectors.items()}, pos[0], args.test_share, args.seed)
            report["pos_counts"] = pos[1]
            print_pos(report["pos"], pos[1])
    if "ppl" in probes:
        if args.heldout is None:
            report["ppl"] = "skipped: no --heldout file given"
        elif not args.heldout.is_file():
            raise SystemExit(f"error: held-out text not found: {args.heldout}")
        else:
            report["ppl"] = run_perplexity(args.model, args.heldout, args.heldout_lines)
        print_ppl(report["ppl"])
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
