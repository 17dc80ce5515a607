"""The FastAPI server under load and limits: batching, the queue, timeouts, the API key, request limits,
settings, timing headers (in process: real tiny model, httpx over ASGI)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

import elmo_cache
from elmo_cache.errors import InvalidParameterError
from elmo_cache.server import create_app
from tests.server_helpers import (
    UNSEEN,
    GatedEncoder,
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


def test_the_docs_need_the_key_unless_opened(encoder):
    locked = create_app(settings(api_key="s3cret"), encoder=encoder)
    opened = create_app(settings(api_key="s3cret", open_docs=True), encoder=encoder)
    keyless = create_app(settings(), encoder=encoder)
    docs = ("/docs", "/redoc", "/openapi.json")

    async def needs_key(client):
        for path in docs:
            assert (await client.get(path)).status_code == 401, path
            right = await client.get(path, headers={"Authorization": "Bearer s3cret"})
            assert right.status_code == 200, path
        spec = (await client.get("/openapi.json", headers={"Authorization": "Bearer s3cret"})).json()
        assert "/v1/embeddings" in spec["paths"] and not {"/docs", "/redoc", "/openapi.json"} & set(spec["paths"])
        page = await client.get("/docs", headers={"Authorization": "Bearer s3cret"})
        assert "swagger" in page.text.lower() and "/openapi.json" in page.text

    async def open_docs(client):
        for path in docs:
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/info")).status_code == 401  # only the docs opened

    run(locked, needs_key)
    run(opened, open_docs)
    run(keyless, _docs_open_without_key)


async def _docs_open_without_key(client):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert (await client.get(path)).status_code == 200, path


def test_cors_is_off_by_default_and_allows_only_the_origins_given(encoder):
    off = create_app(settings(), encoder=encoder)
    on = create_app(settings(cors_origins=["https://app.example.org"], api_key="k"), encoder=encoder)
    preflight = {"Origin": "https://app.example.org", "Access-Control-Request-Method": "POST"}

    async def without(client):
        response = await client.get("/health", headers={"Origin": "https://app.example.org"})
        assert "access-control-allow-origin" not in response.headers
        answer = await client.options("/v1/embeddings", headers=preflight)
        assert answer.status_code == 204 and "access-control-allow-origin" not in answer.headers

    async def with_origins(client):
        answer = await client.options(
            "/v1/embeddings", headers={**preflight, "Access-Control-Request-Headers": "authorization,content-type"}
        )
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == "https://app.example.org"
        assert "POST" in answer.headers["access-control-allow-methods"]
        refused = await client.options("/v1/embeddings", headers={**preflight, "Origin": "https://evil.example"})
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        # A real request: the key still applies, and even its 401 is readable by the page.
        denied = await client.post("/v1/embeddings", json={"input": "a"}, headers={"Origin": preflight["Origin"]})
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == preflight["Origin"]
        ok = await client.post(
            "/v1/embeddings",
            json={"input": "a"},
            headers={"Origin": preflight["Origin"], "Authorization": "Bearer k"},
        )
        assert ok.status_code == 200 and "x-request-id" in ok.headers["access-control-expose-headers"].lower()

    run(off, without)
    run(on, with_origins)


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
        # Any layer ids pass the schema (a Transformer has more layers); the model's count refuses layer 3 here.
        assert "layer 3 does not exist" in e["message"] and "[0, 1, 2]" in e["message"]
        e = error(await client.get("/embed", params={"sentence": "a", "layers": "top"}), 422)
        assert "'top' is not a list of layer ids" in e["message"]
        # The schema's pattern refuses what is not plain numbers; the model's layer count, a mix of two.
        for bad in ("1,x,2", "1,nan,2", "1,inf,2"):
            e = error(await client.get("/embed", params={"sentence": "a", "mix": bad}), 422)
            assert e["code"] == "validation_error" and "query.mix" in e["message"]
        e = error(await client.get("/embed", params={"sentence": "a", "mix": "1,2"}), 422)
        assert "expected 3 numbers (one per layer)" in e["message"]
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

    async def pieces(body: bytes):
        for start in range(0, len(body), 50):
            yield body[start : start + 50]

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
        # The same streamed without a Content-Length (chunked): counted while it arrives, same boundary.
        streamed = await client.post("/embed", content=pieces(exact), headers=headers)
        assert streamed.status_code == 200, streamed.text
        streamed = await client.post("/embed", content=pieces(exact[:-1] + b" }"), headers=headers)
        assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "body_too_large"
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


@pytest.mark.parametrize(
    ("method", "fmt"), [("GET", "json"), ("POST", "json"), ("POST", "npy"), ("POST", "base64"), ("POST", "mix")]
)
def test_max_response_bytes_admits_its_own_estimate_and_refuses_one_byte_less(encoder, method, fmt):
    """The response-size limit at its boundary: a limit equal to the request's estimate (server.sizes, whose
    bound on real bodies test_server_robustness checks) is answered, one byte less is refused (413)."""
    from elmo_cache.rows.selection import MixSpec, Selection
    from elmo_cache.server.formats import Format
    from elmo_cache.server.sizes import response_bytes
    from elmo_cache.text.tokenize import tokenize

    lines = ["a b c d e", "f g"] if method == "POST" else ["a b c d e"]
    extra = {"mix": "1,2,3"} if fmt == "mix" else {"format": fmt}
    selection = Selection(layers=None, mix=MixSpec.from_raw("1,2,3")) if fmt == "mix" else Selection()
    answer_format = Format.json if fmt == "mix" else Format(fmt)
    estimate = response_bytes(
        [tokenize(line) for line in lines], selection, encoder.output_dim, np.dtype(np.float32), answer_format
    )

    async def ask(client):
        if method == "GET":
            return await client.get("/embed", params={"sentence": lines[0], **extra})
        return await client.post("/embed", json={"sentences": lines, **extra})

    answered = run(create_app(settings(max_response_bytes=estimate), encoder=encoder), ask)
    assert answered.status_code == 200, answered.text
    assert len(answered.content) <= estimate
    refused = run(create_app(settings(max_response_bytes=estimate - 1), encoder=encoder), ask)
    assert refused.status_code == 413, refused.text
    error = refused.json()["error"]
    assert error["code"] == "limit_exceeded"
    assert (
        f"up to {estimate} bytes" in error["message"]
        and f"{estimate - 1} bytes (max_response_bytes)" in error["message"]
    )
