"""The FastAPI server, in process: real tiny model, real caches, httpx over ASGI."""

from __future__ import annotations

import asyncio
import io

import httpx
import numpy as np
import pytest
import torch

import elmo_cache
from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.selection import MixSpec, Selection
from elmo_cache.server import Settings, create_app, load_resources
from elmo_cache.text.tokenize import tokenize
from tests.server_helpers import (
    LINES,
    UNSEEN,
    build_cache,
    close,
    decode,
    decode_item,
    metric,
    reference,
    run,
    settings,
)


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return elmo_cache.Encoder.load(tiny_model, device="cpu")


@pytest.fixture(scope="module")
def layered_cache(tmp_path_factory, encoder):
    return build_cache(tmp_path_factory.mktemp("layered") / "c.zarr", encoder, LINES)


# -- model only ------------------------------------------------------------------------------------


def test_model_only_answers_equal_embed_batch(encoder):
    app = create_app(settings(), encoder=encoder)
    expected = reference(encoder, UNSEEN)

    async def scenario(client):
        for line, want in zip(UNSEEN, expected):
            for fmt in ("json", "npy", "base64"):
                response = await client.get("/embed", params={"sentence": line, "format": fmt})
                assert response.status_code == 200, response.text
                got = decode(response)
                assert got.dtype == np.float32 and got.shape == want.shape == (3, len(tokenize(line)), 32)
                close(got, want)
            body = (await client.get("/embed", params={"sentence": line})).json()
            assert body["source"] == "live" and body["tokens"] == tokenize(line) and body["layers"] == [0, 1, 2]
        response = await client.post("/embed", json={"sentences": UNSEEN + [""], "layers": "2,0"})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["source"] for r in results] == ["live"] * 4
        for item, want in zip(results, expected):
            close(decode_item(item), want[[0, 2]])
        assert results[3]["shape"] == [2, 0, 32]

    run(app, scenario)


