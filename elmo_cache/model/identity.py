"""Whether two models compute the same vectors: the one check build, verify, serve and the hub share.

An :attr:`Encoder.identity <elmo_cache.Encoder.identity>` (stored in every cache's metadata as
``model``) also says where the model came from (``name``, ``directory``). Those do not change
a vector, so the same files under another name or in another folder are the same model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["MODEL_KEYS", "model_differences", "same_model", "comparable_model"]

MODEL_KEYS = ("weights_sha256", "options", "initial_state", "precision", "warmup_sha256")
"""The identity entries that determine the vectors, in the order differences are reported."""


def comparable_model(identity: Mapping[str, Any] | None) -> dict[str, Any]:
    """The part of a model identity that determines its vectors (absent entries read as None)."""
    identity = identity or {}
    return {key: identity.get(key) for key in MODEL_KEYS}


def model_differences(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> list[str]:
    """The :data:`MODEL_KEYS` on which two identities differ (empty: the same model)."""
    left, right = comparable_model(a), comparable_model(b)
    return [key for key in MODEL_KEYS if left[key] != right[key]]


def same_model(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """Whether both identities describe the same vectors: same weights, options, initial state and precision."""
    return not model_differences(a, b)
