"""The published ELMo models: their catalogue, where they are kept, and their verified download.

``original``, ``medium``, ``small``, ``original-5.5b`` are the files AllenAI published, downloaded
once through pooch into ``$ELMO_CACHE_MODELS`` or the user cache directory (``~/.cache/elmo-cache``
on Linux) and read from there after. The bundled model's folder is named here too.
HIT-SCIR's ELMoForManyLangs models (``efml-LANG``) are in :mod:`.efml_hub`, in the same folder. Which source
answers which model name is :mod:`elmo_cache.model.sources`' business.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from elmo_cache.errors import ModelDownloadError

__all__ = [
    "BUNDLED",
    "BUNDLED_DIR",
    "PublishedModel",
    "PUBLISHED_MODELS",
    "MODEL_NAMES",
    "models_dir",
    "local_paths",
    "download",
    "file_sha256",
]

_log = logging.getLogger(__name__)

BUNDLED = "bundled"
"""Name of the model shipped inside the package."""

BUNDLED_DIR = Path(__file__).parent / "bundled"
"""Folder of the bundled model's files (package data)."""

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
    # SHA-256 (hex) the downloaded options.json must have; None: not pinned (see the note on PUBLISHED_MODELS).
    options_sha256: str | None = None
    # SHA-256 (hex) the downloaded weights must have; None: not pinned.
    weights_sha256: str | None = None

    @property
    def options_url(self) -> str:
        return f"{_BASE_URL}/{self.folder}/{self.stem}_options.json"

    @property
    def weights_url(self) -> str:
        return f"{_BASE_URL}/{self.folder}/{self.stem}_weights.hdf5"

    def files(self) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
        """``(url, sha256 or None)`` of the options file, then of the weights."""
        return (self.options_url, self.options_sha256), (self.weights_url, self.weights_sha256)


# The published files' SHA-256 sums are not pinned yet: this version was made on machines that
# cannot reach the download server, so the sums could not be taken from the files themselves (and
# AllenAI publishes none). `python scripts/pin_published_models.py`, run once with network, prints
# the `options_sha256=`/`weights_sha256=` arguments to add below; from then on a download that
# differs is refused and discarded. Until then downloads are not verified (a warning says so), and
# every cache still records the SHA-256 of the weights that built it.
PUBLISHED_MODELS: dict[str, PublishedModel] = {
    m.name: m
    for m in (
        PublishedModel("original", "elmo_2x4096_512_2048cnn_2xhighway", "2x4096_512_2048cnn_2xhighway"),
        PublishedModel("original-5.5b", "elmo_2x4096_512_2048cnn_2xhighway_5.5B", "2x4096_512_2048cnn_2xhighway_5.5B"),
        PublishedModel("medium", "elmo_2x2048_256_2048cnn_1xhighway", "2x2048_256_2048cnn_1xhighway"),
        PublishedModel("small", "elmo_2x1024_128_2048cnn_1xhighway", "2x1024_128_2048cnn_1xhighway"),
    )
}


MODEL_NAMES = (BUNDLED, *PUBLISHED_MODELS)
"""Names :func:`resolve` knows, besides local directories."""


def models_dir() -> Path:
    """Where named models are cached: ``$ELMO_CACHE_MODELS`` or the user cache directory."""
    configured = os.environ.get("ELMO_CACHE_MODELS")
    if configured:
        return Path(configured).expanduser()
    import pooch

    return Path(pooch.os_cache("elmo-cache"))


@lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file, computed once per process while the file stays the same (size and mtime)."""
    stat = os.stat(path)
    return _sha256(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


def _download(url: str, sha256: str | None, directory: Path, model: PublishedModel) -> Path:
    """The file at ``url``, downloaded once into ``directory``; with ``sha256``, only ever with that hash.

    pooch streams the download to a temporary file beside the target and renames it only once its
    hash matches, so a mismatch leaves nothing behind. A file already there is checked against
    ``sha256`` too (once per process and file version) and downloaded again if it differs.
    """
    import pooch
    import requests

    fname = url.rsplit("/", 1)[1]
    target = directory / fname
    if target.is_file() and (sha256 is None or file_sha256(target) == sha256):
        return target
    if sha256 is None:
        _log.warning("downloading %s without a pinned SHA-256: it cannot be verified", url)
    try:
        downloader = pooch.HTTPDownloader(progressbar=True, timeout=30)
        known = None if sha256 is None else f"sha256:{sha256}"
        return Path(pooch.retrieve(url, known_hash=known, fname=fname, path=directory, downloader=downloader))
    except ValueError as exc:
        if sha256 is not None and "hash" in str(exc).lower():
            raise ModelDownloadError(
                f"the download of {url} does not have the SHA-256 elmo-cache pins for the {model.name!r} model "
                f"({sha256}); it was discarded and nothing was written to {directory}. The file on the server "
                "changed or the download was tampered with; elmo-cache will not use it. "
                f"({exc})"
            ) from None
        raise _failed(model, directory, exc) from None
    except (requests.RequestException, OSError) as exc:
        raise _failed(model, directory, exc) from None


def _failed(model: PublishedModel, directory: Path, exc: Exception) -> ModelDownloadError:
    return ModelDownloadError(
        f"could not download the {model.name!r} ELMo model ({type(exc).__name__}: {exc}).\n"
        f"Download these two files by hand:\n  {model.options_url}\n  {model.weights_url}\n"
        f"and put them in {directory} (or set ELMO_CACHE_MODELS to the folder holding them), "
        "or pass local files with --options-file F --weight-file F "
        "(in Python: Encoder.load((options_file, weight_file)))."
    )


def local_paths(model: PublishedModel) -> tuple[Path, Path]:
    """Where the options and weights of a published model are kept once downloaded."""
    directory = models_dir() / model.name
    return directory / model.options_url.rsplit("/", 1)[1], directory / model.weights_url.rsplit("/", 1)[1]


def download(model: PublishedModel) -> tuple[Path, Path]:
    """The options and weights of a published model, downloaded once into :func:`models_dir`."""
    directory = models_dir() / model.name
    existed = directory.is_dir()
    directory.mkdir(parents=True, exist_ok=True)
    (options_url, options_sha), (weights_url, weights_sha) = model.files()
    try:
        return (
            _download(options_url, options_sha, directory, model),
            _download(weights_url, weights_sha, directory, model),
        )
    except ModelDownloadError:
        # An empty folder left by a failed (offline) first download would look like a model being there.
        if not existed and not any(directory.iterdir()):
            directory.rmdir()
        raise
