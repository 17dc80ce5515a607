"""The store: docs/FORMAT.md's one layout in two containers, each read and written by one module.

* :mod:`elmo_cache.store.format`: every constant of the format and the metadata parser;
* :mod:`elmo_cache.store.zarr` and :mod:`elmo_cache.store.hdf5`: each container's reader
  (``open_arrays``, read by position: :mod:`elmo_cache.store.positioned`), writer (``ZarrWriter`` /
  ``Hdf5Writer``), ``read_metadata``
  and ``open_with_library`` (the container's own library, for ``verify``);
* ``_staging``: the crash-safe staging both writers share.

Every format-specific answer comes from the container registry (:mod:`elmo_cache.store.container`):
this module picks the container of a path or a format name. A build asks :func:`writer_class`
for the writer of its format, creates or resumes it (``Writer.create`` / ``Writer.resume``),
appends sentences in input order, commits now and then (everything committed survives
``kill -9``), and finally calls ``finalize``. :class:`elmo_cache.reader.cache.Cache` opens caches
through :func:`detect` and :func:`open_arrays`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elmo_cache.errors import (
    CacheCorruptError,
    CacheExistsError,
    CacheFormatError,
    CacheNotFoundError,
    IncompleteCacheError,
)
from elmo_cache.store.columns import cache_arrays, with_block_sums
from elmo_cache.store.container import Container, OutputKind, OutputState
from elmo_cache.store.format import (
    BUILD_DIR,
    STAGING_SUFFIX,
    ZARR_JSON,
    aside_path,
    block_sums_name,
    decode_metadata,
    staging_path,
)
from elmo_cache.store.hdf5.writer import Hdf5Writer
from elmo_cache.store.lock import current_builder
from elmo_cache.store.registry import container_for_suffix, container_names, containers, get_container
from elmo_cache.store.staging import Layout, Progress, Writer, load_progress
from elmo_cache.store.zarr import (
    COMPRESSIONS,
    SMALL_CHUNK,
    ZarrWriter,
    create_group,
    finish_group,
    vectors_file_path,
    vectors_file_rows,
    write_vectors_file,
)

__all__ = [
    "Container",
    "container_names",
    "containers",
    "COMPRESSIONS",
    "SMALL_CHUNK",
    "Layout",
    "Progress",
    "Writer",
    "ZarrWriter",
    "Hdf5Writer",
    "create_group",
    "finish_group",
    "vectors_file_path",
    "vectors_file_rows",
    "write_vectors_file",
    "container_at",
    "inspect_output",
    "OutputKind",
    "OutputState",
    "writer_class",
    "infer_format",
    "detect",
    "readable_path",
    "ASIDE_WAIT_S",
    "open_arrays",
    "open_cache_arrays",
    "open_with_library",
    "read_metadata",
    "load_progress",
    "staging_path",
    "remove_output",
    "unfinished",
]


def writer_class(format: str) -> type[Writer]:
    """The writer of ``format``."""
    return get_container(format).writer()


def infer_format(path: str | os.PathLike[str]) -> str | None:
    """The container a path's suffix asks for (``.zarr``, ``.h5``/``.hdf5``), or None."""
    found = container_for_suffix(path)
    return None if found is None else found.name


def unfinished(path: Path) -> IncompleteCacheError:
    """The error for opening ``path`` before its build finished: running now (who) or interrupted."""
    output = path.with_name(path.name.removesuffix(STAGING_SUFFIX))  # X.partial is X's staging
    owner = current_builder(output)
    if owner is not None:
        return IncompleteCacheError(
            f"{path} is being built by {owner.describe()}; its sentences become readable when that build finishes"
        )
    return IncompleteCacheError(
        f"{path}: the build of this cache was interrupted before it finished; resume it by running the same "
        "build command again (its sentences become readable when the build completes)"
    )


# How long a reader that finds no cache at a path, but the cache an update is replacing renamed aside, waits for the
# new one to take the path (a publish by renames: two renames apart) before it reads the old one aside.
ASIDE_WAIT_S = 2.0


def readable_path(path: Path, wait: float = ASIDE_WAIT_S) -> Path:
    """Where the cache at ``path`` is to be read: ``path``, or, in the moment of an update's publish by renames
    (where the system cannot swap two folders: :func:`~elmo_cache.store.durable.publish_directory`) when nothing
    is at ``path``, the new cache once it takes ``path`` within ``wait`` seconds, else the old one renamed aside
    (whole: a publish killed between its renames left it so, until the next build finishes the publish)."""
    if path.exists() or path.is_symlink():
        return path
    aside = aside_path(path)
    deadline = time.monotonic() + wait
    while aside.is_dir() and time.monotonic() < deadline:
        time.sleep(0.005)
        if path.exists():
            return path
    return aside if aside.is_dir() and not path.exists() else path


def _published(path: Path) -> bool:
    """Whether ``path``, a folder holding a build folder, is a finished cache whose publish a kill cut before its
    build folder was removed (the next build removes it): complete metadata, at a path not a staging folder's."""
    if path.name.endswith(STAGING_SUFFIX):
        return False
    meta = read_metadata(path)
    return isinstance(meta, dict) and meta.get("complete") is True


