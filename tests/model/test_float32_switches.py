"""fp32 stays IEEE float32 on CUDA: the process-wide TF32 switches are off while an fp32 forward runs.

The switches are plain attributes, so their handling is checked here without a GPU; tests/encoder/test_cuda.py checks
the numbers on one.
"""

from __future__ import annotations

import threading

import pytest
import torch

from elmo_cache.model import bilm
from elmo_cache.model.float32 import _switches, ieee_float32


def states():
    return [getattr(owner, name) for owner, name, _ in _switches()]


@pytest.fixture
def tf32_everywhere():
    """A user who asked for TF32 everywhere (restored afterwards whatever the test does)."""
    before = states()
    for owner, name, exact in _switches():
        setattr(owner, name, "tf32" if isinstance(exact, str) else True)
    yield states()
    for (owner, name, _), value in zip(_switches(), before):
        setattr(owner, name, value)


def test_cuda_forward_turns_tf32_off_and_restores_it(tf32_everywhere):
    exact = [value for _, _, value in _switches()]
    with ieee_float32(torch.device("cuda")):
        assert states() == exact
    assert states() == tf32_everywhere
    with ieee_float32(torch.device("cpu")):
        assert states() == tf32_everywhere  # nothing of the CPU's is touched


def test_overlapping_forwards_in_threads_restore_once_the_last_ends(tf32_everywhere):
    exact = [value for _, _, value in _switches()]
    first_in, second_in, first_may_leave, first_left = (threading.Event() for _ in range(4))
    seen = {}

    def first():
        with ieee_float32(torch.device("cuda")):
            first_in.set()
            first_may_leave.wait(5)
        first_left.set()

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with ieee_float32(torch.device("cuda")):
        second_in.set()
        first_may_leave.set()
        first_left.wait(5)
        seen["after the first left"] = states()
    thread.join(5)
    assert seen["after the first left"] == exact  # the second forward is still running: still exact
    assert states() == tf32_everywhere


def test_a_torch_without_recompile_limit_compiles_the_cell_without_it(monkeypatch):
    """torch.compile before 2.13 has no recompile_limit argument: the cell still compiles, and the process-wide
    limit is raised only while the cell runs."""
    calls, limits = [], []
    config = torch._dynamo.config

    def old_compile(function, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None):
        calls.append(dynamic)

        def compiled(*args):
            limits.append(config.recompile_limit)
            return function(*args)

        return compiled

    monkeypatch.setattr(torch, "compile", old_compile)
    before = config.recompile_limit
    cell = bilm.FusedCell()
    gates_x, gates_h = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    c_prev = torch.randn(2, 4, 4)
    hidden, state = cell(bilm._lstm_cell, gates_x, 1, gates_h, c_prev, 3.0)
    assert calls == [True] and not cell.failed
    assert limits == [max(bilm.RECOMPILE_LIMIT, before)] and config.recompile_limit == before
    torch.testing.assert_close((hidden, state), bilm._lstm_cell(gates_x, 1, gates_h, c_prev, 3.0))
