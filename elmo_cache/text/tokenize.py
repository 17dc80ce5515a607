"""Tokenisation and sentence identity, shared by build, reader and server.

elmo-cache follows the original tools: a sentence is one line and its tokens are
separated by whitespace. A sentence's *key* is its tokens joined by single spaces,
so ``"a  b"`` and ``"a b"`` are the same sentence; its *hash* is the first 8 bytes
of BLAKE2b over the UTF-8 key, read little-endian as an unsigned 64-bit integer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["tokenize", "sentence_key", "sentence_hash"]


def tokenize(sentence: str) -> list[str]:
    """Split a sentence on runs of whitespace (``str.split()``), dropping a leading BOM."""
    return sentence.lstrip("\ufeff").split()


def sentence_key(sentence: str | Sequence[str]) -> str:
    """The canonical text of a sentence: tokens joined by one space."""
    tokens = tokenize(sentence) if isinstance(sentence, str) else list(sentence)
    return " ".join(tokens)


def sentence_hash(sentence: str | Sequence[str]) -> int:
    """64-bit hash of :func:`sentence_key`, as stored in a cache's sentence index."""
    digest = hashlib.blake2b(sentence_key(sentence).encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "little")
