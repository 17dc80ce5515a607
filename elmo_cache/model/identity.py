"""Whether two models compute the same vectors: the one check build, verify, serve and the hub share.

An :attr:`Encoder.identity <elmo_cache.Encoder.identity>` (stored in every cache's metadata as
``model``) also says where the model came from (``name``, ``directory``). Those do not change
a vector, so the same files under another name or in another folder are the same model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "MODEL_KEYS",
    "ModelDescription",
    "model_identity",
    "model_differences",
    "same_model",
    "comparable_model",
    "identity_layers",
]

MODEL_KEYS = ("weights_sha256", "options", "initial_state", "precision", "warmup_sha256")
"""The identity entries that determine the vectors, in the order differences are reported."""


@dataclass(frozen=True)
class ModelDescription:
    """What a build needs to know of a model before (or without) loading it."""

    # The identity an encoder of the model records (Encoder.identity), stored in each cache as "model".
    identity: dict[str, Any]
    # The width of every output layer (Encoder.output_dim).
    output_dim: int
    # How many layers the model gives (Encoder.n_layers): ELMo's 3, or a Transformer's blocks plus its embeddings.
    n_layers: int = 3


def model_identity(
    name: str | None,
    options: dict[str, Any],
    weights_sha256: str | None,
    initial_state: str,
    precision: str,
    directory: Path | None,
    warmup_sha256: str | None,
) -> dict[str, Any]:
    """A model identity (:attr:`Encoder.identity <elmo_cache.Encoder.identity>`): the one place its keys
    and their order are written, so one read from a model's files equals a loaded encoder's byte for byte."""
    identity: dict[str, Any] = {
        "name": name,
        "options": options,
        "weights_sha256": weights_sha256,
        "initial_state": initial_state,
        "precision": precision,
    }
    if directory is not None:
        identity["directory"] = str(directory)
    if warmup_sha256 is not None:
        identity["warmup_sha256"] = warmup_sha256
    return identity


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


def identity_layers(identity: Mapping[str, Any] | None) -> int:
    """How many layers the model an identity records gives: a Transformer's ``options.n_layers``, else ELMo's 3."""
    options = (identity or {}).get("options")
    if isinstance(options, Mapping) and options.get("format") == "transformers":
        return int(options["n_layers"])
    return 3
