"""Helpers the server tests share: an in-process client, decoders, reference encodings, caches, and an
``elmo-cache serve`` process on a free loopback port."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

import elmo_cache
from elmo_cache.server import Settings
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


def free_port() -> int:
    """A loopback port free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli_command() -> list[str]:
    """How to run the ``elmo-cache`` CLI in a subprocess: its script where installed, else this Python."""
    script = shutil.which("elmo-cache")
    return [script] if script else [sys.executable, "-c", "from elmo_cache.cli.main import main; main()"]


def wait_healthy(proc: subprocess.Popen, url: str, deadline_s: float = 90.0) -> None:
    """Wait until the server at ``url`` answers ``/health``; a failure (with its stderr) if it exits first."""
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


def start_serve(
    cache_path: Path | str, model: tuple[Path, Path], *extra: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """``elmo-cache serve cache_path`` with ``model`` on the CPU on a free port, quiet but for warnings, plus the
    options ``extra`` (``env`` added to this process's environment), once healthy: the process (its stderr a
    pipe) and its URL. The caller stops it (:func:`interrupt`, or a kill)."""
    port = free_port()
    model_files = ["--options-file", str(model[0]), "--weight-file", str(model[1])]
    quiet = ["--log-level", "warning", "--no-access-log"]
    command = [*cli_command(), "serve", str(cache_path), *model_files, "--port", str(port), "--device", "cpu", *quiet]
    command += extra
    environment = None if env is None else {**os.environ, **env}
    proc = subprocess.Popen(command, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stderr.close()
        raise
    return proc, url


def interrupt(proc: subprocess.Popen) -> str:
    """Ctrl-C the server and wait for it (a failure if it is still there 20 s later); its stderr."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        pytest.fail("server did not shut down within 20 s of SIGINT")
    finally:
        log = proc.stderr.read().decode(errors="replace")
        proc.stderr.close()
    return log
