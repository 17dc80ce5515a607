"""Options that size allocations are bounded at load, with an error naming the file, the key, the
value and the limit (issue 33, item 4); the bundled and published models' values still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elmo_cache.errors import OptionsError
from elmo_cache.model import efml
from elmo_cache.model.options import LIMITS, ModelOptions
from elmo_cache.model.random_model import PRESETS
from tests.efml_fixtures import model_config

BUNDLED = Path(__file__).resolve().parents[2] / "elmo_cache" / "model" / "bundled" / "options.json"


def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "options.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(
    ("section", "key", "value", "shown", "limit"),
    [
        ("char_cnn", "max_characters_per_token", 1e9, "1000000000", LIMITS["max_characters_per_token"]),
        ("char_cnn", "n_highway", 1000, "1000", LIMITS["n_highway"]),
        ("lstm", "n_layers", 1000, "1000", LIMITS["n_layers"]),
        ("lstm", "dim", 10**7, "10000000", LIMITS["lstm_dim"]),
        ("lstm", "projection_dim", 10**7, "10000000", LIMITS["projection_dim"]),
        ("char_cnn", "n_characters", 10**9, "1000000000", 262),
    ],
)
def test_each_bound_is_refused_naming_file_key_value_and_limit(tmp_path, section, key, value, shown, limit):
    raw = PRESETS["original"].to_dict()
    raw[section][key] = value
    path = _write(tmp_path, raw)
    with pytest.raises(OptionsError) as info:
        ModelOptions.from_file(path)
    message = str(info.value)
    assert (
        str(path) in message
        and f"{section}.{key} is {shown}" in message
        and f"above {limit}" in message.replace("above elmo-cache's limit of ", "above ")
    )


def test_char_embedding_and_filters_are_bounded(tmp_path):
    raw = PRESETS["original"].to_dict()
    raw["char_cnn"]["embedding"]["dim"] = 10**6
    with pytest.raises(OptionsError, match=r"char_cnn\.embedding\.dim is 1000000, above elmo-cache's limit of 1024"):
        ModelOptions.from_file(_write(tmp_path, raw))
    raw = PRESETS["original"].to_dict()
    raw["char_cnn"]["filters"] = [[1, 10**6]]
    with pytest.raises(
        OptionsError, match=r"char_cnn\.filters\[0\] count is 1000000, above elmo-cache's limit of 16384"
    ):
        ModelOptions.from_file(_write(tmp_path, raw))
    raw["char_cnn"]["filters"] = [[1, 16384], [2, 16384]]
    with pytest.raises(OptionsError, match=r"32768 filters in all, above elmo-cache's limit of 16384"):
        ModelOptions.from_file(_write(tmp_path, raw))
    raw["char_cnn"]["filters"] = [[1, 1]] * 65
    with pytest.raises(OptionsError, match=r"65 convolutions, above elmo-cache's limit of 64"):
        ModelOptions.from_file(_write(tmp_path, raw))
    raw["char_cnn"]["filters"] = [[51, 32]]
    with pytest.raises(OptionsError, match=r"filters\[0\] width is 51, above max_characters_per_token \(50\)"):
        ModelOptions.from_file(_write(tmp_path, raw))


@pytest.mark.parametrize("value", [True, 2.5, "50", -4, None, float("nan")])
def test_non_integers_bools_and_negatives_are_refused(tmp_path, value):
    raw = PRESETS["original"].to_dict()
    raw["lstm"]["n_layers"] = value
    with pytest.raises(OptionsError, match=r"lstm\.n_layers is"):
        ModelOptions.from_dict(raw, source="opts.json")


@pytest.mark.parametrize("value", [float("inf"), float("nan"), -1, True, "3"])
def test_clips_must_be_finite_numbers(value):
    raw = PRESETS["original"].to_dict()
    raw["lstm"]["cell_clip"] = value
    with pytest.raises(OptionsError, match=r"opts\.json: lstm\.cell_clip is"):
        ModelOptions.from_dict(raw, source="opts.json")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_published_and_bundled_values_still_load(name, tmp_path):
    # PRESETS hold the published models' options (original, medium, small, ...): each round-trips.
    options = PRESETS[name]
    assert ModelOptions.from_file(_write(tmp_path, options.to_dict())) == options
    bundled = ModelOptions.from_file(BUNDLED)
    assert bundled.max_characters_per_token == 50 and bundled.n_filters == 512
    # JSON's 1e2-style integers (floats with no fraction) are still integers.
    raw = options.to_dict()
    raw["lstm"]["dim"] = float(options.lstm_dim)
    assert ModelOptions.from_dict(raw).lstm_dim == options.lstm_dim


def test_elmoformanylangs_configs_are_bounded_too():
    options, _ = efml.parse_config(model_config(), "cfg.json")  # the fixtures' config loads
    assert options.max_characters_per_token == model_config()["token_embedder"]["max_characters_per_token"]
    efml.parse_config(efml._PACKAGE_CONFIG, "package.json")  # the published models' config
    for part, key, value, match in [
        ("token_embedder", "max_characters_per_token", 1e9, r"token_embedder\.max_characters_per_token is 1000000000"),
        (
            "token_embedder",
            "word_dim",
            10**8,
            r"token_embedder\.word_dim is 100000000, above elmo-cache's limit of 4096",
        ),
        ("token_embedder", "char_dim", 10**8, r"token_embedder\.char_dim is 100000000, above elmo-cache's limit"),
        ("token_embedder", "n_highway", True, r"token_embedder\.n_highway is True"),
        ("encoder", "dim", 10**8, r"encoder\.dim is 100000000, above elmo-cache's limit of 32768"),
        ("encoder", "n_layers", 2.5, r"encoder\.n_layers is 2\.5"),
        ("encoder", "cell_clip", float("inf"), r"encoder\.cell_clip is inf"),
    ]:
        raw = model_config()
        raw[part][key] = value
        with pytest.raises(OptionsError, match=rf"cfg\.json: {match}"):
            efml.parse_config(raw, "cfg.json")


def test_skip_connections_are_a_json_boolean(tmp_path):
    """bool("false") is True: a string used to switch the skip connections on."""
    for value in ("false", "true", 0, 1, None):
        raw = PRESETS["original"].to_dict()
        raw["lstm"]["use_skip_connections"] = value
        with pytest.raises(OptionsError, match=rf"lstm\.use_skip_connections is {value!r}; it must be true or false"):
            ModelOptions.from_file(_write(tmp_path, raw))
    for value in (True, False):
        raw = PRESETS["original"].to_dict()
        raw["lstm"]["use_skip_connections"] = value
        assert ModelOptions.from_file(_write(tmp_path, raw)).use_skip_connections is value
