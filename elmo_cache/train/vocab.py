"""The training vocabulary: ``<S>``, ``</S>``, ``<UNK>`` first, then words by falling frequency.

The order matters twice: the log-uniform sampler assumes id order is frequency order, and
``vocab.txt`` is the file bilm-tf and allennlp read (one token per line, in id order).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from elmo_cache.errors import CorpusError, InvalidParameterError

__all__ = ["Vocabulary", "BOS", "EOS", "UNK", "SPECIAL_TOKENS"]

BOS = "<S>"
EOS = "</S>"
UNK = "<UNK>"
SPECIAL_TOKENS = (BOS, EOS, UNK)


class Vocabulary:
    """Softmax targets: a word's id is its row in the softmax; unknown words map to ``<UNK>``."""

    def __init__(self, words: Sequence[str]):
        if tuple(words[:3]) != SPECIAL_TOKENS:
            raise InvalidParameterError(f"a vocabulary must start with {list(SPECIAL_TOKENS)}, got {list(words[:3])}")
        self.words = list(words)
        self.ids = {word: i for i, word in enumerate(self.words)}
        if len(self.ids) != len(self.words):
            duplicates = [w for w, n in Counter(self.words).items() if n > 1][:5]
            raise InvalidParameterError(f"vocabulary has duplicate entries, e.g. {duplicates}")

    def __len__(self) -> int:
        return len(self.words)

    def id(self, word: str) -> int:
        """The softmax id of ``word`` (``<UNK>``'s for unknown words)."""
        return self.ids.get(word, 2)

    @classmethod
    def from_counts(cls, counts: Counter[str], *, min_count: int = 3, max_size: int | None = None) -> Vocabulary:
        """Words seen at least ``min_count`` times, most frequent first (ties in code-point order)."""
        if min_count < 1:
            raise InvalidParameterError(f"min_count: must be >= 1, got {min_count}")
        ranked = sorted(
            ((word, n) for word, n in counts.items() if n >= min_count and word not in SPECIAL_TOKENS),
            key=lambda item: (-item[1], item[0]),
        )
        if max_size is not None:
            if max_size < len(SPECIAL_TOKENS) + 1:
                raise InvalidParameterError(f"max_vocab: must be at least {len(SPECIAL_TOKENS) + 1}, got {max_size}")
            ranked = ranked[: max_size - len(SPECIAL_TOKENS)]
        return cls([*SPECIAL_TOKENS, *(word for word, _ in ranked)])

    @classmethod
    def load(cls, path: str | Path) -> Vocabulary:
        """Read a ``vocab.txt`` (one token per line)."""
        path = Path(path)
        if not path.is_file():
            raise CorpusError(f"vocabulary file not found: {path}")
        words = path.read_text(encoding="utf-8").splitlines()
        try:
            return cls(words)
        except InvalidParameterError as exc:
            raise CorpusError(f"{path}: {exc}") from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text("".join(word + "\n" for word in self.words), encoding="utf-8")

    @property
    def sha256(self) -> str:
        return hashlib.sha256("\n".join(self.words).encode("utf-8")).hexdigest()
