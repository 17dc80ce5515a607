"""Views of a zarr array's rows (the reading half of :mod:`elmo_cache.store.zarr`).

:class:`RawChunks` and :class:`RawShards` read raw chunk or shard files with positioned reads
(:mod:`elmo_cache.store.positioned`; zarr is not imported), :class:`DecodedChunks` asks zarr for one
decoded chunk at a time when an array is compressed. The module docstring of :mod:`elmo_cache.store.zarr`
explains the choice.
"""

from __future__ import annotations

import contextlib
import os
import resource
import stat
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheCorruptError, CacheFormatError, CacheReplacedError
from elmo_cache.store.chunked import ChunkedArray
from elmo_cache.store.positioned import OpenFile, PositionedRows

__all__ = ["DecodedChunks", "RawChunks", "RawShards", "folder_identity"]

# zarr's sharding codec marks an inner chunk that is not in the shard file with this offset and size.
ABSENT_CHUNK = 2**64 - 1


# Decoded (compressed) chunks kept per array, in bytes; at least two chunks are always kept.
_DECODED_CACHE_BYTES = 256 * 2**20


def _max_open_files() -> int:
    """Files one array keeps open: an eighth of the soft ``ulimit -n``, leaving the rest to the user's
    program (DataLoader workers, sockets...)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(8, 1024 if soft == resource.RLIM_INFINITY else soft // 8)


def folder_identity(directory: Path | str) -> tuple[int, int] | None:
    try:
        st = os.stat(directory)
    except OSError:
        return None  # gone: the files' own opening says so
    return st.st_dev, st.st_ino


class _Generation:
    """The array folder a reader opened, and whether a path it opens now still leads there.

    An update publishes a new cache by swapping whole folders (or, where the system cannot swap, by renaming the old
    one aside first), then deletes the old one, so a file opened by its path after that is the new cache's. The
    folder is compared once a file is open, not only before: a file whose path was resolved through another folder
    than the one opened is refused, however the opening and the swap interleave (the old folder's inode cannot come
    back under the name: it is deleted after the swap)."""

    def __init__(self, directory: Path | str):
        self.directory = directory
        self.identity = folder_identity(directory)

    def moved_on(self) -> bool:
        """Whether the folder at the path is no longer (or no more) the one opened."""
        return self.identity is not None and folder_identity(self.directory) != self.identity

    def error(self, what: str) -> CacheReplacedError:
        return CacheReplacedError(
            f"{self.directory}: the cache was replaced after this reader opened it (build --update or a rebuild "
            f"published a new one there, or it was removed), so {what} would be the new cache's; open the cache again"
        )


def _open_file(path: str, array: ChunkedArray, c: int) -> int | None:
    """A read-only descriptor of file ``c`` of ``array``, which must be a regular file.

    zarr reads an absent chunk as the fill value, but every file of a finished elmo-cache cache is
    written: an absent one means a partial copy or sync, and reading zeros in its place would hand a
    training loop vectors that were never computed. So it is an error, except in an unfinished cache
    opened with ``allow_incomplete`` (None: the caller reads the fill value). ``O_NONBLOCK`` and the
    ``fstat`` refuse a FIFO (whose plain ``open`` would block forever) or a device; a symbolic link
    is followed (caches are legitimately spread over disks by links): the block checksums vouch for
    what it points at.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        if array.allow_missing:
            return None
        raise CacheCorruptError(
            f"{path}: file {c} of array {array.name!r} is missing; the cache is incomplete (a partial copy "
            "or sync?): run `elmo-cache verify` on it, then re-copy or rebuild it"
        ) from None
    except OSError as exc:
        raise CacheCorruptError(f"{path}: file {c} of array {array.name!r} cannot be opened ({exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CacheCorruptError(
            f"{path}: file {c} of array {array.name!r} is not a regular file (a FIFO, device or directory); "
            "refusing to read it: the cache is damaged, re-copy or rebuild it"
        )
    return fd


