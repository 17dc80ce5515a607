"""Precision and device names are checked without torch, with the valid choices in the message."""

from __future__ import annotations

import pytest

from elmo_cache.encoder.hardware import PRECISIONS, resolve_device
from elmo_cache.encoder.names import PRECISION_NAMES, check_device_name, check_precision_name
from elmo_cache.errors import InvalidParameterError


def test_the_names_are_the_precisions_the_encoder_runs():
    assert tuple(PRECISIONS) == PRECISION_NAMES


@pytest.mark.parametrize("device", [None, "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_names_that_pass(device):
    check_device_name(device)


@pytest.mark.parametrize("device", ["tpu", "gpu", "cuda:", "cuda:x", " cpu", "CPU", "mps"])
def test_device_names_refused_before_torch(device):
    with pytest.raises(InvalidParameterError, match=r"choose 'cpu', 'cuda' or 'cuda:N'"):
        check_device_name(device)
    with pytest.raises(InvalidParameterError, match=r"choose 'cpu', 'cuda' or 'cuda:N'"):
        resolve_device(device)  # the same answer where torch is at hand


def test_precision_names():
    for name in PRECISION_NAMES:
        check_precision_name(name)
    with pytest.raises(InvalidParameterError, match=r"precision: 'fp8' is not valid; choose from \['fp32'"):
        check_precision_name("fp8")
