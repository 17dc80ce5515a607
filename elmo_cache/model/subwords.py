"""A Transformer's tokenizer, applied to tokens the cache already split: subwords per stored token.

The cache's tokenisation is the unit (one vector per stored token), so each sentence goes to the
tokenizer as its list of tokens (``is_split_into_words``) and the fast tokenizer's ``word_ids``
say which token each subword came from. A token that gives no subword at all (a lone control
character, say) is read as the tokenizer's unknown token, so that it still has a vector.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from elmo_cache.errors import InvalidParameterError

__all__ = ["load_tokenizer", "special_tokens", "split_sentences"]


def load_tokenizer(directory: Path) -> Any:
    """The fast tokenizer saved in ``directory``; refuses one that cannot map subwords back to tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    if not getattr(tokenizer, "is_fast", False):
        raise InvalidParameterError(
            f"{directory}: its tokenizer ({type(tokenizer).__name__}) is not a fast (Rust) tokenizer, so it cannot "
            "say which stored token each subword comes from (word_ids); save the model with a tokenizer.json "
            "(AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained(DIR))"
        )
    try:
        tokenizer(["a", "b"], is_split_into_words=True, add_special_tokens=False)
    except ValueError as error:
        if "add_prefix_space" not in str(error):
            raise
        # Byte-level BPE (RoBERTa, GPT-2 vocabularies) reads pre-split words only with a space before each.
        tokenizer = AutoTokenizer.from_pretrained(str(directory), add_prefix_space=True)
    return tokenizer


def special_tokens(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a sentence's subwords (e.g. ``[CLS]`` and ``[SEP]``)."""
    encoded = tokenizer(["a"], is_split_into_words=True)
    word_ids = encoded.word_ids()
    inside = [i for i, word in enumerate(word_ids) if word is not None]
    if not inside:
        raise InvalidParameterError("the tokenizer gives no subword for 'a': it cannot encode stored tokens")
    ids = list(encoded["input_ids"])
    return ids[: inside[0]], ids[inside[-1] + 1 :]


def split_sentences(
    tokenizer: Any, sentences: Sequence[Sequence[str]]
) -> list[tuple[list[int], list[tuple[int, int]]]]:
    """Each sentence's subword ids and each token's subword range ``[start, end)`` in them."""
    result: list[tuple[list[int], list[tuple[int, int]]]] = [([], []) for _ in sentences]
    nonempty = [i for i, sentence in enumerate(sentences) if len(sentence)]
    if not nonempty:
        return result
    encoded = tokenizer([list(sentences[i]) for i in nonempty], is_split_into_words=True, add_special_tokens=False)
    unk = tokenizer.unk_token_id
    for row, i in enumerate(nonempty):
        ids = encoded["input_ids"][row]
        word_ids = encoded.word_ids(row)
        by_word: list[list[int]] = [[] for _ in sentences[i]]
        for subword, word in zip(ids, word_ids, strict=True):
            if word is not None:
                by_word[word].append(subword)
        out_ids: list[int] = []
        spans: list[tuple[int, int]] = []
        for k, pieces in enumerate(by_word):
            if not pieces:
                if unk is None:
                    raise InvalidParameterError(
                        f"sentence {i}, token {k} ({sentences[i][k]!r}): the tokenizer maps it to no subword and "
                        "has no unknown token to stand for it"
                    )
                pieces = [unk]
            spans.append((len(out_ids), len(out_ids) + len(pieces)))
            out_ids.extend(pieces)
        result[i] = (out_ids, spans)
    return result
