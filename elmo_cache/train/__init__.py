"""Pretraining ELMo biLMs in PyTorch, writing the bilm-tf file layout (``elmo-cache train``).

The names are imported on first use, so that ``elmo-cache train --help`` and its option errors
need no torch (the training itself does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elmo_cache.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from elmo_cache.train.api import train as train
    from elmo_cache.train.config import TrainOptions as TrainOptions
    from elmo_cache.train.config import TrainResult as TrainResult
    from elmo_cache.train.evaluate import PerplexityResult as PerplexityResult
    from elmo_cache.train.evaluate import perplexity as perplexity
    from elmo_cache.train.presets import TRAIN_PRESETS as TRAIN_PRESETS

# name -> module that defines it
_EXPORTS = {
    "train": "elmo_cache.train.api",
    "TrainOptions": "elmo_cache.train.config",
    "TrainResult": "elmo_cache.train.config",
    "perplexity": "elmo_cache.train.evaluate",
    "PerplexityResult": "elmo_cache.train.evaluate",
    "TRAIN_PRESETS": "elmo_cache.train.presets",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
