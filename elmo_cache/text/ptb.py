"""PTB-style tokenisation: the splitter the bundled model's training text went through.

``scripts/bundled_model/build_corpus.py`` tokenised the bundled model's corpus with these rules (quotes,
brackets and most punctuation split off, a sentence's final period split, clitics such as ``'s`` and
``n't`` split, ``cannot`` as ``can not``), so text that reaches the model through them looks like what it
learned from. Well-kept tokenisers split otherwise (NLTK 3.10.4's ``TreebankWordTokenizer`` writes ``"``
as directional quotes and splits ``'tis``; sacremoses' Moses gives ``can 't`` and ``10 : 30``), and a lookup
must split exactly as the build did, so the rules live here, in the package, once.

``ptb_tokenize("The cat's on the mat.")`` is ``['The', 'cat', "'s", 'on', 'the', 'mat', '.']``.
"""

from __future__ import annotations

import re

__all__ = ["ptb_tokenize"]

_RULES = [
    (re.compile(r'"'), ' " '),
    (re.compile(r"\.\.\.+"), " ... "),
    (re.compile(r"([;@#$%&?!\[\](){}<>*|~^\u2014\u2013])"), r" \1 "),
    (re.compile(r"--+"), " -- "),
    (re.compile(r"(?<!\d),|,(?!\d)"), " , "),
    (re.compile(r"(?<!\d):|:(?!\d)"), " : "),
    (re.compile(r"/(?=\s)|(?<=\s)/"), " / "),
    # The final period, after any closing quotes or brackets already split off.
    (re.compile(r"([^.])\.(\s*(?:[\])}>\"']\s*)*)$"), r"\1 . \2"),
    # An opening single quote that does not start a contraction ('tis, 'em).
    (re.compile(r"(^|\s)'(?!(?:tis|twas|twere|twill|em|s|re|ve|ll|d|m|t)\b)(?=\S)", re.I), r"\1' "),
    (re.compile(r"([^'\s])'(?=\s|$)"), r"\1 ' "),  # a closing single quote
    (re.compile(r"([^'\s])('[sSmMdD])(?=\s|$)"), r"\1 \2"),
    (re.compile(r"([^'\s])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T)(?=\s|$)"), r"\1 \2"),
    (re.compile(r"\b(can)(not)\b", re.I), r"\1 \2"),
]


def ptb_tokenize(text: str) -> list[str]:
    """The tokens of one sentence, split PTB-style (a leading BOM dropped, as :func:`tokenize` does)."""
    padded = " " + text.lstrip("\ufeff") + " "
    for pattern, replacement in _RULES:
        padded = pattern.sub(replacement, padded)
    return padded.split()
