#!/usr/bin/env python3
"""Held-out perplexity of n-gram baselines, for comparison with the ELMo biLM.

Scores the held-out text with three models estimated on the training text, all on the same
vocabulary as the biLM:

* ``unigram``:    maximum likelihood with add-one smoothing;
* ``kn_bigram``:  interpolated modified Kneser-Ney, order 2;
* ``kn_trigram``: interpolated modified Kneser-Ney, order 3 (Chen & Goodman 1998, section 4.1.6).

Conventions (the same for every model, so the figures are comparable to the forward LM):

* ``vocab.txt`` holds one token per line; its first three lines must be ``<S>``, ``</S>``,
  ``<UNK>``. Any text token not in the vocabulary is mapped to ``<UNK>``. A literal ``<S>`` in the
  text is also mapped to ``<UNK>`` (``<S>`` is a context only, it is never predicted).
* Text files hold one sentence per line, tokens separated by whitespace (``line.split()``).
  Blank lines are skipped (and counted in the report).
* A sentence of n tokens makes n + 1 predictions: each token, then ``</S>``, from the start
  context ``<S>`` (``<S> <S>`` for the trigram). ``<S>`` is never predicted, so every model is a
  distribution over the V - 1 vocabulary entries other than ``<S>`` (``</S>`` and ``<UNK>``
  included).
* Perplexity = exp(-(1/P) * sum of natural-log probabilities) over all P predictions, ``<UNK>``
  and ``</S>`` predictions included.

Modified Kneser-Ney, interpolated, as in Chen & Goodman (and KenLM's lmplz):

    p_k(w | h) = (max(a_k(h w) - D_k(a_k(h w)), 0) + gamma_k(h) * p_{k-1}(w | h')) / sum_w a_k(h w)
    gamma_k(h) = D_k1 N1(h .) + D_k2 N2(h .) + D_k3+ N3+(h .)
    p_0(w)     = 1 / (V - 1)                            (uniform over the predictable vocabulary)

with p_k(w | h) = p_{k-1}(w | h') when the history h was never seen. a_k is the raw count at the
highest order and the continuation count N1+(. h w) (number of distinct left extensions) at lower
orders, except for n-grams that begin with ``<S>``: they cannot be extended to the left by a real
word, so they keep their raw count (as in KenLM and SRILM). Each order k has three discounts
estimated from the count-of-counts n_r of the a_k values:

    Y = n1 / (n1 + 2 n2),  D1 = 1 - 2Y n2/n1,  D2 = 2 - 3Y n3/n2,  D3+ = 3 - 4Y n4/n3

If an order has too few counts for that (some n_r = 0, or a discount outside (0, r]) it falls
back to (0.5, 1.0, 1.5), and the report says so.

Everything is counted with numpy on int64 n-gram keys (base-V digits), so ~6M training tokens and
a ~50k vocabulary take well under a minute and a few hundred MB.

Usage::

    python scripts/bundled_model/ngram_baselines.py --train train.txt --heldout heldout.txt \\
        --vocab vocab.txt [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from array import array
from pathlib import Path

import numpy as np

# The models live beside this script; run as a script, its folder is on sys.path already.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ngram_models import (
    BOS,
    EOS,
    UNK,
    UNK_ID,
    Corpus,
    KneserNey,
    UnigramAddOne,
)

# --------------------------------------------------------------------------------------------
# Vocabulary and corpora
# --------------------------------------------------------------------------------------------


class Vocab:
    """Token <-> id. Ids follow the file's order (duplicates after the first are dropped)."""

    def __init__(self, tokens: list[str]):
        if tokens[:3] != [BOS, EOS, UNK]:
            raise ValueError(f"vocabulary must start with {BOS}, {EOS}, {UNK}; got {tokens[:3]}")
        self.tokens: list[str] = []
        self.ids: dict[str, int] = {}
        self.duplicates = 0
        for tok in tokens:
            if tok in self.ids:
                self.duplicates += 1
                continue
            self.ids[tok] = len(self.tokens)
            self.tokens.append(tok)
        # Lookup used for text: <S> is never a text token (it cannot be predicted).
        self._lookup = dict(self.ids)
        del self._lookup[BOS]

    @classmethod
    def from_file(cls, path: str | Path) -> Vocab:
        with open(path, encoding="utf-8") as f:
            tokens = [line.strip() for line in f]
        return cls([t for t in tokens if t])

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, tokens: list[str]) -> list[int]:
        get = self._lookup.get
        return [get(t, UNK_ID) for t in tokens]


