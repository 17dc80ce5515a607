"""The precisions and devices an encoder may be asked for, checked by name without importing torch.

Option checks (``build``, ``train``, ``serve``) run before anything loads, so that a typo costs no
torch import and no model load; :mod:`~elmo_cache.encoder.hardware` then checks what exists here.
"""

from __future__ import annotations

import re

from elmo_cache.errors import InvalidParameterError

__all__ = [
    "PRECISION_NAMES",
    "BATCH_TOKENS",
    "FORMAT_BATCH_TOKENS",
    "batch_tokens_for",
    "check_precision_name",
    "check_device_name",
]

PRECISION_NAMES = ("fp32", "bf16", "fp16")
"""The encoder's arithmetic: IEEE float32, bfloat16 or float16."""

BATCH_TOKENS = {"cpu": 8192, "cuda": 32768}
"""Tokens per encoder batch when none is asked for, by device type: larger on a GPU, where a batch's fixed costs
(one kernel launch per timestep and layer) are the larger share (benchmarks/RESULTS.md, "On a GPU, second
lease"). The encoder's and the build's default alike."""


FORMAT_BATCH_TOKENS = {"transformers": {"cpu": 1024, "cuda": 32768}}
"""The same for models whose format (:mod:`elmo_cache.model.formats`) batches best otherwise. A Transformer on a CPU:
sub-batches of ~1,000 words keep a block's activations in the caches; BERT-mini on this project's 2-core EPYC took
1.87-1.96 s for 18,942 words at 1,024 against 3.7 s at 8,192 (benchmarks/RESULTS.md, "Transformer encoders")."""


def batch_tokens_for(device_type: str, model_format: str | None = None) -> int:
    """Tokens per batch when none is asked for, for a model of ``model_format`` (None: ELMo's) on ``device_type``
    (the CPU's for any other type): :data:`FORMAT_BATCH_TOKENS`, else :data:`BATCH_TOKENS`."""
    table = FORMAT_BATCH_TOKENS.get(model_format or "", BATCH_TOKENS)
    return table.get(device_type, table["cpu"])


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
