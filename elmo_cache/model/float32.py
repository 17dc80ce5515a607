"""IEEE float32 on CUDA for the duration of an fp32 forward pass.

"fp32" promises the original implementation's vectors to float precision. On CUDA, cuDNN runs float32
convolutions in TF32 by default (a 10-bit mantissa): on the Original model's char-CNN that moved layer 0 by
up to 5.6e-4 on an H200 (benchmarks/RESULTS.md, "On a GPU"), and a user may have switched matmuls to TF32
for the whole process (``torch.set_float32_matmul_precision("high")``). Both switches are process-wide, so
they are turned off while any fp32 forward runs (a count shared by threads) and restored when the last ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["ieee_float32"]

_lock = threading.Lock()
_active = 0
_saved: list[tuple[Any, str, Any]] = []


def _switches() -> list[tuple[Any, str, Any]]:
    """(object, attribute, the value meaning IEEE float32) of each TF32 switch, in the API this torch has:
    the per-backend ``fp32_precision`` (torch 2.9 and later; mixing it with the older flags is an error
    there) or the older ``allow_tf32`` flags."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    matmul = torch.backends.cuda.matmul
    if conv is not None and hasattr(conv, "fp32_precision") and hasattr(matmul, "fp32_precision"):
        return [(conv, "fp32_precision", "ieee"), (matmul, "fp32_precision", "ieee")]
    return [(torch.backends.cudnn, "allow_tf32", False), (matmul, "allow_tf32", False)]


@contextlib.contextmanager
def ieee_float32(device: torch.device) -> Iterator[None]:
    """Run the body with TF32 off for convolutions and matmuls when ``device`` is CUDA (else do nothing)."""
    global _active
    if device.type != "cuda":
        yield
        return
    with _lock:
        if _active == 0:
            switches = _switches()
            _saved[:] = [(owner, name, getattr(owner, name)) for owner, name, _ in switches]
            for owner, name, exact in switches:
                setattr(owner, name, exact)
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                for owner, name, value in _saved:
                    setattr(owner, name, value)
                _saved.clear()
