"""The server's limits over real HTTP: uvicorn on a loopback port, plain HTTP clients.

tests/server/test_server.py checks the same statuses in process (ASGI transport); here the bytes cross
a socket, so what a client sees (status, headers, a body limit on a streamed upload, the
connection staying usable) is what uvicorn really sends.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import uvicorn

import elmo_cache
from elmo_cache.server import Settings, create_app
from tests.server_helpers import GatedEncoder, free_port


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return elmo_cache.Encoder.load(tiny_model, device="cpu")


def _serve(app) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        assert not thread.is_alive(), "uvicorn did not stop"


@pytest.fixture
def serve():
    servers = []

    def start(app) -> str:
        generator = _serve(app)
        servers.append(generator)
        return next(generator)

    yield start
    for generator in servers:
        next(generator, None)


def _depth(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("elmo_cache_live_queue_depth "):
            return float(line.split()[1])
    return -1.0


def test_a_full_queue_answers_429_over_http(encoder, serve):
    gated = GatedEncoder(encoder)
    url = serve(create_app(Settings(queue_size=1, max_wait_ms=0), encoder=gated))
    with httpx.Client(base_url=url, timeout=30) as client, ThreadPoolExecutor(2) as pool:
        first = pool.submit(client.get, "/embed", params={"sentence": "one unseen sentence"})
        assert gated.entered.wait(10)
        second = pool.submit(client.get, "/embed", params={"sentence": "another unseen one"})
        deadline = time.monotonic() + 10
        while _depth(client) != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        third = client.get("/embed", params={"sentence": "a third unseen one"})
        assert third.status_code == 429 and third.headers["retry-after"] == "1"
        assert third.json()["error"]["code"] == "queue_full"
        assert client.get("/health").status_code == 200  # the busy encoder blocks nothing else
        gated.gate.set()
        assert first.result().status_code == 200 and second.result().status_code == 200
        assert client.get("/embed", params={"sentence": "a third unseen one"}).status_code == 200


def test_a_slow_live_answer_is_503_over_http_and_later_requests_are_served(encoder, serve):
    gated = GatedEncoder(encoder)
    url = serve(create_app(Settings(live_timeout_s=0.3, max_wait_ms=0), encoder=gated))
    with httpx.Client(base_url=url, timeout=30) as client:
        started = time.monotonic()
        late = client.get("/embed", params={"sentence": "too slow today"})
        assert late.status_code == 503 and late.headers["retry-after"] == "1"
        assert late.json()["error"]["code"] == "live_timeout"
        assert time.monotonic() - started < 10
        gated.gate.set()
        assert client.get("/embed", params={"sentence": "fine now"}).status_code == 200


def test_size_limits_are_413_over_http(encoder, serve):
    settings = Settings(max_tokens_per_sentence=5, max_sentences_per_request=3, max_body_bytes=200, max_wait_ms=0)
    url = serve(create_app(settings, encoder=encoder))
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.get("/embed", params={"sentence": "a b c d e"}).status_code == 200
        long = client.get("/embed", params={"sentence": "a b c d e f"})
        assert long.status_code == 413 and long.json()["error"]["code"] == "too_many_tokens"
        many = client.post("/embed", json={"sentences": ["a", "b", "c", "d"]})
        assert many.status_code == 413 and many.json()["error"]["code"] == "too_many_sentences"
        # A body over the limit is refused whether its length is declared or streamed in chunks.
        big = b'{"sentences": ["' + b"x" * 400 + b'"]}'
        declared = client.post("/embed", content=big, headers={"content-type": "application/json"})
        assert declared.status_code == 413 and declared.json()["error"]["code"] == "body_too_large"
        streamed = client.post(
            "/embed", content=iter([big[:100], big[100:]]), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413 and streamed.json()["error"]["code"] == "body_too_large"
        # The same connection goes on serving.
        assert client.get("/embed", params={"sentence": "a b"}).status_code == 200


@pytest.mark.parametrize("sent", ["chunked", "declared"])
def test_a_big_body_over_the_limit_gets_a_readable_413_not_a_reset(encoder, serve, sent):
    # http.client writes the whole body before it reads (as requests and curl without Expect do), and
    # 16 MiB is far more than the loopback socket buffers hold: a server that answers and closes
    # without reading the rest resets the upload, and the client never sees the 413. (httpx reads
    # the response even after a failed write, so it would not notice.)
    url = serve(create_app(Settings(max_body_bytes=1000, max_wait_ms=0), encoder=encoder))
    port = int(url.rsplit(":", 1)[1])
    body = b'{"sentences": ["' + b"x" * (16 << 20) + b'"]}'
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        for _ in range(2):  # the connection stays usable after the refused upload
            if sent == "chunked":
                pieces = (body[i : i + 65536] for i in range(0, len(body), 65536))
                connection.request("POST", "/embed", body=pieces, headers=_JSON, encode_chunked=True)
            else:
                connection.request("POST", "/embed", body=body, headers=_JSON)
            refused = connection.getresponse()
            assert refused.status == 413 and refused.getheader("content-type") == "application/json"
            error = json.loads(refused.read())["error"]
            assert error["code"] == "body_too_large" and "max_body_bytes" in error["message"], error
            assert error["request_id"] == refused.getheader("x-request-id")
        connection.request("GET", "/embed?sentence=a+b")
        fine = connection.getresponse()
        assert fine.status == 200 and json.loads(fine.read())["source"] == "live"
    finally:
        connection.close()


_JSON = {"Content-Type": "application/json"}
