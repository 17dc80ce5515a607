"""``elmo-cache serve`` for real: uvicorn in a subprocess on a free loopback port, queried over HTTP."""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.cli.main import cli
from elmo_cache.text.tokenize import tokenize

LINES = ["The cat sat on the mat .", "hello world", "Colourless green ideas sleep furiously ."]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _command() -> list[str]:
    script = shutil.which("elmo-cache")
    return [script] if script else [sys.executable, "-c", "from elmo_cache.cli.main import main; main()"]


def _wait_healthy(proc: subprocess.Popen, url: str, deadline_s: float = 90.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}: {proc.stderr.read().decode(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    pytest.fail(f"server not healthy after {deadline_s} s")


def test_serve_over_http(tmp_path, tiny_model):
    from elmo_cache.builder import BuildOptions, build

    encoder = elmo_cache.Encoder.from_files(*tiny_model, device="cpu")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    build(corpus, BuildOptions(output=tmp_path / "corpus.h5", device="cpu", progress=False), encoder=encoder)
    cache = elmo_cache.open(tmp_path / "corpus.h5")

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "ELMO_CACHE_API_KEY": "e2e-key", "ELMO_CACHE_MAX_WAIT_MS": "20"}
    proc = subprocess.Popen(
        [
            *_command(),
            "serve",
            str(tmp_path / "corpus.h5"),
            "--options-file",
            str(tiny_model[0]),
            "--weight-file",
            str(tiny_model[1]),
            "--port",
            str(port),
            "--device",
            "cpu",
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_healthy(proc, url)
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
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            pytest.fail("server did not shut down within 20 s of SIGINT")
        proc.stderr.close()
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
