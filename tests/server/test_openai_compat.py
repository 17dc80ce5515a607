"""``POST /v1/embeddings`` (server/routers/embeddings.py, server/openai_compat.py): the OpenAI shape over real
caches and a real tiny model; every vector checked against the encoder's own layers."""

from __future__ import annotations

import base64

import numpy as np
import pytest

import elmo_cache
from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.selection import MixSpec
from elmo_cache.server import create_app
from elmo_cache.text.tokenize import tokenize
from tests.server_helpers import LINES, UNSEEN, build_cache, close, reference, run, settings


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return elmo_cache.Encoder.load(tiny_model, device="cpu")


def average_mean(layers: np.ndarray, keep=(0, 1, 2)) -> np.ndarray:
    """The documented default: the mean over tokens of the average of the kept layers, in float32."""
    return layers[list(keep)].astype(np.float32).mean(axis=0).mean(axis=0)


def test_model_only_string_and_list_inputs_float_and_base64(encoder):
    app = create_app(settings(), encoder=encoder)
    expected = [average_mean(layers) for layers in reference(encoder, UNSEEN)]

    async def scenario(client):
        one = await client.post("/v1/embeddings", json={"input": UNSEEN[0], "model": "text-embedding-3-small"})
        assert one.status_code == 200, one.text
        body = one.json()
        assert body["object"] == "list" and body["model"] == encoder.name
        assert [(d["object"], d["index"]) for d in body["data"]] == [("embedding", 0)]
        close(body["data"][0]["embedding"], expected[0])
        n = len(tokenize(UNSEEN[0]))
        assert body["usage"] == {"prompt_tokens": n, "total_tokens": n}

        many = await client.post(
            "/v1/embeddings", json={"input": UNSEEN, "model": "x", "encoding_format": "base64", "user": "u1"}
        )
        assert many.status_code == 200, many.text
        data = many.json()["data"]
        assert [d["index"] for d in data] == [0, 1, 2]
        for item, want in zip(data, expected):
            vector = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
            assert vector.shape == (32,)
            close(vector, want)
        assert many.json()["usage"]["prompt_tokens"] == sum(len(tokenize(line)) for line in UNSEEN)

        same_width = await client.post("/v1/embeddings", json={"input": "a b", "dimensions": 32})
        assert same_width.status_code == 200, same_width.text

    run(app, scenario)


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"input": "a b", "dimensions": 8}, "dimensions: this server's vectors have 32 dimensions"),
        ({"input": []}, "input"),
        ({"input": [1, 2, 3]}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m"}, "input"),
    ],
)
def test_refusals_name_the_field(encoder, body, text):
    app = create_app(settings(), encoder=encoder)

    async def scenario(client):
        response = await client.post("/v1/embeddings", json=body)
        assert response.status_code == 422, response.text
        assert text in response.text

    run(app, scenario)


def test_a_layer_subset_cache_alone_averages_its_layers_and_says_what_it_lacks(tmp_path, encoder):
    cache = build_cache(tmp_path / "c.zarr", encoder, LINES, layers=(1, 2))
    app = create_app(settings(), cache=cache)

    async def scenario(client):
        response = await client.post("/v1/embeddings", json={"input": LINES[:4], "model": "elmo"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model"] == cache.metadata["model"]["name"]
        for i, item in enumerate(body["data"]):
            want = cache[i].astype(np.float32).mean(axis=0).mean(axis=0)  # the stored layers 1 and 2
            close(item["embedding"], want)
        missing = await client.post("/v1/embeddings", json={"input": UNSEEN[0]})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_in_cache"

    run(app, scenario)


def test_a_mixed_cache_pools_its_own_mix(tmp_path, encoder):
    mix = MixSpec.from_raw([0.2, 0.3, 0.5], gamma=2.0)
    cache = build_cache(tmp_path / "m.zarr", encoder, LINES, mix=mix)
    app = create_app(settings(), cache=cache)

    async def scenario(client):
        response = await client.post("/v1/embeddings", json={"input": LINES[0]})
        assert response.status_code == 200, response.text
        close(response.json()["data"][0]["embedding"], cache[0].astype(np.float32).mean(axis=0))

    run(app, scenario)


def test_pool_and_mix_settings(encoder):
    app = create_app(settings(openai_pool="max", openai_mix="0,0,1"), encoder=encoder)
    [layers] = reference(encoder, UNSEEN[:1])

    async def scenario(client):
        response = await client.post("/v1/embeddings", json={"input": UNSEEN[0]})
        assert response.status_code == 200, response.text
        close(response.json()["data"][0]["embedding"], layers[2].max(axis=0))

    run(app, scenario)


def test_first_last_doubles_the_width_and_a_bad_mix_setting_is_refused(encoder):
    app = create_app(settings(openai_pool="first-last"), encoder=encoder)
    [layers] = reference(encoder, UNSEEN[:1])
    mixed = layers.mean(axis=0)

    async def scenario(client):
        response = await client.post("/v1/embeddings", json={"input": UNSEEN[0], "dimensions": 64})
        assert response.status_code == 200, response.text
        close(response.json()["data"][0]["embedding"], np.concatenate([mixed[0], mixed[-1]]))

    run(app, scenario)
    with pytest.raises(ValueError, match="openai_mix"):
        settings(openai_mix="1,x")  # not numbers: refused with the settings
    # Numbers, but not one per layer of the model: refused as the server starts, naming the setting and the count.
    with pytest.raises(InvalidParameterError, match=r"openai_mix \(ELMO_CACHE_OPENAI_MIX\): .*expected 3 numbers"):
        run(create_app(settings(openai_mix="1,2"), encoder=encoder), lambda client: client.get("/health"))


def test_behind_the_api_key(encoder):
    app = create_app(settings(api_key="k"), encoder=encoder)

    async def scenario(client):
        assert (await client.post("/v1/embeddings", json={"input": "a"})).status_code == 401
        ok = await client.post("/v1/embeddings", json={"input": "a"}, headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200, ok.text

    run(app, scenario)
