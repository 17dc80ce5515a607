"""A deterministic English-like corpus for benchmarks.

What matters for ELMo's speed is the *shape* of the text, not its meaning: how long
sentences are (the LSTM runs over every position, and padding to a batch's longest
sentence wastes work), how long words are (the char-CNN's cost is fixed per token, but a
per-word-type cache pays in proportion to how Zipfian the vocabulary is), and how many
distinct word types a batch holds. So the generator draws

- sentence lengths from a lognormal (mean ~25 tokens) mixed with a small share of much
  longer sentences, clipped to [1, 200], like news and web text;
- tokens from a Zipf law (s = 1.1) over a fixed vocabulary, with frequent words short
  (function words and punctuation at the top ranks, long rare words in the tail);
- word forms from English-like syllables, some capitalised (names), some numbers, plus
  punctuation tokens; the first word of a sentence is capitalised and most end with ".".

Everything follows from the seed, so every run of a benchmark sees the same text.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CorpusStats", "make_vocabulary", "make_corpus", "corpus_stats", "write_corpus", "take_tokens"]

_ONSETS = (
    "",
    "",
    "",
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "y",
    "z",
    "bl",
    "br",
    "ch",
    "cl",
    "cr",
    "dr",
    "fl",
    "fr",
    "gr",
    "pl",
    "pr",
    "sh",
    "sl",
    "sp",
    "st",
    "str",
    "th",
    "tr",
    "wh",
)
_NUCLEI = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ea", "ee", "ou", "ai", "oo", "y", "ie")
_CODAS = (
    "",
    "",
    "",
    "",
    "n",
    "r",
    "s",
    "t",
    "l",
    "d",
    "m",
    "ng",
    "st",
    "nt",
    "rd",
    "ck",
    "th",
    "ss",
    "ll",
    "rs",
    "ts",
    "nd",
)
_SUFFIXES = ("", "", "", "", "", "s", "ed", "ing", "ly", "er", "tion", "ment", "ness", "al", "ity")
# The most frequent tokens of English text are short function words and punctuation.
_TOP = (
    "the",
    ",",
    ".",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "that",
    "for",
    "it",
    "was",
    "on",
    "with",
    "as",
    "he",
    "be",
    "by",
    "at",
    "'s",
    "from",
    "his",
    "an",
    "have",
    "are",
    "not",
    "this",
    "''",
    "``",
    "but",
    "had",
    "they",
    "(",
    ")",
    "or",
    "which",
    "-",
    "were",
    "she",
    "has",
    "their",
    "one",
    "you",
    "been",
    "all",
    "would",
    "there",
    "we",
    ":",
    "its",
    "will",
    "more",
    "when",
    "who",
    "said",
    "--",
    ";",
    "?",
    "$",
    "%",
    "!",
)


def _syllable(rng: np.random.Generator) -> str:
    return _ONSETS[rng.integers(len(_ONSETS))] + _NUCLEI[rng.integers(len(_NUCLEI))] + _CODAS[rng.integers(len(_CODAS))]


def _number(rng: np.random.Generator) -> str:
    kind = rng.integers(4)
    if kind == 0:
        return str(int(rng.integers(1, 100)))
    if kind == 1:
        return str(int(rng.integers(1900, 2030)))
    if kind == 2:
        return f"{rng.integers(0, 1000)}.{rng.integers(0, 100):02d}"
    return f"{rng.integers(1, 1000)},{rng.integers(0, 1000):03d}"


def make_vocabulary(size: int = 50_000, seed: int = 0) -> list[str]:
    """``size`` distinct word-like strings in frequency-rank order (most frequent first).

    Below the fixed top tokens, word length grows with rank (in expectation): a word's
    number of syllables is drawn from a distribution whose mean rises with log(rank).
    About 12% of words are capitalised (names) and 3% are numbers.
    """
    rng = np.random.default_rng(seed)
    words: list[str] = list(_TOP[:size])
    seen = set(words)
    while len(words) < size:
        rank = len(words) + 1
        kind = rng.random()
        if kind < 0.03:
            word = _number(rng)
        else:
            mean_syllables = 0.7 + 0.18 * np.log(rank)
            n_syl = 1 + int(rng.poisson(max(mean_syllables - 1.0, 0.05)))
            word = "".join(_syllable(rng) for _ in range(n_syl))
            if rng.random() < 0.25:
                word += _SUFFIXES[rng.integers(len(_SUFFIXES))]
            if kind < 0.15:
                word = word.capitalize()
        if word and word not in seen:
            seen.add(word)
            words.append(word)
    return words


def _sentence_lengths(n: int, rng: np.random.Generator, mean: float) -> np.ndarray:
    # 95% "ordinary" sentences (lognormal, sigma 0.55) and 5% long ones (lists, legal text,
    # unsplit paragraphs) with about 3x the median length; together mean ~ `mean`.
    sigma_main, sigma_long, long_share, long_factor = 0.55, 0.45, 0.05, 3.2
    # Solve the main lognormal's mu so that the mixture's mean is `mean` (before clipping).
    base = mean / ((1 - long_share) + long_share * long_factor)
    mu_main = np.log(base) - sigma_main**2 / 2
    mu_long = np.log(base * long_factor) - sigma_long**2 / 2
    is_long = rng.random(n) < long_share
    lengths = np.where(is_long, rng.lognormal(mu_long, sigma_long, n), rng.lognormal(mu_main, sigma_main, n))
    return np.clip(np.rint(lengths), 1, 200).astype(np.int64)


def make_corpus(
    n_tokens: int,
    *,
    seed: int = 0,
    vocab_size: int = 50_000,
    zipf_s: float = 1.1,
    mean_length: float = 25.0,
) -> list[list[str]]:
    """Sentences (lists of tokens) totalling at least ``n_tokens`` tokens, deterministically.

    The same ``seed`` and parameters always give the same corpus, and a larger
    ``n_tokens`` extends a smaller one (the first sentences are identical).
    """
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    vocab = make_vocabulary(vocab_size, seed)
    rng = np.random.default_rng(seed + 1)
    ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
    cdf = np.cumsum(ranks**-zipf_s)
    cdf /= cdf[-1]
    sentences: list[list[str]] = []
    total = 0
    while total < n_tokens:
        # Draw in blocks so that the corpus is a prefix-stable function of the seed.
        lengths = _sentence_lengths(1024, rng, mean_length)
        ids = np.searchsorted(cdf, rng.random(int(lengths.sum())), side="right")
        ends = rng.random(len(lengths))
        pos = 0
        for length, end in zip(lengths.tolist(), ends.tolist()):
            tokens = [vocab[i] for i in ids[pos : pos + length]]
            pos += length
            if length > 3:
                # Sentence-final punctuation and a capitalised first word, as in real text.
                tokens[-1] = "." if end < 0.85 else ("?" if end < 0.93 else "!")
                tokens[0] = tokens[0][:1].upper() + tokens[0][1:]
            sentences.append(tokens)
            total += length
            if total >= n_tokens:
                break
    return sentences


def take_tokens(sentences: list[list[str]], n_tokens: int) -> list[list[str]]:
    """The leading sentences of ``sentences`` holding at least ``n_tokens`` tokens (or all)."""
    out, total = [], 0
    for sentence in sentences:
        if total >= n_tokens:
            break
        out.append(sentence)
        total += len(sentence)
    return out


@dataclass(frozen=True)
class CorpusStats:
    """Shape of a corpus: what the encoder's speed depends on."""

    sentences: int
    tokens: int
    mean_length: float
    p50_length: float
    p99_length: float
    max_length: int
    distinct_words: int
    mean_word_chars: float  # mean UTF-8 length of a token occurrence

    def line(self) -> str:
        return (
            f"{self.sentences} sentences, {self.tokens} tokens; sentence length mean "
            f"{self.mean_length:.1f} p50 {self.p50_length:.0f} p99 {self.p99_length:.0f} max "
            f"{self.max_length}; {self.distinct_words} distinct words, mean word "
            f"{self.mean_word_chars:.1f} chars"
        )


def corpus_stats(sentences: list[list[str]]) -> CorpusStats:
    """Realised length and vocabulary statistics of ``sentences``."""
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    word_lengths = [len(w.encode("utf-8")) for s in sentences for w in s]
    return CorpusStats(
        sentences=len(sentences),
        tokens=int(lengths.sum()),
        mean_length=float(lengths.mean()),
        p50_length=float(np.percentile(lengths, 50)),
        p99_length=float(np.percentile(lengths, 99)),
        max_length=int(lengths.max()),
        distinct_words=len({w for s in sentences for w in s}),
        mean_word_chars=float(np.mean(word_lengths)),
    )


def write_corpus(sentences: list[list[str]], path: str | Path) -> Path:
    """One sentence a line, tokens separated by single spaces (what ``tokenize`` reads back)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for sentence in sentences:
            f.write(" ".join(sentence))
            f.write("\n")
    return path


if __name__ == "__main__":  # python benchmarks/_corpus.py [n_tokens] [out.txt]
    import sys

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    corpus = make_corpus(n)
    print(corpus_stats(corpus).line())
    for s in corpus[:3]:
        print(" ".join(s))
    if len(sys.argv) > 2:
        print("wrote", write_corpus(corpus, sys.argv[2]))
