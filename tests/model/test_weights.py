"""Weight-file and options problems each give an error naming the file and dataset."""

from __future__ import annotations

import json
from dataclasses import replace

import h5py
import numpy as np
import pytest

from elmo_cache import Encoder
from elmo_cache.errors import ElmoCacheError, ModelDownloadError, ModelNotFoundError, OptionsError, WeightFileError
from elmo_cache.model.chars import sentence_char_ids, word_char_ids
from elmo_cache.model.hub import PUBLISHED_MODELS
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.random_model import PRESETS, write_random_model
from elmo_cache.model.weights import weight_shapes


@pytest.fixture()
def model(tmp_path):
    return write_random_model(tmp_path, "tiny", seed=3)


def test_generated_file_has_exactly_the_published_layout(model):
    with h5py.File(model[1], "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert sorted(names) == sorted(weight_shapes(PRESETS["tiny"]))
        assert f["char_embed"].shape == (261, 4)
        assert f["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"].shape == (32, 256)


def test_missing_dataset(model):
    with h5py.File(model[1], "a") as f:
        del f["CNN_high_1/W_carry"]
    with pytest.raises(WeightFileError, match=r"'CNN_high_1/W_carry' is missing.*\(124, 124\)"):
        Encoder.load(model, device="cpu")


def test_misshapen_dataset(model):
    with h5py.File(model[1], "a") as f:
        del f["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"]
        f["RNN_0/RNN/MultiRNNCell/Cell0/LSTMCell/W_P_0"] = np.zeros((64, 17), np.float32)
    with pytest.raises(WeightFileError, match=r"W_P_0' has shape \(64, 17\).*implies \(64, 16\)"):
        Encoder.load(model, device="cpu")


def test_not_hdf5(model, tmp_path):
    bogus = tmp_path / "weights.hdf5"
    bogus.write_bytes(b"this is not HDF5")
    with pytest.raises(WeightFileError, match="not an HDF5 file"):
        Encoder.load((model[0], bogus), device="cpu")


def test_options_and_weights_that_do_not_belong_together(model, tmp_path):
    other = replace(PRESETS["tiny"], projection_dim=8)
    options_path = tmp_path / "other_options.json"
    options_path.write_text(json.dumps(other.to_dict()))
    with pytest.raises(WeightFileError, match="do not belong together"):
        Encoder.load((options_path, model[1]), device="cpu")
    fewer_filters = replace(PRESETS["tiny"], filters=PRESETS["tiny"].filters[:-1])
    options_path.write_text(json.dumps(fewer_filters.to_dict()))
    with pytest.raises(WeightFileError, match="CNN"):
        Encoder.load((options_path, model[1]), device="cpu")


def test_nan_weights_are_rejected(model):
    with h5py.File(model[1], "a") as f:
        f["CNN_proj/b_proj"][3] = np.nan
    with pytest.raises(WeightFileError, match="b_proj.*NaN"):
        Encoder.load(model, device="cpu")


def test_missing_files_and_bad_options(model, tmp_path):
    with pytest.raises(ModelNotFoundError, match="weight file not found"):
        Encoder.load((model[0], tmp_path / "nope.hdf5"))
    with pytest.raises(ModelNotFoundError, match="options file not found"):
        Encoder.load((tmp_path / "nope.json", model[1]))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(OptionsError, match="not valid JSON"):
        Encoder.load((broken, model[1]))
    raw = PRESETS["tiny"].to_dict()
    del raw["lstm"]["projection_dim"]
    broken.write_text(json.dumps(raw))
    with pytest.raises(OptionsError, match="missing key 'projection_dim'"):
        Encoder.load((broken, model[1]))
    raw = PRESETS["tiny"].to_dict()
    raw["char_cnn"]["activation"] = "gelu"
    broken.write_text(json.dumps(raw))
    with pytest.raises(OptionsError, match="'gelu' is not one of \\['relu', 'tanh'\\]"):
        Encoder.load((broken, model[1]))
    # Every one of these is also catchable as the matching builtin.
    assert issubclass(WeightFileError, ValueError) and issubclass(ModelNotFoundError, FileNotFoundError)
    assert issubclass(OptionsError, ElmoCacheError)


def test_options_round_trip_the_bilm_tf_schema(model):
    options = ModelOptions.from_file(model[0])
    assert ModelOptions.from_dict(options.to_dict()) == options
    assert options.n_filters == 124 and options.output_dim == 32
    assert PRESETS["original"].n_filters == 2048


def test_character_ids_follow_the_original():
    ids = word_char_ids("cat")
    assert ids[:5].tolist() == [259, 100, 98, 117, 260] and (ids[5:] == 261).all()
    assert word_char_ids("<S>")[:4].tolist() == [259, 257, 260, 261]
    assert word_char_ids("</S>")[:4].tolist() == [259, 258, 260, 261]
    long = word_char_ids("x" * 100)
    assert (long[1:49] == ord("x") + 1).all() and long[49] == 260  # cut to 48 bytes
    snow = word_char_ids("☃")  # three UTF-8 bytes
    assert snow[1:4].tolist() == [b + 1 for b in "☃".encode()] and snow[4] == 260
    assert sentence_char_ids(["a", "b"]).shape == (4, 50)


def test_named_model_loads_from_the_model_cache_without_network(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_MODELS", str(tmp_path))
    folder = tmp_path / "small"
    stem = PUBLISHED_MODELS["small"].stem
    write_random_model(folder, "tiny", seed=4, name=stem)  # stands in for the downloaded files
    encoder = Encoder.load("small", device="cpu")
    assert encoder.name == "small" and encoder.embed_sentence(["hi"]).shape == (3, 1, 32)
    local = Encoder.load(folder, device="cpu")  # a directory works too
    np.testing.assert_array_equal(local.embed_sentence(["hi"]), encoder.embed_sentence(["hi"]))


def test_download_failure_says_what_to_fetch_and_where(tmp_path, monkeypatch):
    monkeypatch.setenv("ELMO_CACHE_MODELS", str(tmp_path))
    # A closed loopback port fails at once, like a machine without network.
    monkeypatch.setattr("elmo_cache.model.hub._BASE_URL", "http://127.0.0.1:9/models/elmo")
    with pytest.raises(ModelDownloadError) as info:
        Encoder.load("medium", device="cpu")
    message = str(info.value)
    assert "elmo_2x2048_256_2048cnn_1xhighway_weights.hdf5" in message
    assert str(tmp_path / "medium") in message and "--options-file" in message


def test_unknown_model_name_lists_choices(tmp_path):
    with pytest.raises(ModelNotFoundError, match="'huge'.*original.*small"):
        Encoder.load("huge")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="expected exactly one"):
        Encoder.load(tmp_path / "empty")


def test_loading_the_original_size_needs_little_more_memory_than_its_weights(tmp_path):
    """Load a random Original-size model (374 MB) in a fresh process and measure its peak RSS."""
    import subprocess
    import sys

    options, weights = write_random_model(tmp_path, "original", seed=0)
    script = (
        "import resource, sys, torch\n"
        "from elmo_cache import Encoder\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "Encoder.load((sys.argv[1], sys.argv[2]), device='cpu')\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print((after - before) * 1024)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(options), str(weights)], capture_output=True, text=True, check=True
    )
    growth = int(result.stdout.strip())
    size = weights.stat().st_size
    assert size > 350e6
    assert growth < 1.3 * size, f"loading grew RSS by {growth / 1e6:.0f} MB for {size / 1e6:.0f} MB of weights"


