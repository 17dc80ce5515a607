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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
BOS_ID, EOS_ID, UNK_ID = 0, 1, 2
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


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


@dataclass
class Corpus:
    """Sentences as one flat id array plus per-sentence lengths (no boundary tokens)."""

    ids: np.ndarray  # int32, all tokens of all sentences
    lengths: np.ndarray  # int64, tokens per sentence
    oov_tokens: int = 0  # text tokens not in the vocabulary (mapped to <UNK>)
    empty_lines: int = 0

    @property
    def num_sentences(self) -> int:
        return int(self.lengths.size)

    @property
    def num_tokens(self) -> int:
        return int(self.ids.size)

    @property
    def num_predictions(self) -> int:
        return self.num_tokens + self.num_sentences

    def padded(self, order: int) -> tuple[np.ndarray, np.ndarray]:
        """Stream ``<S>*(order-1) w1 .. wn </S>`` per sentence, and the positions to predict."""
        pad = order - 1
        n_sent = self.num_sentences
        span = self.lengths + pad + 1
        starts = np.zeros(n_sent, dtype=np.int64)
        if n_sent:
            np.cumsum(span[:-1], out=starts[1:])
        stream = np.full(int(span.sum()), BOS_ID, dtype=np.int64)
        tok_starts = np.zeros(n_sent, dtype=np.int64)
        if n_sent:
            np.cumsum(self.lengths[:-1], out=tok_starts[1:])
        shift = np.repeat(starts + pad - tok_starts, self.lengths)
        stream[shift + np.arange(self.num_tokens, dtype=np.int64)] = self.ids
        stream[starts + pad + self.lengths] = EOS_ID
        targets = np.flatnonzero(stream != BOS_ID)
        return stream, targets


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
# Models
# --------------------------------------------------------------------------------------------


def kn_discounts(n1: int, n2: int, n3: int, n4: int) -> tuple[tuple[float, float, float], bool]:
    """Chen & Goodman's (D1, D2, D3+) from count-of-counts; (fallback, True) if not estimable."""
    if min(n1, n2, n3, n4) <= 0:
        return FALLBACK_DISCOUNTS, True
    y = n1 / (n1 + 2 * n2)
    d = (1 - 2 * y * n2 / n1, 2 - 3 * y * n3 / n2, 3 - 4 * y * n4 / n3)
    if not all(0 < dr <= r for r, dr in zip((1, 2, 3), d)):
        return FALLBACK_DISCOUNTS, True
    return d, False


class UnigramAddOne:
    name = "unigram"
    order = 1

    def __init__(self, corpus: Corpus, vocab_size: int):
        stream, targets = corpus.padded(1)
        counts = np.bincount(stream[targets], minlength=vocab_size).astype(np.float64)
        counts[BOS_ID] = 0
        support = vocab_size - 1
        self.p = (counts + 1.0) / (counts.sum() + support)
        self.p[BOS_ID] = 0.0

    def distribution(self, context=()) -> np.ndarray:
        return self.p.copy()

    def logprobs(self, corpus: Corpus) -> np.ndarray:
        stream, targets = corpus.padded(1)
        return np.log(self.p[stream[targets]])


@dataclass
class _Level:
    """One order k >= 2: sorted k-gram keys with their (adjusted) counts, per-history sums."""

    keys: np.ndarray  # int64, sorted, key = history_key * V + w
    counts: np.ndarray  # int64 a_k
    hist: np.ndarray  # int64, sorted distinct history keys
    hist_start: np.ndarray  # int64, first index in keys of each history (+ sentinel at end)
    total: np.ndarray  # float64, sum_w a_k(h w)
    gamma: np.ndarray  # float64, D1 N1(h.) + D2 N2(h.) + D3 N3+(h.)
    discounts: np.ndarray  # float64 [0, D1, D2, D3+]
    fallback: bool = False
    count_of_counts: tuple[int, int, int, int] = (0, 0, 0, 0)


