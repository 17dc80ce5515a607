"""``build --engine ray`` without a cluster: the build starts a local Ray of its own."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import elmo_cache
from tests._build_fixtures import corpus_lines, write_corpus

pytest.importorskip("ray")


def test_the_ray_engine_starts_and_stops_its_own_local_cluster(tmp_path, tiny_model, tiny_encoder):
    lines = corpus_lines(60, seed=8)
    corpus = write_corpus(tmp_path / "c.txt", lines)
    output = tmp_path / "c.zarr"
    command = [
        sys.executable, "-c", "from elmo_cache.cli.main import main; main()",
        "build", str(corpus), "-o", str(output), "--engine", "ray", "--workers", "1",
        "--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    # A fresh process with no RAY_ADDRESS: nothing tells it of a cluster, so it must start one.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with elmo_cache.open(output) as cache:
        assert len(cache) == len(lines)
        for i in (0, 17, 59):
            np.testing.assert_allclose(cache[i], tiny_encoder.embed_sentence(lines[i].split()), atol=1e-5, rtol=0)