def test_encoder_load_picks_files_over_names_and_explains_mistakes(model):
    from elmo_cache.errors import InvalidParameterError, ModelNotFoundError

    files_win = Encoder.load("not-a-model", options_file=model[0], weight_file=model[1], device="cpu")
    assert files_win.output_dim == 32 and files_win.name == model[1].stem
    with pytest.raises(InvalidParameterError, match="go together"):
        Encoder.load(options_file=model[0], device="cpu")
    with pytest.raises(InvalidParameterError, match="tuple is"):
        Encoder.load((model[0],), device="cpu")
    with pytest.raises(ModelNotFoundError, match="'bundled'.*'original'.*a directory"):
        Encoder.load("not-a-model", device="cpu")


def _datasets(options):
    from elmo_cache.model.random_model import random_weights

    return random_weights(options, seed=8)


def test_write_weight_file_round_trips_through_the_loader(tmp_path):
    from elmo_cache.model.weights import write_weight_file

    options = PRESETS["tiny"]
    datasets = {name: array.astype(np.float64) for name, array in _datasets(options).items()}
    options_path = tmp_path / "options.json"
    options_path.write_text(json.dumps(options.to_dict()))
    path = write_weight_file(tmp_path / "weights.hdf5", options, datasets)
    with h5py.File(path, "r") as f:
        assert all(f[name].dtype == np.float32 for name in weight_shapes(options))
        np.testing.assert_array_equal(f["CNN_proj/W_proj"][()], datasets["CNN_proj/W_proj"].astype(np.float32))
    assert Encoder.load((options_path, path), device="cpu").embed_sentence(["hi"]).shape == (3, 1, 32)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("CNN_high_0/b_carry"), r"'CNN_high_0/b_carry' is missing.*\(124,\)"),
        (lambda d: d.__setitem__("softmax/W", np.zeros((3, 3))), "'softmax/W' is not part of the weight file"),
        (
            lambda d: d.__setitem__("CNN_proj/W_proj", np.zeros((124, 17))),
            r"'CNN_proj/W_proj' has shape \(124, 17\).*\(124, 16\)",
        ),
        (lambda d: d["char_embed"].__setitem__((0, 0), np.inf), "'char_embed' contains NaN or infinite"),
        (lambda d: d.__setitem__("CNN/b_cnn_0", np.zeros(4, dtype=np.int32)), "'CNN/b_cnn_0' has dtype int32"),
    ],
)
def test_write_weight_file_refuses_what_the_options_do_not_describe(tmp_path, change, message):
    from elmo_cache.model.weights import write_weight_file

    datasets = _datasets(PRESETS["tiny"])
    change(datasets)
    target = tmp_path / "weights.hdf5"
    with pytest.raises(WeightFileError, match=message):
        write_weight_file(target, PRESETS["tiny"], datasets)
    assert not target.exists() and not list(tmp_path.iterdir())
