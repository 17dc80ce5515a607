"""A trained model directory: what ``elmo-cache train`` writes and ``perplexity`` reads.

* ``options.json`` and ``weights.hdf5``: the bilm-tf pair every ELMo loader reads
  (this project's Encoder, allennlp's ``Elmo``).
* ``vocab.txt`` and ``softmax.hdf5`` (``softmax/W`` (V, P), ``softmax/b`` (V,)): the
  rest of the language model, for perplexity or further training.

Every file is written to a temporary name and renamed into place, so a reader (or a
kill -9) never sees half a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np

from elmo_cache.errors import ModelNotFoundError
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.weights import read_datasets, weight_shapes, write_weight_file
from elmo_cache.train.bilm import TrainableBiLM
from elmo_cache.train.vocab import Vocabulary

__all__ = ["OPTIONS_FILE", "WEIGHTS_FILE", "VOCAB_FILE", "SOFTMAX_FILE", "write_model_dir", "load_trained_model"]

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "weights.hdf5"
VOCAB_FILE = "vocab.txt"
SOFTMAX_FILE = "softmax.hdf5"


def _replace_atomically(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _write_hdf5(path: Path, datasets: dict[str, np.ndarray]) -> None:
    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            for name, data in datasets.items():
                f.create_dataset(name, data=np.asarray(data, dtype=np.float32))

    _replace_atomically(path, write)


def write_model_dir(directory: str | os.PathLike[str], model: TrainableBiLM, vocab: Vocabulary) -> Path:
    """Write the four files of a trained model into ``directory``; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _replace_atomically(directory / VOCAB_FILE, vocab.save)
    _replace_atomically(
        directory / OPTIONS_FILE,
        lambda tmp: tmp.write_text(json.dumps(model.options.to_dict(), indent=2) + "\n", encoding="utf-8"),
    )
    # The official writer checks every name and shape against the options before writing.
    write_weight_file(directory / WEIGHTS_FILE, model.options, model.weight_datasets())
    _write_hdf5(directory / SOFTMAX_FILE, model.softmax_datasets())
    return directory


def load_trained_model(directory: str | os.PathLike[str]) -> tuple[TrainableBiLM, Vocabulary]:
    """A model directory back into a :class:`TrainableBiLM` (eval mode) and its vocabulary."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelNotFoundError(f"model directory not found: {directory}")
    for name in (OPTIONS_FILE, WEIGHTS_FILE, VOCAB_FILE, SOFTMAX_FILE):
        if not (directory / name).is_file():
            raise ModelNotFoundError(
                f"{directory}: {name} is missing; a trained model directory holds "
                f"{OPTIONS_FILE}, {WEIGHTS_FILE}, {VOCAB_FILE} and {SOFTMAX_FILE}"
            )
    options = ModelOptions.from_file(directory / OPTIONS_FILE)
    vocab = Vocabulary.load(directory / VOCAB_FILE)
    p = options.projection_dim
    datasets = read_datasets(directory / WEIGHTS_FILE, weight_shapes(options), source=str(directory / OPTIONS_FILE))
    datasets.update(
        read_datasets(
            directory / SOFTMAX_FILE,
            {"softmax/W": (len(vocab), p), "softmax/b": (len(vocab),)},
            source=str(directory / VOCAB_FILE),
        )
    )
    model = TrainableBiLM(options, len(vocab), dropout=0.0)
    model.load_datasets(datasets)
    return model.eval(), vocab
