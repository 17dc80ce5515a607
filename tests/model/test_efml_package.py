"""ELMoForManyLangs models give the package's own vectors (within 1e-5, every layer).

Random models are made with the package's own modules and written as it writes them (torch.save
of the two state dicts, in the zip and in the legacy format); the package then runs them as it runs
a published model: a fresh ``Embedder`` per model, one ``sents2elmo`` call with a batch at least as
large as the input (it keeps LSTM state between calls and shuffles its batches).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from elmo_cache import Encoder

efml = pytest.importorskip("elmoformanylangs", reason="the test extra installs elmoformanylangs")

TOLERANCE = 1e-5

CHARS = list("abcdefghijklmnopqrstuvwxyz.,") + list("中文模型的我们是一个好") + ["\u3000"]
WORDS = ["the", "cat", "sat", ".", "中文", "模型", "我们", "是", "好", "supercalifragilisticexpialidocious"]

SENTENCES = [
    ["the", "cat", "sat", "."],
    ["我们", "是", "中文", "模型", "。"],  # "。" is an unknown character
    ["好"],  # one token
    ["zebra", "Ünïcode", "😀", "cat"],  # unknown words; unknown and astral characters
    ["supercalifragilisticexpialidocious", "supercalifragilisticexpialidociousness", "x" * 40],  # over the limit
    ["<bos>", "the", "<eos>"],  # the package's own boundary words, as input
    ["", "a b", "中\u3000文", "the"],  # an empty token, a token with a space, one with U+3000 (in char.dic)
    ["."],
]


def _config(word_dim: int, activation: str, clip: float) -> dict:
    return {
        "encoder": {
            "name": "elmo",
            "projection_dim": 8,
            "cell_clip": clip,
            "proj_clip": clip,
            "dim": 12,
            "n_layers": 2,
        },
        "token_embedder": {
            "name": "cnn",
            "activation": activation,
            "filters": [[1, 4], [2, 4], [3, 6]],
            "n_highway": 2,
            "word_dim": word_dim,
            "char_dim": 5,
            "max_characters_per_token": 12,
        },
        "classifier": {"name": "sampled_softmax", "n_samples": 10},
        "dropout": 0.1,
    }


def _dic(path: Path, entries: list[str]) -> dict[str, int]:
    table = {token: i for i, token in enumerate(entries)}
    # A whitespace token is written as the package writes it: the line keeps only its id after stripping.
    path.write_text("".join(f"{t}\t{i}\n" for t, i in table.items()), encoding="utf-8")
    return table


def make_model(
    directory: Path,
    *,
    seed: int,
    word_dim: int = 6,
    legacy: bool = False,
    activation: str = "relu",
    clip: float = 0.5,
) -> Path:
    """A random model in the package's layout, made with its modules, every parameter perturbed."""
    from elmoformanylangs.frontend import Model
    from elmoformanylangs.modules.embedding_layer import EmbeddingLayer

    torch.manual_seed(seed)
    directory.mkdir(parents=True)
    config = _config(word_dim, activation, clip)
    # config.json names the model config by an absolute path from another machine, as the published ones do.
    (directory / "config.json").write_text(json.dumps({"config_path": "/home/author/elmo/configs/model.json"}))
    (directory / "model.json").write_text(json.dumps(config))
    chars = _dic(directory / "char.dic", ["<oov>", "<pad>", "<bos>", "<eos>", "<bow>", "<eow>", *CHARS])
    words = _dic(directory / "word.dic", ["<oov>", "<pad>", "<bos>", "<eos>", *WORDS])
    word_layer = EmbeddingLayer(word_dim, words, fix_emb=False) if word_dim else None
    model = Model(config, word_layer, EmbeddingLayer(5, chars, fix_emb=False), False)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    for name, module in (("token_embedder.pkl", model.token_embedder), ("encoder.pkl", model.encoder)):
        torch.save(module.state_dict(), directory / name, _use_new_zipfile_serialization=not legacy)
    return directory


def package_vectors(directory: Path, sentences: list[list[str]]) -> list[np.ndarray]:
    from elmoformanylangs import Embedder

    embedder = Embedder(str(directory), batch_size=len(sentences))
    return embedder.sents2elmo(sentences, output_layer=-2)


def max_differences(directory: Path, sentences: list[list[str]]) -> np.ndarray:
    expected = package_vectors(directory, sentences)
    ours = Encoder.load(directory, device="cpu").embed_batch(sentences)
    worst = np.zeros(3)
    for sentence, mine, theirs in zip(sentences, ours, expected):
        assert mine.shape == theirs.shape == (3, len(sentence), 16), sentence
        worst = np.maximum(worst, np.abs(mine - theirs).max(axis=(1, 2)))
    return worst


@pytest.mark.parametrize(
    "variant",
    [
        {"legacy": False},
        {"legacy": True},
        {"word_dim": 0},
        {"activation": "tanh", "clip": 0},
    ],
    ids=["zip", "legacy-pickle", "chars-only", "tanh-no-clip"],
)
def test_every_layer_matches_the_package(tmp_path, variant):
    directory = make_model(tmp_path / "model", seed=11, **variant)
    worst = max_differences(directory, SENTENCES)
    print(f"max abs difference per layer ({variant}): {worst}")
    assert (worst < TOLERANCE).all(), worst


def test_one_sentence_of_one_token_matches_the_package(tmp_path):
    directory = make_model(tmp_path / "model", seed=5, legacy=True)
    worst = max_differences(directory, [["好"]])
    assert (worst < TOLERANCE).all(), worst
