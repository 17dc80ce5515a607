"""``elmo-cache serve`` for real: uvicorn in a subprocess on a free loopback port, queried over HTTP."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.cli.main import cli
from elmo_cache.text.tokenize import tokenize
from tests.server_helpers import free_port, interrupt, start_serve, wait_healthy

LINES = ["The cat sat on the mat .", "hello world", "Colourless green ideas sleep furiously ."]


def test_serve_over_http(tmp_path, tiny_model):
    from elmo_cache.builder import BuildOptions, build

    encoder = elmo_cache.Encoder.load(tiny_model, device="cpu")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    build(corpus, BuildOptions(output=tmp_path / "corpus.h5", device="cpu", progress=False), encoder=encoder)
    cache = elmo_cache.open(tmp_path / "corpus.h5")

    env = {"ELMO_CACHE_API_KEY": "e2e-key", "ELMO_CACHE_MAX_WAIT_MS": "20"}
    proc, url = start_serve(tmp_path / "corpus.h5", tiny_model, env=env)
    try:
        auth = {"Authorization": "Bearer e2e-key"}
        with httpx.Client(base_url=url, headers=auth, timeout=30.0) as client:
            assert httpx.get(f"{url}/info", timeout=5).status_code == 401  # the key came from the environment
            hit = client.get("/embed", params={"sentence": LINES[2]})
            assert hit.status_code == 200 and hit.json()["source"] == "cache"
            np.testing.assert_array_equal(np.asarray(hit.json()["vectors"], np.float32), cache[2])
            miss = client.get("/embed", params={"sentence": "a sentence the cache lacks", "format": "npy"})
            assert miss.headers["x-elmo-source"] == "live"
            want = encoder.embed_batch([tokenize("a sentence the cache lacks")])[0]
            np.testing.assert_allclose(np.load(io.BytesIO(miss.content)), want, rtol=1e-5, atol=1e-6)
            many = client.post("/embed", json={"sentences": LINES[:2], "format": "npy", "layers": "1"})
            archive = np.load(io.BytesIO(many.content))
            np.testing.assert_array_equal(archive["arr_1"], np.asarray(cache[1])[[1]])
            assert "server-timing" in miss.headers
            assert 'route="/embed",status="200"' in client.get("/metrics").text
            assert client.get("/info").json()["limits"]["max_wait_ms"] == 20
    finally:
        interrupt(proc)
    assert proc.returncode == 0


def test_serve_reports_mistakes_plainly(tmp_path, monkeypatch):
    runner = CliRunner()
    monkeypatch.delenv("ELMO_CACHE_MODEL", raising=False)
    result = runner.invoke(cli, ["serve"])
    assert result.exit_code == 1 and "nothing to serve" in result.output
    result = runner.invoke(cli, ["serve", str(tmp_path / "absent.zarr")])
    assert result.exit_code == 1 and "cache not found" in result.output
    result = runner.invoke(cli, ["serve", "--options-file", str(tmp_path / "o.json")])
    assert result.exit_code == 1 and "options_file and weight_file go together" in result.output
    result = runner.invoke(cli, ["serve", "--live-timeout", "-1"])
    assert result.exit_code == 1 and "live_timeout_s (ELMO_CACHE_LIVE_TIMEOUT_S)" in result.output
    monkeypatch.setenv("ELMO_CACHE_PORT", "eighty")
    result = runner.invoke(cli, ["serve", str(tmp_path / "absent.zarr")])
    assert result.exit_code == 1 and "ELMO_CACHE_PORT" in result.output
    assert "Traceback" not in result.output


# A real cache served by `run_server` (what `elmo-cache serve` runs) in a subprocess, whose reads of
# "boom" fail with a path in the message and of "hang" block forever (a dead disk).
_WRAPPED_SERVER = """
import pathlib, sys, threading
import elmo_cache
from elmo_cache.cli.serve import run_server
from elmo_cache.server import load_settings

cache_path, port, marker = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])

