"""elmo_cache.store.staging: a sentence as ``tokens/bytes`` stores it, and back."""

from __future__ import annotations

import numpy as np

from elmo_cache.store.staging import decode_tokens, encode_tokens, stored_key

SENTENCES = [
    ["The", "cat", "sat", "."],
    [],
    ["a token with spaces", "x"],  # a listed key: its tokens cannot be joined by spaces
    ["", "empty", ""],
    ["caf\u00e9", "\ud800"],  # a lone surrogate: stored with surrogatepass, as the corpus reader keeps it
]


def test_a_stored_sentence_decodes_to_its_tokens():
    for tokens in SENTENCES:
        assert decode_tokens(stored_key(tokens)) == tokens


def test_encode_tokens_concatenates_each_sentences_stored_key():
    text, sizes = encode_tokens(SENTENCES)
    assert text.dtype == np.uint8 and sizes.tolist() == [len(stored_key(t)) for t in SENTENCES]
    ends = np.cumsum(sizes)
    starts = ends - sizes
    raw = text.tobytes()
    assert [decode_tokens(raw[a:b]) for a, b in zip(starts, ends)] == SENTENCES
