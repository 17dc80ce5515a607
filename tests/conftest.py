"""Shared fixtures: tiny ELMo models generated in the original weight-file layout."""

from __future__ import annotations

import functools
import http.server
import os
import threading
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
    import elmo_cache.encoder.hardware

    monkeypatch.setattr(elmo_cache.encoder.hardware, "cpu_bf16_problem", lambda *args: None)


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """The bilm-tf golden fixture (see tests/data/bilm_tf_golden/NOTICE.md)."""
    return GOLDEN


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> tuple[Path, Path]:
    """(options_path, weights_path) of a random tiny model (32-d outputs)."""
    return write_random_model(tmp_path_factory.mktemp("tiny_model"), "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_transformers(tmp_path_factory) -> dict[str, Path]:
    """Tiny random Transformer encoders (BERT, RoBERTa, XLM-R, DeBERTa-v2) with local tokenizers, by family;
    skips where transformers is not installed (it is the optional extra ``transformers``)."""
    pytest.importorskip("transformers")
    from tests.transformer_fixtures import write_tiny_transformers

    return write_tiny_transformers(tmp_path_factory.mktemp("tiny_transformers"))


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

    return Encoder.load(tiny_model, device="cpu")


@pytest.fixture(scope="session")
def bundled_model():
    """The bundled model's ModelFiles: the trained files shipped in elmo_cache/model/bundled/.

    No stand-in: a package shipped without them must fail these tests, not pass them on a random
    model (tests/model/test_bundled_identity.py also checks that the files are the ones the card names).
    """
    from elmo_cache.model import hub

    missing = [name for name in ("options.json", "weights.hdf5") if not (hub.BUNDLED_DIR / name).is_file()]
    if missing:
        pytest.fail(f"the bundled model lacks {missing} in {hub.BUNDLED_DIR}; the package must ship them")
    from elmo_cache.model import sources

    return sources.resolve(hub.BUNDLED)


@pytest.fixture(autouse=True)
def no_elmo_cache_environment(monkeypatch):
    """A developer's own ELMO_CACHE_* variables (server settings, model cache, slow-fp16 override)
    must not change what a test sees; tests that need one set it themselves."""
    for name in list(os.environ):
        if name.startswith("ELMO_CACHE_"):
            monkeypatch.delenv(name)
    # Commands run in process (CliRunner, train()) size torch's pool; keep the one thread above.
    monkeypatch.setenv("ELMO_CACHE_THREADS", "1")


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
    """No test reaches the network: resolving any host name but this machine's fails the test.

    Model names resolve to downloads, and a slip would otherwise pass wherever a network exists.
    Names are what leave a machine (pooch, requests); numeric addresses (a loopback server, Ray's
    own node address) are left alone.
    """
    import ipaddress
    import socket

    resolve = socket.getaddrinfo
    local_names = {None, "localhost", socket.gethostname()}

    def local_only(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in local_names:
            try:
                ipaddress.ip_address(name)
            except ValueError:
                raise AssertionError(f"a test tried to resolve {name!r}; tests never leave this machine") from None
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", local_only)


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    """No downloads: an empty model cache, and any attempt to fetch a published model fails the test."""
    import pooch

    def refuse(url, *args, **kwargs):
        raise AssertionError(f"tried to download {url}")

    monkeypatch.setenv("ELMO_CACHE_MODELS", str(tmp_path / "model-cache"))
    monkeypatch.setattr(pooch, "retrieve", refuse)


def pytest_configure(config):
    """CI names the optional modules it installed (``ELMO_CACHE_REQUIRED_MODULES=ray,schemathesis``):
    a test module that would skip for lack of one fails the run instead of passing unnoticed."""
    import importlib

    names = [name for name in os.environ.get("ELMO_CACHE_REQUIRED_MODULES", "").split(",") if name.strip()]
    for name in names:
        try:
            importlib.import_module(name.strip())
        except ImportError as exc:
            raise pytest.UsageError(
                f"ELMO_CACHE_REQUIRED_MODULES names {name.strip()!r}, which cannot be imported ({exc}); "
                "its tests would be skipped"
            ) from None


@pytest.fixture()
def file_server(tmp_path):
    """An HTTP server on the loopback for the files under ``tmp_path / "www"``: yields (root, base URL)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[method-assign]
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
