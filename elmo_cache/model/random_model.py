"""Random ELMo models in the original weight-file layout, for tests and benchmarks.

The files written here are byte-for-byte the same *layout* as the published
``options.json`` + ``*_weights.hdf5`` pairs (same dataset names, shapes, dtypes,
TensorFlow orientation, 261-row ``char_embed`` without padding row, forget-gate
bias not stored), so every loader path is exercised exactly as with a real model.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from elmo_cache.model.options import ModelOptions

__all__ = ["PRESETS", "preset_options", "random_weights", "write_random_model", "write_placeholder_bundle"]

_ORIGINAL_FILTERS = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024))
_BASE = ModelOptions(
    char_embedding_dim=16,
    filters=_ORIGINAL_FILTERS,
    n_highway=2,
    n_characters=262,
    max_characters_per_token=50,
    activation="relu",
    n_layers=2,
    lstm_dim=4096,
    projection_dim=512,
    cell_clip=3.0,
    proj_clip=3.0,
    use_skip_connections=True,
)

PRESETS: dict[str, ModelOptions] = {
    # The published model sizes (elmo_2x4096_512_2048cnn_2xhighway etc.).
    "original": _BASE,
    "medium": replace(_BASE, lstm_dim=2048, projection_dim=256, n_highway=1),
    "small": replace(
        _BASE,
        lstm_dim=1024,
        projection_dim=128,
        n_highway=1,
        filters=((1, 32), (2, 32), (3, 64), (4, 128), (5, 256), (6, 512), (7, 1024)),
    ),
    # The architecture of the model bundled with the package (elmo_cache/model/bundled/).
    "bundled": replace(
        _BASE,
        filters=((1, 32), (2, 32), (3, 64), (4, 128), (5, 256)),
        n_highway=1,
        lstm_dim=512,
        projection_dim=128,
    ),
    # Tiny: the shape of the bilm-tf test fixture, fast enough for unit tests.
    "tiny": replace(
        _BASE,
        char_embedding_dim=4,
        filters=((1, 4), (2, 8), (3, 16), (4, 32), (5, 64)),
        lstm_dim=64,
        projection_dim=16,
    ),
}


def preset_options(name: str) -> ModelOptions:
    """Options of a named size: one of :data:`PRESETS`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; choose from {sorted(PRESETS)}") from None


def write_random_model(
    directory: str | Path,
    options: ModelOptions | str = "tiny",
    *,
    seed: int = 0,
    scale: float = 1.0,
    lstm_scale: float = 1.0,
    name: str = "model",
) -> tuple[Path, Path]:
    """Write ``{name}_options.json`` and ``{name}_weights.hdf5`` with random weights.

    Weights are drawn N(0, 1/fan_in) (so activations keep a realistic size) and
    multiplied by ``scale``; LSTM datasets are further multiplied by ``lstm_scale``:
    an ``lstm_scale`` of 3 or more drives the cells into the cell and projection
    clips while the token embeddings keep a realistic size. Returns
    ``(options_path, weights_path)``.
    """
    # Imported here: weights imports torch, and PRESETS alone (elmo-cache train --preset) must not.
    from elmo_cache.model.weights import write_weight_file

    if isinstance(options, str):
        options = preset_options(options)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    options_path = directory / f"{name}_options.json"
    weights_path = directory / f"{name}_weights.hdf5"
    options_path.write_text(json.dumps(options.to_dict(), indent=2), encoding="utf-8")
    write_weight_file(weights_path, options, random_weights(options, seed=seed, scale=scale, lstm_scale=lstm_scale))
    return options_path, weights_path


def random_weights(
    options: ModelOptions, *, seed: int = 0, scale: float = 1.0, lstm_scale: float = 1.0
) -> dict[str, np.ndarray]:
    """Every dataset of the weight file, drawn as :func:`write_random_model` describes."""
    from elmo_cache.model.weights import weight_shapes

    rng = np.random.default_rng(seed)
    datasets = {}
    for dataset, shape in weight_shapes(options).items():
        fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else shape[0]
        std = 1.0 if dataset == "char_embed" else (0.1 if len(shape) == 1 else fan_in**-0.5)
        factor = scale * (lstm_scale if dataset.startswith("RNN_") else 1.0)
        datasets[dataset] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std * factor)
    return datasets


def write_placeholder_bundle(directory: str | Path, *, seed: int = 0) -> tuple[Path, Path]:
    """A random stand-in for the bundled model: ``options.json`` + ``weights.hdf5`` of the "bundled" preset.

    For development and tests before the trained files exist; its vectors mean nothing.
    """
    directory = Path(directory)
    options_path, weights_path = write_random_model(directory, "bundled", seed=seed, name="placeholder")
    options_path = options_path.rename(directory / "options.json")
    weights_path = weights_path.rename(directory / "weights.hdf5")
    return options_path, weights_path
