"""The one-process zarr writer: rows stream into the vectors file being filled (see :mod:`elmo_cache.store.zarr`)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store.blocksums import BlockSummer, write_sums_file
from elmo_cache.store.durable import ChunkedColumn, RawColumn, fsync_path
from elmo_cache.store.format import BLOCK_SUMS, CHECKSUMS_FILE, checksum
from elmo_cache.store.staging import Layout, Progress, Writer
from elmo_cache.store.zarr.read import open_arrays
from elmo_cache.store.zarr.write import (
    CRC_BYTES,
    create_group,
    file_block_sums,
    file_geometry,
    finish_sentences,
    publish_file,
    shard_index,
    staged_chunk_path,
    sums_path,
    vectors_file_path,
    vectors_file_rows,
    write_file_body,
)

__all__ = ["ZarrWriter"]

_workers: tuple[int, ThreadPoolExecutor] | None = None  # (the process it belongs to, the pool)
_workers_lock = threading.Lock()


def _side_workers() -> ThreadPoolExecutor:
    """Threads for a window's writes and the work beside them: each vectors file's piece of the window is written
    by its own thread (one file's buffered writes are serialised by the kernel, separate files' are not: from one
    to four threads the page cache took 3.1 -> 14.4 GB/s on an H100 machine, ``benchmarks/bench_disk.py``), its
    whole-file CRC-32 and block CRC-32Cs are computed beside the write, and a filled file is synced as soon as it
    fills. The writes and the sums release the GIL. On an H200 machine the writer had been the build's limit,
    at ~1.1 GB/s for the three passes in a row (benchmarks/RESULTS.md)."""
    global _workers
    with _workers_lock:
        # A forked child inherits the pool but not its threads: work given to it would wait forever.
        if _workers is None or _workers[0] != os.getpid():
            threads = max(3, min(12, os.cpu_count() or 1))
            _workers = (
                os.getpid(),
                ThreadPoolExecutor(max_workers=threads, thread_name_prefix="elmo-cache-writer-side"),
            )
        return _workers[1]


def _link_or_copy(source: Path, final: Path) -> None:
    """``source`` at ``final`` as a hard link (a copy where links are refused), durably: the link is on disk before
    a commit counts its rows."""
    final.parent.mkdir(parents=True, exist_ok=True)
    final.unlink(missing_ok=True)
    try:
        os.link(source, final)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copyfile(source, final)
        fsync_path(final)
    fsync_path(final.parent, directory=True)


def _append_to(path: Path, data: memoryview) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


class ZarrWriter(Writer):
    """Writes a zarr v3 cache (FORMAT.md) through its staging folder.

    Rows stream into ``_build/rows-<k>.bin``, the raw rows of the vectors file ``k`` being filled. At a
    commit each filled file is finished into ``_build/shard-<k>.ready`` (uncompressed: its index is
    appended and the file renamed, so the vectors are never copied; compressed: zarr encodes it) and
    synced; ``progress.json`` is written; then the ready files are renamed into ``vectors/c/``. A
    crash between the two is repaired on resume, which also cuts the open file back to the commit.
    """

    def __init__(self, output: Path, layout: Layout, progress: Progress):
        super().__init__(output, layout, progress)
        assert layout.chunk_rows is not None and layout.shard_rows is not None, "the build plan fills both"
        self.file_rows = vectors_file_rows(layout)
        self._rows = 0  # rows appended, committed or not (file self._rows // file_rows is the one being filled)
        self._filled: list[int] = []  # files whose rows are all appended, not yet finished
        self._ready: list[int] = []  # files finished at the last sync, renamed after the commit
        # CRC-32 of the rows appended so far to each file not yet finished, so that finishing a file
        # does not read its rows back (up to 256 MiB) to sum them.
        self._rows_crc: dict[int, int] = {}
        # Block sums (CRC-32C per chunk of rows) of each file not yet finished, likewise summed as appended.
        self._summers: dict[int, BlockSummer] = {}
        # The sync of each filled file's rows, started as it fills, so that a commit has little left to wait for.
        self._early_syncs: dict[int, Future[None]] = {}
        # (size, CRC-32) of each finished vectors file, for checksums.json.
        self.file_sums = RawColumn(self.build_dir / "file_sums.bin", "int64", (2,))
        # An update's vectors files taken from the cache it replaces (link_unchanged): file -> (size, CRC-32).
        # Their rows are counted as appended but never written.
        self._linked: dict[int, tuple[int, int]] = {}
        # Files taken whole from the cache an update replaces (link_window), by their number there: a resume links
        # again the one it had not finished.
        self._window_links: dict[int, int] = {}
        # That cache's checksums.json entries, vectors and block sums (read once, by the first link).
        self._source: tuple[dict[str, Any], Any, Any] | None = None
        # Filled files whose rows end short of the file (a window's last file; the next window starts the next
        # file): file -> the row its rows end at.
        self._ends: dict[int, int] = {}

    def _rows_path(self, k: int) -> Path:
        return self.build_dir / f"rows-{k}.bin"

    def _ready_path(self, k: int) -> Path:
        return self.build_dir / f"shard-{k}.ready"

    # -- container hooks ----------------------------------------------------------------------

    def _create_container(self) -> None:
        create_group(self.staging, self.layout, 0, self.initial_metadata)

    def _recover_columns(self) -> None:
        for spec in self.specs.values():
            column = self.columns[spec.name]
            if spec.array is None or not isinstance(column, ChunkedColumn):
                continue
            k = 0
            while True:  # chunk files a finish moved into the group before it was interrupted
                moved = staged_chunk_path(self.staging, spec.array, k, 1 + len(spec.row_shape))
                if not moved.is_file():
                    break
                os.replace(moved, column.file_path(k))
                k += 1

    def _open_vectors(self) -> None:
        rows = self.stored_rows
        published = rows // self.file_rows
        self.file_sums.open(published)
        for k in range(published):  # finish a publication a crash interrupted
            final = vectors_file_path(self.staging, self.layout, k)
            if not final.is_file():
                if not self._ready_path(k).is_file():
                    raise CacheFormatError(f"{final}: a committed vectors file is missing; rerun with --overwrite")
                publish_file(self._ready_path(k), final)
        current = self._rows_path(published)
        if self.layout.compression is None and not current.exists():
            # Its rows were finished into a vectors file (index appended) by a commit or a finish that
            # did not complete: take them back; the cut below drops the index.
            for finished in (self._ready_path(published), vectors_file_path(self.staging, self.layout, published)):
                if finished.is_file():
                    os.replace(finished, current)
                    break
        for path in self.build_dir.glob("*.bin"):
            if path.name.startswith("rows-") and path != current:
                path.unlink()
        for path in self.build_dir.glob("shard-*.ready"):
            path.unlink()
        chunk_dir = self.staging / "vectors" / "c"
        if chunk_dir.is_dir():
            for entry in chunk_dir.iterdir():
                if not entry.name.isdigit() or int(entry.name) >= published:
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        want = (rows - published * self.file_rows) * self.layout.row_bytes
        window_links = {int(k): int(old) for k, old in self.progress.extra.get("window_links", {}).items()}
        if want and published in window_links:
            # An update committed a window whose files it takes whole, the last one not yet finished: taken again.
            current.unlink(missing_ok=True)
            self._rows_crc, self._summers = {}, {}
            self._link_window_file(window_links[published], published, rows - published * self.file_rows)
        elif want and published in self.progress.extra.get("linked", ()):
            # An update committed part of a file it links (never written): link_unchanged links it again.
            current.unlink(missing_ok=True)
            self._rows_crc, self._summers = {}, {}
        elif want:
            if not current.is_file() or current.stat().st_size < want:
                raise CacheFormatError(
                    f"{current}: the committed rows of the vectors are missing or damaged; rerun with --overwrite"
                )
            os.truncate(current, want)
            summer, crc = BlockSummer(self.chunk_rows_bytes), 0
            with open(current, "rb") as f:  # the committed rows of the open file, summed again (once per resume)
                while piece := f.read(CRC_BYTES):
                    crc = checksum(piece, crc)
                    summer.update(piece)
            self._rows_crc, self._summers = {published: crc}, {published: summer}
        else:
            current.unlink(missing_ok=True)
            self._rows_crc, self._summers = {}, {}
        self._rows = rows

    def link_unchanged(self, source: Path, rows: int) -> int:
        """An update's vectors files that need no writing: those of the complete cache at ``source`` (of this
        layout) that hold only rows below ``rows``, which this build appends unchanged at the same places
        (:meth:`StoredWindows.unchanged_rows <elmo_cache.builder.update.StoredWindows.unchanged_rows>`). Each is
        hard-linked into the staging (copied where links are refused) with its block sums, its rows are then
        skipped as they are appended, and its recorded size and CRC-32 reused. Returns how many files it took."""
        files = rows // self.file_rows if self.layout.token_rows else 0
        first = self.progress.rows // self.file_rows  # those before were committed (and linked) already
        if files <= first:
            return max(0, files)
        if self._old_cache(source)[2] is None:
            return 0  # a cache without block sums: its files are written again
        for k in range(first, files):
            self._link_file(source, k, k, self.file_rows)
        return files

    def link_window(self, old_start: int, new_start: int, count: int) -> None:
        """An update's window whose rows the cache it replaces (at the output) holds from row ``old_start``, a
        vectors file's start, in files of their own (windows version 3), and which this build places from
        ``new_start``: those files are taken whole, hard-linked (copied where links are refused), at their new
        numbers, with their block sums; its ``count`` rows are then counted as they are appended, never written."""
        f = self.file_rows
        if old_start % f or new_start % f:
            raise ValueError(f"link_window: rows {old_start} and {new_start} must start vectors files of {f} rows")
        for j in range(-(-count // f)):
            self._link_window_file(old_start // f + j, new_start // f + j, min(f, count - j * f))

    def _link_window_file(self, old: int, k: int, rows: int) -> None:
        """File ``old`` of a window linked whole, as this build's file ``k`` (recorded: a resume takes it again)."""
        self._link_file(self.output, old, k, rows)
        self._window_links[k] = old

    def _old_cache(self, source: Path) -> tuple[dict[str, Any], Any, Any]:
        """The cache an update replaces: its checksums.json entries, its vectors and their block sums (None in a
        cache without them), read once."""
        if self._source is None:
            recorded = json.loads((source / CHECKSUMS_FILE).read_text(encoding="utf-8"))["files"]
            _, found = open_arrays(source, ("vectors", BLOCK_SUMS["vectors"]))
            self._source = (recorded, found["vectors"], found[BLOCK_SUMS["vectors"]])
        return self._source

    def _link_file(self, cache: Path, old: int, k: int, rows: int) -> None:
        """Vectors file ``old`` of the cache at ``cache``, holding ``rows`` rows, as this build's file ``k``:
        hard-linked with its block sums, its recorded size and CRC-32 reused."""
        recorded, vectors, stored_sums = self._old_cache(cache)
        assert stored_sums is not None, "an update links files only from a cache with block sums"
        source, final = vectors_file_path(cache, self.layout, old), vectors_file_path(self.staging, self.layout, k)
        _link_or_copy(source, final)
        chunk = int(self.layout.chunk_rows or 1)
        present, tail = -(-rows // chunk), rows % chunk
        first_block = old * (self.file_rows // chunk)
        sums: np.ndarray = np.array(stored_sums[first_block : first_block + present], dtype=np.uint32)
        if tail:
            # The last block as a file that ends short sums it (padded: it reads as zeros past the rows); the
            # cache's own sum is of its rows alone when the file was its last. The finish sums the array's last.
            start = old * self.file_rows + rows - tail
            sums[-1] = file_block_sums(np.asarray(vectors[start : start + tail]), self.layout, short=True)[-1]
        write_sums_file(sums_path(self.staging, k), sums)
        size, crc = recorded[source.relative_to(cache).as_posix()]
        self._linked[k] = (int(size), int(crc))

    def _append_vectors(self, vectors: np.ndarray, gap: int = 0) -> None:
        # The window's rows cut at file boundaries: each file gets one piece, so the pieces are written side by
        # side, and only the first can continue a file (and its sums) begun by an earlier append.
        pieces: list[tuple[int, memoryview]] = []
        filled: list[int] = []
        if gap:  # the file being filled ends here, short: these rows start the next one
            assert (self._rows + gap) % self.file_rows == 0 and self._rows % self.file_rows, (self._rows, gap)
            k = self._rows // self.file_rows
            self._ends[k] = self._rows
            filled.append(k)
            summer = self._summers.get(k)
            if summer is not None:  # the last block is a whole chunk (its padding reads as zeros): summed whole
                summer.pad_block()
        done, rows, n = 0, self._rows + gap, len(vectors)
        while done < n:
            k = rows // self.file_rows
            take = min(n - done, (k + 1) * self.file_rows - rows)
            if k not in self._linked:  # else the cache being updated holds these rows at these places: not written
                pieces.append((k, np.ascontiguousarray(vectors[done : done + take]).data.cast("B")))
            done += take
            rows += take
            if rows % self.file_rows == 0:
                filled.append(k)
        workers = _side_workers()
        writes: list[Future[None]] = []
        block_sums: list[Future[None]] = []
        file_crcs: dict[int, Future[int]] = {}
        for k, data in pieces:
            summer = self._summers.get(k)
            if summer is None:
                summer = self._summers[k] = BlockSummer(self.chunk_rows_bytes)
            file_crcs[k] = workers.submit(checksum, data, self._rows_crc.get(k, 0))
            block_sums.append(workers.submit(summer.update, data))
            writes.append(workers.submit(_append_to, self._rows_path(k), data))
        # Every piece and sum is done before anything else touches the files or the sums, also when one failed;
        # then the first failure is raised (nothing of this append counts: a resume cuts the files back).
        everything: list[Future[Any]] = [*writes, *block_sums, *file_crcs.values()]
        wait(everything)
        for future in everything:
            future.result()
        for k, crc in file_crcs.items():
            self._rows_crc[k] = crc.result()
        self._rows = rows
        for k in filled:
            self._filled.append(k)
            if k not in self._linked:
                self._early_syncs[k] = workers.submit(fsync_path, self._rows_path(k))

    def _finish_file(self, k: int, n_rows: int) -> tuple[int, int]:
        """Turn rows-<k>.bin into the vectors file shard-<k>.ready (synced); returns its (size, CRC-32)."""
        if k in self._linked:
            return self._linked[k]  # in place already, with its block sums
        rows_path, ready = self._rows_path(k), self._ready_path(k)
        early_sync = self._early_syncs.pop(k, None)
        if early_sync is not None:
            early_sync.result()
        summer = self._summers.pop(k, None)
        if summer is not None:  # else: no rows appended in this session and none to resume (cannot happen)
            write_sums_file(sums_path(self.staging, k), summer.finish())
        if self.layout.compression is None:
            _, present = file_geometry(self.layout, n_rows, k)
            padding_and_index = bytes(present * self.chunk_rows_bytes - rows_path.stat().st_size)
            padding_and_index += shard_index(self.layout, present)
            with open(rows_path, "ab") as handle:
                handle.write(padding_and_index)
                handle.flush()
                os.fsync(handle.fileno())
                size = handle.tell()
            os.replace(rows_path, ready)
            return size, checksum(padding_and_index, self._rows_crc.pop(k, 0))
        self._rows_crc.pop(k, None)  # compressed: the file's sum is of the encoded bytes
        block = np.fromfile(rows_path, dtype=self.layout.dtype).reshape(-1, *self.layout.row_shape)
        with open(ready, "wb") as handle:
            crc = write_file_body(handle, self.layout, n_rows, k, block)
            handle.flush()
            os.fsync(handle.fileno())
            return handle.tell(), crc

    @property
    def chunk_rows_bytes(self) -> int:
        return int(self.layout.chunk_rows or 0) * self.layout.row_bytes

    def _sync_vectors(self) -> dict[str, Any]:
        for k in self._filled:
            end = self._ends.pop(k, (k + 1) * self.file_rows)
            self.file_sums.append(np.array([self._finish_file(k, end)], dtype=np.int64))
        self._ready, self._filled = self._filled, []
        current = self._rows // self.file_rows
        if self._rows % self.file_rows and current not in self._linked:  # the file being filled: its rows so far
            fsync_path(self._rows_path(current))
        self.file_sums.sync()
        extra: dict[str, Any] = {"linked": sorted(self._linked)} if self._linked else {}
        if self._window_links:
            extra["window_links"] = {str(k): old for k, old in sorted(self._window_links.items())}
        return extra

    def _after_commit(self) -> None:
        for k in self._ready:
            if k in self._linked:
                continue
            publish_file(self._ready_path(k), vectors_file_path(self.staging, self.layout, k))
            self._rows_path(k).unlink(missing_ok=True)  # compressed: the raw rows, now encoded
        self._ready = []

    def _close_vectors(self) -> None:
        self.file_sums.close()

    # -- finishing ----------------------------------------------------------------------------

    def finalize(self, metadata: dict[str, Any]) -> Path:
        rows = self.stored_rows
        assert rows == self._rows and not self._filled, "finalize follows the last commit"
        files = -(-rows // self.file_rows)
        sums = {
            k: (int(size), int(crc))
            for k, (size, crc) in enumerate(self.file_sums.read(rows // self.file_rows).tolist())
        }
        if rows % self.file_rows:  # the last, partly filled file
            k = files - 1
            sums[k] = self._finish_file(k, rows)
            # Compressed: the raw rows stay until the build folder goes, in case finishing fails.
            if k not in self._linked:  # else in place already
                publish_file(self._ready_path(k), vectors_file_path(self.staging, self.layout, k))
        sentences = self.sentences()
        small = sentences.arrays(self.extra_arrays)
        self.close()
        return finish_sentences(self.staging, self.output, sentences, small, metadata, sums)
