"""Durable files of a build's staging: fsync, atomic replacement, and append-only columns of fixed-size items.

What makes a build survive ``kill -9``: data is flushed and fsync'ed before the record that claims it is
replaced atomically, and an append-only column is cut back to its committed size when it is opened again.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store.format import aside_path

__all__ = ["RawColumn", "atomic_write_json", "finish_interrupted_publish", "fsync_path", "publish_directory"]


def fsync_path(path: Path, *, directory: bool = False) -> None:
    """Flush ``path`` (a file, or a directory's entries) to stable storage."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_json(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)


def publish_directory(source: Path, target: Path) -> None:
    """Rename the finished directory ``source`` to ``target``. A ``target`` already there (the cache an update
    replaces, ``build --update``) is swapped with ``source`` in one atomic step where the system can (Linux's
    ``renameat2(RENAME_EXCHANGE)``: a reader opening ``target`` finds the old cache or the new one, never
    nothing), then removed from ``source``.

    Elsewhere it is renamed aside first (to :func:`~elmo_cache.store.format.aside_path`), then ``source`` takes its
    name: for that moment nothing is at ``target``, and a reader that finds it so waits for the new cache, or reads
    the old one aside (:func:`elmo_cache.store.readable_path`). A kill -9 in that moment leaves both, whole: the
    next build finishes the publish (:func:`finish_interrupted_publish`)."""
    try:
        os.rename(source, target)
        fsync_path(target.parent, directory=True)
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not target.is_dir():
            raise
    if not _exchange(source, target):
        aside = aside_path(target)
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(target, aside)
        os.rename(source, target)
        source = aside
    fsync_path(target.parent, directory=True)
    # Left behind by a kill here, the old cache at ``source`` (a staging path, or the aside one) is removed by the
    # next build.
    shutil.rmtree(source, ignore_errors=True)


def finish_interrupted_publish(source: Path, target: Path) -> None:
    """Finish a :func:`publish_directory` of ``source`` to ``target`` that a kill -9 cut between its two renames
    (nothing at ``target``, the old cache aside): ``source``, the finished new cache, takes its name (or, were it
    gone, the old cache goes back), and the old one aside is removed. Nothing to do for any other state."""
    aside = aside_path(target)
    if not aside.is_dir():
        return
    if not target.exists() and not target.is_symlink():
        os.rename(source if source.is_dir() else aside, target)
        fsync_path(target.parent, directory=True)
    shutil.rmtree(aside, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` atomically; False where the system or the filesystem cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):  # a libc before glibc 2.28
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a filesystem without the exchange
        return False
    raise OSError(code, os.strerror(code), os.fspath(b))


class RawColumn:
    """An append-only file of fixed-size items (one per sentence or row)."""

    def __init__(self, path: Path, dtype: str, item_shape: tuple[int, ...] = ()):
        self.path = path
        self.dtype = np.dtype(dtype)
        self.item_shape = item_shape
        self.item_bytes = int(np.prod(item_shape, dtype=np.int64)) * self.dtype.itemsize
        self._file: BinaryIO | None = None

    def _handle(self) -> BinaryIO:
        if self._file is None:
            raise ValueError(f"{self.path}: not open")
        return self._file

    def open(self, committed_items: int) -> None:
        """Open for appending after cutting the file back to ``committed_items``."""
        want = committed_items * self.item_bytes
        if not self.path.exists():
            if want:
                raise CacheFormatError(
                    f"{self.path}: missing, but {committed_items} items were committed (a build begun by an older "
                    "elmo-cache, or a damaged staging folder); rerun with --overwrite"
                )
            self.path.touch()
        size = self.path.stat().st_size
        if size < want:
            raise CacheFormatError(f"{self.path}: {size} bytes on disk but {want} were committed; staging is damaged")
        handle = self._file = open(self.path, "r+b")  # noqa: SIM115 - held open across appends until close()
        handle.truncate(want)
        handle.seek(want)

    def append(self, data: np.ndarray) -> None:
        array = np.ascontiguousarray(data, dtype=self.dtype)
        if array.size:
            self._handle().write(array.data.cast("B"))

    def skip(self, count: int) -> None:
        """Append ``count`` items that are not written: a hole in the file (no disk), read as zeros."""
        if count > 0:
            handle = self._handle()
            end = handle.tell() + count * self.item_bytes
            handle.truncate(end)
            handle.seek(end)

    def sync(self) -> None:
        handle = self._handle()
        handle.flush()
        os.fsync(handle.fileno())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def read(self, count: int) -> np.ndarray:
        """The first ``count`` items (memory-mapped; a copy is not made)."""
        if count == 0:
            return np.empty((0, *self.item_shape), dtype=self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", shape=(count, *self.item_shape))

    def read_into(self, start: int, out: np.ndarray) -> None:
        """Items ``start:start + len(out)`` read into ``out`` (C-contiguous, of this column's dtype and item shape)."""
        if out.dtype != self.dtype or out.shape[1:] != self.item_shape or not out.flags.c_contiguous:
            raise ValueError(f"{self.path}: read_into needs a C-contiguous {self.dtype} array of {self.item_shape}")
        view = out.data.cast("B")
        if not len(view):
            return
        with open(self.path, "rb", buffering=0) as f:
            f.seek(start * self.item_bytes)
            done = 0
            while done < len(view):
                got = f.readinto(view[done:])
                if not got:
                    raise CacheFormatError(
                        f"{self.path}: ends before item {start + len(out)}, which was recorded as written; damaged"
                    )
                done += got

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Items ``[start, stop)`` read into memory (no map: the pages do not stay in the process)."""
        out = np.empty((max(0, stop - start), *self.item_shape), dtype=self.dtype)
        self.read_into(start, out)
        return out


class ChunkedColumn(RawColumn):
    """A :class:`RawColumn` kept as files of ``file_rows`` items each: ``path`` holds the first, ``<stem>.<k>.bin``
    the ``k``-th. A container publishes such files as the chunk files of the finished array by renaming them
    (:meth:`chunk_files`), so the column is never copied.

    With ``grow_every``, the files grow instead: ``grow_every`` files of ``file_rows`` items, as many of twice
    that, and so on up to ``max_file_rows``, so a file stays a small share (1/``grow_every`` to
    2/``grow_every``) of the column however long it gets, and a small column is still several files (the HDF5
    finish copies such a column a file at a time and deletes each file copied)."""

    def __init__(
        self,
        path: Path,
        dtype: str,
        item_shape: tuple[int, ...],
        file_rows: int,
        *,
        grow_every: int | None = None,
        max_file_rows: int | None = None,
    ):
        super().__init__(path, dtype, item_shape)
        self.file_rows = int(file_rows)  # items of the first file (of every file without grow_every)
        if self.file_rows < 1 or (grow_every is not None and grow_every < 1):
            raise ValueError(f"{path}: a chunked column needs at least one item per file and per size step")
        self.grow_every = grow_every
        self.max_file_rows = max(self.file_rows, int(max_file_rows or self.file_rows))
        self._starts = [0]  # first item of each file whose start was asked for (growing files)
        self._k = 0  # the file being appended to
        self._in_file = 0  # its items

    def rows_in_file(self, k: int) -> int:
        """Items file ``k`` holds once full."""
        if self.grow_every is None:
            return self.file_rows
        return min(self.max_file_rows, self.file_rows << min(k // self.grow_every, 62))

    def file_start(self, k: int) -> int:
        """The column's first item in file ``k``."""
        if self.grow_every is None:
            return k * self.file_rows
        while len(self._starts) <= k:
            self._starts.append(self._starts[-1] + self.rows_in_file(len(self._starts) - 1))
        return self._starts[k]

    def locate(self, i: int) -> tuple[int, int]:
        """``(k, j)``: item ``i`` is item ``j`` of file ``k`` (an item just past a full file is item 0 of the next)."""
        if self.grow_every is None:
            return divmod(i, self.file_rows)
        while self._starts[-1] <= i:
            self.file_start(len(self._starts))
        k = bisect.bisect_right(self._starts, i) - 1
        return k, i - self._starts[k]

    def file_path(self, k: int) -> Path:
        """Where file ``k`` of the column lives while the build runs."""
        return self.path if k == 0 else self.path.with_name(f"{self.path.stem}.{k}{self.path.suffix}")

    def files(self, count: int) -> list[tuple[Path, int]]:
        """``(path, items)`` of each file holding the first ``count`` items."""
        out = []
        k = 0
        while self.file_start(k) < count:
            out.append((self.file_path(k), min(self.rows_in_file(k), count - self.file_start(k))))
            k += 1
        return out

    def open(self, committed_items: int) -> None:
        full, rest = self.locate(committed_items)
        for k in range(full):
            path = self.file_path(k)
            want = self.rows_in_file(k) * self.item_bytes
            if not path.is_file() or path.stat().st_size < want:
                raise CacheFormatError(
                    f"{path}: missing or short, but {committed_items} items were committed; staging is damaged"
                )
            os.truncate(path, want)  # a published last chunk was padded
        k = full
        while True:  # files past the committed items are garbage of a killed build
            later = self.file_path(k + 1)
            if not later.exists():
                break
            later.unlink()
            k += 1
        self._k, self._in_file = full, rest
        saved, self.path = self.path, self.file_path(full)
        try:
            super().open(rest)
        finally:
            self.path = saved

    def skip(self, count: int) -> None:
        raise NotImplementedError(f"{self.path}: a column kept in files has no holes")

    def read_into(self, start: int, out: np.ndarray) -> None:
        out[...] = self.read_range(start, start + len(out))

    def append(self, data: np.ndarray) -> None:
        array = np.ascontiguousarray(data, dtype=self.dtype)
        done = 0
        while done < len(array):
            if self._in_file == self.rows_in_file(self._k):  # the file is full: the next one begins
                self.sync()
                self.close()
                self._k, self._in_file = self._k + 1, 0
                self._file = open(self.file_path(self._k), "wb")  # noqa: SIM115 - held open across appends
            take = min(len(array) - done, self.rows_in_file(self._k) - self._in_file)
            super().append(array[done : done + take])
            done += take
            self._in_file += take

    def read(self, count: int) -> Any:
        """The first ``count`` items: memory-mapped when they lie in one file, else a :class:`ChunkedRows`."""
        if count <= self.file_rows:
            return super().read(count)
        return ChunkedRows(self, count)

    def read_range(self, start: int, stop: int) -> np.ndarray:
        parts = []
        k = self.locate(start)[0] if stop > start else 0
        while stop > start and self.file_start(k) < stop:
            first = self.file_start(k)
            a, b = max(start, first), min(stop, first + self.rows_in_file(k))
            count = (b - a) * max(1, self.item_bytes // self.dtype.itemsize)
            data = np.fromfile(self.file_path(k), dtype=self.dtype, count=count, offset=(a - first) * self.item_bytes)
            if data.size != count:
                raise CacheFormatError(f"{self.file_path(k)}: shorter than the items {a} to {b} it should hold")
            parts.append(data.reshape(b - a, *self.item_shape))
            k += 1
        return np.concatenate(parts) if parts else np.empty((0, *self.item_shape), dtype=self.dtype)


class ChunkedRows:
    """The first ``count`` items of a :class:`ChunkedColumn` over several files, as far as the finish reads
    and writes them: ``len``, ``shape``, slices read, single items read and written (in place, in the files)."""

    def __init__(self, column: ChunkedColumn, count: int):
        self.column = column
        self.shape = (count, *column.item_shape)
        self.dtype = column.dtype
        self.itemsize = column.dtype.itemsize
        self.ndim = len(self.shape)
        self._maps: dict[int, np.memmap] = {}

    def __len__(self) -> int:
        return self.shape[0]

    def _map(self, k: int) -> np.memmap:
        if k not in self._maps:
            rows = min(self.column.rows_in_file(k), self.shape[0] - self.column.file_start(k))
            shape = (rows, *self.shape[1:])
            self._maps[k] = np.memmap(self.column.file_path(k), dtype=self.dtype, mode="r+", shape=shape)
        return self._maps[k]

    def __getitem__(self, key: int | slice) -> np.ndarray:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.shape[0])
            assert step == 1, "rows are read in runs"
            return self.column.read_range(start, stop)
        k, i = self.column.locate(int(key))
        return np.array(self._map(k)[i])

    def __setitem__(self, key: int, value: np.ndarray) -> None:
        k, i = self.column.locate(int(key))
        self._map(k)[i] = value

    def flush(self) -> None:
        """Write the items set back to their files and sync them."""
        for k, data in self._maps.items():
            data.flush()
            fsync_path(self.column.file_path(k))
        self._maps.clear()
