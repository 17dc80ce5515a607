"""The batch encoder: token lists in, the biLM's three layers out (``encoder``); where each batch's
LSTM state starts (``lstm_states``); the per-batch word cache (``word_cache``); the device and
precision it runs in (``hardware``; their names, checked without torch, in ``names``).

``Encoder`` is imported on first use: option checks import :mod:`~elmo_cache.encoder.names` alone.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from elmo_cache.encoder.encoder import Encoder as Encoder

__all__ = ["Encoder"]


def __getattr__(name: str) -> Any:
    if name != "Encoder":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = importlib.import_module("elmo_cache.encoder.encoder").Encoder
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
