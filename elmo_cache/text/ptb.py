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

# Each rule with the text it cannot match without: a substring of the text as the earlier rules left it (they
# only add spaces, and turn runs of dots or dashes into three dots or two dashes), searched in the text, or
# with ``fold`` in its lower-case form. A rule is run only where that is present: lines of ordinary prose
# lack most of these characters, and scanning for a substring costs little next to running a pattern that
# starts with a lookbehind (the corpus check of an update tokenises every line: issue 32).
_RULES: list[tuple[re.Pattern[str], str, str | None, bool]] = [
    (re.compile(r'"'), ' " ', '"', False),
    (re.compile(r"\.\.\.+"), " ... ", "...", False),
    (re.compile(r"([;@#$%&?!\[\](){}<>*|~^\u2014\u2013])"), r" \1 ", None, False),
    (re.compile(r"--+"), " -- ", "--", False),
    (re.compile(r"(?<!\d),|,(?!\d)"), " , ", ",", False),
    (re.compile(r"(?<!\d):|:(?!\d)"), " : ", ":", False),
    (re.compile(r"/(?=\s)|(?<=\s)/"), " / ", "/", False),
    # The final period, after any closing quotes or brackets already split off.
    (re.compile(r"([^.])\.(\s*(?:[\])}>\"']\s*)*)$"), r"\1 . \2", ".", False),
    # An opening single quote that does not start a contraction ('tis, 'em).
    (re.compile(r"(^|\s)'(?!(?:tis|twas|twere|twill|em|s|re|ve|ll|d|m|t)\b)(?=\S)", re.I), r"\1' ", "'", False),
    (re.compile(r"([^'\s])'(?=\s|$)"), r"\1 ' ", "'", False),  # a closing single quote
    (re.compile(r"([^'\s])('[sSmMdD])(?=\s|$)"), r"\1 \2", "'", False),
    (re.compile(r"([^'\s])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T)(?=\s|$)"), r"\1 \2", "'", False),
    (re.compile(r"\b(can)(not)\b", re.I), r"\1 \2", "cannot", True),
]


def ptb_tokenize(text: str) -> list[str]:
    """The tokens of one sentence, split PTB-style (a leading BOM dropped, as :func:`tokenize` does)."""
    padded = " " + text.lstrip("\ufeff") + " "
    for pattern, replacement, needs, fold in _RULES:
        if needs is None or needs in (padded.lower() if fold else padded):
            padded = pattern.sub(replacement, padded)
    return padded.split()
