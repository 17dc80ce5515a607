"""Cleaning, sentence splitting and PTB-style tokenisation of the bundled corpus's text (see build_corpus.py)."""

from __future__ import annotations

import re

from elmo_cache.text.ptb import ptb_tokenize

# Sentences outside these token counts are dropped.
MIN_TOKENS, MAX_TOKENS = 1, 200

# --------------------------------------------------------------------------------------
# Text processing
# --------------------------------------------------------------------------------------
_QUOTE_MAP = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u2032": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u201f": '"',
        "\u2033": '"',
        "\u00a0": " ",
        "\u2009": " ",
        "\u200a": " ",
        "\u2002": " ",
        "\u2003": " ",
        "\u200b": "",
        "\u00ad": "",
        "\ufeff": "",
        "\u2026": "...",
    }
)
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_WS = re.compile(r"\s+")


def clean(text):
    text = text.translate(_QUOTE_MAP)
    text = _CTRL.sub(" ", text)
    text = text.replace("``", '"').replace("''", '"')
    return _WS.sub(" ", text).strip()


ABBREV = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "st",
    "jr",
    "sr",
    "prof",
    "rev",
    "gen",
    "col",
    "capt",
    "lt",
    "sgt",
    "hon",
    "messrs",
    "mme",
    "mlle",
    "esq",
    "gov",
    "sen",
    "rep",
    "co",
    "corp",
    "inc",
    "ltd",
    "bros",
    "vs",
    "etc",
    "e.g",
    "i.e",
    "cf",
    "al",
    "approx",
    "no",
    "nos",
    "vol",
    "vols",
    "fig",
    "figs",
    "eq",
    "sec",
    "secs",
    "ch",
    "chap",
    "p",
    "pp",
    "ed",
    "eds",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "mt",
    "ft",
    "u.s",
    "u.k",
    "a.m",
    "p.m",
    "viz",
    "ca",
    "dept",
    "univ",
    "assn",
    "ave",
    "blvd",
    "op",
    "esp",
    "incl",
    "max",
    "min",
    "ref",
    "resp",
    "b.c",
    "a.d",
}
# candidate sentence end: [.?!] (+ closing quotes/brackets), whitespace, then something
# that can start a sentence
_SENT_END = re.compile(r"""([.?!]+)(["')\]]*)\s+(?=["'(\[]*[A-Z0-9])""")
_LAST_WORD = re.compile(r"(\S+)$")


def split_sentences(text):
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        punct = m.group(1)
        if punct == ".":
            w = _LAST_WORD.search(text, start, m.start())
            word = w.group(1) if w else ""
            bare = word.lstrip("\"'([").lower()
            if bare in ABBREV:
                continue
            if len(bare) == 1 and bare.isalpha():  # initials: "J. Smith"
                continue
            if re.fullmatch(r"(?:[a-z]\.)+[a-z]", bare):  # "e.g", "U.S.A"
                continue
        end = m.end(2)
        out.append(text[start:end].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


# The tokeniser lives in the package (lookups must split as the build did): one definition.
tokenize = ptb_tokenize


# leading list enumerators ("1. ", "(2) ", "iv. ") are dropped
_ENUM = re.compile(r"^(?:\(?\d{1,3}[.)]|\([a-z]\)|[ivx]{1,4}\.)\s+(?=\S)")


def paragraph_sentences(text):
    """Clean a paragraph, split it into sentences, tokenise; yield token lists."""
    text = _ENUM.sub("", clean(text))
    if not text:
        return
    for sent in split_sentences(text):
        toks = tokenize(sent)
        if MIN_TOKENS <= len(toks) <= MAX_TOKENS:
            yield toks


# --------------------------------------------------------------------------------------
