"""A small reader of the WordNet 3.0 database files, and the probe examples drawn from them.

Only what the quality probes need: the synsets of ``data.noun``/``data.verb`` (their words and
the double-quoted example sentences of their glosses), the sense order of ``index.*`` (WordNet
lists a lemma's synsets most frequent first) and the irregular forms of ``*.exc``. The format
is WordNet's ``wndb(5WN)``; the files come from Debian's wordnet-base package::

    apt-get download wordnet-base && dpkg-deb -x wordnet-base_*.deb DIR
    # then pass --wordnet DIR/usr/share/wordnet

Examples are tokenised as the bundled model's training text was (PTB-style, by
``scripts/bundled_model/build_corpus.py``, whose rules are in ``_ptb_text.py``), then split on
whitespace as ``build`` and ``serve`` split every line (``elmo_cache.text.tokenize``), so a probe
sees the tokens a cache would hold.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from elmo_cache.text.tokenize import tokenize as split_line

__all__ = [
    "POS_NAMES",
    "Synset",
    "Example",
    "WordNetMissingError",
    "check_wordnet_dir",
    "parse_data_line",
    "read_data",
    "read_index",
    "read_exceptions",
    "word_forms",
    "locate",
    "tokenize_example",
    "collect_examples",
    "split_of",
]

POS_NAMES = {"n": "noun", "v": "verb"}
_HOW_TO_GET = (
    "get it from Debian's wordnet-base package: `apt-get download wordnet-base && "
    "dpkg-deb -x wordnet-base_*.deb DIR`, then pass --wordnet DIR/usr/share/wordnet"
)
_EXAMPLE = re.compile(r'"([^"]+)"')
# Adjective words carry a syntactic marker such as "(a)" or "(ip)"; it is not part of the word.
_MARKER = re.compile(r"\([a-z]+\)$")


class WordNetMissingError(FileNotFoundError):
    """The WordNet directory or one of its files is not there."""


@dataclass(frozen=True)
class Synset:
    offset: int
    pos: str  # the ss_type of the line: "n", "v" (or "a", "s", "r" in the other files)
    words: tuple[str, ...]  # lower-cased, multiword lemmas joined by "_" as WordNet writes them
    examples: tuple[str, ...]


@dataclass(frozen=True)
class Example:
    """One occurrence of a lemma in an example sentence of one of its synsets."""

    lemma: str
    pos: str
    offset: int  # the synset: the sense label
    rank: int  # the synset's place in the lemma's index line (0 = WordNet's most frequent sense)
    tokens: tuple[str, ...]
    index: int  # where the lemma (or an inflected form of it) is in tokens

    @property
    def key(self) -> str:
        """What identifies the example; the train/test split hashes it."""
        return f"{self.lemma}|{self.pos}|{self.offset}|{' '.join(self.tokens)}"


def check_wordnet_dir(directory: str | Path, pos: Iterable[str] = ("n", "v")) -> Path:
    """``directory`` as a Path, or a :class:`WordNetMissingError` naming what is missing and how to get it."""
    directory = Path(directory)
    if not directory.is_dir():
        raise WordNetMissingError(f"WordNet directory not found: {directory}; {_HOW_TO_GET}")
    for p in pos:
        for name in (f"data.{POS_NAMES[p]}", f"index.{POS_NAMES[p]}"):
            if not (directory / name).is_file():
                raise WordNetMissingError(
                    f"{directory}: {name} is missing (not a WordNet 3.0 dict dir?); {_HOW_TO_GET}"
                )
    return directory


def parse_data_line(line: str) -> Synset | None:
    """A ``data.*`` line as a Synset; None for the licence header (lines starting with spaces)."""
    if line.startswith(" ") or not line.strip():
        return None
    head, bar, gloss = line.partition(" | ")
    if not bar:  # a gloss-less line still has "|" at its end
        head, _, gloss = line.partition("|")
    fields = head.split()
    try:
        offset, pos, n_words = int(fields[0]), fields[2], int(fields[3], 16)  # w_cnt is two hex digits
        words = tuple(_MARKER.sub("", fields[4 + 2 * k]).lower() for k in range(n_words))
    except (IndexError, ValueError):
        raise ValueError(f"not a WordNet data line: {line[:80]!r}") from None
    examples = tuple(e.strip() for e in _EXAMPLE.findall(gloss) if e.strip())
    return Synset(offset, pos, words, examples)


def read_data(directory: Path, pos: str) -> dict[int, Synset]:
    """Every synset of ``data.{noun,verb}``, by byte offset (the id the index uses)."""
    synsets = {}
    with open(Path(directory) / f"data.{POS_NAMES[pos]}", encoding="utf-8", errors="replace") as f:
        for line in f:
            synset = parse_data_line(line)
            if synset is not None:
                synsets[synset.offset] = synset
    return synsets


def read_index(directory: Path, pos: str) -> dict[str, list[int]]:
    """lemma -> its synset offsets, most frequent sense first (``index.*``: the last synset_cnt fields)."""
    index = {}
    with open(Path(directory) / f"index.{POS_NAMES[pos]}", encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(" ") or not line.strip():
                continue
            fields = line.split()
            n_synsets = int(fields[2])
            index[fields[0].lower()] = [int(o) for o in fields[-n_synsets:]]
    return index


def read_exceptions(directory: Path, pos: str) -> dict[str, set[str]]:
    """base form -> its irregular inflections (``noun.exc``/``verb.exc`` list inflected -> base); {} if absent."""
    path = Path(directory) / f"{POS_NAMES[pos]}.exc"
    irregular: dict[str, set[str]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            fields = line.lower().split()
            for base in fields[1:]:
                irregular.setdefault(base, set()).add(fields[0])
    return irregular


def word_forms(lemma: str, pos: str, irregular: dict[str, set[str]] | None = None) -> set[str]:
    """The lemma and its regular inflections (plural; 3rd person, past, -ing) plus its irregular ones.

    Over-generating is harmless here: a form is only looked for in that lemma's own examples.
    """
    forms = {lemma, lemma + "s", lemma + "es"}
    consonant_y = len(lemma) > 1 and lemma.endswith("y") and lemma[-2] not in "aeiou"
    if consonant_y:
        forms.add(lemma[:-1] + "ies")  # city -> cities, carry -> carries
    if pos == "v":
        stem = lemma[:-1] if lemma.endswith("e") else lemma
        forms |= {stem + "ed", stem + "ing", lemma + "d"}
        if consonant_y:
            forms.add(lemma[:-1] + "ied")
        cvc = len(lemma) > 2 and lemma[-1] not in "aeiouwxy" and lemma[-2] in "aeiou" and lemma[-3] not in "aeiou"
        if cvc:
            forms |= {lemma + lemma[-1] + "ed", lemma + lemma[-1] + "ing"}  # stop -> stopped, stopping
    return forms | (irregular or {}).get(lemma, set())


def locate(tokens: Iterable[str], forms: set[str]) -> int | None:
    """Position of the first token that is one of ``forms`` (case-insensitive), or None."""
    for i, token in enumerate(tokens):
        if token.lower() in forms:
            return i
    return None


# build_corpus.py's text rules (clean, split, tokenise), in their own module beside it.
_CORPUS_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bundled_model" / "_ptb_text.py"
_tokenizer: Callable[[str], list[str]] | None = None


def _corpus_tokenizer() -> Callable[[str], list[str]]:
    """``clean`` + ``tokenize`` of the script that made the bundled model's corpus (loaded once)."""
    global _tokenizer
    if _tokenizer is None:
        spec = importlib.util.spec_from_file_location("_elmo_ptb_text", _CORPUS_SCRIPT)
        if spec is None or spec.loader is None or not _CORPUS_SCRIPT.is_file():
            raise FileNotFoundError(f"{_CORPUS_SCRIPT} is missing: run the probes from a checkout of the repository")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _tokenizer = lambda text: module.tokenize(module.clean(text))  # noqa: E731 - a one-line closure
    return _tokenizer


