"""Named-model downloads pinned to SHA-256 sums: a real HTTP server on the loopback interface serves
the files; pooch downloads them as it would from AllenAI's server."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from elmo_cache.errors import ModelDownloadError
from elmo_cache.model import hub, sources
from elmo_cache.model.random_model import write_random_model


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def server(file_server):
    """The loopback file server (tests/conftest.py): its root folder and the published models' base URL."""
    root, base = file_server
    return root, f"{base}/models/elmo"


@pytest.fixture
def published(server, tmp_path, monkeypatch):
    """The 'small' model's files on the server (a random tiny model in their names); returns a
    function that pins them to given sums."""
    root, base = server
    model = hub.PUBLISHED_MODELS["small"]
    folder = root / "models" / "elmo" / model.folder
    options, weights = write_random_model(folder, "tiny", seed=3, name=model.stem)
    monkeypatch.setattr(hub, "_BASE_URL", base)
    monkeypatch.setenv("ELMO_CACHE_MODELS", str(tmp_path / "models"))

    def pin(options_sha: str | None, weights_sha: str | None) -> None:
        pinned = hub.PublishedModel(model.name, model.stem, model.folder, options_sha, weights_sha)
        monkeypatch.setitem(hub.PUBLISHED_MODELS, "small", pinned)

    return options, weights, pin


def test_pinned_download_is_verified_and_used(published, tmp_path):
    options, weights, pin = published
    pin(sha256(options), sha256(weights))
    files = sources.resolve("small")
    assert files.origin == "published" and sha256(files.weight_file) == sha256(weights)
    assert files.weight_file.parent == tmp_path / "models" / "small"
    assert sources.resolve("small") == files  # found again without downloading


def test_a_download_with_another_hash_is_refused_and_leaves_nothing(published, tmp_path):
    options, _, pin = published
    wrong = "0" * 64
    pin(sha256(options), wrong)
    with pytest.raises(ModelDownloadError) as info:
        sources.resolve("small")
    message = str(info.value)
    assert wrong in message and "weights.hdf5" in message and "nothing was written" in message
    folder = tmp_path / "models" / "small"
    assert [p.name for p in folder.iterdir()] == [options.name]  # the verified options file only


def test_a_local_file_that_no_longer_matches_is_downloaded_again(published, tmp_path):
    options, weights, pin = published
    pin(sha256(options), sha256(weights))
    files = sources.resolve("small")
    files.weight_file.write_bytes(b"damaged")
    again = sources.resolve("small")
    assert sha256(again.weight_file) == sha256(weights)


def test_an_unpinned_download_warns(published, caplog):
    _, _, pin = published
    pin(None, None)
    with caplog.at_level("WARNING", logger="elmo_cache.model.hub"):
        sources.resolve("small")
    assert "without a pinned SHA-256" in caplog.text


def test_every_published_model_has_both_files_or_neither_pinned():
    for model in hub.PUBLISHED_MODELS.values():
        assert (model.options_sha256 is None) == (model.weights_sha256 is None), model.name
        for sha in (model.options_sha256, model.weights_sha256):
            assert sha is None or (len(sha) == 64 and int(sha, 16) >= 0)


def test_a_failed_first_download_leaves_no_empty_folder(tmp_path, monkeypatch):
    """Offline, a first download fails before any file arrives: no empty model folder stays behind."""
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(hub, "_BASE_URL", f"http://127.0.0.1:{port}/models/elmo")
    monkeypatch.setenv("ELMO_CACHE_MODELS", str(tmp_path / "models"))
    with pytest.raises(ModelDownloadError, match="could not download the 'small' ELMo model"):
        sources.resolve("small")
    assert not (tmp_path / "models" / "small").exists()
