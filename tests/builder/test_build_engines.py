"""The build's seams: the engine registry, the model described without loading it, and a local build that
never imports Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elmo_cache import Encoder
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.engine import ENGINES, engine_class, make_engine
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.model import sources
from elmo_cache.model.files import ModelFiles
from elmo_cache.store.format import staging_path
from tests._build_fixtures import corpus_lines, write_corpus


def test_the_registry_names_every_engine_and_refuses_others_listing_them():
    assert ENGINES == ("local", "ray")
    for name in ENGINES:
        cls = engine_class(name)
        assert cls.name == name
        for method in ("from_arguments", "check", "session", "interrupted", "start"):
            assert callable(getattr(cls, method)), (name, method)
    with pytest.raises(InvalidParameterError, match=r"engine: 'spark' is not valid; choose from \['local', 'ray'\]"):
        make_engine("spark", encoder=None, address=None, workers=None)
    with pytest.raises(InvalidParameterError, match=r"engine: 'spark' is not valid; choose from \['local', 'ray'\]"):
        build("corpus.txt", BuildOptions(progress=False), engine="spark")


def test_each_engine_refuses_the_arguments_it_does_not_take(tiny_encoder):
    with pytest.raises(InvalidParameterError, match="address, workers: only the ray engine takes them"):
        make_engine("local", encoder=None, address="auto", workers=None)
    with pytest.raises(InvalidParameterError, match="encoder: the ray engine loads the model in every worker"):
        make_engine("ray", encoder=tiny_encoder, address=None, workers=None)
    assert make_engine("local", encoder=tiny_encoder, address=None, workers=None).name == "local"


@pytest.mark.parametrize("initial_state", ["zero", "warm"])
def test_describe_is_what_loading_would_give(tiny_model, tmp_path, initial_state):
    """The build plans with Encoder.describe; its identity must be the loaded encoder's, key order included
    (the identity is written into every cache's metadata)."""
    named = ModelFiles("tiny-dir", tiny_model[0], tiny_model[1], "directory", directory=tmp_path)
    for model in (sources.resolve(tiny_model), named):
        described = Encoder.describe(model, precision="fp32", initial_state=initial_state)
        loaded = Encoder.load(model, device="cpu", initial_state=initial_state)
        assert list(described.identity.items()) == list(loaded.identity.items())
        assert described.output_dim == loaded.output_dim == 32
    # Precision is recorded as asked, without a device to check it against.
    assert Encoder.describe(named, precision="bf16").identity["precision"] == "bf16"
    with pytest.raises(InvalidParameterError, match="initial_state: 'hot' is not one of"):
        Encoder.describe(named, initial_state="hot")


def test_a_local_build_never_imports_ray(tmp_path, tiny_model):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(5, seed=1))
    output = tmp_path / "c.zarr"
    script = (
        "import sys; import elmo_cache; from elmo_cache.builder import BuildOptions, build; "
        f"build({str(corpus)!r}, BuildOptions(output={str(output)!r}, options_file={str(tiny_model[0])!r}, "
        f"weight_file={str(tiny_model[1])!r}, device='cpu', progress=False)); "
        "print('ray imported:', any(name == 'ray' or name.startswith('ray.') for name in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert "ray imported: False" in done.stdout


def test_an_interrupted_build_of_the_other_engine_is_named(tmp_path, tiny_model, monkeypatch):
    """A local build's staging refuses the ray engine before it connects to any cluster's work."""
    pytest.importorskip("ray")
    from elmo_cache.builder.ray import engine as distributed

    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(30, seed=2))
    output = tmp_path / "c.zarr"
    options = BuildOptions(
        output=output, options_file=tiny_model[0], weight_file=tiny_model[1], device="cpu", progress=False
    )

    def interrupted(*args):
        raise KeyboardInterrupt  # a build stopped before it encoded anything

    monkeypatch.setattr("elmo_cache.builder.local._run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(corpus, options)
    assert staging_path(output).is_dir() and not output.exists()
    monkeypatch.undo()
    # No cluster is started: the session is entered only to be left (Ray stands in as already running).
    monkeypatch.setattr(distributed, "import_ray", lambda: _RunningRay())
    with pytest.raises(CacheExistsError, match="interrupted build of the local engine; rerun it with --engine local"):
        build(corpus, options, engine="ray")


class _RunningRay:
    """Ray as seen by a driver whose cluster is up: nothing to start, nothing to stop."""

    @staticmethod
    def is_initialized() -> bool:
        return True
