"""Named ELMo models: where the published files live and how they are cached locally.

Downloads go through pooch (caching, atomic writes, progress), into
``$ELMO_CACHE_MODELS`` or the platform's user cache directory
(``~/.cache/elmo-cache`` on Linux). A name may also be a local directory holding
one ``*options*.json`` and one ``*weights*.hdf5``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from elmo_cache.errors import ModelDownloadError, ModelNotFoundError

__all__ = ["PublishedModel", "PUBLISHED_MODELS", "models_dir", "resolve_model"]

_BASE_URL = "https://allennlp.s3.amazonaws.com/models/elmo"


@dataclass(frozen=True)
class PublishedModel:
    """One of the ELMo models AllenAI published."""

    # Short name users pass to ``--model`` / ``Encoder.load``.
    name: str
    # File stem shared by the options and weights files.
    stem: str
    # Folder on the download server.
    folder: str

    @property
    def options_url(self) -> str:
        return f"{_BASE_URL}/{self.folder}/{self.stem}_options.json"

    @property
    def weights_url(self) -> str:
        return f"{_BASE_URL}/{self.folder}/{self.stem}_weights.hdf5"


PUBLISHED_MODELS: dict[str, PublishedModel] = {
    m.name: m
    for m in (
        PublishedModel("original", "elmo_2x4096_512_2048cnn_2xhighway", "2x4096_512_2048cnn_2xhighway"),
        PublishedModel("original-5.5b", "elmo_2x4096_512_2048cnn_2xhighway_5.5B", "2x4096_512_2048cnn_2xhighway_5.5B"),
        PublishedModel("medium", "elmo_2x2048_256_2048cnn_1xhighway", "2x2048_256_2048cnn_1xhighway"),
        PublishedModel("small", "elmo_2x1024_128_2048cnn_1xhighway", "2x1024_128_2048cnn_1xhighway"),
    )
}


def models_dir() -> Path:
    """Where named models are cached: ``$ELMO_CACHE_MODELS`` or the user cache directory."""
    configured = os.environ.get("ELMO_CACHE_MODELS")
    if configured:
        return Path(configured).expanduser()
    import pooch

    return Path(pooch.os_cache("elmo-cache"))


def _find_in_directory(directory: Path) -> tuple[Path, Path]:
    options = sorted(directory.glob("*options*.json"))
    weights = sorted(p for p in directory.glob("*weights*.hdf5")) or sorted(directory.glob("*weights*.h5"))
    if len(options) != 1 or len(weights) != 1:
        found = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        raise ModelNotFoundError(
            f"{directory}: expected exactly one '*options*.json' and one '*weights*.hdf5', found {found or 'nothing'}; "
            "pass --options-file and --weight-file to choose"
        )
    return options[0], weights[0]


def _download(url: str, directory: Path, model: PublishedModel) -> Path:
    import pooch
    import requests

    fname = url.rsplit("/", 1)[1]
    if (directory / fname).is_file():
        return directory / fname
    try:
        downloader = pooch.HTTPDownloader(progressbar=True, timeout=30)
        return Path(pooch.retrieve(url, known_hash=None, fname=fname, path=directory, downloader=downloader))
    except (requests.RequestException, OSError, ValueError) as exc:
        raise ModelDownloadError(
            f"could not download the {model.name!r} ELMo model ({type(exc).__name__}: {exc}).\n"
            f"Download these two files by hand:\n  {model.options_url}\n  {model.weights_url}\n"
            f"and put them in {directory} (or set ELMO_CACHE_MODELS to the folder holding them), "
            "or pass local files with --options-file F --weight-file F (Encoder.from_files in Python)."
        ) from None


def resolve_model(name_or_path: str | os.PathLike[str]) -> tuple[Path, Path, str]:
    """Return ``(options_path, weights_path, name)`` for a model name or a local directory.

    Named models are downloaded once into :func:`models_dir` and read from there after.
    """
    key = str(name_or_path)
    model = PUBLISHED_MODELS.get(key.lower())
    if model is not None:
        directory = models_dir() / model.name
        directory.mkdir(parents=True, exist_ok=True)
        options = _download(model.options_url, directory, model)
        weights = _download(model.weights_url, directory, model)
        return options, weights, model.name
    path = Path(key).expanduser()
    if path.is_dir():
        options, weights = _find_in_directory(path)
        return options, weights, path.name
    raise ModelNotFoundError(
        f"unknown model {key!r}: not a directory and not one of {sorted(PUBLISHED_MODELS)}; "
        "or pass --options-file F --weight-file F"
    )
