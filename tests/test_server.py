"""The FastAPI server, in process: real tiny model, real caches, httpx over ASGI."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import re
import threading

import httpx
import numpy as np
import pytest
import torch

import elmo_cache
from elmo_cache.errors import InvalidParameterError
from elmo_cache.selection import MixSpec, Selection
from elmo_cache.server import Settings, create_app, load_resources
from elmo_cache.text.tokenize import tokenize

LINES = [
    "The cat sat on the mat .",
    "A dog ran away",
    "hello world",
    "Colourless green ideas sleep furiously .",
    "",
    "one",
]
UNSEEN = ["nobody wrote this line", "the mat sat on the cat", "x y z w v u t"]


# -- helpers ---------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(app):
    """Run the app's lifespan and give an httpx client talking to it over ASGI."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://elmo.test") as client:
            yield client


def run(app, scenario):
    """Run ``await scenario(client)`` against a started app."""

    async def main():
        async with serving(app) as client:
            return await scenario(client)

    return asyncio.run(main())


def metric(text: str, name: str) -> float:
    """Sum of the samples of ``name`` (any labels) in a Prometheus text exposition."""
    total, found = 0.0, False
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match:
            total += float(match.group(2))
            found = True
    assert found, f"metric {name} not exported"
    return total


def decode(response: httpx.Response) -> np.ndarray:
    """The vectors of a GET /embed response, whatever its format."""
    if response.headers["content-type"].startswith("application/x-npy"):
        return np.load(io.BytesIO(response.content), allow_pickle=False)
    body = response.json()
    return decode_item(body)


def decode_item(item: dict) -> np.ndarray:
    dtype = np.dtype(item["dtype"]).newbyteorder("<")
    if "data" in item:
        return np.frombuffer(base64.b64decode(item["data"]), dtype=dtype).reshape(item["shape"])
    return np.asarray(item["vectors"], dtype=np.float32).astype(item["dtype"]).reshape(item["shape"])


def reference(encoder, lines):
    """What Encoder.embed_batch says for ``lines`` (the live answers must match it)."""
    return encoder.embed_batch([tokenize(line) for line in lines])


def close(a, b):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-5, atol=1e-6)


def build_cache(path, encoder, lines, *, layers=None, mix=None, fp16=False):
    """A real cache of ``lines`` built by ``elmo_cache.builder`` with the tiny model."""
    from elmo_cache.builder import BuildOptions, build

    corpus = path.with_suffix(".txt")
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    options = BuildOptions(output=path, layers=layers, mix=mix, fp16=fp16, device="cpu", progress=False)
    build(corpus, options, encoder=encoder)
    return elmo_cache.open(path)


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return elmo_cache.Encoder.load(tiny_model, device="cpu")


@pytest.fixture(scope="module")
def layered_cache(tmp_path_factory, encoder):
    return build_cache(tmp_path_factory.mktemp("layered") / "c.zarr", encoder, LINES)


def settings(**overrides) -> Settings:
    base = {"max_wait_ms": 2.0}
    base.update(overrides)
    return Settings(**base)


class GatedEncoder:
    """A real encoder whose ``embed_batch`` first waits until the test opens the gate."""

    def __init__(self, encoder):
        self._encoder = encoder
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.output_dim = encoder.output_dim
        self.identity = encoder.identity

    def embed_batch(self, sentences):
        self.entered.set()
        assert self.gate.wait(30), "test never opened the gate"
        return self._encoder.embed_batch(sentences)


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


# -- batching and back-pressure --------------------------------------------------------------------


def test_concurrent_live_requests_are_batched(encoder):
    app = create_app(settings(max_wait_ms=300), encoder=encoder)
    lines = [f"sentence number {i} has {'some ' * (i % 4)}words" for i in range(12)]
    want = reference(encoder, lines)

    async def scenario(client):
        responses = await asyncio.gather(*(client.get("/embed", params={"sentence": s}) for s in lines))
        for response, expected in zip(responses, want):
            assert response.status_code == 200, response.text
            close(decode(response), expected)
        return (await client.get("/metrics")).text

    text = run(app, scenario)
    batches = metric(text, "elmo_cache_live_batch_sentences_count")
    sentences = metric(text, "elmo_cache_live_batch_sentences_sum")
    assert sentences == len(lines)
    assert batches < len(lines) and sentences > batches
    assert metric(text, "elmo_cache_live_batch_requests_sum") == len(lines)


