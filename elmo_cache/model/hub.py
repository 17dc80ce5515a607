"""Model names, resolved to files once: the bundled model, the published ones, local directories.

* ``bundled`` (the default when no model is named): a small model shipped inside the package
  (``elmo_cache/model/bundled/``: ``options.json``, ``weights.hdf5``, ``MODEL_CARD.md``); it
  needs no network.
* ``original``, ``medium``, ``small``, ``original-5.5b``: the files AllenAI published, downloaded
  once through pooch into ``$ELMO_CACHE_MODELS`` or the user cache directory
  (``~/.cache/elmo-cache`` on Linux) and read from there after.
* a local directory holding one ``*options*.json`` and one ``*weights*.hdf5``.

:func:`resolve` turns a name into :class:`ModelFiles` before any encoder exists; :func:`locate`
finds, without downloading, the files of a model a cache's metadata records (``serve`` uses it
to answer misses with the model that built the cache).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from elmo_cache.errors import InvalidParameterError, ModelDownloadError, ModelNotFoundError

__all__ = [
    "BUNDLED",
    "BUNDLED_DIR",
    "ModelFiles",
    "PublishedModel",
    "PUBLISHED_MODELS",
    "MODEL_NAMES",
    "models_dir",
    "resolve",
    "choose",
    "locate",
    "file_sha256",
]

_log = logging.getLogger(__name__)

BUNDLED = "bundled"
"""Name of the model shipped inside the package."""

BUNDLED_DIR = Path(__file__).parent / "bundled"
"""Folder of the bundled model's files (package data)."""

_BUNDLED_OPTIONS = "options.json"
_BUNDLED_WEIGHTS = "weights.hdf5"


@dataclass(frozen=True)
class ModelFiles:
    """A model resolved to its two files in the official layout."""

    # Name recorded in cache metadata: "bundled", a published name, the directory's or weight file's name.
    name: str
    # The options.json (bilm-tf schema).
    options_file: Path
    # The weights HDF5 (bilm-tf layout).
    weight_file: Path
    # Where the files came from: "bundled", "published", "directory" or "files".
    origin: str
    # For origin "directory": the folder the model was named by, recorded so that `serve` finds it again.
    directory: Path | None = None


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


def _bundled() -> ModelFiles:
    options, weights = BUNDLED_DIR / _BUNDLED_OPTIONS, BUNDLED_DIR / _BUNDLED_WEIGHTS
    missing = [p.name for p in (options, weights) if not p.is_file()]
    if missing:
        raise ModelNotFoundError(
            f"the bundled model is incomplete: {missing} missing from {BUNDLED_DIR}; reinstall elmo-cache, "
            f"or name another model with --model (one of {list(PUBLISHED_MODELS)} or a directory)"
        )
    return ModelFiles(BUNDLED, options, weights, "bundled")


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
        "or pass local files with --options-file F --weight-file F (Encoder.from_files in Python)."
    )


def resolve(model: str | os.PathLike[str] | None = None) -> ModelFiles:
    """The files of ``model``: None or "bundled" for the bundled model, a published name, or a directory.

    Published models are downloaded once into :func:`models_dir` and read from there after.
    """
    if model is None:
        return _bundled()
    key = str(model)
    if key.lower() == BUNDLED:
        return _bundled()
    published = PUBLISHED_MODELS.get(key.lower())
    if published is not None:
        directory = models_dir() / published.name
        directory.mkdir(parents=True, exist_ok=True)
        (options_url, options_sha), (weights_url, weights_sha) = published.files()
        options = _download(options_url, options_sha, directory, published)
        weights = _download(weights_url, weights_sha, directory, published)
        return ModelFiles(published.name, options, weights, "published")
    path = Path(key).expanduser()
    if path.is_dir():
        options, weights = _find_in_directory(path)
        return ModelFiles(path.name, options, weights, "directory", directory=path.resolve())
    raise ModelNotFoundError(
        f"unknown model {key!r}: not a directory and not one of {sorted(MODEL_NAMES)}; "
        "or pass --options-file F --weight-file F"
    )


def choose(
    model: str | os.PathLike[str] | None,
    options_file: str | os.PathLike[str] | None = None,
    weight_file: str | os.PathLike[str] | None = None,
) -> ModelFiles:
    """What a user asked for: ``options_file`` + ``weight_file`` (both or neither; they win over
    ``model``), else the named ``model``. Unlike :func:`resolve`, None is not a name here: the
    caller says which default it means."""
    if (options_file is None) != (weight_file is None):
        raise InvalidParameterError("options_file and weight_file go together: give both, or use model")
    if options_file is not None and weight_file is not None:
        return ModelFiles(Path(weight_file).stem, Path(options_file), Path(weight_file), "files")
    if model is None:
        raise InvalidParameterError("no model: give a model name or directory, or options_file with weight_file")
    return resolve(model)


def _published_locally(name: str) -> ModelFiles | None:
    published = PUBLISHED_MODELS.get(name.lower())
    if published is None:
        return None
    directory = models_dir() / published.name
    options = directory / published.options_url.rsplit("/", 1)[1]
    weights = directory / published.weights_url.rsplit("/", 1)[1]
    if options.is_file() and weights.is_file():
        return ModelFiles(published.name, options, weights, "published")
    return None


def _matches(candidate: ModelFiles, recorded: Mapping[str, Any]) -> bool:
    from elmo_cache.model.options import ModelOptions

    if file_sha256(candidate.weight_file) != recorded.get("weights_sha256"):
        return False
    try:
        return ModelOptions.from_file(candidate.options_file).to_dict() == recorded.get("options")
    except (ModelNotFoundError, ValueError):
        return False


def locate(recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
    """The local files of the model a cache records (its metadata's ``model``), without downloading.

    Returns ``(files, "")`` when they are here with the recorded weights SHA-256 and options:
    the bundled model, a published one already in :func:`models_dir`, or the directory it was
    loaded from. Otherwise ``(None, why)``.
    """
    sha = recorded.get("weights_sha256")
    name = str(recorded.get("name"))
    if not isinstance(sha, str):
        return None, "the cache does not record its model's weights SHA-256"
    tried = []
    try:
        bundled = _bundled()
    except ModelNotFoundError:
        tried.append("the bundled model's files are missing")
    else:
        if _matches(bundled, recorded):
            return bundled, ""
        tried.append("it is not the bundled model")
    published = _published_locally(name)
    if published is not None:
        if _matches(published, recorded):
            return published, ""
        tried.append(f"{published.weight_file} holds other weights")
    elif name.lower() in PUBLISHED_MODELS:
        tried.append(f"{name!r} is not downloaded into {models_dir() / name.lower()}")
    directory = recorded.get("directory")
    if isinstance(directory, str):
        path = Path(directory)
        try:
            found = ModelFiles(path.name, *_find_in_directory(path), "directory", directory=path)
        except ModelNotFoundError:
            tried.append(f"its directory {directory} no longer holds a model")
        else:
            if _matches(found, recorded):
                return found, ""
            tried.append(f"its directory {directory} now holds other weights")
    return None, (
        f"the model that built the cache ({name!r}, weights sha256 {sha[:12]}...) is not available locally: "
        + "; ".join(tried)
    )
