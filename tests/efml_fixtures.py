"""Random ELMoForManyLangs model directories (its layout: config.json, the model config, char.dic, word.dic and
two pickled state dicts) with a few Chinese characters and words, for the tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch

P, D, WORD_DIM, CHAR_DIM, MAX_CHARS = 4, 6, 3, 5, 10
FILTERS = [[1, 3], [2, 3], [3, 4]]
CHARS = ["<oov>", "<pad>", "<bos>", "<eos>", "<bow>", "<eow>", *"abcdefghijklmnopqrstuvwxyz.", *"中文我们是好"]
WORDS = ["<oov>", "<pad>", "<bos>", "<eos>", "the", "cat", "sat", ".", "中文", "我们", "是"]
LINES = ["the cat sat .", "我们 是 中文 .", "好", "zebra cat", "supercalifragilistic ."]


def model_config(word_dim: int = WORD_DIM, token_embedder: str = "cnn", encoder: str = "elmo") -> dict:
    return {
        "encoder": {"name": encoder, "projection_dim": P, "cell_clip": 3, "proj_clip": 3, "dim": D, "n_layers": 2},
        "token_embedder": {
            "name": token_embedder,
            "activation": "relu",
            "filters": FILTERS,
            "n_highway": 1,
            "word_dim": word_dim,
            "char_dim": CHAR_DIM,
            "max_characters_per_token": MAX_CHARS,
        },
        "dropout": 0.1,
    }


def state_dicts(seed: int, word_dim: int = WORD_DIM) -> tuple[dict, dict]:
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.5

    nf = sum(n for _, n in FILTERS)
    embedder = {"char_emb_layer.embedding.weight": rand(len(CHARS), CHAR_DIM)}
    if word_dim:
        embedder["word_emb_layer.embedding.weight"] = rand(len(WORDS), word_dim)
    for i, (width, num) in enumerate(FILTERS):
        embedder[f"convolutions.{i}.weight"] = rand(num, CHAR_DIM, width)
        embedder[f"convolutions.{i}.bias"] = rand(num)
    embedder["highways._layers.0.weight"] = rand(2 * nf, nf)
    embedder["highways._layers.0.bias"] = rand(2 * nf)
    embedder["projection.weight"] = rand(P, word_dim + nf)
    embedder["projection.bias"] = rand(P)
    encoder = {}
    for layer in range(2):
        for direction in ("forward", "backward"):
            prefix = f"{direction}_layer_{layer}"
            encoder[f"{prefix}.input_linearity.weight"] = rand(4 * D, P)
            encoder[f"{prefix}.state_linearity.weight"] = rand(4 * D, P)
            encoder[f"{prefix}.state_linearity.bias"] = rand(4 * D)
            encoder[f"{prefix}.state_projection.weight"] = rand(P, D)
    return embedder, encoder


def write_model(directory: Path, seed: int = 0, *, config_path: str | None = None, **config_args) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = model_config(**config_args)
    named = config_path or "/home/someone/models/zh/cnn_50_100_512_4096_sample.json"
    (directory / "config.json").write_text(json.dumps({"config_path": named, "model": "zh"}), encoding="utf-8")
    (directory / Path(named.replace("\\", "/")).name).write_text(json.dumps(config), encoding="utf-8")
    for name, entries in (("char.dic", CHARS), ("word.dic", WORDS)):
        (directory / name).write_text("".join(f"{t}\t{i}\n" for i, t in enumerate(entries)), encoding="utf-8")
    embedder, encoder = state_dicts(seed, config["token_embedder"]["word_dim"])
    torch.save(embedder, directory / "token_embedder.pkl")
    torch.save(encoder, directory / "encoder.pkl")
    return directory
