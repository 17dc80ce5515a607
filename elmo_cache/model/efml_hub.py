"""The published ELMoForManyLangs models by name (``efml-<lang>``): catalogue, download, safe unpacking.

HIT-SCIR published one archive per language (their README's download table); ``--model efml-de``
or ``Encoder.load("efml-de")`` downloads it once (pooch) into ``models_dir()/efml-de/``, unpacks it
there and loads the directory with :mod:`elmo_cache.model.efml`; later loads find the unpacked
files and need no network. An archive is unpacked only after every member was checked: absolute
paths, ``..`` components and anything but plain files and folders (links, devices) are refused.
The archive is removed once unpacked. Which source answers the names is :mod:`.sources`' business.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO

from elmo_cache.errors import ModelDownloadError
from elmo_cache.model import efml, hub

__all__ = ["PREFIX", "PublishedEfml", "EFML_MODELS", "local_dir", "find_model_dir", "download", "unpack"]

_log = logging.getLogger(__name__)

PREFIX = "efml-"
"""Every name of this catalogue starts with it (``efml-`` + a language code)."""

_NLPL = "http://vectors.nlpl.eu/repository/11"


@dataclasses.dataclass(frozen=True)
class PublishedEfml:
    """One ELMoForManyLangs model HIT-SCIR published: an archive holding one model directory."""

    # Short name users pass to ``--model`` / ``Encoder.load`` (``efml-`` + a language code).
    name: str
    # The language as their README names it.
    language: str
    # Where the archive (zip or tar.bz2) is downloaded from.
    url: str
    # SHA-256 (hex) the downloaded archive must have; None: not pinned (see the note on _SHA256).
    sha256: str | None = None

    @property
    def archive_name(self) -> str:
        return self.url.rsplit("/", 1)[1]


# Language code (ISO 639-1, else the code Universal Dependencies uses), their README's language
# name, and the NLPL repository ID of its archive: exactly the README's download table
# (github.com/HIT-SCIR/ELMoForManyLangs, README.md at b3de5f1, "Downloads"), IDs 136-179; note
# that it gives Dutch 164 and Norwegian Bokmal 165. Their "Chinese" (179) was trained on
# Wikipedia, traditional Chinese (the README's own words; another project links 179.zip as
# "Traditional-Chinese ELMo"): it is efml-zht. The simplified-Chinese model (Xinhua part of
# Chinese Gigaword) is not on NLPL; the README links a tar.bz2 on a bare IP address, reported
# unreachable since (their issues #36, #57, #106): efml-zh points there, and a copy obtained
# elsewhere can be unpacked into its folder by hand. NLPL IDs are global to their repository
# (180 and later are other models), so nothing beyond 179 belongs here.
_NLPL_IDS = (
    ("ar", "Arabic", 136),
    ("bg", "Bulgarian", 137),
    ("ca", "Catalan", 138),
    ("cs", "Czech", 139),
    ("cu", "Old Church Slavonic", 140),
    ("da", "Danish", 141),
    ("de", "German", 142),
    ("el", "Greek", 143),
    ("en", "English", 144),
    ("es", "Spanish", 145),
    ("et", "Estonian", 146),
    ("eu", "Basque", 147),
    ("fa", "Persian", 148),
    ("fi", "Finnish", 149),
    ("fr", "French", 150),
    ("ga", "Irish", 151),
    ("gl", "Galician", 152),
    ("grc", "Ancient Greek", 153),
    ("he", "Hebrew", 154),
    ("hi", "Hindi", 155),
    ("hr", "Croatian", 156),
    ("hu", "Hungarian", 157),
    ("id", "Indonesian", 158),
    ("it", "Italian", 159),
    ("ja", "Japanese", 160),
    ("ko", "Korean", 161),
    ("la", "Latin", 162),
    ("lv", "Latvian", 163),
    ("nl", "Dutch", 164),
    ("nb", "Norwegian Bokmål", 165),
    ("nn", "Norwegian Nynorsk", 166),
    ("pl", "Polish", 167),
    ("pt", "Portuguese", 168),
    ("ro", "Romanian", 169),
    ("ru", "Russian", 170),
    ("sk", "Slovak", 171),
    ("sl", "Slovene", 172),
    ("sv", "Swedish", 173),
    ("tr", "Turkish", 174),
    ("ug", "Uyghur", 175),
    ("uk", "Ukrainian", 176),
    ("ur", "Urdu", 177),
    ("vi", "Vietnamese", 178),
    ("zht", "Chinese (traditional, Wikipedia)", 179),
)

# The archives' SHA-256 sums, by name. None is pinned yet, for the reason given on
# hub.PUBLISHED_MODELS (no network where this was written, and HIT-SCIR/NLPL publish none): downloads
# are not verified (a warning says so) until `python scripts/pin_published_models.py efml` is run
# once with network and the `"efml-LANG": "<sha256>",` lines it prints are added here; from then on
# an archive that differs is refused and discarded. Caches record the weights' SHA-256 anyway.
_SHA256: dict[str, str] = {}

EFML_MODELS: dict[str, PublishedEfml] = {
    m.name: dataclasses.replace(m, sha256=_SHA256.get(m.name))
    for m in (
        *(PublishedEfml(f"{PREFIX}{code}", language, f"{_NLPL}/{number}.zip") for code, language, number in _NLPL_IDS),
        PublishedEfml(f"{PREFIX}zh", "Chinese (simplified, Xinhua news)", "http://39.96.43.154/zhs.model.tar.bz2"),
    )
}


def local_dir(model: PublishedEfml) -> Path:
    """The folder a published model is downloaded and unpacked into."""
    return hub.models_dir() / model.name


def find_model_dir(directory: Path) -> Path | None:
    """The model directory in ``directory``: itself, or its only sub-folder in the layout."""
    if efml.is_model_dir(directory):
        return directory
    if not directory.is_dir():
        return None
    inside = [p for p in sorted(directory.iterdir()) if p.is_dir() and efml.is_model_dir(p)]
    return inside[0] if len(inside) == 1 else None


# ------------------------------------------------------------------------------- unpacking
def _refusal(name: str) -> str | None:
    """Why a member name may not be unpacked (None: it may)."""
    posix = name.replace("\\", "/")
    if posix.startswith("/") or (len(posix) > 1 and posix[1] == ":"):
        return "an absolute path"
    if ".." in PurePosixPath(posix).parts:
        return "a '..' component"
    return None


def _bad(archive: Path, name: str, why: str) -> ModelDownloadError:
    return ModelDownloadError(f"{archive}: member {name!r} is {why}; refused, nothing was unpacked")


def _check(archive: Path, members: list[tuple[str, str | None]]) -> None:
    """Refuse the archive if any member (``(name, why not)``) must not be unpacked."""
    for name, why in members:
        why = why or _refusal(name)
        if why is not None:
            raise _bad(archive, name, why)


def _target(archive: Path, root: Path, name: str) -> Path:
    target = (root / name.replace("\\", "/")).resolve()
    if target != root and root not in target.parents:
        raise _bad(archive, name, "outside the folder it is unpacked into")
    return target


def _copy(stream: IO[bytes] | None, target: Path) -> None:
    assert stream is not None
    target.parent.mkdir(parents=True, exist_ok=True)
    with stream, open(target, "wb") as out:
        shutil.copyfileobj(stream, out, 1 << 22)


# An archive member: its name, whether it is a folder, and how to open its data.
_Member = tuple[str, bool, Callable[[], IO[bytes] | None]]


def unpack(archive: Path, into: Path) -> None:
    """Unpack a zip or tar archive into ``into``, once every member's name and kind was checked."""
    root = into.resolve()
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            link = "a symbolic link"
            _check(archive, [(i.filename, link if stat.S_ISLNK(i.external_attr >> 16) else None) for i in infos])
            _write_members(archive, root, [(i.filename, i.is_dir(), partial(zf.open, i)) for i in infos])
        return
    if not tarfile.is_tarfile(archive):
        raise ModelDownloadError(f"{archive} is neither a zip nor a tar archive (a server's error page?)")
    with tarfile.open(archive) as tf:
        members = tf.getmembers()
        plain = "not a plain file or folder (a link or a device)"
        _check(archive, [(m.name, None if m.isfile() or m.isdir() else plain) for m in members])
        _write_members(archive, root, [(m.name, m.isdir(), partial(tf.extractfile, m)) for m in members])


