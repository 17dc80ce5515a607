"""``options.json``: the hyper-parameters of an ELMo biLM, parsed and validated."""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from elmo_cache.errors import ModelNotFoundError, OptionsError

__all__ = ["ModelOptions", "LIMITS", "bounded_int", "bounded_filters", "finite_clip", "flag"]

_ACTIVATIONS = ("relu", "tanh")

# Upper bounds on every option that sizes an allocation, checked when the options are read, before
# anything is allocated: without them an options.json with max_characters_per_token 1e9 loads and
# the first sentence asks for 7.45 GiB per token. Each is far above every published model (bilm-tf's
# original, 5.5B, medium and small, and the ELMoForManyLangs configs; their values in parentheses)
# and low enough that one token's char-CNN activations stay in the megabytes.
LIMITS: dict[str, int] = {
    # Character slots per token (50 in all published models): one int64 id and one char-CNN
    # activation row per slot and filter, for every token of a batch.
    "max_characters_per_token": 512,
    # Width of a character embedding (16 in bilm-tf's models, 50 in ELMoForManyLangs').
    "char_embedding_dim": 1024,
    # Convolutions in the char-CNN (7).
    "filters": 64,
    # Filters of one convolution (at most 1024), and of all of them together (2048, the width the
    # highway layers square).
    "filter_count": 16384,
    "n_filters": 16384,
    # Highway layers (1 or 2).
    "n_highway": 32,
    # LSTM layers per direction (2).
    "n_layers": 32,
    # LSTM memory cells per layer (4096 at most).
    "lstm_dim": 32768,
    # Projection of each LSTM layer and of the token embedding (512 at most).
    "projection_dim": 16384,
    # ELMoForManyLangs' word embedding width (100).
    "word_dim": 4096,
}


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
        """Validate the bilm-tf options dictionary; errors name ``source`` and the key.

        Every integer is checked to be one (not a bool, not 2.5, not "50") and within its bound in
        :data:`LIMITS` here, before anything the options size is allocated."""

        def number(key: str, value: Any, low: int, limit: str) -> int:
            return bounded_int(value, source=source, key=key, low=low, high=LIMITS[limit])

        try:
            cnn = raw["char_cnn"]
            lstm = raw["lstm"]
            max_chars = number(
                "char_cnn.max_characters_per_token", cnn["max_characters_per_token"], 3, "max_characters_per_token"
            )
            filters = bounded_filters(cnn["filters"], source, "char_cnn.filters", max_chars)
            options = cls(
                char_embedding_dim=number("char_cnn.embedding.dim", cnn["embedding"]["dim"], 1, "char_embedding_dim"),
                filters=filters,
                n_highway=number("char_cnn.n_highway", cnn["n_highway"], 0, "n_highway"),
                # Exactly 262 is required below; the bound only makes a huge or odd value fail as a number.
                n_characters=bounded_int(
                    cnn["n_characters"], source=source, key="char_cnn.n_characters", low=1, high=262, bound="262"
                ),
                max_characters_per_token=max_chars,
                activation=str(cnn["activation"]),
                n_layers=number("lstm.n_layers", lstm["n_layers"], 1, "n_layers"),
                lstm_dim=number("lstm.dim", lstm["dim"], 1, "lstm_dim"),
                projection_dim=number("lstm.projection_dim", lstm["projection_dim"], 1, "projection_dim"),
                cell_clip=finite_clip(lstm.get("cell_clip"), source=source, key="lstm.cell_clip"),
                proj_clip=finite_clip(lstm.get("proj_clip"), source=source, key="lstm.proj_clip"),
                use_skip_connections=flag(
                    lstm.get("use_skip_connections", False), source=source, key="lstm.use_skip_connections"
                ),
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
        # What the bounded parsing in from_dict cannot say: the activation's name and ELMo's fixed alphabet.
        if self.activation not in _ACTIVATIONS:
            raise OptionsError(f"{source}: char_cnn.activation {self.activation!r} is not one of {list(_ACTIVATIONS)}")
        if self.n_characters != 262:
            raise OptionsError(
                f"{source}: char_cnn.n_characters is {self.n_characters}; ELMo's character ids "
                "need 262 (261 in the weight file plus the padding row)"
            )

    def as_json_dict(self) -> dict[str, Any]:
        """Flat dictionary of the fields, for metadata and ``/info``."""
        return asdict(self)


def bounded_int(value: Any, *, source: str, key: str, low: int, high: int, bound: str = "") -> int:
    """``value`` as an int in ``[low, high]``, else an :class:`OptionsError` naming ``source``, ``key``,
    the value and the bound. JSON writes 1e9 as a float, so integral floats are taken; bools, strings
    and fractions are not (``int()`` would quietly make True a 1 and 2.5 a 2). ``bound`` says what
    ``high`` is when it is not one of :data:`LIMITS`."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionsError(f"{source}: {key} is {value!r}; it must be an integer from {low} to {high}")
    if value < low:
        raise OptionsError(f"{source}: {key} is {value}; it must be at least {low}")
    if value > high:
        what = bound or f"elmo-cache's limit of {high} (far above every published model)"
        raise OptionsError(f"{source}: {key} is {value}, above {what}; refused before anything was allocated")
    return value


def flag(value: Any, *, source: str, key: str) -> bool:
    """A JSON boolean (``bool("false")`` is True: a string must not switch the skip connections on)."""
    if not isinstance(value, bool):
        raise OptionsError(f"{source}: {key} is {value!r}; it must be true or false")
    return value


def finite_clip(value: Any, *, source: str, key: str) -> float | None:
    """A clip value: None (no clipping) or a finite, non-negative number (not a bool)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise OptionsError(f"{source}: {key} is {value!r}; it must be null or a finite number >= 0")
    return float(value)


def bounded_filters(raw: Any, source: str, key: str, max_chars: int) -> tuple[tuple[int, int], ...]:
    """The char-CNN's ``[width, count]`` pairs: each bounded, and their number and total too."""
    if not isinstance(raw, list) or not raw:
        raise OptionsError(f"{source}: {key} must be a non-empty list of [width, number of filters]")
    if len(raw) > LIMITS["filters"]:
        raise OptionsError(
            f"{source}: {key} has {len(raw)} convolutions, above elmo-cache's limit of {LIMITS['filters']}; "
            "refused before anything was allocated"
        )
    filters = []
    for i, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2:
            raise OptionsError(f"{source}: {key}[{i}] is {pair!r}; expected [width, number of filters]")
        width = bounded_int(
            pair[0],
            source=source,
            key=f"{key}[{i}] width",
            low=1,
            high=max_chars,
            bound=f"max_characters_per_token ({max_chars})",
        )
        count = bounded_int(pair[1], source=source, key=f"{key}[{i}] count", low=1, high=LIMITS["filter_count"])
        filters.append((width, count))
    total = sum(count for _, count in filters)
    if total > LIMITS["n_filters"]:
        raise OptionsError(
            f"{source}: {key} has {total} filters in all, above elmo-cache's limit of {LIMITS['n_filters']}; "
            "refused before anything was allocated"
        )
    return tuple(filters)
