"""elmo_cache.text.ptb: the PTB-style rules the bundled model's training text went through."""

from __future__ import annotations

import random

import pytest

from elmo_cache.text import ptb
from elmo_cache.text.ptb import ptb_tokenize
from elmo_cache.text.tokenize import tokenize, tokenizer_for

CASES = [
    ("The cat sat on the mat.", ["The", "cat", "sat", "on", "the", "mat", "."]),
    ("The cat's on the mat .", ["The", "cat", "'s", "on", "the", "mat", "."]),
    ('He said, "I can\'t go."', ["He", "said", ",", '"', "I", "ca", "n't", "go", ".", '"']),
    ("It costs $5,000 (approx.) -- really?", ["It", "costs", "$", "5,000", "(", "approx.", ")", "--", "really", "?"]),
    ("e.g. the U.S.A. is big...", ["e.g.", "the", "U.S.A.", "is", "big", "..."]),
    (
        "I cannot; you'll see: 10:30 and/or 'tis 'quoted'",
        ["I", "can", "not", ";", "you", "'ll", "see", ":", "10:30", "and/or", "'tis", "'", "quoted", "'"],
    ),
    ("\ufeffBOM first.", ["BOM", "first", "."]),
    ("   ", []),
]


@pytest.mark.parametrize(("text", "tokens"), CASES)
def test_ptb_rules(text, tokens):
    assert ptb_tokenize(text) == tokens


def test_spacing_does_not_change_the_tokens():
    for text, tokens in CASES:
        assert ptb_tokenize(" ".join(tokens)) == tokens  # already split text stays as it is
        if not text.startswith("\ufeff"):  # a BOM is dropped only where a line starts, as by tokenize()
            assert ptb_tokenize("  " + text.replace(" ", "   ") + " ") == tokens


def test_tokenizer_for_what_a_cache_records():
    assert tokenizer_for("ptb") is ptb_tokenize
    for recorded in ("whitespace", "tsv", "conllu", None):
        assert tokenizer_for(recorded) is tokenize


def _every_rule(text: str) -> list[str]:
    """The rules run on every text, whatever it holds: what the guards in ptb_tokenize must not change."""
    padded = " " + text.lstrip("\ufeff") + " "
    for pattern, replacement, _, _ in ptb._RULES:
        padded = pattern.sub(replacement, padded)
    return padded.split()


def test_skipping_a_rule_whose_text_is_absent_changes_nothing():
    # Each rule runs only where the text holds what it needs (a comma for the comma rule, "cannot" in any case
    # for the last one): random text made of what the rules look for, their neighbours and other whitespace.
    words = "... .... -- --- can not CanNot CANNOT n't N'T 's 'S 'll 're 've 'd 'm 'tis 'em 'Twas 10 3 a Bo x.y U.S."
    spaces = [" ", " ", " ", "\t", "\r", "\x0b", "\xa0", "\u2028", "\ufeff"]
    pieces = [*"\",.:;/'-!?()[]$%&\u2014\u2013", *words.split(), *spaces]
    rng = random.Random(32)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 14))) for _ in range(20_000)]
    texts += [text for text, _ in CASES]
    differing = [text for text in texts if ptb_tokenize(text) != _every_rule(text)]
    assert not differing, differing[:5]
    # The random text reaches every rule, so a guard that skipped one it needs would be seen above.
    for pattern, *_ in ptb._RULES:
        assert any(pattern.search(" " + text + " ") for text in texts), pattern.pattern