@dataclass
class KneserNey:
    """Interpolated modified Kneser-Ney of any order >= 1 (order 1 = KN unigram + uniform)."""

    order: int
    vocab_size: int
    p1: np.ndarray = field(repr=False)  # float64 [V], the order-1 distribution
    levels: list[_Level] = field(repr=False)  # orders 2..N
    unigram_discounts: np.ndarray = field(repr=False)
    unigram_fallback: bool = False
    unigram_count_of_counts: tuple[int, int, int, int] = (0, 0, 0, 0)

    @property
    def name(self) -> str:
        return {2: "kn_bigram", 3: "kn_trigram"}.get(self.order, f"kn_{self.order}gram")

    # ---- estimation -------------------------------------------------------------------------

    @classmethod
    def fit(cls, corpus: Corpus, vocab_size: int, order: int = 3) -> KneserNey:
        if order < 1:
            raise ValueError("order must be >= 1")
        v = vocab_size
        if corpus.num_sentences == 0:
            raise ValueError("empty training corpus")
        if order * math.log2(max(v, 2)) >= 62:
            raise ValueError(f"order {order} with vocabulary {v} overflows int64 keys")
        stream, targets = corpus.padded(order)

        # Highest order: raw counts of every predicted n-gram.
        key = np.zeros(targets.size, dtype=np.int64)
        for back in range(order - 1, -1, -1):
            key *= v
            key += stream[targets - back]
        keys, raw = np.unique(key, return_counts=True)
        del key
        adj = raw

        by_order: dict[int, tuple[np.ndarray, np.ndarray]] = {order: (keys, adj)}
        for k in range(order - 1, 0, -1):
            # k-grams are the suffixes of the (k+1)-grams (padding gives every prediction a full
            # window); continuation count = number of distinct (k+1)-gram types per suffix.
            suffix = keys % (v**k)
            keys_k, inverse, cont = np.unique(suffix, return_inverse=True, return_counts=True)
            raw_k = np.bincount(inverse, weights=raw, minlength=keys_k.size).astype(np.int64)
            first = keys_k // (v ** (k - 1)) if k > 1 else keys_k
            adj_k = np.where(first == BOS_ID, raw_k, cont) if k > 1 else cont
            by_order[k] = (keys_k, adj_k)
            keys, raw = keys_k, raw_k

        # Order 1: continuation unigram interpolated with the uniform distribution.
        keys1, a1 = by_order[1]
        a1_full = np.zeros(v, dtype=np.int64)
        a1_full[keys1] = a1
        coc1 = _count_of_counts(a1)
        d1, fb1 = kn_discounts(*coc1)
        disc1 = np.array((0.0, *d1))
        total1 = float(a1.sum())
        support = v - 1
        if total1 > 0:
            gamma1 = float((disc1[np.minimum(a1, 3)]).sum())
            p1 = (np.maximum(a1_full - disc1[np.minimum(a1_full, 3)], 0) + gamma1 / support) / total1
        else:
            p1 = np.full(v, 1.0 / support)
        p1[BOS_ID] = 0.0

        levels = []
        for k in range(2, order + 1):
            keys_k, a_k = by_order[k]
            coc = _count_of_counts(a_k)
            d, fb = kn_discounts(*coc)
            disc = np.array((0.0, *d))
            hist_key = keys_k // v
            hist, hist_start = np.unique(hist_key, return_index=True)
            del hist_key
            capped = np.minimum(a_k, 3)
            total = np.add.reduceat(a_k, hist_start).astype(np.float64)
            gamma = np.add.reduceat(disc[capped], hist_start)
            levels.append(
                _Level(
                    keys=keys_k,
                    counts=a_k,
                    hist=hist,
                    hist_start=np.append(hist_start, keys_k.size).astype(np.int64),
                    total=total,
                    gamma=gamma,
                    discounts=disc,
                    fallback=fb,
                    count_of_counts=coc,
                )
            )
        return cls(
            order=order,
            vocab_size=v,
            p1=p1,
            levels=levels,
            unigram_discounts=disc1,
            unigram_fallback=fb1,
            unigram_count_of_counts=coc1,
        )

    # ---- scoring ----------------------------------------------------------------------------

    def prob(self, history: np.ndarray, words: np.ndarray) -> np.ndarray:
        """p(words[i] | history[i]); history is [n, order-1] ids (oldest first)."""
        v = self.vocab_size
        words = np.asarray(words, dtype=np.int64)
        history = np.asarray(history, dtype=np.int64).reshape(words.size, self.order - 1)
        p = self.p1[words]
        hkey = np.zeros(words.size, dtype=np.int64)
        for k, level in enumerate(self.levels, start=2):
            hkey = hkey + history[:, self.order - k] * v ** (k - 2)  # one token further back
            hi = np.searchsorted(level.hist, hkey)
            hi_c = np.minimum(hi, level.hist.size - 1)
            seen_h = (hi < level.hist.size) & (level.hist[hi_c] == hkey)
            full = hkey * v + words
            ki = np.searchsorted(level.keys, full)
            ki_c = np.minimum(ki, level.keys.size - 1)
            seen = (ki < level.keys.size) & (level.keys[ki_c] == full)
            c = np.where(seen, level.counts[ki_c], 0)
            num = np.maximum(c - level.discounts[np.minimum(c, 3)], 0) + level.gamma[hi_c] * p
            p = np.where(seen_h, num / level.total[hi_c], p)
        return p

    def logprobs(self, corpus: Corpus, chunk: int = 1 << 21) -> np.ndarray:
        stream, targets = corpus.padded(self.order)
        out = np.empty(targets.size, dtype=np.float64)
        for lo in range(0, targets.size, chunk):
            t = targets[lo : lo + chunk]
            hist = (
                np.stack([stream[t - back] for back in range(self.order - 1, 0, -1)], axis=1)
                if self.order > 1
                else np.zeros((t.size, 0), dtype=np.int64)
            )
            out[lo : lo + chunk] = np.log(self.prob(hist, stream[t]))
        return out

    def distribution(self, context=()) -> np.ndarray:
        """p(. | context) over the whole vocabulary (index = id; p[<S>] = 0).

        ``context`` holds the last ``order - 1`` ids, oldest first (``<S>`` ids pad short ones).
        """
        v = self.vocab_size
        ctx = [BOS_ID] * (self.order - 1) + [int(i) for i in context]
        ctx = ctx[len(ctx) - (self.order - 1) :] if self.order > 1 else []
        p = self.p1.copy()
        hkey = 0
        for k, level in enumerate(self.levels, start=2):
            hkey += ctx[self.order - k] * v ** (k - 2)
            hi = int(np.searchsorted(level.hist, hkey))
            if hi >= level.hist.size or level.hist[hi] != hkey:
                continue
            lo, up = level.hist_start[hi], level.hist_start[hi + 1]
            words = level.keys[lo:up] % v
            c = level.counts[lo:up]
            q = level.gamma[hi] * p
            q[words] += np.maximum(c - level.discounts[np.minimum(c, 3)], 0)
            p = q / level.total[hi]
        return p

    def describe(self) -> dict:
        orders = {
            "1": {
                "discounts": [float(x) for x in self.unigram_discounts[1:]],
                "count_of_counts": list(self.unigram_count_of_counts),
                "fallback": self.unigram_fallback,
            }
        }
        for k, level in enumerate(self.levels, start=2):
            orders[str(k)] = {
                "discounts": [float(x) for x in level.discounts[1:]],
                "count_of_counts": list(level.count_of_counts),
                "fallback": level.fallback,
                "ngram_types": int(level.keys.size),
                "histories": int(level.hist.size),
            }
        return orders


def _count_of_counts(a: np.ndarray) -> tuple[int, int, int, int]:
    small = np.bincount(np.minimum(a, 5), minlength=6)
    return int(small[1]), int(small[2]), int(small[3]), int(small[4])


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
