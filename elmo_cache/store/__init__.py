"""Writing caches: the two containers of docs/FORMAT.md behind one interface.

A build asks :func:`writer_class` for the writer of its format, creates or resumes it
(``Writer.create`` / ``Writer.resume``), appends sentences in input order, commits now and
then (everything committed survives ``kill -9``), and finally calls ``finalize``. Reading
is :mod:`elmo_cache.reader`'s job; :func:`read_metadata` here only answers "what is at
this path?" for a build about to write there.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.store._hdf5 import Hdf5Writer, read_hdf5_metadata
from elmo_cache.store._staging import Layout, Progress, Writer, load_progress, staging_path
from elmo_cache.store._zarr import COMPRESSIONS, SMALL_CHUNK, ZarrWriter, read_zarr_metadata

__all__ = [
    "FORMATS",
    "COMPRESSIONS",
    "SMALL_CHUNK",
    "Layout",
    "Progress",
    "Writer",
    "ZarrWriter",
    "Hdf5Writer",
    "writer_class",
    "infer_format",
    "read_metadata",
    "load_progress",
    "staging_path",
    "remove_output",
]

FORMATS = ("zarr", "hdf5")
"""Container formats, in order of preference (zarr is the default)."""

_SUFFIXES = {".zarr": "zarr", ".h5": "hdf5", ".hdf5": "hdf5", ".he5": "hdf5"}


def writer_class(format: str) -> type[Writer]:
    """The writer of ``format`` ("zarr" or "hdf5")."""
    if format == "zarr":
        return ZarrWriter
    if format == "hdf5":
        return Hdf5Writer
    raise InvalidParameterError(f"format: {format!r} is not valid; choose from {list(FORMATS)}")


def infer_format(path: str | Path) -> str | None:
    """The format a path's suffix asks for (``.zarr``, ``.h5``/``.hdf5``), or None."""
    return _SUFFIXES.get(Path(path).suffix.lower())


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The elmo-cache metadata stored at ``path`` (either container), or None if there is none."""
    if path.is_dir():
        return read_zarr_metadata(path)
    if path.is_file():
        return read_hdf5_metadata(path)
    return None


def remove_output(path: Path) -> None:
    """Delete an old cache (or a file the user asked to overwrite), refusing foreign directories.

    A directory is removed only when it is a zarr group (has ``zarr.json``) or a staging
    folder of ours: ``--overwrite`` must never wipe, say, a home directory given as ``-o``.
    """
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        ours = (path / "zarr.json").is_file() or (path / ".build").is_dir() or path.name.endswith(".partial")
        if not ours and any(path.iterdir()):
            raise CacheExistsError(f"{path}: a non-empty directory that is not a zarr cache; refusing to delete it, choose another -o/--output")
        shutil.rmtree(path)
