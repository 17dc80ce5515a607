"""elmo_cache.text.ptb: the PTB-style rules the bundled model's training text went through."""

from __future__ import annotations

import pytest

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
