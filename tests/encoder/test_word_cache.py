"""The encoder's per-word cache of token vectors: exact answers, bounded size, cleared on demand."""

from __future__ import annotations

import torch

from elmo_cache.encoder.word_cache import WordVectorCache


def _computer():
    asked: list[list[str]] = []

    def compute(words: list[str]) -> torch.Tensor:
        asked.append(list(words))
        return torch.tensor([[float(len(w)), float(ord(w[0]))] for w in words])

    return compute, asked


def _expected(words: list[str]) -> torch.Tensor:
    return torch.tensor([[float(len(w)), float(ord(w[0]))] for w in words])


def test_answers_equal_computing_and_only_new_words_are_computed():
    compute, asked = _computer()
    cache = WordVectorCache(capacity=3, dim=2, device=torch.device("cpu"), compute=compute)
    assert torch.equal(cache.vectors(["cat", "dog"]), _expected(["cat", "dog"]))
    assert torch.equal(cache.vectors(["dog", "emu", "cat"]), _expected(["dog", "emu", "cat"]))
    assert asked == [["cat", "dog"], ["emu"]] and len(cache) == 3
    # Past the capacity a word is computed again every time, and the answers stay right.
    assert torch.equal(cache.vectors(["fox", "cat"]), _expected(["fox", "cat"]))
    assert torch.equal(cache.vectors(["fox"]), _expected(["fox"]))
    assert asked[-2:] == [["fox"], ["fox"]] and len(cache) == 3


def test_clear_forgets_and_zero_capacity_never_keeps():
    compute, asked = _computer()
    cache = WordVectorCache(capacity=5, dim=2, device=torch.device("cpu"), compute=compute)
    cache.vectors(["ant", "bee"])
    cache.clear()
    assert len(cache) == 0
    assert torch.equal(cache.vectors(["bee"]), _expected(["bee"])) and asked[-1] == ["bee"]
    none = WordVectorCache(capacity=0, dim=2, device=torch.device("cpu"), compute=compute)
    for _ in range(2):
        assert torch.equal(none.vectors(["owl", "yak"]), _expected(["owl", "yak"]))
    assert asked[-2:] == [["owl", "yak"], ["owl", "yak"]] and len(none) == 0
