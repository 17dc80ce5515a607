"""``POST /v1/embeddings`` without HTTP: what the OpenAI embeddings API's shape maps to here.

Clients of that API (the ``openai`` SDK, LangChain, TEI and infinity users) send texts and get one
vector per text. ELMo gives three layers per token, so a text's vector is a pool over its tokens of
one mix of the layers:

* the mix: ``openai_mix`` when the server was given one, else the **average of the layers the cache
  stores** (all three without a cache, as simple_elmo averages them by default), or a mixed cache's own
  mix. So the default is always answered from the cache for a sentence it holds; a layer-subset cache
  (``--layers 1,2``) averages those layers.
* the pool: ``openai_pool`` (``mean`` by default; ``max`` or ``first-last``), computed in float32 as
  ``/embed?pool=`` computes it (:mod:`elmo_cache.server.pooled`).

The request's ``model`` is required by the API's clients but names nothing here: a server holds one
model, so any value is accepted and the response names the model that answered (as TEI does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.selection import MixSpec, Selection

if TYPE_CHECKING:
    from elmo_cache.server.service import EmbedService

__all__ = ["openai_selection", "served_model_name", "check_dimensions", "vector_width"]


def openai_selection(service: EmbedService) -> Selection:
    """The mix every ``/v1/embeddings`` vector pools (see the module docstring); refused at once when a
    configured mix needs layers the cache lacks and no model is loaded."""
    configured = service.settings.openai_mix
    if configured is not None:
        return service.resolve(None, configured, None, False)
    stored = service.stored
    if stored is not None and stored.mix is not None:
        return stored
    every = tuple(range(service.n_layers))
    layers = stored.layers if stored is not None and stored.layers is not None else every
    weights = tuple(1.0 / len(layers) if j in layers else 0.0 for j in every)
    return Selection(layers=None, mix=MixSpec(weights))


def served_model_name(service: EmbedService) -> str:
    """The name of the model behind the answers: the live model's, else the one that built the cache."""
    if service.encoder is not None:
        return str(service.encoder.name)
    model = (service.cache.metadata.get("model") or {}) if service.cache is not None else {}
    return str(model.get("name") or "elmo")


def vector_width(service: EmbedService) -> int:
    """The length of every ``/v1/embeddings`` vector (first-last puts two token vectors side by side)."""
    return service.dim * (2 if service.settings.openai_pool == "first-last" else 1)


def check_dimensions(service: EmbedService, dimensions: int | None) -> None:
    """ELMo vectors cannot be shortened (no Matryoshka training): ``dimensions`` must be the width or absent."""
    width = vector_width(service)
    if dimensions is not None and dimensions != width:
        raise InvalidParameterError(
            f"dimensions: this server's vectors have {width} dimensions and cannot be shortened; "
            f"leave dimensions out or pass {width}"
        )
