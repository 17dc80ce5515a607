"""``train()``, the public entry: one process here, or several through torchrun's launcher."""

from __future__ import annotations

import os

from elmo_cache.train.config import TrainOptions, TrainResult
from elmo_cache.train.launch import launch
from elmo_cache.train.trainer import train_rank

__all__ = ["train"]


def train(
    corpus: str | os.PathLike[str], output: str | os.PathLike[str], options: TrainOptions | None = None
) -> TrainResult:
    """Train a biLM on ``corpus`` (one sentence per line, whitespace tokens) into ``output``.

    ``output`` receives options.json, weights.hdf5, vocab.txt, softmax.hdf5 and checkpoint.pt.
    Running again with the same corpus and fixed options resumes from the checkpoint.
    ``options.nproc`` > 1 starts that many processes (torchrun's launcher) and returns rank 0's
    result; a process that torchrun started joins its group and trains as its rank.
    """
    options = options or TrainOptions()
    options.validate()
    if options.nproc > 1:
        return launch(corpus, output, options)
    return train_rank(corpus, output, options)
