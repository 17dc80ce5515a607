"""Tokenisation and sentence identity, shared by build, reader and server.

elmo-cache follows the original tools: a sentence is one line and its tokens are
separated by whitespace. Pre-tokenised input (``--input-format tsv|conllu``) may
hold tokens with spaces inside (Vietnamese syllables, "New York"); a sentence is
then its token list exactly as given.

A sentence's *key* is one string that tells token lists apart:

* tokens without whitespace (every whitespace-split line): the tokens joined by
  single spaces, so ``"a  b"`` and ``"a b"`` are the same sentence;
* otherwise (a token holds whitespace, or is empty): a newline, then the tokens
  joined by newlines. No key of the first kind holds a newline, so the two kinds
  never meet, and caches built before token lists existed keep their keys.

A token may not hold a newline (no input format can carry one). Its *hash* is the
first 8 bytes of BLAKE2b over the UTF-8 key, read little-endian as an unsigned
64-bit integer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from elmo_cache.text.ptb import ptb_tokenize

__all__ = [
    "tokenize",
    "tokenizer_for",
    "LINE_TOKENIZERS",
    "WHITESPACE",
    "PTB",
    "sentence_key",
    "sentence_hash",
    "key_hash",
    "split_key",
    "is_storable",
    "has_plain_tokens",
]

WHITESPACE = "whitespace"
PTB = "ptb"

LINE_TOKENIZERS = (WHITESPACE, PTB)
"""How a line of text may become tokens (``build --tokenize``): ``str.split``, or the PTB-style rules of
:mod:`elmo_cache.text.ptb` that the bundled model's training text went through."""

# Starts a key whose tokens are joined by newlines (a plain key never holds a newline).
_LISTED = "\n"


def tokenize(sentence: str) -> list[str]:
    """Split a sentence on runs of whitespace (``str.split()``), dropping a leading BOM."""
    return sentence.lstrip("\ufeff").split()


def tokenizer_for(tokenization: str | None) -> Callable[[str], list[str]]:
    """How a text query becomes tokens for a cache whose metadata records ``tokenization``: the PTB-style
    rules for ``"ptb"``, whitespace for anything else (a whitespace build, and the pre-tokenised formats,
    whose text queries have always been split on whitespace)."""
    return ptb_tokenize if tokenization == PTB else tokenize


def _plain_key(tokens: list[str]) -> str | None:
    """The tokens joined by one space when every token is non-empty and free of whitespace, else None."""
    plain = " ".join(tokens)
    # One join and one split in C: an empty token or one holding whitespace changes the split.
    return plain if plain.split() == tokens else None


def has_plain_tokens(tokens: Sequence[str]) -> bool:
    """Whether every token is non-empty and free of whitespace (what ``tokenize`` can give)."""
    return _plain_key(list(tokens)) is not None


def is_storable(tokens: Sequence[str]) -> bool:
    """Whether a cache can hold this token list: no token holds a newline."""
    return not any("\n" in token for token in tokens)


def sentence_key(sentence: str | Sequence[str]) -> str:
    """The canonical text of a sentence (see the module docstring): plain tokens joined by one space."""
    tokens = tokenize(sentence) if isinstance(sentence, str) else list(sentence)
    plain = _plain_key(tokens)
    return plain if plain is not None else _LISTED + _LISTED.join(tokens)


def split_key(key: str) -> list[str]:
    """The token list of a stored key (the inverse of :func:`sentence_key`)."""
    if key.startswith(_LISTED):
        return key[1:].split(_LISTED)
    return key.split(" ") if key else []


def key_hash(key: bytes) -> int:
    """64-bit hash of a sentence key in UTF-8 (``surrogatepass``), as stored in a cache's sentence index: for
    a caller that holds the key's bytes already (a lookup confirms against them, verify reads them)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def sentence_hash(sentence: str | Sequence[str]) -> int:
    """64-bit hash of :func:`sentence_key`, as stored in a cache's sentence index."""
    return key_hash(sentence_key(sentence).encode("utf-8", "surrogatepass"))
