"""A learnable scalar mix of cached ELMo layers: ``gamma * sum_j softmax(a)_j h_j``.

Train it on a layered cache; once the downstream model is good, freeze the mix into a
smaller, faster cache with ``elmo-cache build ... <ScalarMix.build_args()>``, which stores
exactly what :meth:`ScalarMix.forward` computes (the build applies the same softmax in
float32). There is no layer normalisation option, because a fixed-mix cache could not
reproduce it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.identity import identity_layers
from elmo_cache.rows.selection import ALL_LAYERS, MixSpec, parse_layers

if TYPE_CHECKING:
    from elmo_cache.reader.cache import Cache

__all__ = ["ScalarMix"]

# Raw parameter given to layers the mix never saw (absent from a layered cache), relative to
# the smallest learned one: its softmax weight is below e**-200, which rounds to exactly 0 in
# float32 (where the build mixes), while staying a finite number that `build --mix` accepts.
_ABSENT_OFFSET = 200.0


class ScalarMix(nn.Module):
    """Softmax-normalised, learnable layer weights ``s_j`` and scale ``gamma``.

    ``layers`` are the ELMo layer ids of the input's layer axis (``cache.layers``, e.g.
    ``(1, 2)`` for a cache built with ``--layers 1,2``). ``forward`` takes a float tensor whose
    ``layer_dim`` axis (default -3, as in ``collate``'s ``(batch, n_layers, tokens, dim)``)
    holds those layers and returns it mixed, without that axis.
    """

    def __init__(
        self,
        layers: Iterable[int] | str | None = ALL_LAYERS,
        *,
        initial: Iterable[float] | None = None,
        gamma: float = 1.0,
        trainable: bool = True,
        n_layers: int = len(ALL_LAYERS),
    ):
        super().__init__()
        # How many layers the model has (ELMo's 3, a Transformer's L + 1): the ids ``layers`` may name, and the
        # length of the mix the build takes (raw_weights, mix_spec).
        self.n_layers = int(n_layers)
        self.layers = parse_layers(layers, n_layers=self.n_layers)
        n = len(self.layers)
        raw = torch.zeros(n) if initial is None else torch.tensor(list(initial), dtype=torch.float32)
        if raw.shape != (n,):
            raise InvalidParameterError(
                f"initial: expected {n} raw weights (one per layer {list(self.layers)}), got {raw.numel()}"
            )
        self.scalar_parameters = nn.Parameter(raw, requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor(float(gamma)), requires_grad=trainable)

    @classmethod
    def for_cache(cls, cache: Cache, **kwargs: Any) -> ScalarMix:
        """A mix over the layers a layered cache stores (``cache``: a Cache or a CacheDataset)."""
        if cache.layers is None:
            raise InvalidParameterError(f"{cache.path}: a mixed cache has no layers to learn a mix over")
        metadata = getattr(cache, "metadata", None)
        if isinstance(metadata, dict):
            n_layers = identity_layers(metadata.get("model"))
        else:  # a dataset holds its cache's path only: its layers say at least how many there are
            n_layers = max(len(ALL_LAYERS), max(cache.layers) + 1)
        return cls(cache.layers, **{"n_layers": n_layers, **kwargs})

    def forward(self, tensor: torch.Tensor, layer_dim: int = -3) -> torch.Tensor:
        n = len(self.layers)
        if tensor.shape[layer_dim] != n:
            raise InvalidParameterError(
                f"ScalarMix over layers {list(self.layers)}: input axis {layer_dim} has size "
                f"{tensor.shape[layer_dim]}, expected {n}"
            )
        weights = torch.softmax(self.scalar_parameters, dim=0)
        shape = [1] * tensor.dim()
        shape[layer_dim] = n
        mixed = (tensor.to(weights.dtype) * weights.view(shape)).sum(dim=layer_dim)
        return self.gamma * mixed

    # -- the learned values, in the form `elmo-cache build --mix` takes ---------------------------

    @property
    def weights(self) -> tuple[float, ...]:
        """Effective weights ``s_j`` of the mixed layers (sum to 1)."""
        return tuple(torch.softmax(self.scalar_parameters.detach().float(), dim=0).tolist())

    @property
    def raw_weights(self) -> tuple[float, ...]:
        """Raw parameters for all the model's layers (ELMo's 0, 1, 2), for ``--mix ... --mix-softmax``.

        Layers outside ``self.layers`` get a raw value far below the others, so their softmax
        weight is 0 in float32.
        """
        raw = self.scalar_parameters.detach().double().tolist()
        floor = min(raw) - _ABSENT_OFFSET
        by_layer = dict(zip(self.layers, raw))
        return tuple(float(by_layer.get(layer, floor)) for layer in range(self.n_layers))

    @property
    def gamma_value(self) -> float:
        return float(self.gamma.detach())

    def mix_spec(self) -> MixSpec:
        """The fixed mix this module computes, as the build uses it."""
        return MixSpec.from_raw(self.raw_weights, gamma=self.gamma_value, softmax=True, n_layers=self.n_layers)

    def build_args(self) -> list[str]:
        """``["--mix", "a0,a1,a2", "--mix-softmax", "--gamma", "g"]`` for ``elmo-cache build``."""
        return [
            "--mix",
            ",".join(repr(x) for x in self.raw_weights),
            "--mix-softmax",
            "--gamma",
            repr(self.gamma_value),
        ]

    def extra_repr(self) -> str:
        weights = ", ".join(f"{w:.3f}" for w in self.weights)
        return f"layers={list(self.layers)}, weights=[{weights}], gamma={self.gamma_value:.3f}"
