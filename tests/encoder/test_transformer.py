"""The Transformer encoder: every stored vector equals transformers' own forward, aligned independently here."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

import torch
from transformers import AutoModel, AutoTokenizer

from elmo_cache import Encoder
from elmo_cache.errors import InvalidParameterError, ModelNotFoundError
from elmo_cache.model import transformer
from tests.transformer_fixtures import FAMILIES

SHORT = [
    ["the", "cat", "sat", "on", "the", "mat", "."],
    ["Hello", ",", "world", "!"],
    [],
    ["unbelievable", "tokenisation"],
    ["a"],
]
# Far more subwords than the tiny models' 14 or so positions: encoded in several windows.
LONG = [
    "the",
    "committee",
    "met",
    "on",
    "tuesday",
    "to",
    "discuss",
    "the",
    "new",
    "budget",
    "and",
    "officials",
    "said",
    "the",
    "plan",
    "would",
    "be",
    "published",
    "later",
    "this",
    "year",
    "after",
    "a",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "the",
    "lazy",
    "dog",
]


def _reference(directory, words, subword, window, stride):
    """transformers' forward on the sentence (each window separately, through the tokenizer's own special tokens),
    then one vector per word by the documented rule, written out independently of the encoder's code."""
    tokenizer = AutoTokenizer.from_pretrained(directory)
    if "roberta" in str(directory) or tokenizer.backend_tokenizer.pre_tokenizer.__class__.__name__ == "ByteLevel":
        tokenizer = AutoTokenizer.from_pretrained(directory, add_prefix_space=True)
    model = AutoModel.from_pretrained(directory).eval()
    pieces = [len(tokenizer([w], is_split_into_words=True, add_special_tokens=False)["input_ids"]) for w in words]
    starts = np.concatenate([[0], np.cumsum(pieces)])
    # Windows of whole words, as README.md describes them.
    windows = []
    first = 0
    while True:
        end = first
        while end < len(words) and starts[end + 1] - starts[first] <= window:
            end += 1
        windows.append((first, end))
        if end == len(words):
            break
        nxt = first + 1
        while nxt < end and starts[nxt] < starts[first] + stride:
            nxt += 1
        first = nxt
    states = []
    for first, end in windows:
        batch = tokenizer(words[first:end], is_split_into_words=True, return_tensors="pt")
        with torch.no_grad():
            hidden = torch.stack(model(**batch, output_hidden_states=True).hidden_states)[:, 0]
        states.append((hidden, batch.word_ids()))
    out = []
    for k in range(len(words)):
        scored = [
            (min(starts[k] - starts[f], starts[e] - starts[k + 1]), -w)
            for w, (f, e) in enumerate(windows)
            if f <= k < e
        ]
        w = -max(scored)[1]
        hidden, word_ids = states[w]
        positions = [p for p, word in enumerate(word_ids) if word == k - windows[w][0]]
        pick = {
            "first": hidden[:, positions[0]],
            "last": hidden[:, positions[-1]],
            "mean": hidden[:, positions].mean(1),
        }
        out.append(pick[subword].numpy())
    return np.stack(out, axis=1) if out else np.zeros((hidden.shape[0], 0, hidden.shape[-1]), np.float32)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("subword", ["first", "mean", "last"])
def test_every_vector_equals_transformers_forward(tiny_transformers, family, subword):
    directory = tiny_transformers[family]
    encoder = Encoder.load(f"hf:{directory},subword={subword}", device="cpu")
    options = encoder.identity["options"]
    assert encoder.n_layers == 4 and encoder.output_dim == 16  # embeddings + 3 blocks
    sentences = [*SHORT, LONG]
    got = encoder.embed_batch(sentences)
    for words, vectors in zip(sentences, got, strict=True):
        assert vectors.shape == (4, len(words), 16) and vectors.dtype == np.float32
        if words:
            expected = _reference(directory, words, subword, options["window"], options["stride"])
            np.testing.assert_allclose(vectors, expected, atol=1e-5, rtol=0)
    # The long sentence really went through several windows.
    tokenizer = encoder.tokenizer
    n_subwords = len(tokenizer(LONG, is_split_into_words=True, add_special_tokens=False)["input_ids"])
    assert n_subwords > 2 * options["window"]


@pytest.mark.parametrize("family", ["bert", "deberta"])
def test_a_smaller_stride_changes_only_long_sentences(tiny_transformers, family):
    directory = tiny_transformers[family]
    default = Encoder.load(f"hf:{directory}", device="cpu")
    strided = Encoder.load(f"hf:{directory},stride=3", device="cpu")
    assert strided.identity["options"]["stride"] == 3 != default.identity["options"]["stride"]
    assert strided.identity["weights_sha256"] == default.identity["weights_sha256"]
    short_a, long_a = default.embed_batch([SHORT[0], LONG])
    short_b, long_b = strided.embed_batch([SHORT[0], LONG])
    np.testing.assert_array_equal(short_a, short_b)
    assert not np.allclose(long_a, long_b, atol=1e-4)
    np.testing.assert_allclose(long_b, _reference(directory, LONG, "first", strided.window, 3), atol=1e-5, rtol=0)


