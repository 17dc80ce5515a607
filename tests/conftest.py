"""Shared fixtures: tiny ELMo models generated in the original weight-file layout."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from elmo_cache.model.random_model import PRESETS, write_random_model

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "bilm_tf_golden"

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tests run tiny models on one intra-op thread: such small ops gain nothing from a second
    thread, and on a busy 2-core machine two spinning OpenMP threads run ~10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture()
def native_bf16(monkeypatch):
    """Let bf16 run on the CPU whatever this machine has (the detector says "native"): tests of
    bf16 arithmetic must pass on CPUs without AVX512-BF16 too, where it is merely slow."""
    import elmo_cache.encoder

    monkeypatch.setattr(elmo_cache.encoder, "cpu_bf16_problem", lambda *args: None)


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The bilm-tf golden fixture (see tests/data/bilm_tf_golden/NOTICE.md)."""
    return GOLDEN


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> tuple[Path, Path]:
    """(options_path, weights_path) of a random tiny model (32-d outputs)."""
    return write_random_model(tmp_path_factory.mktemp("tiny_model"), "tiny", seed=0)


@pytest.fixture(scope="session")
def clipping_model(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny model whose cell and projection clips fire thousands of times per corpus.

    The clips are lowered (cell 1.0, projection 0.3) rather than the weights scaled up:
    random LSTMs with large recurrent weights are chaotic and amplify float32 rounding
    exponentially with sentence length, which would test the weights, not the code.
    """
    options = replace(PRESETS["tiny"], cell_clip=1.0, proj_clip=0.3)
    return write_random_model(tmp_path_factory.mktemp("clipping_model"), options, seed=1, name="clipping")


@pytest.fixture(scope="session")
def tiny_encoder(tiny_model):
    from elmo_cache import Encoder

    return Encoder.from_files(*tiny_model, device="cpu")


@pytest.fixture(scope="session")
def bundled_model(tmp_path_factory):
    """The bundled model's ModelFiles. Before the trained files are dropped into
    elmo_cache/model/bundled/ (a fresh checkout has only options.json and the card), a random
    placeholder of the same architecture stands in for the whole session."""
    from elmo_cache.model import hub
    from elmo_cache.model.random_model import write_placeholder_bundle

    if (hub.BUNDLED_DIR / "weights.hdf5").is_file():
        yield hub.resolve(hub.BUNDLED)
        return
    directory = tmp_path_factory.mktemp("bundled")
    write_placeholder_bundle(directory)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hub, "BUNDLED_DIR", directory)
        yield hub.resolve(hub.BUNDLED)


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    """No downloads: an empty model cache, and any attempt to fetch a published model fails the test."""
    import pooch

    def refuse(url, *args, **kwargs):
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setenv("ELMO_CACHE_MODELS", str(tmp_path / "model-cache"))
    monkeypatch.setattr(pooch, "retrieve", refuse)
