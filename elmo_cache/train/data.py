"""Training data: a corpus held as integer arrays, cut into bilm-tf style streams.

Every epoch the sentences are shuffled (seeded by the epoch, so any batch can be
recomputed from ``(seed, epoch, batch)`` alone: that is what makes resuming exact),
wrapped as ``<S> tokens </S>`` and concatenated; the stream is cut into
``batch_size`` contiguous rows read ``unroll`` tokens at a time, so the LSTM state
of row ``b`` at the end of one batch is the right start for the next. The backward
direction reads the same sentences, each reversed, in the same rows: both
directions see the same text in every batch.

Words have two ids. The *type* id indexes every distinct string of the corpus and
selects its characters (the char-CNN reads every word, known or not); the *target*
id is its softmax row, ``<UNK>`` for words outside the vocabulary. Types are numbered
so that a vocabulary word's type id equals its target id.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from elmo_cache.errors import CorpusError
from elmo_cache.model.chars import word_char_ids
from elmo_cache.text.corpus import Corpus
from elmo_cache.train.vocab import BOS, EOS, Vocabulary

__all__ = ["TokenizedCorpus", "StreamBatch", "read_sentences", "count_tokens"]


def read_sentences(path: str | os.PathLike[str]) -> Iterator[list[str]]:
    """Token lists of a corpus file (gzip read transparently; errors name the line), skipping
    empty lines: they hold nothing to predict."""
    for _, tokens in Corpus(path).sentences():
        if tokens:
            yield tokens


@dataclass
class StreamBatch:
    """One training step: ``inputs`` and ``targets`` are (2, batch, unroll), direction 0 = forward.

    ``inputs`` holds type ids, ``targets`` softmax ids; ``weights`` is 1 where a target counts
    (0 for the stream's tail and for the trivial sentence start after an end). ``resets``
    (batch, unroll), when given, is True where a sentence begins that is to be read from the
    initial (zero) LSTM state instead of the state carried from the text before it, in both
    directions. ``counts`` (2,), when given, is the summed weights of the whole (global) batch
    per direction, of which this batch may be one rank's rows.
    """

    inputs: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    resets: np.ndarray | None = None
    counts: np.ndarray | None = None


class TokenizedCorpus:
    """A text as type-id arrays plus the character ids of every type."""

    def __init__(self, sentences: list[np.ndarray], types: list[str], vocab: Vocabulary, max_chars: int = 50):
        self.vocab = vocab
        self.types = types
        self.lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        self.offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=self.offsets[1:])
        self.tokens = np.concatenate(sentences).astype(np.int32) if sentences else np.zeros(0, dtype=np.int32)
        self.type_to_target = np.minimum(np.arange(len(types)), len(vocab)).astype(np.int64)
        self.type_to_target[len(vocab) :] = vocab.id("<UNK>")
        # Unshifted ids (0..260): training uses the 261-row table the weight file stores.
        self.char_ids = np.stack([word_char_ids(t, max_chars) - 1 for t in types]).astype(np.int16)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], vocab: Vocabulary, max_chars: int = 50) -> TokenizedCorpus:
        type_ids: dict[str, int] = {word: i for i, word in enumerate(vocab.words)}
        types = list(vocab.words)
        sentences = []
        for tokens in read_sentences(path):
            ids = np.empty(len(tokens), dtype=np.int32)
            for k, token in enumerate(tokens):
                i = type_ids.get(token)
                if i is None:
                    i = type_ids[token] = len(types)
                    types.append(token)
                ids[k] = i
            sentences.append(ids)
        if not sentences:
            raise CorpusError(f"{path}: no tokens (every line is empty)")
        return cls(sentences, types, vocab, max_chars)

    @property
    def n_sentences(self) -> int:
        return len(self.lengths)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    def oov_rate(self) -> float:
        return float(np.mean(self.tokens >= len(self.vocab))) if self.n_tokens else 0.0

    # ----------------------------------------------------------------- streams
    def streams(self, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward type-id streams of the sentences in ``order`` (default: file order)."""
        if order is None:
            order = np.arange(self.n_sentences)
        lengths = self.lengths[order] + 2
        starts = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        forward = np.empty(int(starts[-1]), dtype=np.int32)
        backward = np.empty_like(forward)
        bos, eos = self.vocab.id(BOS), self.vocab.id(EOS)
        # Position k inside its sentence, for every stream slot.
        owner = np.repeat(np.arange(len(order)), lengths)
        position = np.arange(len(forward)) - starts[owner]
        first_token = self.offsets[order][owner]
        inner = (position > 0) & (position < lengths[owner] - 1)
        forward[inner] = self.tokens[first_token[inner] + position[inner] - 1]
        backward[inner] = self.tokens[first_token[inner] + (lengths[owner][inner] - 2 - position[inner])]
        forward[position == 0] = bos
        backward[position == 0] = eos
        last = position == lengths[owner] - 1
        forward[last] = eos
        backward[last] = bos
        return forward, backward

    def epoch_order(self, seed: int, epoch: int) -> np.ndarray:
        return np.random.default_rng([seed, epoch]).permutation(self.n_sentences)

    def batches_per_epoch(self, batch_size: int, unroll: int, reset_share: float | None = None) -> int:
        if reset_share is None:
            row = (self.n_tokens + 2 * self.n_sentences) // batch_size
        else:
            row = self._sentence_row_length(batch_size)
        return max(0, (row - 1) // unroll)

    def _sentence_row_length(self, batch_size: int) -> int:
        """How far every row of :meth:`_sentence_rows` is read, whatever the sentence order: a row
        starts less than one longest sentence after its even cut and ends at or after the next."""
        longest = int(self.lengths.max()) + 2 if self.n_sentences else 0
        return (self.n_tokens + 2 * self.n_sentences) // batch_size - longest

    def _sentence_rows(self, order: np.ndarray, batch_size: int) -> np.ndarray:
        """Stream positions where ``batch_size`` rows begin: the first sentence start at or after
        each even cut of the stream."""
        starts = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(self.lengths[order] + 2, out=starts[1:])
        wanted = np.arange(batch_size) * starts[-1] // batch_size
        return starts[np.searchsorted(starts[:-1], wanted, side="left").clip(max=len(order) - 1)]

    def epoch_batches(
        self,
        seed: int,
        epoch: int,
        batch_size: int,
        unroll: int,
        start: int = 0,
        reset_share: float | None = None,
        part: slice | None = None,
    ) -> Iterator[StreamBatch]:
        """Batches ``start..`` of one epoch (each a pure function of its arguments).

        ``part``: only these rows of each ``batch_size``-row batch (one rank's share of a
        data-parallel global batch); ``counts`` still sums the whole batch.

        ``reset_share`` None: bilm-tf's layout, the shuffled stream cut into ``batch_size`` equal
        rows (which may begin mid-sentence) with the LSTM state carried throughout. A number in
        [0, 1]: every row begins at a sentence start, and that share of the sentences (drawn per
        epoch from the seed) is read from the initial state, as the encoder reads every sentence;
        the others carry the state of the text before them.
        """
        mine = slice(None) if part is None else part
        order = self.epoch_order(seed, epoch)
        forward, backward = self.streams(order)
        bos, eos = self.vocab.id(BOS), self.vocab.id(EOS)
        if reset_share is None:
            rows = len(forward) // batch_size
            both = np.stack([forward[: rows * batch_size], backward[: rows * batch_size]]).reshape(2, batch_size, rows)
            resets = None
        else:
            cuts, rows = self._sentence_rows(order, batch_size), max(self._sentence_row_length(batch_size), 0)
            take = (cuts[:, None] + np.arange(rows)).reshape(-1)
            both = np.stack([forward[take], backward[take]]).reshape(2, len(cuts), rows)
            # Its own generator, so that the share changes which sentences reset and nothing else.
            chosen = np.random.default_rng([seed, epoch, 1]).random(len(order)) < reset_share
            starts = np.zeros(len(order), dtype=np.int64)
            np.cumsum(self.lengths[order][:-1] + 2, out=starts[1:])
            reset_at = np.zeros(len(forward), dtype=bool)
            reset_at[starts[chosen]] = True
            resets = reset_at[take].reshape(len(cuts), rows)
        for k in range(start, self.batches_per_epoch(batch_size, unroll, reset_share)):
            window = both[:, :, k * unroll : (k + 1) * unroll + 1]
            targets = self.type_to_target[window[:, :, 1:]]
            weights = _counted(targets, bos, eos)
            batch_resets = None if resets is None else resets[mine, k * unroll : (k + 1) * unroll].copy()
            yield StreamBatch(
                window[:, mine, :-1].copy(),
                np.ascontiguousarray(targets[:, mine]),
                np.ascontiguousarray(weights[:, mine]),
                batch_resets,
                counts=weights.sum(axis=(1, 2), dtype=np.float64),
            )

    def evaluation_batches(self, batch_size: int, unroll: int) -> Iterator[StreamBatch]:
        """The text in file order, cut into at most ``batch_size`` rows that each begin at a sentence
        start (as bilm-tf's rows do: an LSTM started from zeros in mid-sentence is off its training
        distribution, and can stay there for hundreds of tokens), read to the end."""
        forward, backward = self.streams()
        sentence_starts = np.zeros(self.n_sentences, dtype=np.int64)
        np.cumsum(self.lengths[:-1] + 2, out=sentence_starts[1:])
        wanted = np.arange(batch_size) * len(forward) // batch_size
        cuts = np.unique(
            sentence_starts[np.searchsorted(sentence_starts, wanted, side="left").clip(max=len(sentence_starts) - 1)]
        )
        bounds = np.append(cuts, len(forward))
        width = int(np.max(np.diff(bounds)))
        # Each row also holds the first slot of the next row, so every slot but the very first is
        # a target exactly once; -1 pads the shorter rows.
        both = np.full((2, len(cuts), width + 1), -1, dtype=np.int64)
        for row, (a, b) in enumerate(itertools.pairwise(bounds)):
            stop = min(b + 1, len(forward))
            both[0, row, : stop - a] = forward[a:stop]
            both[1, row, : stop - a] = backward[a:stop]
        bos, eos = self.vocab.id(BOS), self.vocab.id(EOS)
        for k in range(0, width, unroll):
            window = both[:, :, k : k + unroll + 1]
            inputs = np.maximum(window[:, :, :-1], 0)
            next_ids = window[:, :, 1:]
            targets = self.type_to_target[np.maximum(next_ids, 0)]
            weights = _counted(targets, bos, eos) * (next_ids >= 0) * (window[:, :, :-1] >= 0)
            yield StreamBatch(inputs, targets, weights.astype(np.float32))


def _counted(targets: np.ndarray, bos: int, eos: int) -> np.ndarray:
    """1 where a target is a real prediction. A sentence start always follows a sentence end
    in the forward stream (and the reverse in the backward one): predicting it is free, and
    counting it would flatter the perplexity. So every sentence of n tokens contributes
    exactly n + 1 predictions per direction, as an n-gram model's does."""
    weights = np.ones(targets.shape, dtype=np.float32)
    weights[0][targets[0] == bos] = 0.0
    weights[1][targets[1] == eos] = 0.0
    return weights


def count_tokens(path: str | os.PathLike[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for tokens in read_sentences(path):
        counts.update(tokens)
    return counts
