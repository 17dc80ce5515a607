"""A server whose cache is brought up to date under it (``build --update``) serves the new generation."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.server import create_app
from elmo_cache.server import service as service_module
from tests.server_helpers import LINES, UNSEEN, decode, metric, run, settings


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return elmo_cache.Encoder.load(tiny_model, device="cpu")


def _options(path, **extra):
    return BuildOptions(output=path, device="cpu", progress=False, **extra)


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_an_update_under_a_running_server_is_served(tmp_path, encoder, suffix, monkeypatch):
    """Before: the new line is not in the cache (404 without a model). After ``build --update`` added it: the
    server notices the new generation at the path, reopens it and answers the line from it, byte for byte."""
    monkeypatch.setattr(service_module, "REOPEN_CHECK_S", 0.0)  # check at every lookup (default: once a second)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    path = tmp_path / f"corpus{suffix}"
    build(corpus, _options(path), encoder=encoder)
    app = create_app(settings(cache_path=path))  # the cache alone: a miss is a 404

    async def scenario(client):
        before = await client.get("/embed", params={"sentence": UNSEEN[0]})
        hit = await client.get("/embed", params={"sentence": LINES[0], "format": "npy"})
        corpus.write_text("\n".join([*LINES, UNSEEN[0]]) + "\n", encoding="utf-8")
        summary = await asyncio.to_thread(build, corpus, _options(path, update=True), encoder=encoder)
        assert summary.updated
        after = await client.get("/embed", params={"sentence": UNSEEN[0], "format": "npy"})
        again = await client.get("/embed", params={"sentence": LINES[0], "format": "npy"})
        return before, hit, after, again, (await client.get("/metrics")).text, (await client.get("/info")).json()

    before, hit, after, again, text, info = run(app, scenario)
    assert before.status_code == 404 and hit.status_code == 200
    assert after.status_code == 200 and after.headers["x-elmo-source"] == "cache"
    with elmo_cache.open(path) as fresh:
        np.testing.assert_array_equal(decode(after), fresh.get(UNSEEN[0]))
        # The line's window was encoded again with the new line: its last bits are the new generation's.
        assert decode(again).tobytes() == np.asarray(fresh.get(LINES[0])).tobytes()
    assert metric(text, "elmo_cache_cache_reopened_total") == 1
    assert info["cache"]["sentences"] == len(LINES) + 1


def test_a_cache_of_other_options_in_its_place_is_not_taken(tmp_path, encoder, monkeypatch, caplog):
    """A rebuild with other layers is not this server's cache any more: it keeps answering from what it opened
    (what it can still read), logs that it needs a restart, and never answers with the new layers."""
    monkeypatch.setattr(service_module, "REOPEN_CHECK_S", 0.0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    path = tmp_path / "corpus.h5"
    build(corpus, _options(path), encoder=encoder)
    app = create_app(settings(cache_path=path))

    async def scenario(client):
        hit = await client.get("/embed", params={"sentence": LINES[0], "format": "npy"})
        await asyncio.to_thread(build, corpus, _options(path, layers=(2,), overwrite=True), encoder=encoder)
        again = await client.get("/embed", params={"sentence": LINES[0], "format": "npy"})
        return hit, again, (await client.get("/metrics")).text

    with caplog.at_level(logging.ERROR, logger="elmo_cache.server"):
        hit, again, text = run(app, scenario)
    assert again.status_code == 200 and decode(again).tobytes() == decode(hit).tobytes()
    assert decode(again).shape[0] == 3  # the layers it opened with, not the new cache's one
    assert metric(text, "elmo_cache_cache_reopened_total") == 0
    assert "restart it to serve the new one" in caplog.text
