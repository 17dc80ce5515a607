"""Model formats: how the files a source resolved become the biLM's options, weights and token ids.

Two formats: ``"bilm-tf"`` (``options.json`` + weights HDF5, :mod:`~elmo_cache.model.weights`)
and ``"elmoformanylangs"`` (a HIT-SCIR model directory, :mod:`~elmo_cache.model.efml`). Both end
in the same :class:`~elmo_cache.model.bilm.BiLM`; they differ in how tokens become ids
(:class:`~elmo_cache.model.chars.TokenIds`) and in what identifies them (:func:`fingerprint`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elmo_cache.model.chars import ByteTokenIds, TokenIds
from elmo_cache.model.identity import ModelDescription, model_identity
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.weights import ElmoWeights

if TYPE_CHECKING:
    from elmo_cache.model.files import ModelFiles

__all__ = ["BILM_TF", "EFML", "TRANSFORMERS", "FORMATS", "LoadedModel", "load", "fingerprint", "output_dim", "describe"]

BILM_TF = "bilm-tf"
EFML = "elmoformanylangs"
# A Transformer encoder's save_pretrained directory (elmo_cache.model.transformer): no biLM, its own encoder.
TRANSFORMERS = "transformers"
FORMATS = (BILM_TF, EFML, TRANSFORMERS)


@dataclass
class LoadedModel:
    """A model's files read: what :meth:`Encoder.load <elmo_cache.Encoder.load>` builds an encoder from."""

    options: ModelOptions
    weights: ElmoWeights
    tokens: TokenIds
    # The options as a cache identity records them.
    options_dict: dict[str, Any]
    # The weights SHA-256, when reading computed it (None: hashed from the weight file on first use).
    weights_sha256: str | None = None


def _directory(files: ModelFiles) -> Any:
    if files.directory is None:
        raise ValueError(f"ModelFiles of format {files.format!r} need their directory")
    return files.directory


def load(files: ModelFiles) -> LoadedModel:
    """Read the files of a model in its format."""
    if files.format == EFML:
        from elmo_cache.model import efml

        model = efml.load_model(_directory(files))
        return LoadedModel(model.options, model.weights, model.tokens, model.options_dict, model.weights_sha256)
    if files.format == TRANSFORMERS:
        raise ValueError("a Transformer model has no biLM weights: Encoder.load gives it its own encoder")
    if files.format != BILM_TF:
        raise ValueError(f"unknown model format {files.format!r}; one of {list(FORMATS)}")
    from elmo_cache.model.weights import load_weights

    options = ModelOptions.from_file(files.options_file)
    weights = load_weights(files.weight_file, options, options_source=str(files.options_file))
    return LoadedModel(options, weights, ByteTokenIds(options.max_characters_per_token), options.to_dict())


def fingerprint(files: ModelFiles) -> tuple[str, dict[str, Any]]:
    """The weights SHA-256 and options an encoder of these files records, without loading the weights."""
    if files.format == TRANSFORMERS:
        from elmo_cache.model import transformer

        return transformer.fingerprint(files)
    if files.format == EFML:
        from elmo_cache.model import efml

        return efml.fingerprint(_directory(files))
    from elmo_cache.model import hub

    return hub.file_sha256(files.weight_file), ModelOptions.from_file(files.options_file).to_dict()


def output_dim(files: ModelFiles) -> int:
    """The width of the model's output layers, from its options alone (no weight is read)."""
    if files.format == TRANSFORMERS:
        from elmo_cache.model import transformer

        return transformer.describe(files, "fp32", "zero").output_dim
    if files.format == EFML:
        from elmo_cache.model import efml

        options, _ = efml.parse_config(*efml.read_config(_directory(files)))
        return options.output_dim
    return ModelOptions.from_file(files.options_file).output_dim


def describe(files: ModelFiles, precision: str, initial_state: str, warmup_sha256: str | None) -> ModelDescription:
    """The identity and width of an encoder of ``files`` (see :meth:`Encoder.describe
    <elmo_cache.Encoder.describe>`, which knows the warm-up text), from the files alone."""
    if files.format == TRANSFORMERS:
        from elmo_cache.model import transformer

        return transformer.describe(files, precision, initial_state)
    weights_sha256, options = fingerprint(files)
    identity = model_identity(
        files.name, options, weights_sha256, initial_state, precision, files.directory, warmup_sha256
    )
    return ModelDescription(identity, output_dim(files))