def test_full_queue_answers_429_at_once(encoder):
    gated = GatedEncoder(encoder)
    app = create_app(settings(queue_size=1, max_wait_ms=0), encoder=gated)

    async def scenario(client):
        first = asyncio.create_task(client.get("/embed", params={"sentence": UNSEEN[0]}))
        assert await asyncio.to_thread(gated.entered.wait, 10)  # the encoder holds request 1
        second = asyncio.create_task(client.get("/embed", params={"sentence": UNSEEN[1]}))
        for _ in range(500):  # until request 2 sits in the queue
            text = (await client.get("/metrics")).text
            if metric(text, "elmo_cache_live_queue_depth") == 1:
                break
            await asyncio.sleep(0.01)
        assert metric(text, "elmo_cache_live_queue_depth") == 1
        third = await asyncio.wait_for(client.get("/embed", params={"sentence": UNSEEN[2]}), 5)
        assert third.status_code == 429 and third.json()["error"]["code"] == "queue_full"
        assert third.headers["retry-after"] == "1"
        # Cache-free routes stay responsive while the encoder is busy.
        assert (await client.get("/health")).status_code == 200
        gated.gate.set()
        done = await asyncio.gather(first, second)
        want = reference(encoder, UNSEEN[:2])
        for response, expected in zip(done, want):
            assert response.status_code == 200
            close(decode(response), expected)
        return (await client.get("/metrics")).text

    text = run(app, scenario)
    assert metric(text, "elmo_cache_live_rejected_total") == 1
    assert metric(text, "elmo_cache_live_queue_depth") == 0


def test_live_timeout_answers_503_and_the_worker_carries_on(encoder):
    gated = GatedEncoder(encoder)
    app = create_app(settings(live_timeout_s=0.2, max_wait_ms=0), encoder=gated)
    assert app.openapi()["paths"]["/embed"]["get"]["responses"]["503"]

    async def scenario(client):
        # Request 1 holds the encoder past the timeout; request 2 waits in the queue behind it.
        first = asyncio.create_task(client.get("/embed", params={"sentence": UNSEEN[0]}))
        assert await asyncio.to_thread(gated.entered.wait, 10)
        second = await client.post("/embed", json={"sentences": UNSEEN[1:]})
        timed_out = await first
        for response in (timed_out, second):
            assert response.status_code == 503, response.text
            error = response.json()["error"]
            assert error["code"] == "live_timeout" and "0.2 s (live_timeout_s)" in error["message"]
            assert response.headers["retry-after"] == "1"
        # The worker is still alive (only stuck in the encoder): health and cache-free routes answer.
        assert (await client.get("/health")).status_code == 200
        gated.gate.set()  # the encoder finishes request 1's batch; its answer is dropped
        later = await client.get("/embed", params={"sentence": UNSEEN[2]})
        assert later.status_code == 200, later.text
        close(decode(later), reference(encoder, UNSEEN[2:])[0])
        info = (await client.get("/info")).json()
        assert info["limits"]["live_timeout_s"] == 0.2
        return (await client.get("/metrics")).text

    text = run(app, scenario)
    assert metric(text, "elmo_cache_live_timeouts_total") == 2
    # Request 2 timed out while queued: it never reached the encoder.
    assert metric(text, "elmo_cache_live_sentences_total") == 2


def test_live_timeout_zero_means_no_limit(encoder):
    gated = GatedEncoder(encoder)
    app = create_app(settings(live_timeout_s=0, max_wait_ms=0), encoder=gated)

    async def scenario(client):
        pending = asyncio.create_task(client.get("/embed", params={"sentence": UNSEEN[0]}))
        assert await asyncio.to_thread(gated.entered.wait, 10)
        await asyncio.sleep(0.3)
        assert not pending.done()
        gated.gate.set()
        response = await pending
        assert response.status_code == 200
        close(decode(response), reference(encoder, UNSEEN[:1])[0])

    run(app, scenario)


# -- security, limits, errors, docs ----------------------------------------------------------------


def test_api_key(encoder):
    app = create_app(settings(api_key="s3cret"), encoder=encoder)
    spec = app.openapi()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert spec["paths"]["/embed"]["get"]["security"] and "security" not in spec["paths"]["/health"]["get"]

    async def scenario(client):
        assert (await client.get("/health")).status_code == 200
        for path in ("/embed?sentence=a", "/info", "/metrics"):
            missing = await client.get(path)
            assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
            assert missing.headers["www-authenticate"] == "Bearer"
            wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            right = await client.get(path, headers={"Authorization": "Bearer s3cret"})
            assert right.status_code == 200, right.text
        assert (await client.get("/info", headers={"Authorization": "Bearer s3cret"})).json()["auth"] is True

    run(app, scenario)


