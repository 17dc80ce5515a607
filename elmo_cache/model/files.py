"""A model resolved to files: what every model source hands on and every model format loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelFiles"]


@dataclass(frozen=True)
class ModelFiles:
    """A model resolved to its two files in the official layout."""

    # Name recorded in cache metadata: "bundled", a published name, the directory's or weight file's name.
    name: str
    # The options.json (bilm-tf schema).
    options_file: Path
    # The weights HDF5 (bilm-tf layout).
    weight_file: Path
    # The source that produced it (its ``origin``): "bundled", "published", "directory", "files",
    # "elmoformanylangs", "elmoformanylangs-published", "nlpl" or "transformers".
    origin: str
    # For origins "directory" and "nlpl": the folder the model was named by (for an NLPL zip, the folder it
    # was unpacked into), recorded so that `serve` finds it again.
    directory: Path | None = None
    # The files' layout (elmo_cache.model.formats): "bilm-tf", or "elmoformanylangs" (a HIT-SCIR model
    # directory: options_file is its config.json, weight_file its encoder.pkl, the others beside them), or
    # "transformers" (a save_pretrained directory: options_file its config.json, weight_file its first weights file).
    format: str = "bilm-tf"
    # Format-specific settings that change the vectors, as (name, value) pairs: a Transformer's subword choice
    # and stride (elmo_cache.model.transformer). Empty for ELMo formats.
    variant: tuple[tuple[str, Any], ...] = ()
