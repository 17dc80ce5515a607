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
from elmo_cache.verify.checks import verify

FIRST, SECOND = "the cat sat on the mat", "a dog ran into the park"  # six tokens each
LINES = ["hello world", FIRST, "one", SECOND, ""]


real_key_hash = tokenize_module.key_hash


def colliding_key_hash(key: bytes) -> int:
    """blake2b-64 of a stored key as usual, except that SECOND's key hashes like FIRST's."""
    return real_key_hash(FIRST.encode() if key == SECOND.encode() else key)


def colliding_hash(sentence) -> int:
    """The sentence hash over :func:`colliding_key_hash`."""
    return colliding_key_hash(tokenize_module.sentence_key(sentence).encode("utf-8", "surrogatepass"))


@pytest.fixture
def collide(monkeypatch):
    # Where the build hashes sentences, and where lookups and verify hash keys (or corpus lines).
    monkeypatch.setattr("elmo_cache.builder.local.sentence_hash", colliding_hash)
    monkeypatch.setattr("elmo_cache.reader.cache.key_hash", colliding_key_hash)
    monkeypatch.setattr("elmo_cache.verify.checks.key_hash", colliding_key_hash)
    monkeypatch.setattr("elmo_cache.verify.checks.sentence_hash", colliding_hash)


def make(tmp_path, encoder, name: str, lines=LINES, **options) -> elmo_cache.Cache:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
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


@pytest.mark.parametrize("where", ["same window", "later window", "after a resume"])
def test_dedupe_never_shares_rows_between_colliding_sentences(tmp_path, tiny_encoder, collide, where):
    # Dedupe matches a second, independent hash too, so a colliding sentence gets its own rows.
    lines = [*LINES, FIRST, SECOND]
    options = {"dedupe": True, "commit_seconds": 0}
    if where != "same window":
        options.update(batch_tokens=8, window_batches=1)  # FIRST and SECOND in different windows
    if where == "after a resume":
        real, calls = tiny_encoder.encode_flat, [0]

        def crash_on_second_window(sentences):
            calls[0] += 1
            if calls[0] == 2:
                raise RuntimeError("simulated crash")
            return real(sentences)

        tiny_encoder.encode_flat = crash_on_second_window
        try:
            with pytest.raises(RuntimeError, match="simulated crash"):
                make(tmp_path, tiny_encoder, "d.h5", lines, **options)
        finally:
            del tiny_encoder.encode_flat
    with make(tmp_path, tiny_encoder, "d.h5", lines, **options) as cache:
        offsets = np.asarray(cache._offsets)
        assert offsets[5] == offsets[1]  # a true repeat still shares rows
        assert len({offsets[1], offsets[3], offsets[6]}) == 3
        want = tiny_encoder.embed_batch([SECOND.split()])[0]
        for i in (3, 6):
            np.testing.assert_allclose(cache[i], want, rtol=1e-5, atol=1e-6)
        assert cache.get(SECOND) is None
    assert verify(tmp_path / "d.h5").ok


def test_verify_finds_rows_shared_by_different_sentences(tmp_path, tiny_encoder, collide, monkeypatch):
    # A build that deduplicates by the index hash alone (as before the check hash) shares rows.
    monkeypatch.setattr(
        "elmo_cache.builder.encoding.check_hashes", lambda token_lists: np.zeros(len(token_lists), np.uint64)
    )
    with make(tmp_path, tiny_encoder, "d.h5", dedupe=True) as cache:
        assert np.asarray(cache._offsets)[3] == np.asarray(cache._offsets)[1]
        assert cache.get(SECOND) is None  # lookups by text still refuse it
    report = verify(tmp_path / "d.h5")
    assert not report.ok and "sentences 1 and 3 share rows of vectors but hold different tokens" in report.problems[0]
