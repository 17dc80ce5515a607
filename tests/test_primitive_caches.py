"""``import elmo_cache`` bounds torch's oneDNN primitive caches (elmo_cache._primitives): a build's char-CNN
sees a new input shape nearly every batch, and with torch's defaults every shape's primitive was kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elmo_cache._primitives import PRIMITIVE_CACHE_CAPACITY, PRIMITIVE_CACHE_VARIABLES
from tests._glibc import MALLINFO2, needs_mallinfo2

# Malloc'ed bytes still in use after convolutions of 300 distinct batch sizes (glibc's mallinfo2).
_GROWTH = (
    MALLINFO2
    + """
import sys
if sys.argv[1] == "elmo_cache":
    import elmo_cache  # first, as a build's process does
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
weight = torch.randn(32, 4, 3)
with torch.inference_mode():
    for n in range(1, 20):
        F.conv1d(torch.randn(n, 4, 50), weight)
    before = libc.mallinfo2().uordblks
    for n in range(100, 400):
        F.conv1d(torch.randn(n, 4, 50), weight)
    print(libc.mallinfo2().uordblks - before)
"""
)


def _env_without_capacities() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in PRIMITIVE_CACHE_VARIABLES}


def test_import_sets_the_capacities_unless_set():
    code = f"import os, elmo_cache; print(*(os.environ[n] for n in {PRIMITIVE_CACHE_VARIABLES!r}))"
    env = _env_without_capacities()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(PRIMITIVE_CACHE_CAPACITY)] * 2
    env["LRU_CACHE_CAPACITY"] = "5"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["5", str(PRIMITIVE_CACHE_CAPACITY)]


@needs_mallinfo2
def test_convolutions_of_many_shapes_do_not_accumulate_primitives():
    def growth(first: str) -> int:
        run = subprocess.run(
            [sys.executable, "-c", _GROWTH, first],
            env=_env_without_capacities(),
            capture_output=True,
            text=True,
            check=False,
        )
        # mallinfo2 exists (checked above): a failing measure is a failure (of torch, of elmo_cache's import).
        assert run.returncode == 0, run.stderr
        return int(run.stdout)

    unbounded = growth("torch")
    if unbounded < 4 * 2**20:
        pytest.skip(f"this torch keeps no primitive per shape ({unbounded} bytes for 300 shapes)")
    bounded = growth("elmo_cache")
    assert bounded < unbounded / 4, (bounded, unbounded)
