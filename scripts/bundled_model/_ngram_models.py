"""The n-gram models of ngram_baselines.py: add-one unigram and interpolated Kneser-Ney (modified discounts)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

BOS, EOS, UNK = "<S>", "</S>", "<UNK>"
BOS_ID, EOS_ID, UNK_ID = 0, 1, 2
FALLBACK_DISCOUNTS = (0.5, 1.0, 1.5)


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
