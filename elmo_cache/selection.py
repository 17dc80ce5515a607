"""What to keep of the three ELMo layers: a subset of layers, or one fixed mix.

A *fixed* mix is ``gamma * sum_j s_j h_j`` with constant weights, computed in
float32 before any cast to a storage dtype. Trained models (allennlp's ScalarMix,
:class:`elmo_cache.ScalarMix`) store raw parameters that pass through a softmax;
``MixSpec.from_raw(..., softmax=True)`` applies it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from elmo_cache.errors import InvalidParameterError

__all__ = ["ALL_LAYERS", "parse_layers", "parse_floats", "MixSpec"]

ALL_LAYERS = (0, 1, 2)


def parse_layers(value: str | Iterable[int] | None, *, n_layers: int = 3, parameter: str = "layers") -> tuple[int, ...]:
    """Parse ``"1,2"`` (or an iterable of ints) into a sorted tuple of distinct layer ids.

    ``None`` means all layers. Raises :class:`InvalidParameterError` naming the
    parameter and listing the valid choices.
    """
    valid = tuple(range(n_layers))
    if value is None:
        return valid
    items: list[Any]
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",") if part.strip()]
    else:
        items = list(value)
    if not items:
        raise InvalidParameterError(f"{parameter}: empty; choose from {list(valid)}")
    layers = set()
    for item in items:
        try:
            layer = int(item)
        except (TypeError, ValueError):
            raise InvalidParameterError(f"{parameter}: {item!r} is not a layer; choose from {list(valid)}") from None
        if layer not in valid:
            raise InvalidParameterError(f"{parameter}: layer {layer} does not exist; choose from {list(valid)}")
        layers.add(layer)
    return tuple(sorted(layers))


def parse_floats(value: str | Sequence[float], *, count: int, parameter: str) -> tuple[float, ...]:
    """Parse ``"0.2,0.3,0.5"`` into exactly ``count`` finite floats."""
    items = [p.strip() for p in value.split(",")] if isinstance(value, str) else list(value)
    try:
        numbers = tuple(float(x) for x in items)
    except (TypeError, ValueError):
        raise InvalidParameterError(f"{parameter}: {value!r} is not a list of {count} numbers") from None
    if len(numbers) != count:
        raise InvalidParameterError(f"{parameter}: expected {count} numbers (one per layer), got {len(numbers)}")
    if not all(math.isfinite(x) for x in numbers):
        raise InvalidParameterError(f"{parameter}: weights must be finite, got {list(numbers)}")
    return numbers


@dataclass(frozen=True)
class MixSpec:
    """A fixed scalar mix of the three layers."""

    # Effective per-layer weights s_j (already softmax-normalised when built from raw parameters).
    weights: tuple[float, ...]
    # Global scale applied after the weighted sum.
    gamma: float = 1.0
    # The raw parameters the user gave, when ``softmax`` was applied to them (for metadata).
    raw: tuple[float, ...] | None = None

    @classmethod
    def from_raw(cls, weights: str | Sequence[float], *, gamma: float = 1.0, softmax: bool = False, n_layers: int = 3) -> MixSpec:
        """Build a mix from user input; with ``softmax`` the weights are raw ScalarMix parameters."""
        numbers = parse_floats(weights, count=n_layers, parameter="mix")
        if not math.isfinite(gamma):
            raise InvalidParameterError(f"gamma: must be finite, got {gamma}")
        if softmax:
            top = max(numbers)
            exps = [math.exp(x - top) for x in numbers]
            total = sum(exps)
            return cls(weights=tuple(e / total for e in exps), gamma=float(gamma), raw=numbers)
        return cls(weights=numbers, gamma=float(gamma))

    def apply(self, layers: torch.Tensor, *, layer_dim: int = -3) -> torch.Tensor:
        """Mix a float tensor whose ``layer_dim`` axis holds the three layers, in float32."""
        weights = torch.tensor(self.weights, dtype=torch.float32, device=layers.device)
        shape = [1] * layers.dim()
        shape[layer_dim] = len(self.weights)
        mixed = (layers.float() * weights.view(shape)).sum(dim=layer_dim)
        return mixed * self.gamma

    def to_metadata(self) -> dict[str, Any]:
        """JSON form stored in cache metadata."""
        return {"weights": list(self.weights), "gamma": self.gamma, "raw": None if self.raw is None else list(self.raw), "softmax": self.raw is not None}