def _write_members(archive: Path, root: Path, members: list[_Member]) -> None:
    """Write checked archive members ``(name, is a folder, open its data)`` under ``root``."""
    for name, is_dir, open_member in members:
        target = _target(archive, root, name)
        if is_dir:
            target.mkdir(parents=True, exist_ok=True)
        else:
            _copy(open_member(), target)


# ------------------------------------------------------------------------------- download
def _failed(model: PublishedEfml, directory: Path, exc: Exception) -> ModelDownloadError:
    return ModelDownloadError(
        f"could not download the {model.name!r} ELMoForManyLangs model ({model.language}; "
        f"{type(exc).__name__}: {exc}).\n"
        f"Download this archive by hand:\n  {model.url}\n"
        f"and put it, or the files it unpacks to ({efml.CONFIG_FILE}, {', '.join(efml.MODEL_FILES)}), "
        f"in {directory} (or set ELMO_CACHE_MODELS to the folder holding {model.name}/), "
        "or pass the unpacked directory with --model DIR (in Python: Encoder.load(DIR))."
    )


def _retrieve(model: PublishedEfml, directory: Path) -> Path:
    """The archive in ``directory``: put there by hand, or downloaded (only with its pinned hash)."""
    import pooch
    import requests

    target = directory / model.archive_name
    if model.sha256 is None and not target.is_file():
        _log.warning("downloading %s without a pinned SHA-256: it cannot be verified", model.url)
    try:
        downloader = pooch.HTTPDownloader(progressbar=True, timeout=30)
        known = None if model.sha256 is None else f"sha256:{model.sha256}"
        return Path(
            pooch.retrieve(model.url, known_hash=known, fname=model.archive_name, path=directory, downloader=downloader)
        )
    except ValueError as exc:
        if model.sha256 is not None and "hash" in str(exc).lower():
            raise ModelDownloadError(
                f"the download of {model.url} does not have the SHA-256 elmo-cache pins for the {model.name!r} "
                f"model ({model.sha256}); it was discarded and nothing was written to {directory}. The file on the "
                f"server changed or the download was tampered with; elmo-cache will not use it. ({exc})"
            ) from None
        raise _failed(model, directory, exc) from None
    except (requests.RequestException, OSError) as exc:
        raise _failed(model, directory, exc) from None


