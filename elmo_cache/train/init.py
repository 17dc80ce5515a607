"""What ``--init-from`` starts training from: a trained model directory, or any bilm-tf model.

Two kinds of starting point:

* a directory this trainer wrote (options, weights, ``vocab.txt`` and ``softmax.hdf5``): every
  weight, the softmax and its vocabulary carry on (only the optimizer starts afresh);
* any other model in the bilm-tf layout, named as ``build --model`` names one (a published name
  such as ``elmo-original``, ``bundled``, or a directory with an ``*options*.json`` and a
  ``*weights*.hdf5``). The published files hold no softmax (bilm-tf's ``dump_weights`` leaves it
  out), so the encoder's weights carry on and a fresh softmax is made over the new corpus's
  vocabulary (or ``--vocab``), initialised as a new model's is. That is domain adaptation: the
  char-CNN and the LSTMs begin where the published model ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.hub import file_sha256
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.weights import read_datasets, weight_shapes
from elmo_cache.train.bilm import TrainableBiLM
from elmo_cache.train.files import SOFTMAX_FILE, VOCAB_FILE
from elmo_cache.train.vocab import Vocabulary

__all__ = ["StartingModel", "resolve_start"]


@dataclass(frozen=True)
class StartingModel:
    """A model to continue training from, resolved to its files."""

    # What the user named (a directory, a published name, "bundled"): recorded in the fingerprint.
    name: str
    # Its options (the run's model shape).
    options: ModelOptions
    # The bilm-tf weight file.
    weight_file: Path
    # vocab.txt and softmax.hdf5 beside it, when the model has a softmax to go on with; else None.
    vocab_file: Path | None
    softmax_file: Path | None

    @property
    def has_softmax(self) -> bool:
        return self.softmax_file is not None

    def fingerprint(self) -> dict[str, Any]:
        """What a checkpoint records of the start, so that a resumed run starts from the same one."""
        return {"init_from": self.name, "init_weights_sha256": file_sha256(self.weight_file)}

    def vocabulary(self) -> Vocabulary | None:
        """The softmax's vocabulary, or None where a fresh softmax is to be made."""
        return None if self.vocab_file is None else Vocabulary.load(self.vocab_file)

    def load_into(self, model: TrainableBiLM) -> None:
        """Copy the starting weights into ``model`` (and the softmax, where there is one); a model
        without a softmax leaves ``model``'s freshly initialised one as it is."""
        datasets = read_datasets(self.weight_file, weight_shapes(self.options), source=self.name)
        if self.softmax_file is not None:
            shapes = {"softmax/W": (model.vocab_size, self.options.projection_dim), "softmax/b": (model.vocab_size,)}
            datasets.update(read_datasets(self.softmax_file, shapes, source=str(self.vocab_file)))
        else:
            datasets["softmax/W"] = model.softmax_weight.detach().cpu().numpy()
            datasets["softmax/b"] = model.softmax_bias.detach().cpu().numpy()
        model.load_datasets(datasets)


def resolve_start(name: str, *, vocab_file: str | None = None) -> StartingModel:
    """The model ``name`` designates, through the model-source registry (published models are
    downloaded once, as ``build`` does). ``vocab_file`` is refused for a model with its own softmax."""
    from elmo_cache.model import sources

    files = sources.resolve(name)
    if files.format != "bilm-tf":
        raise InvalidParameterError(
            f"init_from: {name!r} is a {files.format} model; training continues models in the bilm-tf layout only "
            "(a published AllenAI name, 'bundled', or a directory with *options*.json and *weights*.hdf5)"
        )
    folder = files.options_file.parent
    vocab, softmax = folder / VOCAB_FILE, folder / SOFTMAX_FILE
    if vocab.is_file() and softmax.is_file():
        if vocab_file is not None:
            raise InvalidParameterError(
                f"init_from: {name} brings its own vocabulary and softmax ({VOCAB_FILE}, {SOFTMAX_FILE}): "
                "drop vocab_file (--vocab)"
            )
        return StartingModel(name, ModelOptions.from_file(files.options_file), files.weight_file, vocab, softmax)
    return StartingModel(name, ModelOptions.from_file(files.options_file), files.weight_file, None, None)
