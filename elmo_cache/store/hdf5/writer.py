"""The HDF5 container of docs/FORMAT.md, written.

Writing. HDF5 files are not crash safe (a killed writer can leave the whole file unreadable) and a
contiguous dataset, the only kind a reader can memory-map, cannot grow. So the build appends
vectors to a raw ``vectors.bin`` in the staging folder and only the finished build writes
``cache.h5`` there, with every dataset contiguous and of its final shape (and records each
dataset's CRC-32 in the metadata), then renames it to the output path: the output only ever
holds a finished cache.

Disk while finishing. A declared column staged in chunks (``pooled``: nearly all of a ``--pool-only`` cache) is
staged as files that grow with the column (:class:`~elmo_cache.store.durable.ChunkedColumn` with ``grow_every``:
each a sixteenth to an eighth of it), copied into ``cache.h5`` a file at a time, and each file is deleted once
its rows are in ``cache.h5`` on disk and ``.build/finish.json`` says so: the build needs about the cache's size
plus one file, not twice the column. A finish killed after some deletions leaves those rows only in the
half-written ``cache.h5``, at the place the record names; the next run (:meth:`Hdf5Writer._recover_columns`)
writes the files back from there, last first, cutting ``cache.h5`` short behind each (so that disk stays
bounded too), deletes it and finishes again from the staged files: the same bytes as a finish never interrupted.

An update (``build --update``). The cache it replaces stays at the output until the finish, so the rows it takes
from there unchanged (those before the first changed line, :meth:`Hdf5Writer.link_unchanged`, and each window it
reuses whole, :meth:`Hdf5Writer.link_window`) are not staged: ``vectors.bin`` holds a hole for them (no bytes on
disk) and the finish reads them from the old file, checked against its block sums, straight into the new one.
The new file is still written whole (one file, published by a rename), but once, not twice: an HDF5 update writes
the cache's bytes plus the rows it encoded, where staging every row wrote them twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store.blocksums import BlockGuard, BlockSummer, block_sums, guards, sums_listing
from elmo_cache.store.columns import Column
from elmo_cache.store.durable import ChunkedColumn, RawColumn, atomic_write_json, fsync_path
from elmo_cache.store.format import (
    BLOCK_SUMS,
    CHECKSUM_ALGORITHM,
    META_KEY,
    OPTIONAL_ARRAYS,
    SMALL_BLOCK_ROWS,
    block_sums_name,
    checksum,
    decode_metadata,
    metadata_checksum,
    vector_block_rows,
)
from elmo_cache.store.hdf5.read import open_arrays
from elmo_cache.store.positioned import PositionedRows
from elmo_cache.store.staging import Layout, Progress, Writer, array_blocks

__all__ = ["Hdf5Writer", "little_endian"]

# Rows copied per step when the vectors move into the HDF5 file (bounds memory, keeps writes large).
_COPY_BYTES = 64 * 2**20

# Staged files of a column staged in chunks: the first ones of about this many bytes (whole rows), twice that
# after every _GROW_EVERY files, at most _COPY_BYTES: a file is 1/16 to 1/8 of the column, the disk a finish
# needs beyond the cache, and a column of GiBs is some hundreds of files, not hundreds of thousands.
_FIRST_FILE_BYTES = 128 * 2**10
_GROW_EVERY = 16

# The finish's record of the staged files already copied into cache.h5 and deleted (see the module docstring).
FINISH_FILE = "finish.json"

# progress.json's extra: the staged files grow (a staging begun before they did has files of the zarr chunk).
_STAGED_FILES = "hdf5_staged_files"
_GROWING = "growing"

# progress.json's extra of an update: the runs of rows taken from the cache it replaces (new start -> [old start,
# rows]); a resume goes on only while that cache is at the output (Progress.updating).
_TAKEN = "hdf5_taken"


def little_endian(data: Any) -> np.ndarray:
    """``data`` as a C-contiguous little-endian array (no copy when it already is one)."""
    array = np.asarray(data)
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))


class Hdf5Writer(Writer):
    """Writes an HDF5 cache (FORMAT.md) through its staging folder."""

    def __init__(self, output: Path, layout: Layout, progress: Progress):
        super().__init__(output, layout, progress)
        self.vectors = RawColumn(self.build_dir / "vectors.bin", layout.dtype, layout.row_shape)
        # An update takes any run of the replaced cache's rows (one file, rows packed), not whole files: the unit
        # of link_unchanged and link_window is a row.
        self.file_rows = 1
        self._rows = 0  # rows appended, committed or not
        # An update's runs of rows taken from the cache it replaces at the finish: new start -> (old start, rows).
        self._taken: dict[int, tuple[int, int]] = {}
        # That cache's vectors and their block guard (opened once, by the first run).
        self._old: tuple[Any, BlockGuard | None] | None = None

    def _growing_files(self) -> bool:
        """Whether columns staged in chunks have growing files: in a new staging, or one that says so."""
        return self.progress.lines == 0 or self.progress.extra.get(_STAGED_FILES) == _GROWING

    def _column(self, spec: Column) -> RawColumn:
        column = super()._column(spec)
        if not isinstance(column, ChunkedColumn) or not self._growing_files():
            return column
        row_bytes = max(1, spec.row_bytes)
        return ChunkedColumn(
            column.path,
            spec.dtype,
            spec.row_shape,
            max(1, _FIRST_FILE_BYTES // row_bytes),
            grow_every=_GROW_EVERY,
            max_file_rows=max(1, _COPY_BYTES // row_bytes),
        )

    def _staged_files(self, spec: Column | None) -> ChunkedColumn | None:
        """The column behind a declared array when it is copied a file at a time (and its files deleted)."""
        column = self.columns.get(spec.name) if spec is not None else None
        if isinstance(column, ChunkedColumn) and column.grow_every is not None:
            return column
        return None

    def _recover_columns(self) -> None:
        """Write back the staged files a finish that did not complete had deleted, from the half-written
        ``cache.h5`` (at the place ``finish.json`` names), then drop both: the finish starts again."""
        record = self.build_dir / FINISH_FILE
        if not record.is_file():
            return
        h5 = self.staging / "cache.h5"
        try:
            copied = json.loads(record.read_text(encoding="utf-8"))["copied"]
            entries = [(str(e["column"]), int(e["offset"]), int(e["files"])) for e in copied]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            raise CacheFormatError(
                f"{record}: unreadable record of an interrupted finish ({exc}); rerun with --overwrite"
            ) from None
        for name, offset, done in reversed(entries):  # the later arrays lie further on in cache.h5
            column = self.columns.get(name)
            if not isinstance(column, ChunkedColumn) or column.grow_every is None:
                raise CacheFormatError(f"{record}: names column {name!r}, not one staged in growing files")
            files = column.files(self.sentences().committed(self.specs[name]))[:done]
            for k in reversed(range(len(files))):
                path, rows = files[k]
                where = offset + column.file_start(k) * column.item_bytes
                if not path.is_file():
                    _restore(h5, where, rows * column.item_bytes, path)
                if h5.is_file() and h5.stat().st_size > where:
                    os.truncate(h5, where)  # the rows just restored: so the disk held stays bounded
        h5.unlink(missing_ok=True)
        record.unlink()
        fsync_path(self.build_dir, directory=True)

    def _copy_files(self, h5: Path, dataset: Any, name: str, rows: int, block_rows: int) -> tuple[int, np.ndarray]:
        """Copy the first ``rows`` of column ``name`` into ``dataset`` a staged file at a time, deleting each file
        once its rows are durably in ``h5`` and recorded; returns the rows' CRC-32 and their block sums."""
        column = self.columns[name]
        assert isinstance(column, ChunkedColumn)
        column.close()  # an open file, even deleted, would keep its disk
        summer = BlockSummer(block_rows * column.item_bytes)
        crc = 0
        record = self.build_dir / FINISH_FILE
        copied = json.loads(record.read_text(encoding="utf-8"))["copied"] if record.is_file() else []
        entry: dict[str, Any] | None = None
        fd = os.open(h5, os.O_RDWR)
        try:
            for k, (path, count) in enumerate(column.files(rows)):
                start = column.file_start(k)
                block = little_endian(column.read_range(start, start + count))
                dataset[start : start + count] = block
                crc = checksum(block, crc)
                summer.update(block)
                if entry is None:
                    offset = dataset.id.get_offset()  # given at the first write (contiguous, late allocation)
                    assert offset is not None, "a written contiguous dataset has its place in the file"
                    entry = {"column": name, "offset": int(offset), "files": 0}
                    copied.append(entry)
                # h5py may still hold some of the rows in its buffers: written here as well (the same bytes, in the
                # space the dataset already has), they are on disk once synced, whatever h5py does later.
                _write_at(fd, block.reshape(-1).view(np.uint8), entry["offset"] + start * column.item_bytes)
                os.fsync(fd)
                entry["files"] = k + 1
                atomic_write_json(record, {"copied": copied})
                path.unlink()
        finally:
            os.close(fd)
        return crc, summer.finish()

    def _create_container(self) -> None:
        pass  # nothing but raw files until the end

    def _open_vectors(self) -> None:
        rows = self.stored_rows
        self.vectors.open(rows)
        self._rows = rows
        # The runs an interrupted update had committed (cut to its committed rows): their rows are holes here.
        for new, (old, count) in ((int(k), v) for k, v in self.progress.extra.get(_TAKEN, {}).items()):
            if new < rows:
                self._taken[new] = (int(old), min(int(count), rows - new))

    def link_unchanged(self, source: Path, rows: int) -> int:
        """An update's first ``rows`` rows, which the cache it replaces (at ``source``, the output) holds at the
        same places (:meth:`StoredWindows.unchanged_rows <elmo_cache.builder.update.StoredWindows.unchanged_rows>`):
        taken from there by the finish, never staged. Returns the rows taken (0 for a cache without block sums,
        whose rows are staged as they are appended: a row is never copied unchecked)."""
        assert source == self.output, "an update replaces the cache at its output"
        if rows <= 0 or not self.layout.token_rows or self._old_cache()[1] is None:
            return 0
        self._taken[0] = (0, rows)
        return rows

    def link_window(self, old_start: int, new_start: int, count: int) -> None:
        """An update's window whose ``count`` rows the cache it replaces holds from row ``old_start`` and which
        this build places from ``new_start``: taken from there by the finish; appended as a hole, never staged."""
        if new_start != self._rows:
            raise ValueError(f"link_window: the window's rows start at {new_start}, not after the rows before")
        if count > 0:
            self._taken[new_start] = (old_start, count)

    def _old_cache(self) -> tuple[Any, BlockGuard | None]:
        """The cache an update replaces (at the output): its vectors and their block guard (None without block
        sums), opened once."""
        if self._old is None:
            raw, arrays = open_arrays(self.output, ("vectors", BLOCK_SUMS["vectors"]))
            vectors, sums = arrays["vectors"], arrays[BLOCK_SUMS["vectors"]]
            meta = decode_metadata(raw) or {}
            self._old = (vectors, guards(self.output, meta, {"vectors": vectors}, {"vectors": sums}).get("vectors"))
        return self._old

    def _taken_runs(self, start: int, stop: int) -> list[tuple[int, int, int]]:
        """``(first, stop, old first)`` of each piece of rows ``start:stop`` an update takes from the old cache."""
        runs = []
        for new, (old, count) in sorted(self._taken.items()):
            a, b = max(start, new), min(stop, new + count)
            if a < b:
                runs.append((a, b, old + a - new))
        return runs

    def _append_vectors(self, vectors: np.ndarray, gap: int = 0) -> None:
        assert not gap, "an HDF5 layout's windows start where the rows before end (Layout.window_rows is 1)"
        start, n = self._rows, len(vectors)
        done = start
        for a, b, _ in self._taken_runs(start, start + n):
            if a > done:
                self.vectors.append(vectors[done - start : a - start])
            self.vectors.skip(b - a)  # a hole: the finish reads these rows from the old cache
            done = b
        if done < start + n:
            self.vectors.append(vectors[done - start :])
        self._rows += n

    def _sync_vectors(self) -> dict[str, Any]:
        self.vectors.sync()
        extra: dict[str, Any] = {_STAGED_FILES: _GROWING} if self._growing_files() else {}
        if self._taken:
            extra[_TAKEN] = {str(new): [old, count] for new, (old, count) in sorted(self._taken.items())}
        return extra

    def _staged_vectors(self, start: int, out: np.ndarray) -> np.ndarray:
        """Rows ``start:start + len(out)`` of the vectors read into ``out``: staged, or taken from the cache an
        update replaces (checked against its block sums first: damage there is an error, never copied into the new
        cache with fresh sums). Returns them little-endian."""
        at = start
        for a, b, first in self._taken_runs(start, start + len(out)):
            if a > at:
                self.vectors.read_into(at, out[at - start : a - start])
            old, guard = self._old_cache()
            assert guard is not None, "rows are taken only from a cache with block sums"
            guard.check_rows(first, first + b - a)
            target = out[a - start : b - start]
            if isinstance(old, PositionedRows) and old.dtype == target.dtype:
                old.read_into(first, target)
            else:  # another byte order than this machine's staging
                target[...] = np.asarray(old[first : first + b - a])
            at = b
        if at < start + len(out):
            self.vectors.read_into(at, out[at - start :])
        return little_endian(out)

    def _close_vectors(self) -> None:
        self.vectors.close()

    def finalize(self, metadata: dict[str, Any]) -> Path:
        rows = self.stored_rows
        tmp = self.staging / "cache.h5"
        tmp.unlink(missing_ok=True)
        self.vectors.sync()
        shape = (rows, *self.layout.row_shape)
        # CRC-32 of each dataset's little-endian C-order bytes, computed from what is written.
        crcs: dict[str, int] = {}
        with h5py.File(tmp, "w") as f:
            f.attrs[META_KEY] = json.dumps({**metadata, "complete": False})
            # No chunks, no compression, fixed shape: contiguous, so readers can numpy.memmap it.
            dataset = f.create_dataset("vectors", shape=shape, dtype=self.vectors.dtype)
            # Block sums (FORMAT.md) as the rows are copied: a step is a whole number of blocks.
            block_rows = vector_block_rows(self.layout.row_bytes, None)
            step = max(1, _COPY_BYTES // max(1, self.layout.row_bytes * block_rows)) * block_rows
            crc, sums = 0, []
            # Read, not memory-mapped (a map's pages would stay in the process, all the vectors by the end), into
            # one buffer: a fresh array per step would be fresh memory, slow to fill (benchmarks/RESULTS.md).
            buffer = np.empty((min(rows, step), *self.layout.row_shape), dtype=self.vectors.dtype)
            for start in range(0, rows, step):
                block = self._staged_vectors(start, buffer[: min(rows, start + step) - start])
                dataset[start : start + step] = block
                crc = checksum(block, crc)
                sums.append(block_sums(block, block_rows))
            crcs["vectors"] = crc
            del buffer
            self._old = None  # its descriptor goes with it: the replaced file's disk is freed once it is unlinked
            all_sums = {BLOCK_SUMS["vectors"]: np.concatenate(sums) if sums else np.empty(0, np.uint32)}
            optional: dict[str, int] = {}  # block rows of the optional arrays written (pooled)
            declared = self.array_columns()
            arrays = self.small_arrays()
            summed = ["vectors", *arrays]  # every array with block sums, by name (their digests are recorded)
            for name in list(arrays):
                data = arrays.pop(name)  # dropped once written: a staged file's map would keep its disk
                # Copied a block at a time (a whole copy would stay resident); a step is whole sum blocks.
                dataset = f.create_dataset(name, shape=data.shape, dtype=data.dtype.newbyteorder("<"))
                crc, sums = 0, []
                row_bytes = data.dtype.itemsize * int(np.prod(data.shape[1:], dtype=np.int64))
                spec = declared.get(name)
                rows_per_sum = spec.block_rows if spec is not None else SMALL_BLOCK_ROWS
                if name in OPTIONAL_ARRAYS or (spec is not None and spec.optional):
                    optional[name] = rows_per_sum
                if spec is not None and self._staged_files(spec) is not None:
                    n = len(data)
                    del data
                    copy = self._copy_files(tmp, dataset, spec.name, n, rows_per_sum)
                    crcs[name], all_sums[block_sums_name(name)] = copy
                    continue
                step = max(1, _COPY_BYTES // (row_bytes * rows_per_sum)) * rows_per_sum
                for start, block in array_blocks(data, step):
                    block = little_endian(block)
                    dataset[start : start + len(block)] = block
                    crc = checksum(block, crc)
                    sums.append(block_sums(block, rows_per_sum))
                crcs[name] = crc
                all_sums[block_sums_name(name)] = np.concatenate(sums) if sums else np.empty(0, np.uint32)
            for name, array in all_sums.items():
                array = little_endian(array)
                f.create_dataset(name, data=array)
                crcs[name] = checksum(array)
            f.flush()
            final = {**metadata}
            final["checksums"] = {
                "algorithm": CHECKSUM_ALGORITHM,
                "datasets": crcs,
                "metadata": metadata_checksum(final),
                "blocks": sums_listing(
                    block_rows, optional, {name: all_sums[block_sums_name(name)] for name in summed}
                ),
            }
            f.attrs[META_KEY] = json.dumps(final)
        fsync_path(tmp)
        self.close()
        os.replace(tmp, self.output)
        fsync_path(self.output.parent, directory=True)
        self.remove_staging()
        return self.output


def _write_at(fd: int, data: np.ndarray, offset: int) -> None:
    """Write all of ``data``'s bytes at ``offset`` of the open file ``fd``."""
    view = np.ascontiguousarray(data).data.cast("B")
    while len(view):
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _restore(h5: Path, where: int, size: int, path: Path) -> None:
    """Write back a deleted staged file (``size`` bytes) from ``h5`` at ``where``, atomically and durably."""
    try:
        with open(h5, "rb") as source:
            source.seek(where)
            data = source.read(size)
    except FileNotFoundError:
        data = b""
    if len(data) != size:
        raise CacheFormatError(
            f"{path}: deleted by an interrupted finish, and {h5} no longer holds its rows; rerun with --overwrite"
        )
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent, directory=True)