class _RawFiles(PositionedRows):
    """An array whose files hold raw rows, each checked when first opened and read by position.

    A "chunk" of :class:`ChunkedArray` is one file here. Subclasses say how many rows a file's
    block has and how a file is checked (:meth:`_check`, which raises :class:`CacheFormatError`;
    it returns None for a file of raw rows from byte 0, else what :meth:`_gather` needs to read it
    into memory). At most :func:`_max_open_files` files stay open (first in, first out).
    """

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        file_rows: int,
        directory: Path,
        key: Callable[[int, int], str],
        fill_value: Any,
    ):
        super().__init__(name, shape, dtype, file_rows)
        self._directory = directory
        self._key = key
        self._fill_value = fill_value
        self._files: dict[int, tuple[OpenFile, int] | np.ndarray] = {}
        self._max_files = _max_open_files()
        # Each file's identity when first opened, and whether it held raw rows (then it is not checked again).
        self._known: dict[int, tuple[tuple[int, ...], bool]] = {}
        # The folder as opened: an update publishes a new cache by swapping folders, after which files first opened
        # here would be the new cache's (see _open).
        self._folder = _Generation(directory)

    def _block_rows(self, c: int) -> int:
        raise NotImplementedError

    def _check(self, c: int, path: str, fd: int) -> Any:
        raise NotImplementedError

    def _gather(self, c: int, path: str, fd: int, checked: Any) -> np.ndarray:
        raise NotImplementedError

    def _what(self, c: int) -> str:
        return f"file {c} of array {self.name!r}"

    def _source(self, c: int) -> tuple[OpenFile, int] | np.ndarray:
        source = self._files.get(c)
        return source if source is not None else self._open(c)

    def _open(self, c: int) -> tuple[OpenFile, int] | np.ndarray:
        if not 0 <= c < self.n_chunks:
            raise IndexError(f"file {c} out of range for array {self.name!r}")
        path = os.path.join(self._directory, self._key(c, self.ndim))  # not pathlib: this runs per reopen
        try:
            fd = _open_file(path, self, c)
        except CacheCorruptError:
            if self._folder.moved_on():  # missing because the cache it belonged to went
                raise self._folder.error(self._what(c)) from None
            raise
        if self._folder.moved_on():  # opened through the new cache's folder: never read
            if fd is not None:
                os.close(fd)
            raise self._folder.error(self._what(c))
        source: tuple[OpenFile, int] | np.ndarray
        if fd is None:  # only in an unfinished cache opened with allow_incomplete: the fill value, as zarr says
            source = np.broadcast_to(np.asarray(self._fill_value, dtype=self.dtype), (self._block_rows(c), *self._tail))
        else:
            handle = OpenFile(path, fd)  # owns fd from here
            known = self._known.get(c)
            if known is not None and known[0] != handle.identity:
                raise CacheCorruptError(
                    f"{path}: {self._what(c)} is not the file this reader first opened (replaced or rewritten "
                    "since the cache was opened: a new build or copy over it?); reopen the cache"
                )
            checked = None if known is not None and known[1] else self._check(c, path, fd)
            self._known[c] = (handle.identity, checked is None)
            source = (handle, 0) if checked is None else self._gather(c, path, fd, checked)
        files = self._files
        if len(files) >= self._max_files:
            # Its descriptor closes once no read holds it; another thread may have changed the dict: no matter.
            with contextlib.suppress(KeyError, StopIteration, RuntimeError):
                del files[next(iter(files))]
        files[c] = source
        return source

    def check_files(self) -> None:
        """Check the first and the last file (a ``stat`` and, for shards, a small read each; the rest on first use)."""
        for c in sorted({0, self.n_chunks - 1} if self.n_chunks else set()):
            self._source(c)


class RawChunks(_RawFiles):
    """Uncompressed, unsharded zarr arrays: each chunk file is ``chunk_rows`` raw rows (edge chunks padded)."""

    def _block_rows(self, c: int) -> int:
        return self.chunk_rows

    def _check(self, c: int, path: str, fd: int) -> None:
        size, expected = os.fstat(fd).st_size, self.chunk_rows * self._row_bytes
        if size != expected:
            raise CacheFormatError(
                f"{path}: chunk of array {self.name!r} has {size} bytes, expected {expected} (an uncompressed "
                f"chunk of shape {(self.chunk_rows, *self.shape[1:])} {self.dtype}); the cache is corrupt"
            )


