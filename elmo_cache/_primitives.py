"""Bounding torch's oneDNN primitive caches, which must be done before torch is loaded.

torch runs CPU convolutions through oneDNN, which caches a compiled *primitive* (with its JIT code) per
input shape: up to 1024 in ideep's cache (``LRU_CACHE_CAPACITY``) and 1024 in oneDNN's own
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY``). The char-CNN's input is a batch's distinct words, a count that
changes nearly every batch, so a long build compiled a new primitive per batch and kept them all: with
the tiny model, the build's anonymous memory grew by ~40 MB per million tokens early on, 0.42 -> 0.77 GB
of peak from 1M to 10M tokens (benchmarks/RESULTS.md, "Build memory against corpus size"), and would
have gone on to the caches' full size. Since a shape rarely comes back, a small cache loses next to
nothing: a primitive is built in well under a millisecond, next to the batch it serves; results are the
same bits (the same primitive is built again for the same shape).

Both variables are read once, when torch's libraries load, so ``import elmo_cache`` sets them (only
where unset: a user's own value wins) before anything of elmo-cache imports torch. A process that
loaded torch first keeps torch's defaults. Ray workers inherit the variables from the driver of a local
cluster, and import ``elmo_cache`` (unpickling the part writer) before torch on any cluster.
"""

from __future__ import annotations

import os

__all__ = ["PRIMITIVE_CACHE_CAPACITY", "PRIMITIVE_CACHE_VARIABLES", "bound_primitive_caches"]

PRIMITIVE_CACHE_CAPACITY = 64
"""Primitives each of the two caches keeps (a dozen batches' worth of the char-CNN's five convolutions)."""

PRIMITIVE_CACHE_VARIABLES = ("LRU_CACHE_CAPACITY", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")


def bound_primitive_caches() -> None:
    """Set both capacities to :data:`PRIMITIVE_CACHE_CAPACITY` where the environment does not name them."""
    for name in PRIMITIVE_CACHE_VARIABLES:
        os.environ.setdefault(name, str(PRIMITIVE_CACHE_CAPACITY))
