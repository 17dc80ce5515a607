"""Input formats of a corpus: how its lines become sentences (token lists).

* ``lines``: one sentence per line, tokens separated by whitespace (the original tools' input).
* ``tsv``: one sentence per line, tokens separated by tabs, each kept exactly as written (spaces
  inside a token stay: Vietnamese syllables, multi-word names). An empty line is a sentence of no
  tokens, so line ``i`` is still sentence ``i``; a final ``\\r`` (CRLF) and a BOM opening the line are
  dropped. An empty token (two tabs in a row, a tab at either end) is an error naming the line.
* ``conllu``: Universal Dependencies' CoNLL-U. A sentence is a block of word lines ended by a blank
  line (or the end of the file); ``#`` lines are comments; a word line has 10 tab-separated fields
  and the token is its FORM (the second). Multiword-token ranges (``3-4``) and empty nodes (``5.1``)
  are not words of the sentence and are skipped, as UD's own tools count words. A block of comments
  alone is no sentence. Sentence ``i`` is the ``i``-th block.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator

from elmo_cache.errors import CorpusError, InvalidParameterError

__all__ = ["INPUT_FORMATS", "check_input_format", "tsv_tokens", "conllu_sentences", "count_conllu"]

INPUT_FORMATS = ("lines", "tsv", "conllu")
"""Valid ``input_format`` values (see the module docstring)."""

_CONLLU_FIELDS = 10
_WORD_ID = re.compile(r"[1-9][0-9]*")
_SKIPPED_ID = re.compile(r"[1-9][0-9]*-[1-9][0-9]*|[0-9]+\.[1-9][0-9]*")


def check_input_format(name: str) -> str:
    """``name`` if it is an input format, else :class:`InvalidParameterError` listing the valid ones."""
    if name not in INPUT_FORMATS:
        raise InvalidParameterError(f"input_format: {name!r} is not valid; choose from {list(INPUT_FORMATS)}")
    return name


def tsv_tokens(text: str, where: str, number: int) -> list[str]:
    """The tokens of one decoded tsv line (0-based ``number`` of the file ``where``)."""
    text = text.lstrip("\ufeff")
    if text.endswith("\r"):
        text = text[:-1]
    if not text:
        return []
    tokens = text.split("\t")
    for k, token in enumerate(tokens):
        if not token:
            raise CorpusError(
                f"{where}, line {number + 1}: token {k + 1} of {len(tokens)} is empty (two tabs in a row, or a "
                "tab at the start or end of the line); tsv input has one token between each pair of tabs"
            )
    return tokens


def _is_blank(raw: bytes) -> bool:
    return not raw.strip()


def conllu_sentences(
    raw_lines: Iterable[bytes], decode: Callable[[bytes, int], str], where: str, start: int = 0
) -> Iterator[tuple[int, list[str]]]:
    """``(sentence_number, tokens)`` of a CoNLL-U stream, from sentence ``start`` on.

    Lines of earlier sentences are read to find the block ends but not decoded (how a build resumes).
    """
    tokens: list[str] = []
    number = 0  # sentences ended so far
    in_block = False
    for line_number, raw in enumerate(raw_lines):
        if _is_blank(raw):
            if in_block:
                if number >= start:
                    yield number, tokens
                number += 1
                tokens = []
                in_block = False
            continue
        if number < start:
            in_block = in_block or not raw.lstrip(b"\xef\xbb\xbf").startswith(b"#")
            continue
        text = decode(raw, line_number).lstrip("\ufeff")
        if text.endswith("\r"):
            text = text[:-1]
        if text.startswith("#"):
            continue
        in_block = True
        fields = text.split("\t")
        if len(fields) != _CONLLU_FIELDS:
            raise CorpusError(
                f"{where}, line {line_number + 1}: a CoNLL-U word line has {_CONLLU_FIELDS} tab-separated fields, "
                f"this one has {len(fields)}: {text[:80]!r}"
            )
        word_id, form = fields[0], fields[1]
        if _WORD_ID.fullmatch(word_id):
            if not form:
                raise CorpusError(f"{where}, line {line_number + 1}: word {word_id} has an empty FORM")
            tokens.append(form)
        elif not _SKIPPED_ID.fullmatch(word_id):
            raise CorpusError(
                f"{where}, line {line_number + 1}: ID {word_id!r} is not a CoNLL-U word ID (1, 2, ...), "
                "multiword range (3-4) or empty node (5.1)"
            )
    if in_block and number >= start:
        yield number, tokens


def count_conllu(raw_lines: Iterable[bytes]) -> int:
    """Sentences of a CoNLL-U stream (blocks holding a word line), without decoding it."""
    count = 0
    in_block = False
    for raw in raw_lines:
        if _is_blank(raw):
            count += in_block
            in_block = False
        elif not raw.lstrip(b"\xef\xbb\xbf").startswith(b"#"):
            in_block = True
    return count + in_block