def test_limits_and_bad_parameters(encoder):
    app = create_app(
        settings(max_tokens_per_sentence=5, max_sentences_per_request=3, max_body_bytes=400), encoder=encoder
    )

    async def chunked(body: bytes):
        yield body[:100]
        yield body[100:]

    async def scenario(client):
        def error(response, status):
            assert response.status_code == status, response.text
            return response.json()["error"]

        e = error(await client.get("/embed", params={"sentence": "a b c d e f"}), 413)
        assert e["code"] == "too_many_tokens" and "6 tokens" in e["message"] and "limit is 5" in e["message"]
        e = error(await client.post("/embed", json={"sentences": ["a", "b c d e f g", "c"]}), 413)
        assert e["code"] == "too_many_tokens" and "sentences[1]" in e["message"]
        e = error(await client.post("/embed", json={"sentences": ["a"] * 4}), 413)
        assert e["code"] == "too_many_sentences" and "limit is 3" in e["message"]
        e = error(await client.post("/embed", json={"sentences": ["word " * 100]}), 413)
        assert e["code"] == "body_too_large" and "400 bytes" in e["message"]
        big = b'{"sentences": ["' + b"w " * 300 + b'"]}'
        e = error(await client.post("/embed", content=chunked(big), headers={"content-type": "application/json"}), 413)
        assert e["code"] == "body_too_large"
        e = error(await client.get("/embed", params={"sentence": "a", "layers": "1,3"}), 422)
        assert "query.layers: '1,3' is not a list of layer ids" in e["message"] and "[0, 1, 2]" in e["message"]
        e = error(await client.get("/embed", params={"sentence": "a", "layers": "top"}), 422)
        assert "'top' is not a list of layer ids" in e["message"]
        # The schema's pattern refuses what is not three plain numbers.
        for bad in ("1,x,2", "1,nan,2", "1,2", "1,inf,2"):
            e = error(await client.get("/embed", params={"sentence": "a", "mix": bad}), 422)
            assert e["code"] == "validation_error" and "query.mix" in e["message"]
        e = error(await client.get("/embed", params={"sentence": "a", "mix": "1,1,1", "layers": "1"}), 422)
        assert "not both" in e["message"]
        e = error(await client.get("/embed", params={"sentence": "a", "gamma": 2}), 422)
        assert "only with mix" in e["message"]
        e = error(await client.get("/embed", params={"sentence": "a", "format": "xml"}), 422)
        assert e["code"] == "validation_error" and "'json', 'npy' or 'base64'" in e["message"]
        e = error(await client.get("/embed"), 422)
        assert "query.sentence" in e["message"]
        e = error(await client.post("/embed", json={"sentences": []}), 422)
        assert "body.sentences" in e["message"]
        e = error(await client.post("/embed", json={"sentences": ["a"], "layer": "1"}), 422)
        assert "layer" in e["message"]
        e = error(await client.post("/embed", content=b"{not json", headers={"content-type": "application/json"}), 422)
        assert e["code"] == "validation_error"
        # Still answers normally after all that.
        assert (await client.get("/embed", params={"sentence": "a b"})).status_code == 200

    run(app, scenario)