def test_mix_is_applied_in_float32(encoder):
    app = create_app(settings(), encoder=encoder)
    mix = MixSpec.from_raw([0.5, -1.0, 2.0], gamma=0.7, softmax=True)
    want = [mix.apply(torch.from_numpy(a)).numpy() for a in reference(encoder, UNSEEN)]

    async def scenario(client):
        response = await client.get(
            "/embed",
            params={"sentence": UNSEEN[0], "mix": "0.5,-1,2", "gamma": 0.7, "softmax": "true", "format": "npy"},
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-elmo-shape"] == f"{len(tokenize(UNSEEN[0]))},32"
        close(decode(response), want[0])
        response = await client.post(
            "/embed",
            json={"sentences": UNSEEN, "mix": [0.5, -1.0, 2.0], "gamma": 0.7, "softmax": True, "format": "npy"},
        )
        archive = np.load(io.BytesIO(response.content))
        assert response.headers["x-elmo-sources"] == "live,live,live"
        for i, expected in enumerate(want):
            close(archive[f"arr_{i}"], expected)

    run(app, scenario)


def test_health_is_ready_only_once_loaded(encoder):
    app = create_app(settings(), encoder=encoder)

    async def before():
        transport = httpx.ASGITransport(app=app)  # no lifespan: nothing loaded yet
        async with httpx.AsyncClient(transport=transport, base_url="http://elmo.test") as client:
            health = await client.get("/health")
            embed = await client.get("/embed", params={"sentence": "a b"})
            return health, embed

    health, embed = asyncio.run(before())
    assert health.status_code == 503 and health.json()["status"] == "loading"
    assert embed.status_code == 503 and embed.json()["error"]["code"] == "not_ready"

    async def during(client):
        return (await client.get("/health")).json(), (await client.get("/info")).json()

    health, info = run(app, during)
    assert health == {"status": "ok", "cache": False, "model": True}
    assert info["model"]["weights_sha256"] == encoder.identity["weights_sha256"]
    assert info["cache"] is None and info["dim"] == 32 and info["available_layers"] == [0, 1, 2]
    assert info["limits"]["max_tokens_per_sentence"] == Settings().max_tokens_per_sentence


# -- cache -----------------------------------------------------------------------------------------


def test_cached_answers_equal_cache_rows(encoder, layered_cache):
    app = create_app(settings(), encoder=encoder, cache=layered_cache)
    live_want = reference(encoder, UNSEEN)

    async def scenario(client):
        for line in LINES:
            row = np.asarray(layered_cache[layered_cache.find(line)])
            for fmt in ("json", "npy", "base64"):
                response = await client.get("/embed", params={"sentence": f"  {line} ", "format": fmt})
                assert response.status_code == 200, response.text
                got = decode(response)
                assert got.dtype == row.dtype and got.shape == row.shape
                np.testing.assert_array_equal(got, row)
            assert response.json()["source"] == "cache"
        response = await client.post("/embed", json={"sentences": [LINES[0], UNSEEN[0], LINES[2], UNSEEN[1]]})
        results = response.json()["results"]
        assert [r["source"] for r in results] == ["cache", "live", "cache", "live"]
        np.testing.assert_array_equal(decode_item(results[0]), layered_cache[0])
        close(decode_item(results[1]), live_want[0])
        close(decode_item(results[3]), live_want[1])
        return (await client.get("/metrics")).text

    text = run(app, scenario)
    assert metric(text, "elmo_cache_cache_hits_total") == 3 * len(LINES) + 2
    assert metric(text, "elmo_cache_cache_misses_total") == 2
    assert metric(text, "elmo_cache_live_sentences_total") == 2


def test_cache_alone(tmp_path, encoder, layered_cache):
    partial = build_cache(tmp_path / "partial.h5", encoder, LINES, layers=(1, 2))
    app = create_app(settings(), cache=partial)

    async def scenario(client):
        miss = await client.get("/embed", params={"sentence": UNSEEN[0]})
        assert miss.status_code == 404
        assert miss.json()["error"]["code"] == "not_in_cache" and "no model" in miss.json()["error"]["message"]
        many = await client.post("/embed", json={"sentences": [LINES[0], UNSEEN[0], UNSEEN[1]]})
        assert many.status_code == 404 and "sentences[1, 2]" in many.json()["error"]["message"]
        hit = await client.get("/embed", params={"sentence": LINES[0], "layers": "2"})
        np.testing.assert_array_equal(decode(hit), np.asarray(partial[0])[[1]])
        absent = await client.get("/embed", params={"sentence": LINES[0], "layers": "0,2"})
        assert absent.status_code == 422 and "choose from [1, 2]" in absent.json()["error"]["message"]
        # A mix that gives layer 0 no weight is computable from layers 1 and 2, in float32.
        mixed = await client.get("/embed", params={"sentence": LINES[0], "mix": "0,0.25,0.75", "gamma": 2})
        assert mixed.status_code == 200, mixed.text
        full = np.asarray(layered_cache[0], np.float32)
        close(decode(mixed), 2 * (0.25 * full[1] + 0.75 * full[2]))
        needs_zero = await client.get("/embed", params={"sentence": LINES[0], "mix": "1,1,1"})
        assert needs_zero.status_code == 422 and "needs layers [0, 1, 2]" in needs_zero.json()["error"]["message"]
        info = (await client.get("/info")).json()
        assert info["model"] is None and info["available_layers"] == [1, 2]
        assert info["cache"]["metadata"]["layers"] == [1, 2] and info["cache"]["sentences"] == len(LINES)

    run(app, scenario)


def test_mixed_float16_cache(tmp_path, encoder):
    mix = MixSpec.from_raw([0.2, 0.3, 0.5], gamma=1.5)
    mixed = build_cache(tmp_path / "mixed.zarr", encoder, LINES, mix=mix, fp16=True)
    stored = mixed.metadata["mix"]
    spec = MixSpec(weights=tuple(stored["weights"]), gamma=stored["gamma"])

    async def cache_only(client):
        hit = await client.get("/embed", params={"sentence": LINES[3], "format": "base64"})
        assert hit.json()["dtype"] == "float16" and hit.json()["shape"] == [len(tokenize(LINES[3])), 32]
        np.testing.assert_array_equal(decode(hit), mixed[3])
        same = await client.get("/embed", params={"sentence": LINES[3], "mix": "0.2,0.3,0.5", "gamma": 1.5})
        assert same.json()["source"] == "cache"
        for params in ({"layers": "1"}, {"mix": "1,0,0"}):
            refused = await client.get("/embed", params={"sentence": LINES[3], **params})
            assert refused.status_code == 422 and "only one fixed mix" in refused.json()["error"]["message"]

    run(create_app(settings(), cache=mixed), cache_only)

    async def with_model(client):
        miss = await client.get("/embed", params={"sentence": UNSEEN[2], "format": "npy"})
        assert miss.headers["x-elmo-source"] == "live" and miss.headers["x-elmo-dtype"] == "float16"
        want = spec.apply(torch.from_numpy(reference(encoder, UNSEEN[2:])[0])).numpy().astype(np.float16)
        np.testing.assert_array_equal(decode(miss), want)
        layers = await client.get("/embed", params={"sentence": LINES[3], "layers": "1"})
        assert layers.json()["source"] == "live"
        close(decode(layers), reference(encoder, LINES[3:4])[0][[1]].astype(np.float16))

    run(create_app(settings(), cache=mixed, encoder=encoder), with_model)


def test_model_that_did_not_build_the_cache_is_refused(tmp_path, layered_cache):
    from elmo_cache.model.random_model import write_random_model

    other = elmo_cache.Encoder.load(write_random_model(tmp_path, "tiny", seed=7), device="cpu")
    with pytest.raises(InvalidParameterError, match="weights_sha256"):
        load_resources(Settings(), encoder=other, cache=layered_cache)
    with pytest.raises(InvalidParameterError, match="nothing to serve"):
        load_resources(Settings())


def test_model_loaded_for_a_cache_encodes_as_the_cache_was_built(tmp_path, tiny_model, native_bf16):
    from elmo_cache.builder import BuildOptions, build

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    options = BuildOptions(
        output=tmp_path / "c.zarr",
        options_file=str(tiny_model[0]),
        weight_file=str(tiny_model[1]),
        precision="bf16",
        initial_state="warm",
        device="cpu",
        progress=False,
    )
    build(corpus, options)
    encoder, cache = load_resources(
        Settings(cache_path=tmp_path / "c.zarr", options_file=tiny_model[0], weight_file=tiny_model[1])
    )
    assert (encoder.precision, encoder.initial_state) == ("bf16", "warm")
    with pytest.raises(InvalidParameterError, match="precision"):
        load_resources(
            Settings(
                cache_path=tmp_path / "c.zarr", options_file=tiny_model[0], weight_file=tiny_model[1], precision="fp32"
            )
        )
    cache.close()


def test_openapi_describes_every_parameter_and_error(encoder):
    spec = create_app(settings(), encoder=encoder).openapi()
    get = spec["paths"]["/embed"]["get"]
    names = {p["name"] for p in get["parameters"]}
    assert names == {"sentence", "layers", "mix", "gamma", "softmax", "pool", "format"}
    assert all(p.get("description") for p in get["parameters"])
    # The pools are an enum in the schema, for GET and the POST body alike.
    assert spec["components"]["schemas"]["PoolName"]["enum"] == ["mean", "max", "first-last"]
    post = spec["paths"]["/embed"]["post"]
    body = spec["components"]["schemas"]["EmbedRequest"]["properties"]
    assert all(field.get("description") for field in body.values())
    for operation in (get, post):
        assert {"200", "401", "404", "413", "422", "429", "503"} <= set(operation["responses"])
        assert all(r.get("description") for r in operation["responses"].values())
    assert "application/x-npy" in get["responses"]["200"]["content"]
    assert set(spec["paths"]) == {"/embed", "/v1/embeddings", "/health", "/info", "/metrics"}


def test_json_vectors_have_one_text():
    """/embed's JSON is written by one encoder (orjson), so the same vectors always read as the same
    text: the shortest float32 form of each value, float16 widened exactly, non-ASCII tokens as UTF-8."""
    from elmo_cache.server.formats import Format, render_one
    from elmo_cache.server.service import Embedding

    vectors = np.array([[[0.1, 1 / 3, -2.5e-8, 1e20], [0.0, -0.0, 65504.0, 1.5]]], dtype=np.float32)
    body = render_one(Embedding(["Grüße", "."], vectors, "cache"), Selection(), Format.json).body
    text = (
        '{"source":"cache","tokens":["Grüße","."],"shape":[1,2,4],"dtype":"float32",'
        '"vectors":[[[0.1,0.33333334,-2.5e-8,1e+20],[0.0,-0.0,65504.0,1.5]]],"layers":[0,1,2],"mix":null}'
    )
    assert body == text.encode()
    half = vectors[:, :, :2].astype(np.float16)
    body = render_one(Embedding(["a", "b"], half, "live"), Selection(layers=(2,)), Format.json).body
    assert body == (
        b'{"source":"live","tokens":["a","b"],"shape":[1,2,2],"dtype":"float16",'
        b'"vectors":[[[0.099975586,0.33325195],[0.0,-0.0]]],"layers":[2],"mix":null}'
    )


def test_text_requests_are_split_as_the_cache_was_built(tmp_path, encoder):
    """A PTB-tokenised cache answers a raw sentence from the cache whatever its spacing, and a miss is encoded
    live with the same split (the tokens it answers are the cache's kind of tokens)."""
    from elmo_cache.builder import BuildOptions, build

    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat's on the mat.\n", encoding="utf-8")
    build(corpus, BuildOptions(output=tmp_path / "c.zarr", tokenize="ptb", progress=False), encoder=encoder)
    cache = elmo_cache.open(tmp_path / "c.zarr")
    app = create_app(settings(), encoder=encoder, cache=cache)

    async def scenario(client):
        for text in ("The cat's on the mat.", "The cat 's on the mat ."):
            hit = await client.get("/embed", params={"sentence": text})
            assert hit.status_code == 200 and hit.json()["source"] == "cache", hit.text
            np.testing.assert_allclose(decode(hit), cache[0], rtol=0, atol=0)
        miss = await client.get("/embed", params={"sentence": "A dog's bark."})
        assert miss.json()["source"] == "live" and miss.json()["tokens"] == ["A", "dog", "'s", "bark", "."]

    run(app, scenario)
