"""ELMoForManyLangs model directories wherever a model is taken (no elmoformanylangs needed).

The models here are written with torch alone, under the tensor names the package's modules give
(``test_efml_package.py`` makes them with the package itself and compares the vectors).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import elmo_cache
from elmo_cache import Encoder
from elmo_cache.cli.main import cli
from elmo_cache.errors import ModelNotFoundError, OptionsError, WeightFileError
from elmo_cache.model import efml, sources
from elmo_cache.server import Settings, load_resources
from elmo_cache.verify.checks import verify
from tests.efml_fixtures import CHARS, LINES, WORDS, D, P, state_dicts, write_model


@pytest.fixture()
def model_dir(tmp_path) -> Path:
    return write_model(tmp_path / "zh-model")


def test_a_directory_loads_by_its_path_and_layer_zero_is_the_token_twice(model_dir):
    files = sources.resolve(str(model_dir))
    assert files.format == efml.FORMAT and files.origin == "elmoformanylangs" and files.directory == model_dir
    encoder = Encoder.load(model_dir, device="cpu")
    vectors = encoder.embed_sentence(["我们", "是", "中文", "。", "supercalifragilistic"])
    assert vectors.shape == (3, 5, 2 * P) and np.isfinite(vectors).all()
    np.testing.assert_array_equal(vectors[0, :, :P], vectors[0, :, P:])
    identity = encoder.identity
    assert identity["options"]["format"] == efml.FORMAT and identity["directory"] == str(model_dir)
    assert identity["weights_sha256"] == efml.fingerprint(model_dir)[0]
    assert (identity["weights_sha256"], identity["options"]) == efml.fingerprint(model_dir)


def test_vectors_are_deterministic_and_batch_invariant(model_dir):
    sentences = [line.split() for line in LINES]
    batch = Encoder.load(model_dir, device="cpu").embed_batch(sentences)
    for sentence, together in zip(sentences, batch):
        alone = Encoder.load(model_dir, device="cpu").embed_sentence(sentence)
        np.testing.assert_allclose(together, alone, atol=1e-6, rtol=0)
    again = Encoder.load(model_dir, device="cpu").embed_batch(sentences[::-1])[::-1]
    for first, second in zip(batch, again):
        np.testing.assert_allclose(first, second, atol=1e-6, rtol=0)


def test_tokens_are_cut_and_unknown_characters_are_oov(model_dir):
    ids = Encoder.load(model_dir, device="cpu").tokens
    chars = {c: i for i, c in enumerate(CHARS)}
    row = ids.char_ids(["好x。", "abcdefghijkl", "<bos>"])
    start, end, pad, oov = chars["<eow>"], chars["<bow>"], chars["<pad>"], chars["<oov>"]
    assert row[0].tolist() == [start, chars["好"], chars["x"], oov, end] + [pad] * 5
    assert row[1].tolist() == [start, *(chars[c] for c in "abcdefgh"), end]  # cut to MAX_CHARS - 2
    assert row[2].tolist()[:4] == [start, chars["<bos>"], end, pad]
    assert ids.word_ids(["cat", "dog", "中文"]).tolist() == [WORDS.index("cat"), 0, WORDS.index("中文")]


def test_describe_reads_the_identity_and_width_loading_gives(model_dir):
    described = Encoder.describe(sources.resolve(str(model_dir)), initial_state="warm")
    loaded = Encoder.load(model_dir, device="cpu", initial_state="warm")
    assert list(described.identity.items()) == list(loaded.identity.items())
    assert described.output_dim == loaded.output_dim == 2 * P


@pytest.mark.parametrize(
    "config_path",
    ["/home/author/elmo/cfg.json", "C:\\Users\\author\\elmo\\cfg.json", "cfg.json", "sub/../cfg.json"],
)
def test_the_model_config_is_found_wherever_config_json_says_it_was(tmp_path, config_path):
    directory = write_model(tmp_path / "m", config_path=config_path)
    assert Encoder.load(directory, device="cpu").options.lstm_dim == D


def test_a_missing_model_config_names_config_json_and_the_path(model_dir):
    (model_dir / "cnn_50_100_512_4096_sample.json").rename(model_dir / "elsewhere.json")
    (model_dir / "config.json").write_text(json.dumps({"config_path": "/x/gone.json"}))
    with pytest.raises(ModelNotFoundError, match=r"config\.json: config_path '/x/gone.json'.*'gone.json'"):
        Encoder.load(model_dir, device="cpu")
    (model_dir / "config.json").write_text(json.dumps({"model": "zh"}))
    with pytest.raises(OptionsError, match=r"config\.json: field 'config_path'"):
        Encoder.load(model_dir, device="cpu")


@pytest.mark.parametrize(
    ("part", "args"), [("token_embedder", {"token_embedder": "lstm"}), ("encoder", {"encoder": "lstm"})]
)
def test_other_variants_are_refused_naming_the_file_and_the_field(tmp_path, part, args):
    directory = write_model(tmp_path / "m", **args)
    with pytest.raises(
        OptionsError, match=rf"cnn_50_100_512_4096_sample\.json: field {part}\.name is 'lstm'.*'cnn'.*'elmo'"
    ):
        Encoder.load(directory, device="cpu")


def test_the_package_default_config_serves_a_directory_without_its_config(model_dir):
    (model_dir / "cnn_50_100_512_4096_sample.json").unlink()
    # The published English model ships no model config: the package's default of that name applies.
    with pytest.raises(
        WeightFileError,
        match=r"token_embedder\.pkl: tensor 'word_emb_layer.*\(11, 3\).*11 entries.*word_dim of the package's default",
    ):
        Encoder.load(model_dir, device="cpu")  # it describes the 512 x 4096 model, not this tiny one


def test_weight_files_are_checked_tensor_by_tensor(model_dir):
    embedder, encoder = state_dicts(0)
    broken = {k: v for k, v in encoder.items() if k != "backward_layer_1.state_projection.weight"}
    torch.save(broken, model_dir / "encoder.pkl")
    with pytest.raises(
        WeightFileError, match=r"encoder\.pkl: tensor 'backward_layer_1\.state_projection\.weight' is missing"
    ):
        Encoder.load(model_dir, device="cpu")
    torch.save({**encoder, "forward_layer_2.input_linearity.weight": torch.zeros(1)}, model_dir / "encoder.pkl")
    with pytest.raises(WeightFileError, match=r"encoder\.pkl: tensor 'forward_layer_2.*not part of the model"):
        Encoder.load(model_dir, device="cpu")
    torch.save(encoder, model_dir / "encoder.pkl")
    embedder["projection.weight"] = torch.zeros(P, 7)
    torch.save(embedder, model_dir / "token_embedder.pkl")
    with pytest.raises(WeightFileError, match=r"token_embedder\.pkl: tensor 'projection\.weight' has shape \(4, 7\)"):
        Encoder.load(model_dir, device="cpu")
    torch.save(torch.nn.Linear(2, 2), model_dir / "token_embedder.pkl")  # a whole module, not a state dict
    with pytest.raises(WeightFileError, match=r"token_embedder\.pkl: not a torch state dict.*state_dict\(\)"):
        Encoder.load(model_dir, device="cpu")


def test_dictionaries_are_read_as_the_package_reads_them(tmp_path):
    path = tmp_path / "char.dic"
    path.write_text("a\t0\n\u3000\t1\n \t2\n<oov>\t3\n", encoding="utf-8")
    assert efml.read_dic(path, ["<oov>"]) == {"a": 0, "\u3000": 2, "<oov>": 3}
    path.write_text("a\tb\t0\n", encoding="utf-8")
    with pytest.raises(WeightFileError, match=r"char\.dic: line 1 is not 'token<TAB>id'"):
        efml.read_dic(path, [])
    path.write_text("a\t0\n", encoding="utf-8")
    with pytest.raises(WeightFileError, match=r"char\.dic: has no entry for \['<oov>'\]"):
        efml.read_dic(path, ["<oov>"])


def test_build_verify_and_serve_find_the_directory_again(tmp_path, model_dir, caplog):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    result = CliRunner().invoke(
        cli, ["build", str(corpus), "-o", str(tmp_path / "c.zarr"), "--model", str(model_dir), "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    cache = elmo_cache.open(tmp_path / "c.zarr")
    recorded = cache.metadata["model"]
    assert recorded["options"]["format"] == efml.FORMAT and recorded["directory"] == str(model_dir.resolve())
    files, why = sources.locate(recorded)
    assert files is not None and files.format == efml.FORMAT, why
    report = verify(tmp_path / "c.zarr", sample=3)
    assert report.ok and report.sampled == 3, report.problems

    encoder, _ = load_resources(Settings(device="cpu"), cache=cache)
    assert encoder is not None and encoder.directory == model_dir.resolve()
    np.testing.assert_allclose(
        cache.get(LINES[1].split()),
        Encoder.load(model_dir, device="cpu").embed_sentence(LINES[1].split()),
        atol=1e-5,
        rtol=0,
    )

    write_model(model_dir, seed=1)  # same names, other weights
    assert sources.locate(recorded)[0] is None
    with caplog.at_level(logging.WARNING, logger="elmo_cache.server"):
        encoder, _ = load_resources(Settings(device="cpu"), cache=cache)
    assert encoder is None and "now holds another ELMoForManyLangs model" in caplog.text
    cache.close()