def detect(path: Path) -> str:
    """The container of the cache at ``path`` (its name).

    Raises :class:`CacheNotFoundError` when nothing is there, :class:`IncompleteCacheError` for
    the staging folder of an unfinished build, :class:`CacheFormatError` for anything else.
    """
    if not path.exists():
        if staging_path(path).is_dir():
            raise unfinished(path)
        raise CacheNotFoundError(f"cache not found: {path}")
    if path.is_dir() and (path / BUILD_DIR).is_dir() and not _published(path):
        raise unfinished(path)  # the staging folder of a running or interrupted build
    if not path.is_dir() and not path.is_file():  # a FIFO (whose open would block forever), a device, a socket
        raise CacheCorruptError(f"{path}: not a regular file nor a directory; not an elmo-cache store")
    for known in containers():
        if known.owns(path):
            return known.name
    for known in containers():
        why = known.explain(path)
        if why is not None:
            raise CacheFormatError(why)
    kinds = " nor ".join(known.description for known in containers())
    raise CacheFormatError(f"{path}: neither {kinds}; not an elmo-cache store")


def open_arrays(path: Path, names: tuple[str, ...]) -> tuple[str, Any, dict[str, Any]]:
    """``(format, raw metadata attribute, arrays)`` of the cache at ``path``, read by position where possible."""
    path = readable_path(path)
    fmt = detect(path)
    raw, arrays = get_container(fmt).open_arrays(path, names)
    return fmt, raw, arrays


def open_cache_arrays(path: Path) -> tuple[str, Any, dict[str, Any], dict[str, Any]]:
    """``(format, raw metadata attribute, arrays, block sums)`` of the cache at ``path``: every array it may
    hold (:func:`elmo_cache.store.columns.cache_arrays`, the built-in ones and the optional ones its metadata
    names), read by position where possible, and each one's block sums; None where missing."""
    path = readable_path(path)
    fmt = detect(path)
    container = get_container(fmt)
    names = cache_arrays(None)
    raw, arrays = container.open_arrays(path, with_block_sums(names))
    # Columns declared beyond the built-in ones are known only from the metadata, read with the arrays: a
    # second opening for them, which caches without such columns never pay.
    extra = tuple(name for name in cache_arrays(decode_metadata(raw)) if name not in names)
    if extra:
        again, more = container.open_arrays(path, with_block_sums(extra))
        if again != raw:  # another cache was published at the path in between: open that one, whole
            return open_cache_arrays(path)
        arrays.update(more)
        names = (*names, *extra)
    sums = {name: arrays.pop(block_sums_name(name)) for name in names}
    return fmt, raw, arrays, sums


def open_with_library(path: Path) -> tuple[str, Any, dict[str, Any], Callable[[], None]]:
    """``(format, raw metadata, arrays, close)`` read by zarr-python or h5py (for ``verify``)."""
    path = readable_path(path)
    if not path.exists():
        raise CacheNotFoundError(f"cache not found: {path}")
    found = _by_shape(path)
    raw, arrays, close = found.open_with_library(path)
    return found.name, raw, arrays, close


def container_at(path: Path) -> str:
    """The name of the container of the store at ``path`` (by its owner, else by its shape: directory or file)."""
    return _by_shape(path).name


def inspect_output(output: Path, format: str) -> OutputState:
    """What a build of ``output`` in container ``format`` finds there (:meth:`Container.inspect`).

    The container whose store is at ``output`` answers, whatever ``format`` is (a build then sees that it
    differs); a foreign file or folder is OCCUPIED, without metadata; when nothing is there, ``format``'s
    container answers from the staging folder."""
    if not output.exists() and not output.is_symlink():
        state = get_container(format).inspect(output)
        assert state is not None  # nothing at the output is every container's to describe
        return state
    for known in containers():
        state = known.inspect(output)
        if state is not None:
            return state
    # No container owns it: name the one of its shape (no signature is read again).
    return OutputState(OutputKind.OCCUPIED, next(c for c in containers() if c.is_directory == output.is_dir()).name)


def _by_shape(path: Path) -> Container:
    """The container owning ``path``, else (a damaged cache) the first one of its shape: directory or file."""
    return next((c for c in containers() if c.owns(path)), None) or next(
        c for c in containers() if c.is_directory == path.is_dir()
    )


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The elmo-cache metadata stored at ``path`` (either container), or None if there is none."""
    if not path.is_dir() and not path.is_file():
        return None
    return _by_shape(path).read_metadata(path)


def remove_output(path: Path) -> None:
    """Delete an old cache (or a file the user asked to overwrite), refusing foreign directories.

    A directory is removed only when it is a zarr group (has ``zarr.json``) or a staging
    folder of ours: ``--overwrite`` must never wipe, say, a home directory given as ``-o``.
    """
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        ours = (path / ZARR_JSON).is_file() or (path / BUILD_DIR).is_dir() or path.name.endswith(STAGING_SUFFIX)
        if not ours and any(path.iterdir()):
            raise CacheExistsError(
                f"{path}: a non-empty directory that is not a zarr cache; refusing to delete it, "
                "choose another -o/--output"
            )
        shutil.rmtree(path)