def test_every_limit_admits_its_own_value_and_is_shown(encoder):
    """Each documented limit: exactly at the limit is answered, one over is refused (413), GET /info shows it."""
    app = create_app(
        settings(max_tokens_per_sentence=5, max_sentences_per_request=3, max_body_bytes=120, batch_tokens=4),
        encoder=encoder,
    )

    async def scenario(client):
        at_limit = "a b c d e"
        response = await client.get("/embed", params={"sentence": at_limit})
        assert response.status_code == 200 and response.json()["shape"] == [3, 5, 32]
        # Three 5-token sentences: more than batch_tokens (4) in one request, so the encoder runs in slices;
        # the answers are the same as one encoder call's.
        lines = ["a b c d e", "f g h i j", "k l m n o"]
        body = {"sentences": lines, "format": "base64"}
        assert len(json.dumps(body)) <= 120
        response = await client.post("/embed", json=body)
        assert response.status_code == 200, response.text
        for item, want in zip(response.json()["results"], reference(encoder, lines)):
            close(decode_item(item), want)
        # Exactly max_body_bytes is accepted, one byte more is not.
        raw = json.dumps({"sentences": ["a"]}).encode()
        exact = raw[:-1] + b" " * (120 - len(raw)) + raw[-1:]
        assert len(exact) == 120
        headers = {"content-type": "application/json"}
        assert (await client.post("/embed", content=exact, headers=headers)).status_code == 200
        over = await client.post("/embed", content=exact[:-1] + b" }", headers=headers)
        assert over.status_code == 413 and over.json()["error"]["code"] == "body_too_large"
        # Format choices are the same for POST.
        bad = await client.post("/embed", json={"sentences": ["a"], "format": "xml"})
        assert bad.status_code == 422 and "'json', 'npy' or 'base64'" in bad.json()["error"]["message"]
        npz = await client.post("/embed", json={"sentences": ["a", "b c"], "format": "npy"})
        assert npz.headers["content-type"].startswith("application/x-npz")
        return (await client.get("/info")).json()["limits"]

    limits = run(app, scenario)
    assert limits == {
        "max_tokens_per_sentence": 5,
        "max_sentences_per_request": 3,
        "max_body_bytes": 120,
        "batch_tokens": 4,
        "max_wait_ms": 2.0,
        "queue_size": 64,
        "live_timeout_s": 60.0,
        "max_response_bytes": 64 * 1024 * 1024,
        "request_timeout_s": 30.0,
    }


def test_settings_come_from_the_environment_and_are_checked(monkeypatch):
    from elmo_cache.server import load_settings

    monkeypatch.setenv("ELMO_CACHE_MAX_TOKENS_PER_SENTENCE", "7")
    monkeypatch.setenv("ELMO_CACHE_LIVE_TIMEOUT_S", "2.5")
    monkeypatch.setenv("ELMO_CACHE_QUEUE_SIZE", "3")
    loaded = load_settings(queue_size=9, max_body_bytes=None)  # a flag wins, an absent one leaves the env
    assert (loaded.max_tokens_per_sentence, loaded.live_timeout_s, loaded.queue_size) == (7, 2.5, 9)
    assert loaded.max_body_bytes == 1_000_000
    for name, value in (
        ("max_tokens_per_sentence", 0),
        ("max_sentences_per_request", 0),
        ("max_body_bytes", 0),
        ("batch_tokens", 0),
        ("queue_size", 0),
        ("max_wait_ms", -1),
        ("live_timeout_s", -1),
        ("port", 70000),
    ):
        with pytest.raises(InvalidParameterError, match=f"{name} \\(ELMO_CACHE_{name.upper()}\\)"):
            load_settings(**{name: value})
    monkeypatch.setenv("ELMO_CACHE_LIVE_TIMEOUT_S", "soon")
    with pytest.raises(InvalidParameterError, match="ELMO_CACHE_LIVE_TIMEOUT_S"):
        load_settings()


def test_timing_headers_and_request_metrics(encoder):
    app = create_app(settings(), encoder=encoder)

    async def scenario(client):
        response = await client.get("/embed", params={"sentence": "timing test"})
        assert float(response.headers["x-process-time"]) > 0
        parts = dict(p.strip().split(";dur=") for p in response.headers["server-timing"].split(","))
        assert {"queue", "encode", "serialize", "total"} <= set(parts)
        assert float(parts["encode"]) > 0 and float(parts["total"]) >= float(parts["encode"])
        await client.get("/nowhere")
        return (await client.get("/metrics")).text

    text = run(app, scenario)
    assert 'elmo_cache_requests_total{method="GET",route="/embed",status="200"} 1.0' in text
    assert 'route="unmatched",status="404"' in text
    assert metric(text, "elmo_cache_request_seconds_count") >= 2


def test_openapi_describes_every_parameter_and_error(encoder):
    spec = create_app(settings(), encoder=encoder).openapi()
    get = spec["paths"]["/embed"]["get"]
    names = {p["name"] for p in get["parameters"]}
    assert names == {"sentence", "layers", "mix", "gamma", "softmax", "format"}
    assert all(p.get("description") for p in get["parameters"])
    post = spec["paths"]["/embed"]["post"]
    body = spec["components"]["schemas"]["EmbedRequest"]["properties"]
    assert all(field.get("description") for field in body.values())
    for operation in (get, post):
        assert {"200", "401", "404", "413", "422", "429", "503"} <= set(operation["responses"])
        assert all(r.get("description") for r in operation["responses"].values())
    assert "application/x-npy" in get["responses"]["200"]["content"]
    assert set(spec["paths"]) == {"/embed", "/health", "/info", "/metrics"}


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