def encode_lines(lines, vocab: Vocab) -> Corpus:
    get = vocab._lookup.get
    ids = array("i")
    lengths = array("q")
    empty = 0
    oov = 0
    for line in lines:
        toks = line.split()
        if not toks:
            empty += 1
            continue
        enc = [get(t, -1) for t in toks]
        n_oov = enc.count(-1)
        if n_oov:
            oov += n_oov
            enc = [UNK_ID if i < 0 else i for i in enc]
        ids.extend(enc)
        lengths.append(len(enc))
    return Corpus(
        ids=np.frombuffer(ids, dtype=np.int32).astype(np.int64) if ids else np.zeros(0, np.int64),
        lengths=np.frombuffer(lengths, dtype=np.int64).copy() if lengths else np.zeros(0, np.int64),
        oov_tokens=oov,
        empty_lines=empty,
    )


def read_corpus(path: str | Path, vocab: Vocab) -> Corpus:
    with open(path, encoding="utf-8") as f:
        return encode_lines(f, vocab)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def evaluate(train: Corpus, heldout: Corpus, vocab: Vocab) -> dict:
    v = len(vocab)
    results: dict = {
        "vocab_size": v,
        "vocab_duplicates_dropped": vocab.duplicates,
        "train": _corpus_stats(train),
        "heldout": _corpus_stats(heldout),
        "models": {},
    }
    models = [UnigramAddOne(train, v), KneserNey.fit(train, v, 2), KneserNey.fit(train, v, 3)]
    for model in models:
        t0 = time.perf_counter()
        lp = model.logprobs(heldout)
        n = lp.size
        entry = {
            "perplexity": math.exp(-float(lp.sum()) / n) if n else float("nan"),
            "cross_entropy_bits": -float(lp.sum()) / n / math.log(2) if n else float("nan"),
            "log_prob_sum": float(lp.sum()),
            "predictions": int(n),
        }
        if isinstance(model, KneserNey):
            entry["orders"] = model.describe()
        entry["score_seconds"] = round(time.perf_counter() - t0, 3)
        results["models"][model.name] = entry
    return results


def _corpus_stats(c: Corpus) -> dict:
    unk = int(np.count_nonzero(c.ids == UNK_ID))
    return {
        "sentences": c.num_sentences,
        "tokens": c.num_tokens,
        "predictions": c.num_predictions,
        "oov_tokens": c.oov_tokens,
        "oov_rate": c.oov_tokens / c.num_tokens if c.num_tokens else 0.0,
        "unk_tokens": unk,  # OOV tokens plus literal <UNK> (and <S>) in the text
        "empty_lines_skipped": c.empty_lines,
    }


LABELS = {
    "unigram": "unigram (add-one)",
    "kn_bigram": "KN bigram (interp., modified)",
    "kn_trigram": "KN trigram (interp., modified)",
}


def format_table(results: dict) -> str:
    h = results["heldout"]
    t = results["train"]
    lines = [
        f"vocab: {results['vocab_size']:,} types (incl. <S>, </S>, <UNK>)",
        f"train:   {t['sentences']:,} sentences, {t['tokens']:,} tokens, OOV rate {100 * t['oov_rate']:.2f}%",
        f"heldout: {h['sentences']:,} sentences, {h['tokens']:,} tokens, "
        f"{h['predictions']:,} predictions, OOV rate {100 * h['oov_rate']:.2f}%",
        "",
        f"{'model':<32}{'perplexity':>12}{'bits/pred':>11}",
    ]
    for name, m in results["models"].items():
        lines.append(f"{LABELS.get(name, name):<32}{m['perplexity']:>12.2f}{m['cross_entropy_bits']:>11.3f}")
    for name, m in results["models"].items():
        for k, o in m.get("orders", {}).items():
            d = ", ".join(f"{x:.3f}" for x in o["discounts"])
            fb = " (fallback)" if o["fallback"] else ""
            lines.append(f"  {name} order {k} discounts D1, D2, D3+ = {d}{fb}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", required=True, type=Path)
    ap.add_argument("--heldout", required=True, type=Path)
    ap.add_argument("--vocab", required=True, type=Path)
    ap.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    vocab = Vocab.from_file(args.vocab)
    train = read_corpus(args.train, vocab)
    heldout = read_corpus(args.heldout, vocab)
    t_read = time.perf_counter() - t0
    results = evaluate(train, heldout, vocab)
    results["files"] = {"train": str(args.train), "heldout": str(args.heldout), "vocab": str(args.vocab)}
    results["seconds"] = {"read": round(t_read, 2), "total": round(time.perf_counter() - t0, 2)}
    print(format_table(results))
    print(f"({results['seconds']['total']:.1f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
