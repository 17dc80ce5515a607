"""The precisions and devices an encoder may be asked for, checked by name without importing torch.

Option checks (``build``, ``train``, ``serve``) run before anything loads, so that a typo costs no
torch import and no model load; :mod:`~elmo_cache.encoder.hardware` then checks what exists here.
"""

from __future__ import annotations

import re

from elmo_cache.errors import InvalidParameterError

__all__ = ["PRECISION_NAMES", "BATCH_TOKENS", "batch_tokens_for", "check_precision_name", "check_device_name"]

PRECISION_NAMES = ("fp32", "bf16", "fp16")
"""The encoder's arithmetic: IEEE float32, bfloat16 or float16."""

BATCH_TOKENS = {"cpu": 8192, "cuda": 32768}
"""Tokens per encoder batch when none is asked for, by device type: larger on a GPU, where a batch's fixed costs
(one kernel launch per timestep and layer) are the larger share (benchmarks/RESULTS.md, "On a GPU, second
lease"). The encoder's and the build's default alike."""


def batch_tokens_for(device_type: str) -> int:
    """:data:`BATCH_TOKENS` of ``device_type`` (the CPU's for any other)."""
    return BATCH_TOKENS.get(device_type, BATCH_TOKENS["cpu"])


_DEVICE = re.compile(r"(cpu|cuda)(:[0-9]+)?")


def check_precision_name(precision: str) -> None:
    """Raise :class:`InvalidParameterError` unless ``precision`` is one of :data:`PRECISION_NAMES`."""
    if precision not in PRECISION_NAMES:
        raise InvalidParameterError(f"precision: {precision!r} is not valid; choose from {list(PRECISION_NAMES)}")


def check_device_name(device: str | None) -> None:
    """Raise :class:`InvalidParameterError` when ``device`` is a string other than 'cpu', 'cuda' or 'cuda:N'
    (None, the default, and torch.device objects pass).

    Whether CUDA (or device N) exists here is :func:`~elmo_cache.encoder.hardware.resolve_device`'s check.
    """
    if isinstance(device, str) and not _DEVICE.fullmatch(device):
        raise InvalidParameterError(f"device: {device!r} is not a device; choose 'cpu', 'cuda' or 'cuda:N'")
