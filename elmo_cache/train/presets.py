"""Model sizes ``elmo-cache train --preset`` knows, as bilm-tf ``options.json`` contents."""

from __future__ import annotations

from dataclasses import replace

from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.random_model import PRESETS as _PUBLISHED_SHAPES

__all__ = ["TRAIN_PRESETS", "train_preset"]

TRAIN_PRESETS: dict[str, ModelOptions] = {
    # Unit tests and smoke runs: trains at thousands of tokens/s on one CPU core.
    "tiny": _PUBLISHED_SHAPES["tiny"],
    # The bundled default model: ~3M parameters, 256-d vectors; trains on 2 CPU cores in hours.
    "base": replace(
        _PUBLISHED_SHAPES["small"],
        filters=((1, 32), (2, 32), (3, 64), (4, 128), (5, 256)),
        lstm_dim=512,
        projection_dim=128,
    ),
    # The published shapes, for those with GPUs and billions of tokens.
    "small": _PUBLISHED_SHAPES["small"],
    "medium": _PUBLISHED_SHAPES["medium"],
    "original": _PUBLISHED_SHAPES["original"],
}


def train_preset(name: str) -> ModelOptions:
    try:
        return TRAIN_PRESETS[name]
    except KeyError:
        raise InvalidParameterError(f"preset: {name!r} is not one of {list(TRAIN_PRESETS)}") from None
