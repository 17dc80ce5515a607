"""Hash collisions never give a wrong answer: lookups confirm the stored tokens (format 2).

The 64-bit sentence hash is forced to collide for two sentences of the same length during the
build, as two real sentences of a large corpus might; the cache, the server and verify must
each notice that the second sentence is not the first.
"""

from __future__ import annotations

import asyncio
import io

import httpx
import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.server import Settings, create_app
from elmo_cache.text import tokenize as tokenize_module
from elmo_cache.verify import verify

FIRST, SECOND = "the cat sat on the mat", "a dog ran into the park"  # six tokens each
LINES = ["hello world", FIRST, "one", SECOND, ""]


real_hash = tokenize_module.sentence_hash


def colliding_hash(sentence) -> int:
    """blake2b-64 as usual, except that SECOND hashes like FIRST."""
    key = tokenize_module.sentence_key(sentence)
    return real_hash(FIRST if key == SECOND else key)


@pytest.fixture
def collide(monkeypatch):
    for module in ("elmo_cache.builder.pipeline", "elmo_cache.reader"):
        monkeypatch.setattr(f"{module}.sentence_hash", colliding_hash)
    monkeypatch.setattr("elmo_cache.verify.sentence_hash", colliding_hash)


def make(tmp_path, encoder, name: str, **options) -> elmo_cache.Cache:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    build(corpus, BuildOptions(output=tmp_path / name, progress=False, **options), encoder=encoder)
    return elmo_cache.open(tmp_path / name)


@pytest.mark.parametrize("name", ["c.zarr", "c.h5"])
def test_the_cache_does_not_answer_for_a_colliding_sentence(tmp_path, tiny_encoder, collide, name):
    with make(tmp_path, tiny_encoder, name) as cache:
        assert colliding_hash(SECOND) == colliding_hash(FIRST)
        assert cache.find(FIRST) == 1 and cache.find(SECOND) is None and cache.get(SECOND) is None
        assert cache.tokens(3) == SECOND.split()  # still stored, and readable by number
        assert not np.array_equal(cache[1], cache[3])
    assert verify(tmp_path / name).ok  # a collision in the corpus is not damage


def test_the_server_encodes_a_colliding_sentence_live_or_says_404(tmp_path, tiny_encoder, collide):
    cache = make(tmp_path, tiny_encoder, "c.zarr")
    want = tiny_encoder.embed_batch([SECOND.split()])[0]

    async def ask(app) -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://elmo.test") as client:
                return [
                    await client.get("/embed", params={"sentence": SECOND, "format": "npy"}),
                    await client.get("/embed", params={"sentence": FIRST, "format": "npy"}),
                ]

    alone, hit = asyncio.run(ask(create_app(Settings(max_wait_ms=2.0), cache=cache)))
    assert alone.status_code == 404 and alone.json()["error"]["code"] == "not_in_cache"
    assert hit.status_code == 200
    live, _ = asyncio.run(ask(create_app(Settings(max_wait_ms=2.0), cache=cache, encoder=tiny_encoder)))
    assert live.status_code == 200
    np.testing.assert_allclose(np.load(io.BytesIO(live.content)), want, rtol=1e-5, atol=1e-6)


def test_verify_finds_rows_shared_by_colliding_sentences(tmp_path, tiny_encoder, collide):
    # With dedupe the build shares rows by hash, so the colliding sentence gets the first one's
    # vectors by number; lookups by text still refuse it, and verify names the two sentences.
    with make(tmp_path, tiny_encoder, "d.h5", dedupe=True) as cache:
        assert cache.get(SECOND) is None
    report = verify(tmp_path / "d.h5")
    assert not report.ok and "sentences 1 and 3 share rows of vectors but hold different tokens" in report.problems[0]
