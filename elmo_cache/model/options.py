"""``options.json``: the hyper-parameters of an ELMo biLM, parsed and validated."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from elmo_cache.errors import ModelNotFoundError, OptionsError

__all__ = ["ModelOptions"]

_ACTIVATIONS = ("relu", "tanh")


@dataclass(frozen=True)
class ModelOptions:
    """The architecture an ``options.json`` describes (the original bilm-tf schema)."""

    # Width of the character embeddings fed to the char-CNN (16 in the published models).
    char_embedding_dim: int
    # (width, number of filters) per convolution; the outputs are concatenated.
    filters: tuple[tuple[int, int], ...]
    # Highway layers between the char-CNN and the projection.
    n_highway: int
    # Size of the character vocabulary *with* the padding row the loader prepends (262).
    n_characters: int
    # Character slots per token (50); longer words are truncated.
    max_characters_per_token: int
    # Activation after the char-CNN max-pool: "relu" or "tanh".
    activation: str
    # LSTM layers per direction (2 in every published model).
    n_layers: int
    # LSTM memory cells per layer (4096 for the Original).
    lstm_dim: int
    # Projection size of each LSTM layer and of the token embedding (512 for the Original).
    projection_dim: int
    # Cell state is clipped to +/- this before it is used (None: no clipping).
    cell_clip: float | None
    # Projected output is clipped to +/- this (None: no clipping).
    proj_clip: float | None
    # Whether layers after the first add their input to their output.
    use_skip_connections: bool

    @property
    def n_filters(self) -> int:
        """Total char-CNN output width (2048 for the Original)."""
        return sum(num for _, num in self.filters)

    @property
    def output_dim(self) -> int:
        """Width of every output layer: forward and backward projections side by side."""
        return 2 * self.projection_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str = "options") -> ModelOptions:
        """Validate the bilm-tf options dictionary; errors name ``source`` and the key."""
        try:
            cnn = raw["char_cnn"]
            lstm = raw["lstm"]
            filters = tuple((int(w), int(n)) for w, n in cnn["filters"])
            options = cls(
                char_embedding_dim=int(cnn["embedding"]["dim"]),
                filters=filters,
                n_highway=int(cnn["n_highway"]),
                n_characters=int(cnn["n_characters"]),
                max_characters_per_token=int(cnn["max_characters_per_token"]),
                activation=str(cnn["activation"]),
                n_layers=int(lstm["n_layers"]),
                lstm_dim=int(lstm["dim"]),
                projection_dim=int(lstm["projection_dim"]),
                cell_clip=_optional_float(lstm.get("cell_clip")),
                proj_clip=_optional_float(lstm.get("proj_clip")),
                use_skip_connections=bool(lstm.get("use_skip_connections", False)),
            )
        except KeyError as exc:
            raise OptionsError(f"{source}: missing key {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise OptionsError(f"{source}: malformed value ({exc})") from None
        options._validate(source)
        return options

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ModelOptions:
        """Read and validate an ``options.json``."""
        path = Path(path)
        if not path.is_file():
            raise ModelNotFoundError(f"options file not found: {path}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise OptionsError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise OptionsError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        return cls.from_dict(raw, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The options in the original bilm-tf schema (round-trips through ``from_dict``)."""
        return {
            "char_cnn": {
                "embedding": {"dim": self.char_embedding_dim},
                "filters": [list(f) for f in self.filters],
                "n_highway": self.n_highway,
                "n_characters": self.n_characters,
                "max_characters_per_token": self.max_characters_per_token,
                "activation": self.activation,
            },
            "lstm": {
                "n_layers": self.n_layers,
                "dim": self.lstm_dim,
                "projection_dim": self.projection_dim,
                "cell_clip": self.cell_clip,
                "proj_clip": self.proj_clip,
                "use_skip_connections": self.use_skip_connections,
            },
        }

    def _validate(self, source: str) -> None:
        if self.activation not in _ACTIVATIONS:
            raise OptionsError(f"{source}: char_cnn.activation {self.activation!r} is not one of {list(_ACTIVATIONS)}")
        if self.n_characters != 262:
            raise OptionsError(
                f"{source}: char_cnn.n_characters is {self.n_characters}; ELMo's character ids "
                "need 262 (261 in the weight file plus the padding row)"
            )
        if self.max_characters_per_token < 3:
            raise OptionsError(f"{source}: char_cnn.max_characters_per_token must be >= 3")
        if not self.filters:
            raise OptionsError(f"{source}: char_cnn.filters is empty")
        for width, num in self.filters:
            if not 1 <= width <= self.max_characters_per_token or num < 1:
                raise OptionsError(f"{source}: bad char_cnn filter [{width}, {num}]")
        for name in ("char_embedding_dim", "n_layers", "lstm_dim", "projection_dim"):
            if getattr(self, name) < 1:
                raise OptionsError(f"{source}: {name} must be positive")
        if self.n_highway < 0:
            raise OptionsError(f"{source}: char_cnn.n_highway must be >= 0")

    def as_json_dict(self) -> dict[str, Any]:
        """Flat dictionary of the fields, for metadata and ``/info``."""
        return asdict(self)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
