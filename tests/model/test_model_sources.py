"""The model-source registry: one place that turns what a user names into files, and back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from elmo_cache import Encoder
from elmo_cache.errors import InvalidParameterError, ModelNotFoundError
from elmo_cache.model import sources
from elmo_cache.model.files import ModelFiles
from elmo_cache.model.random_model import write_random_model
from elmo_cache.model.sources import ModelRequest


class ZooSource:
    """A source of the kind a new model format or hub would add: names "zoo:NAME" map to folders."""

    origin = "zoo"

    def __init__(self, root: Path):
        self.root = root

    def claims(self, request: ModelRequest) -> bool:
        return request.model is not None and request.model.startswith("zoo:")

    def resolve(self, request: ModelRequest) -> ModelFiles:
        assert request.model is not None
        name = request.model.removeprefix("zoo:")
        folder = self.root / name
        if not folder.is_dir():
            raise ModelNotFoundError(f"the zoo has no {name!r}")
        (options,), (weights,) = folder.glob("*options*.json"), folder.glob("*weights*.hdf5")
        return ModelFiles(request.model, options, weights, self.origin)

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        name = str(recorded.get("name"))
        if not name.startswith("zoo:"):
            return None, ""
        try:
            return self.resolve(ModelRequest(model=name)), f"the zoo's {name} holds other weights"
        except ModelNotFoundError:
            return None, f"the zoo has no {name}"

    def describe(self) -> str:
        return "'zoo:NAME'"


@pytest.fixture()
def zoo(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "_SOURCES", list(sources.registered_sources()))  # undone after the test
    write_random_model(tmp_path / "alpha", "tiny", seed=3)
    source = ZooSource(tmp_path)
    sources.register_source(source)
    return source


def test_a_registered_source_serves_load_and_locate(zoo, tmp_path):
    encoder = Encoder.load("zoo:alpha", device="cpu")
    assert encoder.name == "zoo:alpha" and encoder.output_dim == 32
    direct = Encoder.load(tmp_path / "alpha", device="cpu")
    tokens = ["a", "zoo", "model"]
    np.testing.assert_array_equal(encoder.embed_sentence(tokens), direct.embed_sentence(tokens))

    found, why = sources.locate(encoder.identity)
    assert why == "" and found is not None and found.origin == "zoo"
    # Same name, other weights: the source proposes its files, the check refuses them and says why.
    write_random_model(tmp_path / "alpha", "tiny", seed=4)
    found, why = sources.locate(encoder.identity)
    assert found is None and "the zoo's zoo:alpha holds other weights" in why
    with pytest.raises(ModelNotFoundError, match="zoo has no 'beta'"):
        Encoder.load("zoo:beta", device="cpu")


def test_unknown_names_list_every_source(zoo):
    with pytest.raises(ModelNotFoundError) as info:
        sources.resolve("nowhere")
    message = str(info.value)
    for part in ("'bundled'", "'original'", "'small'", "a directory", "--options-file", "'zoo:NAME'"):
        assert part in message


def test_registration_order_and_refusals(zoo, tmp_path):
    class Greedy(ZooSource):
        origin = "greedy"

        def claims(self, request: ModelRequest) -> bool:
            return True

        def resolve(self, request: ModelRequest) -> ModelFiles:
            raise ModelNotFoundError(f"greedy answered {request.model!r}")

    sources.register_source(Greedy(tmp_path), before="bundled")
    origins = [source.origin for source in sources.registered_sources()]
    assert origins.index("greedy") == origins.index("bundled") - 1
    assert origins[0] == "files"  # explicit files still win over every name
    with pytest.raises(ModelNotFoundError, match="greedy answered None"):
        sources.resolve(None)  # the greedy source now answers where the bundled one did
    with pytest.raises(InvalidParameterError, match="already registered"):
        sources.register_source(ZooSource(tmp_path))
    with pytest.raises(InvalidParameterError, match="before: 'nope' is not one of"):
        sources.register_source(type("Other", (ZooSource,), {"origin": "other"})(tmp_path), before="nope")
    with pytest.raises(TypeError, match="does not implement ModelSource"):
        sources.register_source(object())  # type: ignore[arg-type]


def test_requests_are_checked_before_any_source_sees_them(tmp_path):
    options, weights = write_random_model(tmp_path, "tiny", seed=1)
    request = ModelRequest.of((options, weights))
    assert request == ModelRequest(model=None, options_file=options, weight_file=weights)
    assert ModelRequest.of("small", options, weights).options_file == options  # files win over the name
    with pytest.raises(InvalidParameterError, match="go together"):
        ModelRequest.of(None, options, None)
    with pytest.raises(InvalidParameterError, match="do not also pass options_file"):
        ModelRequest.of((options, weights), options, weights)
    files = sources.resolve((options, weights))
    assert sources.resolve(files) is files  # already resolved: passed through
    assert files == ModelFiles(weights.stem, options, weights, "files")
