"""Streaming reader for corpora.

A corpus is a text file (``-`` for stdin, gzip read transparently) holding, by
default, one sentence per line, tokens separated by whitespace, as the original ELMo
tools expect; tab-separated tokens and CoNLL-U are the other input formats
(:mod:`elmo_cache.text.formats`). It is read line by line and never held whole, so
its size is bounded by the disk, not by memory.

Defined behaviour for awkward input (documented for users in ``elmo-cache build --help``):

* Line ``i`` (0-based) is sentence ``i``. Lines are split on ``\\n`` only; the
  file's last line needs no final newline, and a final newline adds no sentence.
* Empty or whitespace-only lines are sentences of zero tokens, so rows stay aligned
  with lines.
* CRLF line ends: the ``\\r`` is whitespace and disappears in :func:`tokenize`.
  A lone ``\\r`` inside a line also separates tokens (``str.split`` semantics).
* A UTF-8 BOM at the start of a line is dropped (:func:`tokenize`); elsewhere it is
  part of its token.
* NUL bytes are not whitespace for ``str.split``: a NUL stays inside its token and
  reaches the model as character byte 0, like any other byte.
* Invalid UTF-8: with ``errors="strict"`` (default) a :class:`CorpusError` naming the
  file, line and byte offset; with ``errors="replace"`` each bad byte becomes U+FFFD.
* Long lines and tokens are read whole (a 20,000-token line is one sentence, a 1 MB
  token is one token whose characters the model cuts to 48 bytes, as the original
  does). Only a line longer than ``max_line_bytes`` (64 MiB by default) is refused, since
  a file like that is almost surely not one sentence per line, and reading it would
  cost unbounded memory.
* A truncated or corrupt gzip stream: :class:`CorpusError` naming the line where it broke.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import BinaryIO

from elmo_cache.errors import CorpusError, InvalidParameterError
from elmo_cache.text.formats import check_input_format, conllu_sentences, count_conllu, tsv_tokens
from elmo_cache.text.tokenize import LINE_TOKENIZERS, WHITESPACE, tokenizer_for

__all__ = ["Corpus", "ERRORS", "MAX_LINE_BYTES"]

ERRORS = ("strict", "replace")
"""Valid values of ``errors``: what to do with bytes that are not UTF-8."""

MAX_LINE_BYTES = 64 * 1024 * 1024
"""Longest line accepted by default (bytes, newline excluded)."""

_GZIP_MAGIC = b"\x1f\x8b"
_READ_BLOCK = 1 << 20


class Corpus:
    """A corpus file (or ``-`` for stdin) read as a stream of sentences.

    Iterate :meth:`sentences` for token lists or :meth:`lines` for decoded text;
    both may skip a prefix (``start``) without decoding it, which is how a build resumes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        errors: str = "strict",
        max_line_bytes: int = MAX_LINE_BYTES,
        input_format: str = "lines",
        tokenize: str = WHITESPACE,
    ) -> None:
        if errors not in ERRORS:
            raise InvalidParameterError(f"errors: {errors!r} is not valid; choose from {list(ERRORS)}")
        self.errors = errors
        self.input_format = check_input_format(input_format)
        if tokenize not in LINE_TOKENIZERS:
            raise InvalidParameterError(f"tokenize: {tokenize!r} is not valid; choose from {list(LINE_TOKENIZERS)}")
        if tokenize != WHITESPACE and self.input_format != "lines":
            raise InvalidParameterError(
                f"tokenize: {tokenize!r} splits lines of text; --input-format {self.input_format} holds tokens "
                "already (leave --tokenize out)"
            )
        # How a line becomes tokens ("lines" only): whitespace or PTB-style (elmo_cache.text.tokenize).
        self.tokenize = tokenize
        self._split = tokenizer_for(tokenize)
        self.max_line_bytes = int(max_line_bytes)
        self.is_stdin = str(path) == "-"
        self.path = None if self.is_stdin else Path(path)
        self.name = "<stdin>" if self.is_stdin else str(path)
        if self.path is not None:
            if not self.path.exists():
                raise CorpusError(f"corpus not found: {self.path}")
            if self.path.is_dir():
                raise CorpusError(f"corpus is a directory, expected a text file: {self.path}")
        self._used_stdin = False

    @classmethod
    def as_built(cls, path: str | os.PathLike[str], meta: dict[str, object]) -> Corpus:
        """The corpus at ``path`` read as the build that wrote the cache metadata ``meta`` read its input."""
        build = meta.get("build")
        args = build.get("args") if isinstance(build, dict) else None
        args = args if isinstance(args, dict) else {}
        input_format = str(args.get("input_format", "lines"))
        tokenize = str(meta.get("tokenization")) if input_format == "lines" else WHITESPACE
        return cls(
            path,
            errors=str(args.get("errors", "strict")),
            input_format=input_format,
            tokenize=tokenize if tokenize in LINE_TOKENIZERS else WHITESPACE,
        )

    @property
    def tokenization(self) -> str:
        """Metadata ``tokenization``: how the tokens were read (``whitespace``, ``ptb``, ``tsv``, ``conllu``)."""
        return self.tokenize if self.input_format == "lines" else self.input_format

    @property
    def is_regular_file(self) -> bool:
        """True when the input can be read twice (a first pass can count its lines)."""
        return self.path is not None and stat.S_ISREG(self.path.stat().st_mode)

    def describe(self) -> dict[str, object]:
        """Where the corpus came from, for build metadata."""
        if self.path is None:
            return {"path": "-", "bytes": None}
        resolved = self.path.resolve()
        size = resolved.stat().st_size if self.is_regular_file else None
        return {"path": str(resolved), "bytes": size}

    # -- reading -----------------------------------------------------------------------------

    def _open(self) -> BinaryIO:
        if self.path is None:
            if self._used_stdin:
                raise CorpusError("stdin can be read only once")
            self._used_stdin = True
            raw: BinaryIO = sys.stdin.buffer
            if not isinstance(raw, io.BufferedReader):
                raw = io.BufferedReader(raw)  # type: ignore[type-var]
            magic = raw.peek(2)[:2]
        else:
            try:
                raw = self.path.open("rb")
            except OSError as exc:
                raise CorpusError(f"cannot read corpus {self.path}: {exc.strerror}") from None
            magic = raw.read(2)
            raw.seek(0)
        if magic == _GZIP_MAGIC:
            return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
        if self.path is not None and self.path.suffix == ".gz":
            raw.close()
            raise CorpusError(f"{self.path}: named .gz but not gzip data")
        return raw

    def raw_lines(self) -> Iterator[bytes]:
        """Undecoded lines without their ``\\n``; errors name the line."""
        f = self._open()
        # One byte more than the longest line: room for its newline, and proof of excess without it.
        limit = self.max_line_bytes + 1
        number = 0
        try:
            while True:
                try:
                    raw = f.readline(limit)
                except (EOFError, OSError, zlib.error) as exc:
                    raise CorpusError(
                        f"{self.name}, line {number + 1}: corrupt or truncated compressed data ({exc})"
                    ) from None
                if not raw:
                    return
                if raw.endswith(b"\n"):
                    raw = raw[:-1]
                elif len(raw) > self.max_line_bytes:
                    raise CorpusError(
                        f"{self.name}, line {number + 1}: longer than {self.max_line_bytes} bytes; "
                        "expected one sentence per line"
                    )
                number += 1
                yield raw
        finally:
            if self.path is not None:
                f.close()

    def decode(self, raw: bytes, number: int) -> str:
        """Decode one line (0-based ``number``) following ``errors``."""
        try:
            return raw.decode("utf-8", self.errors)
        except UnicodeDecodeError as exc:
            bad = raw[exc.start : exc.start + 4]
            raise CorpusError(
                f"{self.name}, line {number + 1}: invalid UTF-8 at byte {exc.start} ({bad!r}); "
                "fix the file or pass --errors replace (each bad byte becomes U+FFFD)"
            ) from None

    def lines(self, start: int = 0) -> Iterator[tuple[int, str]]:
        """``(line_number, text)`` pairs from line ``start`` on (earlier lines read, not decoded)."""
        for number, raw in enumerate(self.raw_lines()):
            if number >= start:
                yield number, self.decode(raw, number)

    def sentences(self, start: int = 0) -> Iterator[tuple[int, list[str]]]:
        """``(sentence_number, tokens)`` pairs from sentence ``start`` on, as the input format splits them.

        For ``lines`` and ``tsv`` the sentence number is the line number and empty lines give empty
        token lists; for ``conllu`` it counts the blocks.
        """
        if self.input_format == "conllu":
            yield from conllu_sentences(self.raw_lines(), self.decode, self.name, start)
        elif self.input_format == "tsv":
            for number, text in self.lines(start):
                yield number, tsv_tokens(text, self.name, number)
        else:
            split = self._split
            for number, text in self.lines(start):
                yield number, split(text)

    def count_sentences(self) -> int | None:
        """Number of sentences (lines, or CoNLL-U blocks), by a scan that decodes nothing; None for pipes."""
        if self.input_format != "conllu":
            return self.count_lines()
        if not self.is_regular_file:
            return None
        try:
            return count_conllu(self.raw_lines())
        except CorpusError:
            return None  # the real pass reports the damage with its line number

    def count_lines(self) -> int | None:
        """Number of sentences, by a fast byte scan; ``None`` for stdin or pipes."""
        if not self.is_regular_file:
            return None
        f = self._open()
        count = 0
        last = b"\n"
        try:
            while True:
                try:
                    block = f.read(_READ_BLOCK)
                except (EOFError, OSError, zlib.error):
                    return None  # the real pass reports the damage with its line number
                if not block:
                    break
                count += block.count(b"\n")
                last = block[-1:]
        finally:
            f.close()
        return count + (last != b"\n")

    def count_tokens(self, limit: int) -> int | None:
        """Number of tokens, as :meth:`sentences` splits them, when there are at most ``limit``; ``None`` when
        there are more, and for stdin or pipes (which cannot be read twice) or damage (which the real pass
        reports with its line number). Reading stops once ``limit`` is passed: the cost is bounded by
        ``limit``, not by the corpus."""
        if not self.is_regular_file:
            return None
        count = 0
        try:
            sentences = self.sentences()
            with closing(sentences):  # type: ignore[type-var]  # a generator: close() ends the file's read
                for _, tokens in sentences:
                    count += len(tokens)
                    if count > limit:
                        return None
        except CorpusError:
            return None
        return count