class Wrapped:
    def __init__(self, cache):
        self._cache, self.metadata, self.dtype = cache, cache.metadata, cache.dtype
        self.pool_only = cache.pool_only
    def __len__(self):
        return len(self._cache)
    def find(self, tokens):
        return self._cache.find(tokens)
    def __getitem__(self, index):
        line = " ".join(self._cache.tokens(index))
        if line == "boom":
            raise OSError(5, "Input/output error", "/srv/secret/vectors/c/0")
        if line == "hang":
            marker.write_text("stuck")
            threading.Event().wait()
        return self._cache[index]

settings = load_settings(port=port, graceful_timeout_s=1, request_timeout_s=120, log_level="warning", access_log=False)
run_server(settings, cache=Wrapped(elmo_cache.open(cache_path)))
"""


@pytest.fixture()
def wrapped_server(tmp_path, tiny_model):
    from elmo_cache.builder import BuildOptions, build

    encoder = elmo_cache.Encoder.load(tiny_model, device="cpu")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("boom\nhang\nfine line\n", encoding="utf-8")
    build(corpus, BuildOptions(output=tmp_path / "c.zarr", device="cpu", progress=False), encoder=encoder)
    (tmp_path / "server.py").write_text(_WRAPPED_SERVER, encoding="utf-8")
    port = free_port()
    marker = tmp_path / "stuck"
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "server.py"), str(tmp_path / "c.zarr"), str(port), str(marker)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        yield proc, url, marker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stderr.close()


def test_a_500_closes_its_connection_and_the_next_pooled_request_succeeds(wrapped_server):
    _, url, _ = wrapped_server
    with httpx.Client(base_url=url, timeout=10.0) as client:  # one pooled keep-alive connection
        for _ in range(5):
            failed = client.get("/embed", params={"sentence": "boom"})
            assert failed.status_code == 500 and failed.headers["connection"] == "close"
            error = failed.json()["error"]
            assert error["code"] == "internal_error" and error["request_id"] == failed.headers["x-request-id"]
            assert "secret" not in failed.text and "Errno" not in failed.text
            fine = client.get("/embed", params={"sentence": "fine line"})
            assert fine.status_code == 200 and fine.json()["source"] == "cache"
            assert fine.headers.get("connection") != "close"


def test_sigterm_exits_promptly_while_a_read_is_stuck(wrapped_server):
    proc, url, marker = wrapped_server
    outcome: list = []

    def stuck_request() -> None:
        try:
            outcome.append(httpx.get(f"{url}/embed", params={"sentence": "hang"}, timeout=30.0).status_code)
        except httpx.TransportError as exc:
            outcome.append(type(exc).__name__)

    client = threading.Thread(target=stuck_request, daemon=True)
    client.start()
    deadline = time.monotonic() + 20
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), "the read never started"
    # The read is stuck in a worker thread: the server still answers.
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200
    assert httpx.get(f"{url}/embed", params={"sentence": "fine line"}, timeout=5).status_code == 200
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        pytest.fail("the server ignored SIGTERM with a read stuck")
    took = time.monotonic() - started
    client.join(timeout=10)
    # graceful_timeout_s=1: a second of drain (new requests 503), then the stuck request is cancelled and the
    # process ends.
    assert took < 8, took
    assert proc.returncode == 0, proc.returncode  # a drain that ran out of time is still a clean exit
    assert outcome, "the stuck client never returned"


# A live model served by `run_server` whose encodings wait until the test creates the gate file.
_GATED_SERVER = """
import pathlib, sys, time
import elmo_cache
from elmo_cache.cli.serve import run_server
from elmo_cache.server import load_settings

options, weights, port, folder = sys.argv[1], sys.argv[2], int(sys.argv[3]), pathlib.Path(sys.argv[4])
encoder = elmo_cache.Encoder.load((options, weights), device="cpu")

class Gated:
    output_dim, identity = encoder.output_dim, encoder.identity
    def embed_batch(self, sentences):
        (folder / "entered").write_text("yes")
        deadline = time.monotonic() + 60
        while not (folder / "gate").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return encoder.embed_batch(sentences)