def tokenize_example(text: str) -> list[str]:
    """An example sentence as the model's training text and a cache line would hold it."""
    return split_line(" ".join(_corpus_tokenizer()(text)))


def collect_examples(
    directory: Path, pos_list: Iterable[str] = ("n", "v"), *, min_length: int = 3
) -> tuple[list[Example], dict[str, int]]:
    """Every located occurrence of a single-word lemma in its own synsets' examples, and counts.

    Counts: ``short_lemmas`` (lemmas shorter than ``min_length``: skipped), ``examples``
    (lemma-example pairs looked at), ``not_found`` (the lemma is not in the tokenised example
    in any form it is known to take: skipped), ``duplicates`` (the same sentence for the same
    lemma again, in another sense: skipped, or it would be in train and test with two labels).
    """
    out: list[Example] = []
    counts = {"short_lemmas": 0, "examples": 0, "not_found": 0, "duplicates": 0}
    seen: set[tuple[str, tuple[str, ...]]] = set()
    token_cache: dict[str, tuple[str, ...]] = {}
    for pos in pos_list:
        synsets, index, irregular = (
            read_data(directory, pos),
            read_index(directory, pos),
            read_exceptions(directory, pos),
        )
        for lemma, offsets in index.items():
            if "_" in lemma or "-" in lemma:  # multiword and hyphenated lemmas are not one token
                continue
            if len(lemma) < min_length:  # "a" (ampere), "in" (inch): found as function words, not as themselves
                counts["short_lemmas"] += 1
                continue
            forms = word_forms(lemma, pos, irregular)
            for rank, offset in enumerate(offsets):
                synset = synsets.get(offset)
                if synset is None:
                    raise ValueError(f"{directory}: index.{POS_NAMES[pos]} names synset {offset} of {lemma!r}, absent")
                for text in synset.examples:
                    counts["examples"] += 1
                    tokens = token_cache.get(text)
                    if tokens is None:
                        tokens = token_cache[text] = tuple(tokenize_example(text))
                    where = locate(tokens, forms)
                    if where is None:
                        counts["not_found"] += 1
                        continue
                    if (lemma, tokens) in seen:
                        counts["duplicates"] += 1
                        continue
                    seen.add((lemma, tokens))
                    out.append(Example(lemma, pos, offset, rank, tokens, where))
    return out, counts


def split_of(key: str, test_share: float, seed: int = 0) -> str:
    """ "train" or "test" for ``key``, by a seeded hash: the same on every run and machine."""
    digest = hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest()
    return "test" if int.from_bytes(digest, "little") / 2**64 < test_share else "train"
