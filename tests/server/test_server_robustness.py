"""Issue 17, server side: never a wrong vector, no leak in errors, no request that exhausts or freezes the server.

In process over ASGI with the real tiny model and real caches; reads that fail or hang are
simulated by wrapping a real cache (the reader itself is tested elsewhere).
"""

from __future__ import annotations

import asyncio
import io
import json
import threading

import numpy as np
import pytest

import elmo_cache
from elmo_cache.errors import CacheFormatError
from elmo_cache.server import Settings, create_app
from elmo_cache.text.tokenize import tokenize

LINES = ["The cat sat on the mat .", "hello world", "one two three four five six"]


class WrappedCache:
    """A real cache whose reads of some sentences fail, hang or return damaged rows."""

    def __init__(self, cache, *, fail=None, hang=None, damage=None):
        self._cache = cache
        self.metadata, self.dtype, self.kind = cache.metadata, cache.dtype, getattr(cache, "kind", None)
        self.pool_only = cache.pool_only
        self.fail = fail or {}  # sentence -> exception raised by the read
        self.hang = set(hang or ())  # sentences whose read blocks until `release` is set
        self.damage = set(damage or ())  # sentences read back with a NaN in them
        self.release = threading.Event()
        self.entered = threading.Event()
        self.reads = 0

    def __len__(self):
        return len(self._cache)

    def find(self, tokens):
        return self._cache.find(tokens)

    def __getitem__(self, index):
        self.reads += 1
        line = " ".join(self._cache.tokens(index))
        if line in self.fail:
            raise self.fail[line]
        if line in self.hang:
            self.entered.set()
            assert self.release.wait(30), "the test never released the read"
        row = np.asarray(self._cache[index])
        if line in self.damage:
            row = row.copy()
            row.flat[0] = np.nan
        return row


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return elmo_cache.Encoder.load(tiny_model, device="cpu")


