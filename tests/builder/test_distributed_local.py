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
        "build", str(corpus), "-o", str(output), "--engine", "ray", "--workers", "2",
        "--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu", "--no-progress",
    ]  # fmt: skip
    # A fresh process with no RAY_ADDRESS: nothing tells it of a cluster, so it must start one.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # 60 short lines are one window, so one part: the summary says why the second worker idled.
    assert "on 1 workers" in done.stdout and "2 workers were asked for, but there was only 1 part" in done.stdout
    with elmo_cache.open(output) as cache:
        assert len(cache) == len(lines)
        for i in (0, 17, 59):
            np.testing.assert_allclose(cache[i], tiny_encoder.embed_sentence(lines[i].split()), atol=1e-5, rtol=0)


class _NoCluster:
    """Stands in for the ray module where no cluster runs: ray.init fails as Ray's own does."""

    def __init__(self, error: Exception):
        self.error = error

    def init(self, **kwargs):
        raise self.error


def test_a_missing_cluster_is_a_clear_error():
    from elmo_cache.builder.ray.raydata import connect
    from elmo_cache.errors import ElmoCacheError, InvalidParameterError

    missing = ConnectionError("Could not find any running Ray instance. Please specify the one to connect to")
    with pytest.raises(InvalidParameterError, match=r"address: no Ray cluster answers at 'auto'.*ray start --head"):
        connect(_NoCluster(missing), "auto")
    with pytest.raises(InvalidParameterError, match="leave out --address"):
        connect(_NoCluster(TimeoutError("GCS did not answer")), "10.0.0.1:6379")
    with pytest.raises(ElmoCacheError, match="could not start a local Ray cluster"):
        connect(_NoCluster(ConnectionError("no room")), None)