def download(model: PublishedEfml) -> Path:
    """The unpacked model directory of a published model: found in :func:`local_dir`, else
    downloaded (or taken from an archive put there by hand) and unpacked there once."""
    directory = local_dir(model)
    found = find_model_dir(directory)
    if found is not None:
        return found
    directory.mkdir(parents=True, exist_ok=True)
    archive = _retrieve(model, directory)
    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=directory))
    try:
        try:
            unpack(archive, staging)
            if find_model_dir(staging) is None:
                held = sorted(str(p.relative_to(staging)) for p in staging.rglob("*"))[:20]
                raise ModelDownloadError(
                    f"{archive} does not hold an ELMoForManyLangs model directory ({efml.CONFIG_FILE} beside "
                    f"{', '.join(efml.MODEL_FILES)}) at its top or in one folder; it holds {held}"
                )
        except (ModelDownloadError, zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as exc:
            archive.unlink(missing_ok=True)
            why = str(exc) if isinstance(exc, ModelDownloadError) else f"{archive}: {type(exc).__name__}: {exc}"
            raise ModelDownloadError(f"{why}.\nThe archive (from {model.url}) was removed.") from None
        for entry in staging.iterdir():
            entry.replace(directory / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    archive.unlink(missing_ok=True)
    found = find_model_dir(directory)
    assert found is not None
    return found