settings = load_settings(port=port, graceful_timeout_s=30, max_wait_ms=0, log_level="warning", access_log=False)
run_server(settings, encoder=Gated())
"""


def test_sigterm_drains_in_flight_requests_refuses_new_ones_with_503_and_exits_0(tmp_path, tiny_model):
    (tmp_path / "server.py").write_text(_GATED_SERVER, encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "server.py"), str(tiny_model[0]), str(tiny_model[1]), str(port), str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_healthy(proc, url)
        outcome: list = []

        def in_flight() -> None:
            try:
                outcome.append(httpx.get(f"{url}/embed", params={"sentence": "a slow one"}, timeout=60.0))
            except httpx.TransportError as exc:
                outcome.append(exc)

        with httpx.Client(base_url=url, timeout=10.0) as kept_alive:
            assert kept_alive.get("/health").status_code == 200  # a pooled connection opened before the signal
            client = threading.Thread(target=in_flight, daemon=True)
            client.start()
            deadline = time.monotonic() + 30
            while not (tmp_path / "entered").exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert (tmp_path / "entered").exists(), "the live encoding never started"
            proc.send_signal(signal.SIGTERM)
            # Until the request in flight is done the listener stays open: every new request, on a new
            # connection or on one kept alive from before, is a readable 503 that closes its connection.
            deadline = time.monotonic() + 10
            refused = httpx.get(f"{url}/health", timeout=5.0)
            while refused.status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)  # the signal is handled between two ticks of uvicorn's loop
                refused = httpx.get(f"{url}/health", timeout=5.0)
            for response in (
                refused,
                kept_alive.get("/embed", params={"sentence": "new"}),
                httpx.post(f"{url}/embed", json={"sentences": ["new"]}, timeout=5.0),
            ):
                assert response.status_code == 503, response.text
                assert response.headers["connection"] == "close"
                error = response.json()["error"]
                assert error["code"] == "shutting_down" and error["request_id"] == response.headers["x-request-id"]
            assert proc.poll() is None, "the server exited before its request in flight was answered"
        (tmp_path / "gate").write_text("open")
        client.join(timeout=30)
        [answer] = outcome
        assert isinstance(answer, httpx.Response) and answer.status_code == 200, answer
        assert answer.json()["tokens"] == ["a", "slow", "one"]
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the server did not exit once drained")
        assert proc.returncode == 0, proc.stderr.read().decode(errors="replace")[-3000:]
        # Once drained the listener is closed: a new connection is refused, not left hanging.
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=5.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stderr.close()


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_a_cache_file_truncated_under_the_server_is_a_500_and_it_keeps_serving(tmp_path, tiny_model, fmt):
    """Issue 33: a reader that mapped the cache died with SIGBUS when a file shrank under it, the server with
    it, without a log line. Now the sentences whose rows are gone are 500 cache_corrupt (logged), and every
    other request is still answered by the same process."""
    import h5py

    from elmo_cache.builder import BuildOptions, build

    encoder = elmo_cache.Encoder.load(tiny_model, device="cpu")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output = tmp_path / ("c.h5" if fmt == "hdf5" else "c.zarr")
    build(corpus, BuildOptions(output=output, device="cpu", progress=False), encoder=encoder)
    if fmt == "hdf5":
        with h5py.File(output, "r") as f:
            victim, keep = output, int(f["vectors"].id.get_offset()) + 64  # inside sentence 0's rows
    else:
        victim, keep = output / "vectors" / "c" / "0" / "0" / "0", 64
    proc, url = start_serve(output, tiny_model)
    try:
        with httpx.Client(base_url=url, timeout=30.0) as client:
            for line in LINES:  # every row read once (mapped, by the older reader)
                assert client.get("/embed", params={"sentence": line}).json()["source"] == "cache"
            os.truncate(victim, keep)
            for _ in range(3):
                failed = client.get("/embed", params={"sentence": LINES[0]})
                assert failed.status_code == 500 and failed.json()["error"]["code"] == "cache_corrupt", failed.text
            assert client.get("/health").status_code == 200
            live = client.get("/embed", params={"sentence": "an unseen sentence"})
            assert live.status_code in (200, 500), live.text  # a miss may need an index page that is gone
            assert proc.poll() is None
    finally:
        log = interrupt(proc)
    assert proc.returncode == 0, log[-3000:]
    assert "truncated" in log and str(victim) in log  # the server's log names the file and what happened