@pytest.fixture(scope="module")
def cache(tmp_path_factory, encoder):
    from elmo_cache.builder import BuildOptions, build

    folder = tmp_path_factory.mktemp("robust")
    (folder / "c.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    build(folder / "c.txt", BuildOptions(output=folder / "c.zarr", device="cpu", progress=False), encoder=encoder)
    opened = elmo_cache.open(folder / "c.zarr")
    yield opened
    opened.close()


def run(app, scenario):
    import httpx

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://elmo.test") as client:
                return await scenario(client)

    return asyncio.run(main())


def error_of(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["request_id"] == response.headers["x-request-id"]
    return error


# -- never a wrong vector --------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["cache", "live"])
def test_a_mix_or_gamma_that_overflows_is_422_naming_it(encoder, cache, source):
    app = create_app(Settings(max_wait_ms=0), encoder=encoder, cache=cache if source == "cache" else None)
    sentence = LINES[0] if source == "cache" else "a sentence the cache lacks"

    async def scenario(client):
        for params, name in (
            ({"mix": "1e99,1,1"}, "mix"),
            ({"mix": "3e38,3e38,3e38"}, "mix"),
            ({"mix": "1,1,1", "gamma": 1e300}, "gamma"),
            ({"mix": "0.2,0.3,0.5", "gamma": -1e39}, "gamma"),
        ):
            for fmt in ("json", "npy"):
                response = await client.get("/embed", params={"sentence": sentence, "format": fmt, **params})
                error = error_of(response, 422)
                assert error["code"] == "invalid_parameter" and error["message"].startswith(f"{name}:"), error
                assert "not finite" in error["message"]
            body = {"sentences": [sentence, LINES[1]], "mix": params["mix"], "gamma": params.get("gamma")}
            error = error_of(await client.post("/embed", json=body), 422)
            assert error["message"].startswith(f"{name}:")
        # Finite answers still come back, also for the sentences of a batch that shared the encoder.
        fine = await client.get("/embed", params={"sentence": sentence, "mix": "1e30,0,0", "gamma": 1e-30})
        assert fine.status_code == 200 and np.isfinite(np.asarray(fine.json()["vectors"], np.float32)).all()
        assert fine.json()["source"] == source

    run(app, scenario)


def test_one_overflowing_request_does_not_fail_its_live_batch(encoder):
    app = create_app(Settings(max_wait_ms=200), encoder=encoder)

    async def scenario(client):
        bad = client.get("/embed", params={"sentence": "x y", "mix": "1,1,1", "gamma": 1e39})
        good = client.get("/embed", params={"sentence": "x y z", "mix": "1,1,1"})
        bad, good = await asyncio.gather(bad, good)
        assert bad.status_code == 422 and good.status_code == 200, (bad.text, good.text)

    run(app, scenario)


def test_a_cache_row_with_nan_is_a_500_cache_corrupt_not_a_vector(encoder, cache):
    damaged = WrappedCache(cache, damage={LINES[1]})
    app = create_app(Settings(max_wait_ms=0), encoder=encoder, cache=damaged)

    async def scenario(client):
        for fmt in ("json", "npy", "base64"):
            response = await client.get("/embed", params={"sentence": LINES[1], "format": fmt})
            error = error_of(response, 500)
            assert error["code"] == "cache_corrupt" and response.headers["connection"] == "close"
        assert (await client.get("/embed", params={"sentence": LINES[0]})).status_code == 200

    run(app, scenario)


# -- 5xx: stable code, request id, no internals, connection closed ---------------------------------


def test_server_failures_show_a_code_and_request_id_but_no_message_or_path(encoder, cache, caplog):
    secret = "/srv/data/secret/c.zarr/vectors/c/0"
    failing = WrappedCache(
        cache,
        fail={
            LINES[0]: CacheFormatError(f"{secret}: checksum mismatch"),
            LINES[1]: OSError(5, "Input/output error", secret),
            LINES[2]: KeyError(secret),
        },
    )
    app = create_app(Settings(max_wait_ms=0), encoder=encoder, cache=failing)

    async def scenario(client):
        seen = []
        for line, code in zip(LINES, ("cache_corrupt", "internal_error", "internal_error")):
            for request in (
                client.get("/embed", params={"sentence": line}),
                client.post("/embed", json={"sentences": ["a b", line]}),
            ):
                response = await request
                error = error_of(response, 500)
                assert error["code"] == code and response.headers["connection"] == "close"
                assert "secret" not in response.text and "/srv" not in response.text
                assert error["request_id"] in error["message"]
                seen.append(error["request_id"])
        assert len(set(seen)) == len(seen)
        # A plain incoming id is kept; anything else is replaced.
        mine = await client.get("/embed", params={"sentence": LINES[0]}, headers={"X-Request-ID": "abc-123"})
        assert error_of(mine, 500)["request_id"] == "abc-123"
        odd = await client.get("/health", headers={"X-Request-ID": "a b\tc" * 30})
        assert odd.status_code == 200 and len(odd.headers["x-request-id"]) == 32
        # 4xx keep their messages, and carry the id too.
        refused = error_of(await client.get("/embed", params={"sentence": "a", "layers": "1", "mix": "1,1,1"}), 422)
        assert "not both" in refused["message"]
        return seen

    with caplog.at_level("ERROR", logger="elmo_cache.server"):
        ids = run(app, scenario)
    # The log has the real message under each id.
    for request_id in ids:
        assert any(request_id in r.getMessage() and "secret" in r.getMessage() for r in caplog.records), request_id


# -- response size ---------------------------------------------------------------------------------


def test_oversized_answers_are_refused_before_reading(encoder, cache):
    counting = WrappedCache(cache)
    app = create_app(Settings(max_wait_ms=0, max_response_bytes=40_000), encoder=encoder, cache=counting)

    async def scenario(client):
        # LINES[2]: 6 tokens x 3 layers x 32 = 576 numbers: about 4.6 KB of JSON each.
        for body in ({"sentences": [LINES[2]] * 8}, {"sentences": ["w " * 50] * 5}):
            response = await client.post("/embed", json=body)
            error = error_of(response, 413)
            assert error["code"] == "limit_exceeded" and "40000 bytes (max_response_bytes)" in error["message"]
        assert counting.reads == 0
        error = error_of(await client.get("/embed", params={"sentence": "w " * 300}), 413)
        assert "max_response_bytes" in error["message"]
        # A mix is a third of the numbers; npy is 4 bytes a number: both fit where JSON layers do not.
        for extra in ({"mix": "0.3,0.3,0.4"}, {"format": "npy"}, {"format": "base64"}):
            response = await client.post("/embed", json={"sentences": [LINES[2]] * 8, **extra})
            assert response.status_code == 200, response.text

    run(app, scenario)


def test_the_size_estimate_bounds_every_real_body(encoder, cache):
    from elmo_cache.server.formats import Format
    from elmo_cache.server.sizes import response_bytes

    app = create_app(Settings(max_wait_ms=0), encoder=encoder, cache=cache)
    sentences = [*LINES, "a sentence the cache lacks", '\x01 \u00e9t\u00e9 \U0001f600 "quoted" \\', ""]

    async def scenario(client):
        service = app.state.service
        for fmt in Format:
            for extra, sel in (({}, service.default_selection), ({"mix": "1,2,3"}, None)):
                body = {"sentences": sentences, "format": fmt.value, **extra}
                response = await client.post("/embed", json=body)
                assert response.status_code == 200, response.text
                chosen = sel or service.resolve(None, "1,2,3", None, False)
                bound = response_bytes([tokenize(s) for s in sentences], chosen, 32, service.dtype, fmt)
                assert len(response.content) <= bound, (fmt, len(response.content), bound)
                # ... and not wildly above it for the binary formats.
                if fmt is not Format.json:
                    assert bound < 2 * len(response.content) + 4096

    run(app, scenario)


# -- nothing stuck holds the server ----------------------------------------------------------------


def test_a_stuck_read_times_out_and_blocks_nothing_else(encoder, cache):
    stuck = WrappedCache(cache, hang={LINES[0]})
    app = create_app(Settings(max_wait_ms=0, request_timeout_s=0.5, read_threads=2), encoder=encoder, cache=stuck)

    async def scenario(client):
        try:
            pending = asyncio.create_task(client.get("/embed", params={"sentence": LINES[0]}))
            assert await asyncio.to_thread(stuck.entered.wait, 10)
            # While the read hangs: health, other cache hits and live encodings answer at once.
            async with asyncio.timeout(5):
                assert (await client.get("/health")).status_code == 200
                assert (await client.get("/embed", params={"sentence": LINES[1]})).json()["source"] == "cache"
                assert (await client.get("/embed", params={"sentence": "not cached"})).json()["source"] == "live"
                info = (await client.get("/info")).json()
            assert info["limits"]["request_timeout_s"] == 0.5
            response = await pending
            error = error_of(response, 503)
            assert error["code"] == "cache_timeout" and "0.5 s (request_timeout_s)" in error["message"]
            assert response.headers["retry-after"] == "1" and response.headers["connection"] == "close"
            # Both threads stuck: further reads wait their timeout, never the loop.
            more = [asyncio.create_task(client.get("/embed", params={"sentence": LINES[0]})) for _ in range(3)]
            async with asyncio.timeout(5):
                assert (await client.get("/health")).status_code == 200
                done = await asyncio.gather(*more)
            assert {r.status_code for r in done} == {503}
        finally:
            stuck.release.set()
        later = await client.get("/embed", params={"sentence": LINES[0]})
        assert later.status_code == 200 and later.json()["source"] == "cache"

    run(app, scenario)


# -- methods ---------------------------------------------------------------------------------------


def test_options_and_405_list_every_method(encoder):
    app = create_app(Settings(max_wait_ms=0, api_key="k"), encoder=encoder)

    async def scenario(client):
        options = await client.options("/embed")
        assert options.status_code == 204 and options.headers["allow"] == "GET, OPTIONS, POST"
        wrong = await client.put("/embed", headers={"Authorization": "Bearer k"})
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, OPTIONS, POST"
        assert wrong.json()["error"]["code"] == "method_not_allowed"
        assert (await client.options("/health")).headers["allow"] == "GET, OPTIONS"
        assert (await client.options("/nowhere")).status_code == 404

    run(app, scenario)


def test_npy_answers_read_back(encoder, cache):
    """The size check and the pool leave binary answers intact."""
    app = create_app(Settings(max_wait_ms=0), encoder=encoder, cache=cache)

    async def scenario(client):
        response = await client.post("/embed", json={"sentences": LINES, "format": "npy"})
        archive = np.load(io.BytesIO(response.content))
        for i in range(len(LINES)):
            np.testing.assert_array_equal(archive[f"arr_{i}"], cache[i])
        return json.loads((await client.get("/info")).text)["limits"]["max_response_bytes"]

    assert run(app, scenario) == 64 * 1024 * 1024


# -- text that is not UTF-8 (issue 33, item 3) ------------------------------------------------------


def _post_raw(client, body: str):
    # httpx would refuse to encode a lone surrogate: the JSON escape goes over the wire as six ASCII bytes.
    return client.post("/embed", content=body.encode("ascii"), headers={"content-type": "application/json"})


@pytest.mark.parametrize("fmt", ["json", "npy", "base64"])  # npy: POST answers it as an npz
@pytest.mark.parametrize("source", ["cache", "live"])
def test_lone_surrogates_are_422_naming_the_parameter_in_every_format(encoder, cache, source, fmt):
    app = create_app(Settings(max_wait_ms=0), encoder=encoder, cache=cache if source == "cache" else None)

    async def scenario(client):
        return [
            await _post_raw(client, f'{{"sentences": ["The cat", "\\ud800 cat"], "format": "{fmt}"}}'),
            await _post_raw(client, f'{{"sentences": ["hello world", ["a b", "cat\\udfff"]], "format": "{fmt}"}}'),
            await _post_raw(client, f'{{"sentences": ["x \\udc80"], "format": "{fmt}", "pool": "mean"}}'),
            # A valid pair is one character (U+1F600) and is embedded like any other.
            await _post_raw(client, f'{{"sentences": ["\\ud83d\\ude00 cat"], "format": "{fmt}"}}'),
            # GET: the query's percent-escapes are decoded as UTF-8, never replaced with U+FFFD.
            await client.get(f"/embed?format={fmt}&sentence=ab%ED%A0%80cat"),
            await client.get(f"/embed?sentence=cat%FF&format={fmt}"),
            await client.get("/embed", params={"sentence": "caf\u00e9 \U0001f600", "format": fmt}),
        ]

    first, token, pooled, pair, get_surrogate, get_byte, get_fine = run(app, scenario)
    for response, where, position in (
        (first, "sentences[1]", "U+D800 at character 0"),
        (pooled, "sentences[0]", "U+DC80 at character 2"),
        (get_surrogate, "sentence", "byte 0xED at byte 2"),
        (get_byte, "sentence", "byte 0xFF at byte 3"),
    ):
        error = error_of(response, 422)
        assert error["code"] == "invalid_parameter", error
        assert error["message"].startswith(f"{where}: not valid UTF-8 text"), error
        assert position in error["message"], error
    # A token list is checked against the token pattern first: pydantic refuses the string there, naming it.
    error = error_of(token, 422)
    assert error["code"] == "validation_error", error
    assert "body.sentences.1.list[constrained-str].1: " in error["message"] and "unicode" in error["message"], error
    assert pair.status_code == 200, pair.text
    assert get_fine.status_code == 200, get_fine.text


def test_a_surrogate_in_any_other_json_string_is_a_readable_422(encoder):
    app = create_app(Settings(max_wait_ms=0), encoder=encoder)

    async def scenario(client):
        return [
            await _post_raw(client, '{"sentences": ["a"], "layers": "\\ud800"}'),
            await _post_raw(client, '{"sentences": ["a"], "mix": "\\ud800,1,1"}'),
            await _post_raw(client, '{"sentences": ["a"], "format": "\\ud800"}'),
            await _post_raw(client, '{"sentences": ["a"], "\\ud800": 1}'),
        ]

    for response in run(app, scenario):
        error = error_of(response, 422)
        assert error["code"] == "validation_error", error


@pytest.mark.parametrize("fmt", ["json", "npy", "base64"])
def test_a_body_whose_bytes_are_not_utf8_is_a_422(encoder, cache, fmt):
    """Raw bytes that are not UTF-8 inside the JSON text (not an escape): FastAPI cannot decode the body and
    answered 400 bad_request; text that is not UTF-8 is a 422 in every format."""
    app = create_app(Settings(max_wait_ms=0), encoder=encoder, cache=cache)
    bodies = [
        b'{"sentences": ["\xff cat"], "format": "' + fmt.encode() + b'"}',
        b'{"sentences": ["ab\xed\xa0\x80cat"], "format": "' + fmt.encode() + b'"}',  # a surrogate's UTF-8 bytes
    ]

    async def scenario(client):
        answers = [
            await client.post("/embed", content=body, headers={"content-type": "application/json"}) for body in bodies
        ]
        fine = await client.post("/embed", json={"sentences": [LINES[0]], "format": fmt})
        return answers, fine

    (raw, surrogate), fine = run(app, scenario)
    error = error_of(raw, 422)
    assert error["code"] == "validation_error" and "not JSON text in UTF-8" in error["message"], error
    error = error_of(surrogate, 422)  # decoded as a lone surrogate, then refused like its JSON escape
    assert error["code"] == "invalid_parameter" and "not valid UTF-8 text: a lone surrogate" in error["message"]
    assert fine.status_code == 200