class RawShards(_RawFiles):
    """Uncompressed sharded zarr arrays: each shard file is inner chunks in row order, then its index.

    elmo-cache writes shards whose inner chunks lie back to back from byte 0 (the layout zarr itself
    writes), so a shard's rows are one raw C-order block: it is read by position, and a "chunk" of this
    class is a shard (``chunk_rows`` = rows per shard). The index at the end of the file is checked
    (its CRC-32C, and that it describes exactly that layout) when the file is first opened; a shard
    laid out otherwise (valid zarr, written by another tool) is read chunk by chunk into memory.
    """

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        shard_rows: int,
        inner_rows: int,
        directory: Path,
        key: Callable[[int, int], str],
        fill_value: Any,
        index_crc: bool,
    ):
        super().__init__(name, shape, dtype, shard_rows, directory, key, fill_value)
        self.inner_rows = int(inner_rows)
        self._inner_bytes = self.inner_rows * self._row_bytes
        self._per_shard = self.chunk_rows // self.inner_rows
        self._index_bytes = 16 * self._per_shard + (4 if index_crc else 0)
        self._index_crc = index_crc
        self._layouts: dict[int, bytes] = {}
        # Shards before the last that end short (a window's last: the next window starts the next shard), by the
        # rows they store: the rows past them are chunks the shard does not hold, which read as zeros (as zarr
        # reads them). Learnt from each shard's size and index when first opened.
        self._short: dict[int, int] = {}

    def _block_rows(self, c: int) -> int:
        return self._present(c) * self.inner_rows

    def _present(self, c: int) -> int:
        rows = min(self.chunk_rows, self.shape[0] - c * self.chunk_rows)
        return -(-rows // self.inner_rows)

    def _present_in(self, c: int, size: int) -> int:
        """The inner chunks shard ``c`` holds, judged by its ``size``: the last shard holds those that reach into
        the array; one before it may hold fewer (at least one, back to back from its start)."""
        present = self._present(c)
        if c == self.n_chunks - 1:
            return present
        stored, extra = divmod(size - self._index_bytes, self._inner_bytes)
        return stored if not extra and 1 <= stored < present else present

    def _fill(self, c: int, r: int, out: np.ndarray) -> None:
        short = self._short.get(c)
        if short is None and c not in self._known:
            self._source(c)  # opened and checked: whether it ends short is known from here
            short = self._short.get(c)
        if short is None or r + len(out) <= short:
            super()._fill(c, r, out)
            return
        held = max(0, short - r)
        if held:
            super()._fill(c, r, out[:held])
        out[held:] = self._fill_value

    def _layout_index(self, present: int) -> bytes:
        """The index body of a shard with ``present`` chunks back to back from byte 0 (the layout written here)."""
        body = self._layouts.get(present)
        if body is None:
            index = np.full((self._per_shard, 2), ABSENT_CHUNK, dtype="<u8")
            index[:present, 0] = np.arange(present, dtype=np.uint64) * np.uint64(self._inner_bytes)
            index[:present, 1] = self._inner_bytes
            body = self._layouts[present] = index.tobytes()
        return body

    def _check(self, c: int, path: str, fd: int) -> np.ndarray | None:
        """Check shard ``c``'s size and index; None when its chunks lie back to back (its rows are read
        by position), else its (offset, size) pairs."""
        size = os.fstat(fd).st_size
        present = self._present_in(c, size)
        expected = present * self._inner_bytes + self._index_bytes
        if size < self._index_bytes:
            raise CacheFormatError(
                f"{path}: shard {c} of array {self.name!r} has {size} bytes (expected {expected}), too short "
                "for its index; the cache is corrupt"
            )
        raw = os.pread(fd, self._index_bytes, size - self._index_bytes)
        body = raw[: 16 * self._per_shard]
        if self._index_crc:
            import google_crc32c

            if int(google_crc32c.value(body)) != int.from_bytes(raw[-4:], "little"):
                raise CacheFormatError(
                    f"{path}: shard {c} of array {self.name!r} has {size} bytes (expected {expected}) and its "
                    "index fails its CRC-32C: truncated or damaged; the cache is corrupt"
                )
        if body == self._layout_index(present):
            if size != expected:
                raise CacheFormatError(
                    f"{path}: shard {c} of array {self.name!r} has {size} bytes, expected {expected} "
                    f"({present} uncompressed chunks of {self.inner_rows} rows and the index); the cache is corrupt"
                )
            if present < self._present(c):
                self._short[c] = present * self.inner_rows
            return None
        index = np.frombuffer(body, dtype="<u8").reshape(self._per_shard, 2)
        used = index[:, 0] != ABSENT_CHUNK
        if used.any() and int((index[used, 0] + index[used, 1]).max()) > size - self._index_bytes:
            raise CacheFormatError(
                f"{path}: the index of shard {c} of array {self.name!r} points past the end "
                "of the file; the cache is corrupt"
            )
        return index

    def _gather(self, c: int, path: str, fd: int, index: np.ndarray) -> np.ndarray:
        """A shard whose inner chunks are not back to back, read chunk by chunk (a copy; chunks it does not hold
        read as the fill value)."""
        present = self._present(c)
        block = np.full((present * self.inner_rows, *self.shape[1:]), self._fill_value, dtype=self.dtype)
        for j, (offset, size) in enumerate(index[:present].tolist()):
            if offset == ABSENT_CHUNK:
                continue
            if size != self._inner_bytes:
                raise CacheFormatError(
                    f"{path}: inner chunk {j} of array {self.name!r} has {size} bytes, "
                    f"expected {self._inner_bytes} (uncompressed); the cache is corrupt"
                )
            chunk = np.frombuffer(os.pread(fd, size, offset), dtype=self.dtype)
            block[j * self.inner_rows : (j + 1) * self.inner_rows] = chunk.reshape(self.inner_rows, *self.shape[1:])
        block.setflags(write=False)
        return block


class DecodedChunks(ChunkedArray):
    """Compressed (or otherwise non-raw) zarr arrays: zarr decodes, we keep a few decoded chunks."""

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        chunk_rows: int,
        array: Any,
        file_of: Callable[[int], tuple[int, str]] | None = None,
        directory: Path | None = None,
    ):
        super().__init__(name, shape, dtype, chunk_rows)
        self._array = array
        self._file_of = file_of  # (file number, path) holding chunk c: checked before zarr reads it
        # zarr reads the chunk by its path: a read done through another folder than the one opened is not used.
        self._folder = _Generation(directory) if directory is not None else None
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._max_chunks = max(2, _DECODED_CACHE_BYTES // max(1, row_bytes * self.chunk_rows))
        self._decoded: OrderedDict[int, np.ndarray] = OrderedDict()

    def _load_chunk(self, c: int) -> np.ndarray:
        block = self._decoded.get(c)
        if block is not None:
            self._decoded.move_to_end(c)
            return block
        where = self.name
        folder = self._folder
        try:
            if self._file_of is not None:  # zarr would read an absent file as zeros, and block on a FIFO
                k, where = self._file_of(c)
                fd = _open_file(where, self, k)
                if fd is not None:
                    os.close(fd)
            block = np.asarray(self._array[c * self.chunk_rows : (c + 1) * self.chunk_rows])
        except Exception as exc:  # zarr and its codecs raise many types for a truncated or damaged chunk
            if folder is not None and folder.moved_on():
                raise folder.error(f"chunk {c} of array {self.name!r}") from None
            if isinstance(exc, CacheCorruptError):
                raise
            raise CacheCorruptError(
                f"{where}: zarr cannot decode chunk {c} of array {self.name!r} ({type(exc).__name__}: {exc}); "
                "the file was truncated, replaced or damaged: run `elmo-cache verify` on the cache"
            ) from None
        if folder is not None and folder.moved_on():
            raise folder.error(f"chunk {c} of array {self.name!r}")
        block.setflags(write=False)
        self._decoded[c] = block
        if len(self._decoded) > self._max_chunks:
            self._decoded.popitem(last=False)
        return block
