"""Character ids exactly as the original ELMo computes them.

A token becomes ``max_characters_per_token`` ids: begin-of-word, its UTF-8 bytes
(cut to ``max_characters_per_token - 2``), end-of-word, then padding. The sentence
boundaries ``<S>`` and ``</S>`` are single special characters inside begin/end-of-word.
Every id is then shifted by +1 so that id 0 can mean "no token here" (batch padding),
which the loader maps to an all-zero embedding row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

__all__ = [
    "BOS_CHAR",
    "EOS_CHAR",
    "BOW_CHAR",
    "EOW_CHAR",
    "PAD_CHAR",
    "word_char_ids",
    "sentence_char_ids",
    "TokenIds",
    "ByteTokenIds",
]

BOS_CHAR = 256
EOS_CHAR = 257
BOW_CHAR = 258
EOW_CHAR = 259
PAD_CHAR = 260

BOS_TOKEN = "<S>"
EOS_TOKEN = "</S>"


def _boundary_ids(char: int, max_chars: int) -> np.ndarray:
    ids = np.full(max_chars, PAD_CHAR + 1, dtype=np.int64)
    ids[:3] = np.array([BOW_CHAR, char, EOW_CHAR]) + 1
    return ids


def word_char_ids(word: str, max_chars: int = 50) -> np.ndarray:
    """The (+1-shifted) character ids of one token, shape ``(max_chars,)``.

    ``<S>`` and ``</S>`` map to the sentence-boundary characters, as in the original;
    any other string is encoded as UTF-8 bytes, dropping what UTF-8 cannot encode
    (unpaired surrogates), exactly as the original does.
    """
    if word == BOS_TOKEN:
        return _boundary_ids(BOS_CHAR, max_chars)
    if word == EOS_TOKEN:
        return _boundary_ids(EOS_CHAR, max_chars)
    data = word.encode("utf-8", "ignore")[: max_chars - 2]
    ids = np.full(max_chars, PAD_CHAR + 1, dtype=np.int64)
    ids[0] = BOW_CHAR + 1
    ids[1 : 1 + len(data)] = np.frombuffer(data, dtype=np.uint8).astype(np.int64) + 1
    ids[1 + len(data)] = EOW_CHAR + 1
    return ids


def sentence_char_ids(tokens: Sequence[str], max_chars: int = 50) -> np.ndarray:
    """Ids of ``<S> tokens </S>``, shape ``(len(tokens) + 2, max_chars)``."""
    rows = [word_char_ids(BOS_TOKEN, max_chars)]
    rows.extend(word_char_ids(t, max_chars) for t in tokens)
    rows.append(word_char_ids(EOS_TOKEN, max_chars))
    return np.stack(rows)


class TokenIds(Protocol):
    """How a model format turns tokens into the ids its token embedder reads."""

    # The sentence-boundary tokens the biLM reads before and after every sentence.
    boundaries: tuple[str, str]

    def char_ids(self, words: Sequence[str]) -> np.ndarray:
        """``(len(words), max_chars)`` int64 rows of the character embedding."""
        ...

    def word_ids(self, words: Sequence[str]) -> np.ndarray | None:
        """``(len(words),)`` int64 rows of the word embedding, or None for models without one."""
        ...


class ByteTokenIds:
    """The bilm-tf models' ids: UTF-8 bytes (:func:`word_char_ids`), no word embedding."""

    boundaries = (BOS_TOKEN, EOS_TOKEN)

    def __init__(self, max_chars: int = 50):
        self.max_chars = max_chars

    def char_ids(self, words: Sequence[str]) -> np.ndarray:
        return np.stack([word_char_ids(w, self.max_chars) for w in words])

    def word_ids(self, words: Sequence[str]) -> np.ndarray | None:
        return None
