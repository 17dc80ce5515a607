"""Options several commands share: which model to load, and how a selection's words are spelled as flags."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from elmo_cache.model.hub import BUNDLED, PUBLISHED_MODELS

__all__ = ["model_options", "cache_model_options", "SELECTION_FLAGS"]

F = TypeVar("F", bound=Callable[..., Any])

SELECTION_FLAGS = {"layers": "--layers", "mix": "--mix", "gamma": "--gamma", "softmax": "--mix-softmax"}
"""Selection parameters as the CLI spells them in messages (elmo_cache.rows.selection.Selection.parse)."""


def model_options(function: F) -> F:
    """``--model``, ``--options-file``, ``--weight-file`` and ``--device``; the default is the bundled model."""
    return _model_options(
        function,
        f"Default: {BUNDLED} (256-d, shipped with elmo-cache, no download; said on stderr). allennlp's "
        "default was the Original ELMo (1024-d): --model original.",
    )


def cache_model_options(function: F) -> F:
    """:func:`model_options` for commands reading a cache, whose default model is the one that built it."""
    return _model_options(
        function,
        "Default: the model that built CACHE, as its metadata records it (found locally: the bundled model, "
        "a published one once downloaded, the directory it was loaded from; else loaded by its recorded name).",
    )


def _model_options(function: F, default: str) -> F:
    names = ", ".join([BUNDLED, *PUBLISHED_MODELS])
    for option in reversed(
        [
            click.option(
                "--model",
                default=None,
                help=f"Model name ({names}, or efml-LANG for an ELMoForManyLangs model, e.g. efml-zh), a "
                "directory (options JSON + weights HDF5, an NLPL / simple_elmo options.json + model.hdf5, or an "
                "ELMoForManyLangs model) or an NLPL model's .zip (unpacked once into the model cache). " + default,
            ),
            click.option(
                "--options-file", type=click.Path(dir_okay=False), default=None, help="options.json of the model."
            ),
            click.option(
                "--weight-file", type=click.Path(dir_okay=False), default=None, help="Weights HDF5 of the model."
            ),
            click.option("--device", default=None, help="cpu, cuda or cuda:N. Default: CUDA when available."),
        ]
    ):
        function = option(function)
    return function
