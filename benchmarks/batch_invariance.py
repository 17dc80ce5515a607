"""Whether a sentence's vectors depend, in their last bits, on the sentences it is batched with (issue 32).

    python benchmarks/batch_invariance.py                          # bundled model, fp32 and bf16, this device
    python benchmarks/batch_invariance.py --precision fp32 --threads 1
    python benchmarks/batch_invariance.py --precision fp32 --row-multiple 1 --word-multiple 1   # products unrounded
    python benchmarks/batch_invariance.py --speed 3       # what the rounding costs: tokens/s rounded and not, 3 rounds

An update must write the bytes a fresh build writes. Where a sentence's rows are the same bits in any batch, it
copies every unchanged sentence's rows and encodes only the changed lines; elsewhere it encodes again every window
(the sentences a build encodes together) that an edit or an append touches. The encoder rounds every product's
rows up to a multiple to make them so (elmo_cache.model.bilm; elmo_cache.encoder.batch_free checks it on the
device at hand). This script measures how far that holds on this machine:

* the char-CNN: the vectors of a sentence's words computed in word lists of M words, against M = 4,000;
* the biLSTM: a sentence (the longest of 50) encoded in batches of several compositions, against a batch where
  three longer sentences and fifty shorter ones keep every one of its steps in a product of many rows.

* many sentences: each encoded alone, then inside six batches of 50-600 random others, as a build's would be.

It prints, for each case, how many rows (or sentences) differ in any bit per layer (0 is invariant).
``--row-multiple N`` and ``--word-multiple N`` set what the encoder rounds the row count of every LSTM product
(input, recurrent, projection) and of every char-CNN call up to (the library's: 4 and 16; 1: the shapes as they
come, the encoder before it rounded them). ``--speed N`` instead times the encoder on ~200,000 tokens of the
synthetic corpus, batched as a build batches a window (sorted by length, ``--batch-tokens`` a batch, the word cache
cleared every window of 8 batches), with the products rounded and not, alternating, N rounds: tokens/s of each.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _corpus import make_corpus
from _machine import describe_machine

from elmo_cache.encoder.batch_free import rows_batch_free
from elmo_cache.encoder.encoder import Encoder
from elmo_cache.model import bilm


def differing_rows(got: torch.Tensor, want: torch.Tensor) -> list[int]:
    """Per layer, the rows of ``got`` that differ from ``want`` in any bit."""
    return [int((got[layer] != want[layer]).any(dim=1).sum()) for layer in range(got.shape[0])]


def encode_afresh(encoder: Encoder, batch: list[list[str]]) -> tuple[torch.Tensor, Any]:
    """``encode_flat`` of ``batch`` with an empty word cache, as a build encodes each window."""
    encoder.clear_word_cache()
    return encoder.encode_flat(batch)


def word_vectors_case(encoder: Encoder, sentence: list[str], vocabulary: list[str]) -> None:
    distinct = list(dict.fromkeys(sentence))
    others = [w for w in vocabulary if w not in sentence]
    reference = encoder._token_vectors(distinct + others[:4000])
    want = {w: reference[i] for i, w in enumerate(distinct)}
    for m in (1, 2, 3, 4, 8, 16, 64, 1000):
        words = distinct[:m] + others[: max(0, m - len(distinct))]
        got = encoder._token_vectors(words)
        differ = sum(int((got[i] != want[w]).any()) for i, w in enumerate(words) if w in want)
        print(f"  char-CNN, {m:5d} words per product: {differ} of {sum(w in want for w in words)} word vectors differ")


def sentence_case(encoder: Encoder, pool: list[list[str]]) -> None:
    sentence = max(pool[:50], key=len)
    shorter = [s for s in pool if 3 < len(s) < len(sentence) - 5]
    longer = [s for s in pool if len(s) > len(sentence) + 5]

    def rows(batch: list[list[str]]) -> torch.Tensor:
        out, offsets = encode_afresh(encoder, batch)
        i = next(k for k, s in enumerate(batch) if s is sentence)
        return out[:, offsets[i] : offsets[i + 1]]

    want = rows(longer[:3] + [sentence] + shorter[:50])
    cases = [
        ("alone", [sentence]),
        ("the longest of 4", [sentence] + shorter[:3]),
        ("the longest of 41", [sentence] + shorter[:40]),
        ("with 1 longer", [sentence, longer[0]]),
        ("with 2 longer", [sentence] + longer[1:3]),
        ("with 3 longer", [sentence] + longer[3:6]),
        ("with 8 longer and 100 shorter", longer[6:14] + [sentence] + shorter[50:150]),
    ]
    for name, batch in cases:
        differ = differing_rows(rows(batch), want)
        print(f"  a sentence of {len(sentence)} tokens {name}: rows differing per layer {differ}")


def many_sentences_case(encoder: Encoder, pool: list[list[str]]) -> None:
    rng = random.Random(1)
    targets = list(range(0, len(pool), 15))
    alone = {i: encode_afresh(encoder, [pool[i]])[0] for i in targets}
    by_layer = [0] * encoder.n_layers
    differ = total = 0
    for trial in range(6):
        lines = rng.sample(range(len(pool)), rng.choice([50, 300, 600]))
        lines += [i for i in targets[trial::6] if i not in lines]
        rng.shuffle(lines)
        out, offsets = encode_afresh(encoder, [pool[i] for i in lines])
        for k, i in enumerate(lines):
            if i in alone:
                layers = [n > 0 for n in differing_rows(out[:, offsets[k] : offsets[k + 1]], alone[i])]
                by_layer = [a + int(b) for a, b in zip(by_layer, layers)]
                differ += int(any(layers))
                total += 1
    print(f"  {total} sentences in random batches of 50-600: {differ} differ from alone (per layer {by_layer})")


def speed_case(encoder: Encoder, corpus: list[list[str]], batch_tokens: int, rounds: int) -> None:
    ordered = sorted(corpus, key=len)
    batches: list[list[list[str]]] = [[]]
    cost = 0
    for sentence in ordered:
        if batches[-1] and cost + len(sentence) + 2 > batch_tokens:
            batches.append([])
            cost = 0
        batches[-1].append(sentence)
        cost += len(sentence) + 2
    tokens = sum(len(s) for s in corpus)
    rates: dict[tuple[int, int], list[float]] = {(bilm.ROW_MULTIPLE, bilm.WORD_MULTIPLE): [], (1, 1): []}
    for _ in range(rounds):
        for multiples, measured in rates.items():
            encoder.bilm.row_multiple, encoder.bilm.word_multiple = multiples
            start = time.perf_counter()
            for number, batch in enumerate(batches):
                if number % 8 == 0:
                    encoder.clear_word_cache()
                encoder.encode_flat(batch)
            measured.append(tokens / (time.perf_counter() - start))
    for (rows, words), measured in rates.items():
        figures = ", ".join(f"{rate:,.0f}" for rate in measured)
        median = statistics.median(measured)
        print(f"  rows rounded to x{rows}, words to x{words}: {figures} tokens/s (median {median:,.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--precision", default="fp32,bf16", help="comma list of fp32, bf16, fp16")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--row-multiple", type=int, default=bilm.ROW_MULTIPLE, help="LSTM products' rows rounded to")
    parser.add_argument("--word-multiple", type=int, default=bilm.WORD_MULTIPLE, help="char-CNN words rounded to")
    parser.add_argument("--speed", type=int, default=0, metavar="N", help="time rounded against unrounded, N rounds")
    parser.add_argument(
        "--batch-tokens", type=int, default=8192, help="--speed: tokens per batch (a build's CPU default)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print("\n".join(describe_machine(args.device).lines()))
    pool = make_corpus(3000 * 40, seed=5)[:3000]
    others = make_corpus(3000 * 40, seed=9)[:3000]
    vocabulary = sorted({w for s in pool for w in s})
    for precision in args.precision.split(","):
        encoder = Encoder.load(args.model, precision=precision, device=args.device)
        if args.speed:
            print(f"{args.model}, {precision}, {args.device}, {args.batch_tokens} tokens a batch:")
            with torch.inference_mode():
                speed_case(encoder, make_corpus(200_000, seed=11), args.batch_tokens, args.speed)
            continue
        encoder.bilm.row_multiple, encoder.bilm.word_multiple = args.row_multiple, args.word_multiple
        print(
            f"{args.model}, {precision}, {args.device}, rows rounded to x{args.row_multiple}, words to "
            f"x{args.word_multiple}:"
        )
        free = rows_batch_free(encoder)
        print(
            f"  the check (elmo_cache.encoder.batch_free.rows_batch_free): {'batch-free' if free else 'not batch-free'}"
        )
        with torch.inference_mode():
            word_vectors_case(encoder, pool[7], vocabulary)
            sentence_case(encoder, pool)
            many_sentences_case(encoder, others)


if __name__ == "__main__":
    main()
