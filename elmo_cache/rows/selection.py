"""What to keep of the three ELMo layers: a subset of layers, or one fixed mix (:class:`Selection`).

One type for every stage that chooses: ``build`` stores a selection, ``verify`` recomputes it,
the server answers one per request (from the cache when the stored selection contains it),
and the CLI and the HTTP API parse it from the same words (``layers``, ``mix``, ``gamma``,
``softmax``), so they accept and refuse the same things with the same messages.

A *fixed* mix is ``gamma * sum_j s_j h_j`` with constant weights, computed in
float32 before any cast to a storage dtype. Trained models (allennlp's ScalarMix,
:class:`elmo_cache.ScalarMix`) store raw parameters that pass through a softmax;
``MixSpec.from_raw(..., softmax=True)`` applies it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import InvalidParameterError
from elmo_cache.store.format import LAYER_IDS

if TYPE_CHECKING:
    import torch

__all__ = [
    "ALL_LAYERS",
    "parse_layers",
    "check_distinct_layers",
    "parse_floats",
    "MixSpec",
    "Selection",
    "PARAMETER_NAMES",
]

ALL_LAYERS = LAYER_IDS

PARAMETER_NAMES: Mapping[str, str] = {"layers": "layers", "mix": "mix", "gamma": "gamma", "softmax": "softmax"}
"""How the words of a selection are spelled in messages (the CLI passes its flags, e.g. ``--mix-softmax``)."""

# Two mixes are the same when their weights and gamma agree to this relative precision: a mix
# round-trips through JSON metadata and query strings, which may drop the last bits.
_MIX_REL_TOL = 1e-9
_MIX_ABS_TOL = 1e-12


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


def check_distinct_layers(value: str | Iterable[int] | None, *, parameter: str = "layers") -> None:
    """Refuse a layer listed twice (``"1,1"``): a build that stores the layers asked for must not quietly store
    fewer. (Reading and serving take ``"1,1"`` as ``"1"``: asking twice for a layer there changes nothing.)"""
    if value is None:
        return
    items = [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else list(value)
    seen: set[str] = set()
    for item in items:
        key = str(item).strip()
        if key in seen:
            raise InvalidParameterError(
                f"{parameter}: layer {key} is listed twice in {value if isinstance(value, str) else list(value)!r}; "
                "list each layer to store once"
            )
        seen.add(key)


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
    def from_raw(
        cls, weights: str | Sequence[float], *, gamma: float = 1.0, softmax: bool = False, n_layers: int = 3
    ) -> MixSpec:
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

    @classmethod
    def from_metadata(cls, raw: Mapping[str, Any]) -> MixSpec:
        """The mix stored as :meth:`to_metadata` wrote it."""
        return cls(
            weights=tuple(float(w) for w in raw["weights"]),
            gamma=float(raw["gamma"]),
            raw=None if raw.get("raw") is None else tuple(float(x) for x in raw["raw"]),
        )

    def same_as(self, other: MixSpec) -> bool:
        """Whether both mixes compute the same vectors (effective weights and gamma, to float round-off)."""

        def close(x: float, y: float) -> bool:
            return math.isclose(x, y, rel_tol=_MIX_REL_TOL, abs_tol=_MIX_ABS_TOL)

        return (
            len(self.weights) == len(other.weights)
            and all(map(close, self.weights, other.weights))
            and close(self.gamma, other.gamma)
        )

    def describe(self) -> str:
        return f"weights {list(self.weights)}, gamma {self.gamma}"

    def apply(self, layers: torch.Tensor, *, layer_dim: int = -3) -> torch.Tensor:
        """Mix a float tensor whose ``layer_dim`` axis holds the three layers, in float32."""
        import torch

        weights = torch.tensor(self.weights, dtype=torch.float32, device=layers.device)
        shape = [1] * layers.dim()
        shape[layer_dim] = len(self.weights)
        mixed = (layers.float() * weights.view(shape)).sum(dim=layer_dim)
        return mixed * self.gamma

    def to_metadata(self) -> dict[str, Any]:
        """JSON form stored in cache metadata."""
        return {
            "weights": list(self.weights),
            "gamma": self.gamma,
            "raw": None if self.raw is None else list(self.raw),
            "softmax": self.raw is not None,
        }


def _exclusive(names: Mapping[str, str]) -> InvalidParameterError:
    return InvalidParameterError(
        f"{names['layers']} and {names['mix']} are exclusive: give one of them, not both "
        "(a mix already combines all layers)"
    )


@dataclass(frozen=True)
class Selection:
    """What to keep of the three layers: ``layers`` (a sorted subset) or one fixed ``mix``, never both."""

    # Layer ids kept, sorted: vectors of shape (len(layers), n_tokens, dim). None when mixing.
    layers: tuple[int, ...] | None = ALL_LAYERS
    # The fixed mix kept instead: vectors of shape (n_tokens, dim). None when keeping layers.
    mix: MixSpec | None = None

    def __post_init__(self) -> None:
        if (self.layers is None) == (self.mix is None):
            raise InvalidParameterError("a selection keeps either layers or one mix")

    # -- making one -------------------------------------------------------------------------------

    @classmethod
    def of(
        cls,
        layers: str | Iterable[int] | None = None,
        mix: MixSpec | None = None,
        *,
        names: Mapping[str, str] = PARAMETER_NAMES,
        n_layers: int = 3,
    ) -> Selection:
        """From typed options (``BuildOptions.layers`` / ``.mix``): the mix, or ``layers`` (None: all of the
        model's ``n_layers``: ELMo's three, a Transformer's blocks plus its embeddings)."""
        if mix is not None and layers is not None:
            raise _exclusive(names)
        if mix is not None:
            if isinstance(mix, MixSpec) and len(mix.weights) != n_layers:
                raise InvalidParameterError(
                    f"{names['mix']}: expected {n_layers} numbers (one per layer of the model), got {len(mix.weights)}"
                )
            return cls(layers=None, mix=mix)
        return cls(layers=parse_layers(layers, n_layers=n_layers, parameter=names["layers"]))

    @classmethod
    def parse(
        cls,
        layers: str | Iterable[int] | None = None,
        mix: str | Sequence[float] | None = None,
        gamma: float | None = None,
        softmax: bool = False,
        *,
        names: Mapping[str, str] = PARAMETER_NAMES,
        n_layers: int = 3,
    ) -> Selection | None:
        """From user words (flags, query parameters); None when neither ``layers`` nor ``mix`` is given."""
        if mix is not None and layers is not None:
            raise _exclusive(names)
        if mix is None and (gamma is not None or softmax):
            raise InvalidParameterError(
                f"{names['gamma']} and {names['softmax']} only apply with {names['mix']} s0,s1,s2: drop them, "
                f"or use them only with {names['mix']}"
            )
        if mix is not None:
            mixed = MixSpec.from_raw(mix, gamma=1.0 if gamma is None else gamma, softmax=softmax, n_layers=n_layers)
            return cls(layers=None, mix=mixed)
        if layers is None:
            return None
        return cls(layers=parse_layers(layers, n_layers=n_layers, parameter=names["layers"]))

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> Selection:
        """What a cache's metadata (``kind``, ``layers``, ``mix``) says it stores."""
        if meta.get("kind") == "mix":
            return cls(layers=None, mix=MixSpec.from_metadata(meta["mix"]))
        return cls(layers=tuple(int(layer) for layer in meta["layers"]))

    # -- describing it ----------------------------------------------------------------------------

    @property
    def kind(self) -> str:
        """``"layers"`` or ``"mix"`` (FORMAT.md's ``kind``)."""
        return "mix" if self.mix is not None else "layers"

    def to_metadata(self) -> dict[str, Any]:
        """``kind``, ``layers`` and ``mix`` as FORMAT.md stores them."""
        return {
            "kind": self.kind,
            "layers": None if self.layers is None else list(self.layers),
            "mix": None if self.mix is None else self.mix.to_metadata(),
        }

    def describe(self) -> dict[str, Any]:
        """``layers`` and ``mix`` as the server echoes them."""
        return {
            "layers": None if self.layers is None else list(self.layers),
            "mix": None if self.mix is None else self.mix.to_metadata(),
        }

    def row_shape(self, dim: int) -> tuple[int, ...]:
        """Shape of one token's row in a cache: ``(n_layers, dim)`` or ``(dim,)``."""
        return (dim,) if self.layers is None else (len(self.layers), dim)

    def vector_shape(self, n_tokens: int, dim: int) -> tuple[int, ...]:
        """Shape of one sentence's answer: ``(n_layers, n_tokens, dim)`` or ``(n_tokens, dim)``."""
        return (n_tokens, dim) if self.layers is None else (len(self.layers), n_tokens, dim)

    # -- comparing --------------------------------------------------------------------------------

    def same_as(self, other: Selection) -> bool:
        """Whether both select the same vectors (mixes compared to float round-off)."""
        if self.mix is not None or other.mix is not None:
            return self.mix is not None and other.mix is not None and self.mix.same_as(other.mix)
        return self.layers == other.layers

    def answerable_from(self, stored: Selection) -> bool:
        """Whether a cache that stores ``stored`` holds what this selection needs.

        A layered cache answers any subset of its layers and any mix whose non-zero weights fall
        on stored layers; a mixed cache answers only its own mix.
        """
        if stored.mix is not None:
            return self.mix is not None and self.mix.same_as(stored.mix)
        kept = set(stored.layers or ())
        if self.mix is not None:
            return all(w == 0.0 or j in kept for j, w in enumerate(self.mix.weights))
        return set(self.layers or ()) <= kept

    def unavailable_message(self, stored: Selection) -> str:
        """Why a cache storing ``stored`` cannot answer this selection (no model to compute it)."""
        if stored.mix is not None:
            return (
                f"this cache stores only one fixed mix ({stored.mix.describe()}) and no model is loaded; "
                "omit layers and mix (or pass that mix), or start the server with a model to compute others"
            )
        kept = list(stored.layers or ())
        if self.mix is not None:
            needed = [j for j, w in enumerate(self.mix.weights) if w != 0.0]
            return (
                f"mix: needs layers {needed} but this cache stores layers {kept} and no model is loaded; "
                f"give zero weight to layers outside {kept}, or start the server with a model"
            )
        missing = [layer for layer in self.layers or () if layer not in kept]
        return f"layers: layer(s) {missing} are not stored in this cache and no model is loaded; choose from {kept}"

    # -- applying ---------------------------------------------------------------------------------

    def apply(self, acts: torch.Tensor, *, layer_dim: int = -3) -> torch.Tensor:
        """Select or mix the three layers on axis ``layer_dim`` of ``acts`` (a mix runs in float32, drops the axis)."""
        if self.mix is not None:
            return self.mix.apply(acts, layer_dim=layer_dim)
        assert self.layers is not None
        if self.layers == ALL_LAYERS:
            return acts
        import torch

        return acts.index_select(layer_dim, torch.tensor(self.layers, device=acts.device))

    def apply_array(self, acts: np.ndarray, dtype: Any = None) -> np.ndarray:
        """:meth:`apply` on an encoder output ``(3, n_tokens, dim)`` float32 numpy array, cast to ``dtype``."""
        if self.mix is not None:
            import torch

            out = self.mix.apply(torch.from_numpy(np.asarray(acts, dtype=np.float32)), layer_dim=0).numpy()
        else:
            out = np.asarray(acts)[list(self.layers or ())]
        return np.ascontiguousarray(out, dtype=dtype)

    def extract(self, stored: Selection, vectors: np.ndarray, dtype: Any = None) -> np.ndarray:
        """This selection from one cached sentence ``vectors`` of a cache storing ``stored``.

        Requires :meth:`answerable_from`. A mix of stored layers is computed in float32.
        """
        if stored.mix is not None:
            return np.ascontiguousarray(vectors, dtype=dtype)
        kept = list(stored.layers or ())
        if self.mix is None:
            positions = [kept.index(layer) for layer in self.layers or ()]
            if positions != list(range(len(kept))):
                vectors = np.asarray(vectors)[positions]
            return np.ascontiguousarray(vectors, dtype=dtype)
        full = np.zeros((len(self.mix.weights), vectors.shape[-2], vectors.shape[-1]), dtype=np.float32)
        for position, layer in enumerate(kept):
            full[layer] = vectors[position]  # a float32 copy: the store is read-only
        return Selection(layers=None, mix=self.mix).apply_array(full, dtype)
