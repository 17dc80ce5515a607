"""The published ELMoForManyLangs models by name (``efml-<lang>``): catalogue, download, safe unpacking.

HIT-SCIR published one archive per language (their README's download table); ``--model efml-de``
or ``Encoder.load("efml-de")`` downloads it once (pooch) into ``models_dir()/efml-de/``, unpacks it
there and loads the directory with :mod:`elmo_cache.model.efml`; later loads find the unpacked
files and need no network. An archive is unpacked only after every member was checked: absolute
paths, ``..`` components and anything but plain files and folders (links, devices) are refused,
and so is an archive of more members or more unpacked bytes than :class:`UnpackLimits` allows
(checked on the sizes the archive declares before anything is written, and on the bytes actually
written while unpacking). Members are written into a temporary folder that is removed on refusal,
so nothing is left half-unpacked. The archive is removed once unpacked. Which source answers the
names is :mod:`.sources`' business.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO

from elmo_cache.errors import InvalidParameterError, ModelDownloadError
from elmo_cache.model import efml, hub

__all__ = [
    "PREFIX",
    "PublishedEfml",
    "EFML_MODELS",
    "MAX_BYTES_ENV",
    "MAX_MEMBERS_ENV",
    "UnpackLimits",
    "local_dir",
    "find_model_dir",
    "download",
    "unpack",
]

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


MAX_BYTES_ENV = "ELMO_CACHE_UNPACK_MAX_BYTES"
"""Environment variable raising (or lowering) :attr:`UnpackLimits.max_bytes`."""
MAX_MEMBERS_ENV = "ELMO_CACHE_UNPACK_MAX_MEMBERS"
"""Environment variable raising (or lowering) :attr:`UnpackLimits.max_members`."""


@dataclasses.dataclass(frozen=True)
class UnpackLimits:
    """How much an archive may unpack to. A published ELMoForManyLangs archive is one model of a few
    hundred MB unpacked in six files (a folder, config.json, the model config, two dictionaries, two
    weight files): the defaults leave room for ten times that, and refuse a zip bomb (a 1 MB zip
    can unpack to 1 GiB) before it fills the disk."""

    # Total bytes of all members once unpacked.
    max_bytes: int = 4 << 30
    # Members (files and folders) in the archive.
    max_members: int = 10_000

    @classmethod
    def from_env(cls) -> UnpackLimits:
        """The defaults, each replaced by its environment variable (a positive integer) where set."""
        return cls(
            max_bytes=_env_int(MAX_BYTES_ENV, cls.max_bytes), max_members=_env_int(MAX_MEMBERS_ENV, cls.max_members)
        )


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidParameterError(f"{name} is {raw!r}; it must be a positive integer")
    return int(raw)


def _too_big(archive: Path, limits: UnpackLimits, what: str) -> ModelDownloadError:
    return ModelDownloadError(
        f"{archive}: {what}, above the limit of {limits.max_bytes} bytes unpacked (set {MAX_BYTES_ENV} "
        "to raise it); refused, nothing was unpacked"
    )


def _copy(archive: Path, name: str, stream: IO[bytes] | None, target: Path, declared: int) -> int:
    """Copy one member, counting what is written: a member that yields more than it declared is
    refused before the excess reaches the disk (with the declared sizes checked against the limit
    beforehand, this bounds the total too, whatever the reader trusts). Returns the bytes written."""
    assert stream is not None
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with stream, open(target, "wb") as out:
        while True:
            try:
                chunk = stream.read(1 << 22)
            except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as exc:
                # zipfile stops at the declared size and then finds the CRC wrong: a member whose
                # data is longer than it declares ends here.
                raise _bad(archive, name, f"damaged or not the {declared} bytes it declares ({exc})") from None
            if not chunk:
                return written
            written += len(chunk)
            if written > declared:
                raise _bad(archive, name, f"larger than the {declared} bytes it declares")
            out.write(chunk)


# An archive member: its name, whether it is a folder, its declared size and how to open its data.
_Member = tuple[str, bool, int, Callable[[], IO[bytes] | None]]


def unpack(archive: Path, into: Path, limits: UnpackLimits | None = None) -> None:
    """Unpack a zip or tar archive into ``into``, once every member's name and kind was checked and
    the archive is within ``limits`` (default: :meth:`UnpackLimits.from_env`). The members are
    written to a temporary folder in ``into`` first and moved into place only when all of them are
    written; on any error that folder is removed, so nothing is left half-unpacked."""
    limits = UnpackLimits.from_env() if limits is None else limits
    into.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=into))
    try:
        _unpack(archive, staging.resolve(), limits)
        for entry in staging.iterdir():
            entry.replace(into / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _unpack(archive: Path, root: Path, limits: UnpackLimits) -> None:
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            link = "a symbolic link"
            _check(archive, [(i.filename, link if stat.S_ISLNK(i.external_attr >> 16) else None) for i in infos])
            zip_members: list[_Member] = [(i.filename, i.is_dir(), i.file_size, partial(zf.open, i)) for i in infos]
            _write_members(archive, root, zip_members, limits)
        return
    if not tarfile.is_tarfile(archive):
        raise ModelDownloadError(f"{archive} is neither a zip nor a tar archive (a server's error page?)")
    with tarfile.open(archive) as tf:
        tar_members = tf.getmembers()
        plain = "not a plain file or folder (a link or a device)"
        _check(archive, [(m.name, None if m.isfile() or m.isdir() else plain) for m in tar_members])
        members: list[_Member] = [
            (m.name, m.isdir(), 0 if m.isdir() else m.size, partial(tf.extractfile, m)) for m in tar_members
        ]
        _write_members(archive, root, members, limits)


def _write_members(archive: Path, root: Path, members: list[_Member], limits: UnpackLimits) -> None:
    """Write checked archive members ``(name, is a folder, declared size, open its data)`` under ``root``:
    refused first on their number and declared sizes, then on the bytes actually written."""
    if len(members) > limits.max_members:
        raise ModelDownloadError(
            f"{archive}: holds {len(members)} members, above the limit of {limits.max_members} (set "
            f"{MAX_MEMBERS_ENV} to raise it); refused, nothing was unpacked"
        )
    declared = sum(size for _, _, size, _ in members)
    if declared > limits.max_bytes:
        raise _too_big(archive, limits, f"its members declare {declared} bytes")
    for name, is_dir, size, open_member in members:
        target = _target(archive, root, name)
        if is_dir:
            target.mkdir(parents=True, exist_ok=True)
        else:
            _copy(archive, name, open_member(), target, size)


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
