"""Pretraining ELMo biLMs in PyTorch, writing the bilm-tf file layout (``elmo-cache train``)."""

from elmo_cache.train.api import train
from elmo_cache.train.config import TrainOptions, TrainResult
from elmo_cache.train.evaluate import PerplexityResult, perplexity
from elmo_cache.train.presets import TRAIN_PRESETS

__all__ = ["train", "TrainOptions", "TrainResult", "perplexity", "PerplexityResult", "TRAIN_PRESETS"]