def test_vectors_do_not_depend_on_the_batch(tiny_transformers):
    encoder = Encoder.load(f"hf:{tiny_transformers['roberta']},subword=mean", device="cpu")
    alone = [encoder.embed_sentence(s) for s in [LONG, SHORT[1], SHORT[0]]]
    together = encoder.embed_batch([SHORT[0], LONG, SHORT[3], SHORT[1]], batch_tokens=20)
    for a, b in zip(alone, [together[1], together[3], together[0]], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    again = encoder.embed_batch([SHORT[0], LONG, SHORT[3], SHORT[1]], batch_tokens=20)
    for a, b in zip(together, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_identity_records_the_alignment_and_describe_agrees(tiny_transformers):
    directory = tiny_transformers["xlmr"]
    encoder = Encoder.load(f"hf:{directory},subword=last,stride=5", device="cpu")
    identity = encoder.identity
    options = identity["options"]
    assert options["format"] == "transformers" and options["model_type"] == "xlm-roberta"
    assert (options["subword"], options["stride"], options["n_layers"], options["dim"]) == ("last", 5, 4, 16)
    # 18 positions less the padding offset (2) less <s> and </s>.
    assert options["window"] == 14
    assert identity["directory"] == str(directory.resolve())
    assert isinstance(options["tokenizer_sha256"], str) and len(identity["weights_sha256"]) == 64
    from elmo_cache.model import sources

    described = Encoder.describe(sources.resolve(f"hf:{directory},subword=last,stride=5"))
    assert described.identity == identity and described.n_layers == 4 and described.output_dim == 16
    json.dumps(identity)  # stored in metadata


def test_stored_model_is_found_again_by_its_identity(tiny_transformers):
    from elmo_cache.model import sources

    encoder = Encoder.load(f"hf:{tiny_transformers['bert']},subword=mean", device="cpu")
    files, why = sources.locate(encoder.identity)
    assert why == "" and files is not None
    assert Encoder.load(files, device="cpu").identity == encoder.identity


def test_clear_errors(tiny_transformers, tmp_path):
    decoder = tmp_path / "gpt"
    decoder.mkdir()
    (decoder / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(InvalidParameterError, match="decoder-only"):
        Encoder.load(f"hf:{decoder}")
    seq2seq = tmp_path / "t5"
    seq2seq.mkdir()
    (seq2seq / "config.json").write_text(json.dumps({"model_type": "t5", "is_encoder_decoder": True}))
    with pytest.raises(InvalidParameterError, match="encoder-decoder"):
        Encoder.load(f"hf:{seq2seq}")
    with pytest.raises(
        InvalidParameterError, match=r"subword='middle' is not valid; choose from \['first', 'mean', 'last'\]"
    ):
        transformer.parse_spec("hf:x,subword=middle")
    with pytest.raises(InvalidParameterError, match="stride=0"):
        transformer.parse_spec("hf:x,stride=0")
    with pytest.raises(InvalidParameterError, match="longer than a window"):
        Encoder.load(f"hf:{tiny_transformers['bert']},stride=99")
    with pytest.raises(ModelNotFoundError, match="no such directory"):
        Encoder.load(f"hf:{tmp_path / 'missing'}")
    with pytest.raises(InvalidParameterError, match="no initial state"):
        Encoder.load(f"hf:{tiny_transformers['bert']}", initial_state="warm")


def test_a_token_longer_than_a_window_is_named(tiny_transformers):
    encoder = Encoder.load(f"hf:{tiny_transformers['roberta']}", device="cpu")
    word = "zq" * 40  # byte-level BPE: dozens of subwords
    with pytest.raises(InvalidParameterError, match=r"token 1 \('zqzq"):
        encoder.embed_batch([["the", word]])


def test_layer_count_and_selection_are_the_models(tiny_transformers):
    from elmo_cache.rows.selection import Selection

    spec = f"hf:{tiny_transformers['deberta']}"
    n = transformer.layer_count(spec)
    assert n == 4 and transformer.layer_count("bundled") == 3
    with pytest.raises(InvalidParameterError, match=r"layer 4 does not exist; choose from \[0, 1, 2, 3\]"):
        Selection.parse("0,4", n_layers=n)
    with pytest.raises(InvalidParameterError, match="expected 4 numbers"):
        Selection.parse(mix="0.5,0.5", n_layers=n)
    assert Selection.parse(mix="0.1,0.2,0.3,0.4", n_layers=n).mix.weights == (0.1, 0.2, 0.3, 0.4)


def test_a_token_without_subwords_reads_as_the_unknown_token(tiny_transformers):
    directory = tiny_transformers["bert"]
    encoder = Encoder.load(f"hf:{directory}", device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer(["\x00"], is_split_into_words=True, add_special_tokens=False)["input_ids"] == []
    got = encoder.embed_sentence(["the", "\x00", "cat"])
    ids = tokenizer(["the", "[UNK]", "cat"], is_split_into_words=True, return_tensors="pt")
    assert ids["input_ids"][0, 2] == tokenizer.unk_token_id and ids["input_ids"].shape[1] == 5
    model = AutoModel.from_pretrained(directory).eval()
    with torch.no_grad():
        hidden = torch.stack(model(**ids, output_hidden_states=True).hidden_states)[:, 0]
    np.testing.assert_allclose(got, hidden[:, 1:4].numpy(), atol=1e-5, rtol=0)
