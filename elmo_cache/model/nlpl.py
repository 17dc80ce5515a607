"""NLPL / simple_elmo models: a directory of ``options.json`` and ``model.hdf5``, or its ``.zip``.

The NLPL vector repository (vectors.nlpl.eu) distributes ELMo models as zip archives that simple_elmo's
``ElmoModel().load(PATH)`` takes as they are, or unpacked: ``options.json`` and the weights in the bilm-tf
layout, named ``model.hdf5`` (beside them ``meta.json``, a README and ``vocab.txt``, which only pre-caches
character ids and changes no vector). The files are the bilm-tf format elmo-cache reads anyway, so a
directory loads them as the ``(options.json, model.hdf5)`` pair and computes the same vectors.

Where simple_elmo takes the first ``*.hdf5`` when ``model.hdf5`` is absent, this module takes the only
one and refuses a choice between several (naming them): which file "first" is depends on the listing.

An archive is unpacked once, with every rule of the ELMoForManyLangs archives
(:func:`elmo_cache.model.efml_hub.unpack`: no absolute paths, ``..``, links or devices; at most
:class:`~elmo_cache.model.efml_hub.UnpackLimits` members and bytes; nothing left half-unpacked), into
``models_dir()/nlpl/<name>-<sha256 prefix>/``, keyed by the archive's SHA-256: a changed archive is
unpacked afresh and the same one is read from there after. The archive itself is left where it is.
An archive may hold the model at its top or in one folder, and may hold an ELMoForManyLangs model
directory instead (loaded as :mod:`elmo_cache.model.efml`).
"""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path

from elmo_cache.errors import ModelDownloadError, ModelNotFoundError
from elmo_cache.model import efml, hub
from elmo_cache.model.efml_hub import unpack

__all__ = ["OPTIONS_FILE", "WEIGHTS_FILE", "model_files", "is_model_dir", "is_archive", "unpacked"]

OPTIONS_FILE = "options.json"
WEIGHTS_FILE = "model.hdf5"


def _hdf5_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix.lower() in (".hdf5", ".h5") and p.is_file())


def model_files(directory: Path) -> tuple[Path, Path]:
    """``(options.json, weights)`` of an NLPL directory: ``model.hdf5``, else its only HDF5 file.

    Raises :class:`ModelNotFoundError` naming what the directory holds when that is not one model."""
    options = directory / OPTIONS_FILE
    if not options.is_file():
        raise ModelNotFoundError(f"{directory}: no {OPTIONS_FILE}; an NLPL / simple_elmo model holds {OPTIONS_FILE}")
    if (directory / WEIGHTS_FILE).is_file():
        return options, directory / WEIGHTS_FILE
    found = _hdf5_files(directory)
    if len(found) != 1:
        names = [p.name for p in found]
        raise ModelNotFoundError(
            f"{directory}: no {WEIGHTS_FILE} and {len(found)} other HDF5 files ({names or 'none'}); name the "
            "weights with --options-file and --weight-file"
        )
    return options, found[0]


def is_model_dir(path: Path) -> bool:
    """Whether ``path`` is an NLPL / simple_elmo directory: ``options.json`` beside ``model.hdf5``, or beside
    exactly one HDF5 file whose name does not say ``weights`` (those directories are the bilm-tf layout's)."""
    if not (path / OPTIONS_FILE).is_file():
        return False
    if (path / WEIGHTS_FILE).is_file():
        return True
    found = _hdf5_files(path)
    return len(found) == 1 and "weights" not in found[0].name


def is_archive(path: Path) -> bool:
    """Whether ``path`` names a zip file (by its suffix; its content is checked when it is unpacked)."""
    return path.suffix.lower() == ".zip" and path.is_file()


def _model_in(directory: Path) -> Path | None:
    """The model directory in an unpacked archive: its top, or its only folder holding a model."""
    if is_model_dir(directory) or efml.is_model_dir(directory):
        return directory
    inside = [p for p in sorted(directory.iterdir()) if p.is_dir() and (is_model_dir(p) or efml.is_model_dir(p))]
    return inside[0] if len(inside) == 1 else None


def unpacked(archive: Path) -> Path:
    """The model directory of a zip archive, unpacked once into the model cache (see the module docstring)."""
    archive = archive.expanduser().resolve()
    if not zipfile.is_zipfile(archive):
        raise ModelNotFoundError(f"{archive}: not a zip archive; an NLPL model is a .zip or its unpacked directory")
    target = hub.models_dir() / "nlpl" / f"{archive.stem}-{hub.file_sha256(archive)[:16]}"
    if target.is_dir():
        found = _model_in(target)
        if found is not None:
            return found
        shutil.rmtree(target)  # left by an older version or by hand: unpacked afresh
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=target.parent))
    try:
        unpack(archive, staging)
        if _model_in(staging) is None:
            held = sorted(str(p.relative_to(staging)) for p in staging.rglob("*"))[:20]
            raise ModelDownloadError(
                f"{archive} holds no model at its top or in one folder ({OPTIONS_FILE} beside {WEIGHTS_FILE}, "
                f"or an ELMoForManyLangs model); it holds {held}"
            )
        try:
            staging.rename(target)
        except OSError:
            if not target.is_dir():  # not another process that unpacked it meanwhile
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    found = _model_in(target)
    assert found is not None
    return found
