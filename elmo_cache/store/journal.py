"""The write-back journal: sentences a server encoded live, kept beside the cache they missed.

``serve --write-back`` appends every miss it encodes to ``<cache>.writeback``, a file beside the cache
(never inside it: ``build --update`` swaps the cache's folder, and ``verify`` lists the cache's own
files). Lookups by text (the server's, ``Cache.get``) consult it after the cache. Layout (docs/FORMAT.md,
"Write-back journal"):

* a header: the magic ``ELMOWB\\0\\1``, a uint32 length, a JSON object (the encoding identity of the
  cache, :func:`encoding_identity`, and the record layout: stored row dtype and shape, pooled dtype and
  shape) and the CRC-32C of that JSON;
* records, appended: ``uint32 body_length, uint32 crc32c(body), body`` with body = ``uint32 key_length,
  uint32 n_tokens, key (the sentence key, UTF-8), rows (n_tokens stored rows, the cache's codec, C order,
  little-endian), pooled vector (when the cache has one)``.

Durability is a group commit: a writer thread writes what was queued and ``fsync``\\ s it once the oldest
queued record is ``commit_ms`` old, so a ``kill -9`` (or a power cut) loses at most the records queued in
the last ``commit_ms`` plus the time the commits take (one may wait behind another on a disk slower than
``commit_ms``). A torn tail (a record cut by the kill, or failing
its CRC) is dropped when the writer opens the journal, with everything after it; readers skip it. One
writer at a time (an exclusive ``flock``; the kernel drops it when the process dies). The file never grows
past ``max_bytes``: a record that would pass it is not written (counted, the answer is still served).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.store.blocksums import crc32c
from elmo_cache.store.format import CODEBOOKS

__all__ = [
    "DEFAULT_COMMIT_MS",
    "DEFAULT_MAX_BYTES",
    "JOURNAL_SUFFIX",
    "Journal",
    "RecordLayout",
    "encoding_identity",
    "journal_path",
]

_log = logging.getLogger("elmo_cache.writeback")

JOURNAL_SUFFIX = ".writeback"
MAGIC = b"ELMOWB\x00\x01"
FORMAT_NAME = "elmo-cache-writeback"
VERSION = 1
DEFAULT_COMMIT_MS = 50.0
"""How long a queued record may wait before the writer writes and fsyncs it (ms)."""
DEFAULT_MAX_BYTES = 1 << 30
"""The largest a journal may grow (bytes): 1 GiB."""

_U32 = struct.Struct("<I")
_FRAME = struct.Struct("<II")  # body length, crc32c of the body
_BODY = struct.Struct("<II")  # key length, tokens
# What a sentence's vectors depend on, beyond its tokens (docs/FORMAT.md, "Write-back journal"): the corpus,
# the counts and the storage details (container, chunks, compression, dedupe) do not.
_IDENTITY_KEYS = ("kind", "layers", "mix", "dim", "dtype", "quantization", "pool", "tokenization", "sentence_hash")
_MODEL_KEYS = ("weights_sha256", "options", "initial_state", "precision", "warmup_sha256")


def journal_path(cache_path: str | os.PathLike[str]) -> Path:
    """Where the journal of the cache at ``cache_path`` lives: beside it, ``<cache>.writeback``."""
    path = Path(cache_path)
    return path.with_name(path.name + JOURNAL_SUFFIX)


def encoding_identity(meta: Mapping[str, Any]) -> dict[str, Any]:
    """What a written-back row depends on besides its sentence: the model and how rows are selected and stored
    (and a pq cache's codebooks, by the digest of their block sums). Two caches of the same identity store the
    same bytes for a sentence encoded alone, so a journal stays valid across ``build --update`` of its cache
    (unless the update retrained pq codebooks)."""
    model = meta.get("model") or {}
    out: dict[str, Any] = {key: meta.get(key) for key in _IDENTITY_KEYS}
    out["model"] = {key: model.get(key) for key in _MODEL_KEYS}
    digests = ((meta.get("checksums") or {}).get("blocks") or {}).get("digests") or {}
    out["codebooks"] = digests.get(CODEBOOKS) if meta.get("quantization") else None
    return out


def _digest(identity: Mapping[str, Any]) -> str:
    text = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return "blake2b-128:" + hashlib.blake2b(text, digest_size=16).hexdigest()


@dataclass(frozen=True)
class RecordLayout:
    """The bytes of one record's rows and pooled vector."""

    # numpy dtype string of a stored row ("<f4", "<f2", "|i1", "|u1") and the shape of one token's row.
    row_dtype: str
    row_shape: tuple[int, ...]
    # The pooled vector's dtype and shape; None for a cache without pooled vectors.
    pooled_dtype: str | None = None
    pooled_shape: tuple[int, ...] | None = None

    @property
    def row_bytes(self) -> int:
        return int(np.dtype(self.row_dtype).itemsize * np.prod(self.row_shape, dtype=np.int64))

    @property
    def pooled_bytes(self) -> int:
        if self.pooled_dtype is None or self.pooled_shape is None:
            return 0
        return int(np.dtype(self.pooled_dtype).itemsize * np.prod(self.pooled_shape, dtype=np.int64))

    def to_json(self) -> dict[str, Any]:
        return {
            "row_dtype": self.row_dtype,
            "row_shape": list(self.row_shape),
            "pooled_dtype": self.pooled_dtype,
            "pooled_shape": None if self.pooled_shape is None else list(self.pooled_shape),
        }


@dataclass
class _Entry:
    """Where a committed record's frame starts and how long it is."""

    offset: int
    length: int


# Events a journal reports to its listener (the server's metrics): records written (durable), records lost to
# a failed write, records refused because the journal is full, and a commit's duration in seconds.
Listener = Callable[[str, float], None]


class Journal:
    """One cache's write-back journal (see the module docstring), opened for reading or, with ``writable``, for
    appending (then one writer thread commits queued records every ``commit_ms``)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        identity: Mapping[str, Any],
        layout: RecordLayout,
        *,
        writable: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
        commit_ms: float = DEFAULT_COMMIT_MS,
        listener: Listener | None = None,
    ) -> None:
        self.path = Path(path)
        self.identity = dict(identity)
        self.layout = layout
        self.writable = writable
        self.max_bytes = int(max_bytes)
        self.commit_s = float(commit_ms) / 1000
        self._listener = listener
        self._lock = threading.Lock()
        self._index: dict[bytes, _Entry] = {}
        # Queued records not yet committed: their frame and decoded arrays, visible to lookups at once.
        self._pending: dict[bytes, tuple[bytes, np.ndarray, np.ndarray | None]] = {}
        self._queue: list[bytes] = []
        self._oldest = 0.0
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self.dropped_tail = 0
        """Bytes of a torn or damaged tail dropped (writer) or skipped (reader) at open."""
        flags = os.O_RDWR | os.O_CREAT if writable else os.O_RDONLY
        try:
            self._fd = os.open(self.path, flags | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise InvalidParameterError(f"write-back journal {self.path}: cannot open it: {exc.strerror}") from None
        try:
            if writable:
                self._take_lock()
            self._header_end = self._read_or_write_header()
            self._end = self._scan(self._header_end)
            if writable and self.dropped_tail:
                os.ftruncate(self._fd, self._end)
                os.fsync(self._fd)
                _log.warning(
                    "write-back journal %s: dropped %d bytes of a torn or damaged tail (records cut by a kill or "
                    "failing their CRC); the %d records before it are kept",
                    self.path,
                    self.dropped_tail,
                    len(self._index),
                )
        except OSError as exc:  # a disk that is full or failing as the server starts: a plain refusal
            os.close(self._fd)
            raise InvalidParameterError(
                f"write-back journal {self.path}: cannot prepare it: {exc.strerror or exc}; free space or serve "
                "without --write-back"
            ) from None
        except BaseException:
            os.close(self._fd)
            raise
        self._thread: threading.Thread | None = None
        if writable:
            self._thread = threading.Thread(target=self._run, name="elmo-cache-writeback", daemon=True)
            self._thread.start()

    # -- opening ------------------------------------------------------------------------------------

    def _take_lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise InvalidParameterError(
                    f"write-back journal {self.path}: another process is writing it (a server started with "
                    "--write-back on this cache); stop it, or serve without --write-back"
                ) from None
            raise

    def _header_json(self) -> bytes:
        header = {
            "format": FORMAT_NAME,
            "version": VERSION,
            "identity": _digest(self.identity),
            "encoding": self.identity,
            "layout": self.layout.to_json(),
        }
        return json.dumps(header, sort_keys=True, separators=(",", ":")).encode()

    def _read_or_write_header(self) -> int:
        size = os.fstat(self._fd).st_size
        if size == 0 and self.writable:
            text = self._header_json()
            data = MAGIC + _U32.pack(len(text)) + text + _U32.pack(crc32c(text))
            os.pwrite(self._fd, data, 0)
            os.fsync(self._fd)
            _fsync_directory(self.path.parent)
            return len(data)
        head = os.pread(self._fd, len(MAGIC) + 4, 0)
        if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
            raise CacheFormatError(
                f"write-back journal {self.path}: not an elmo-cache write-back journal (no header); move it away"
            )
        (length,) = _U32.unpack_from(head, len(MAGIC))
        start = len(MAGIC) + 4
        body = os.pread(self._fd, length + 4, start)
        if len(body) < length + 4 or crc32c(body[:length]) != _U32.unpack_from(body, length)[0]:
            raise CacheFormatError(f"write-back journal {self.path}: its header is damaged (CRC); move it away")
        header = json.loads(body[:length])
        if header.get("format") != FORMAT_NAME or header.get("version") != VERSION:
            raise CacheFormatError(
                f"write-back journal {self.path}: format {header.get('format')!r} version {header.get('version')!r} "
                f"is not one this elmo-cache reads ({FORMAT_NAME} {VERSION})"
            )
        if header.get("identity") != _digest(self.identity) or header.get("layout") != self.layout.to_json():
            theirs = header.get("encoding") or {}
            differ = sorted(k for k in set(theirs) | set(self.identity) if theirs.get(k) != self.identity.get(k))
            raise CacheFormatError(
                f"write-back journal {self.path} was written for another cache: its {', '.join(differ) or 'layout'} "
                "differ from this cache's, so its vectors are not this cache's; move it away (or delete it) to "
                "start a new one"
            )
        return start + length + 4

    def _scan(self, start: int) -> int:
        """Index the records from ``start`` on; returns where the valid records end (a bad tail is counted)."""
        size = os.fstat(self._fd).st_size
        pos = start
        while pos < size:
            record = self._read_frame(pos, size)
            if record is None:
                break
            key, length = record
            self._index.setdefault(key, _Entry(pos, length))
            pos += length
        self.dropped_tail = size - pos
        return pos

    def _read_frame(self, pos: int, size: int) -> tuple[bytes, int] | None:
        """The key and frame length of the record at ``pos``, or None when it is cut short or fails its CRC."""
        if size - pos < _FRAME.size:
            return None
        length, crc = _FRAME.unpack(os.pread(self._fd, _FRAME.size, pos))
        if length < _BODY.size or length > size - pos - _FRAME.size:
            return None
        body = os.pread(self._fd, length, pos + _FRAME.size)
        if len(body) != length or crc32c(body) != crc:
            return None
        key_length, n_tokens = _BODY.unpack_from(body)
        if length != _BODY.size + key_length + n_tokens * self.layout.row_bytes + self.layout.pooled_bytes:
            return None
        return body[_BODY.size : _BODY.size + key_length], _FRAME.size + length

    def refresh(self) -> None:
        """A reader: index the records another process committed since it last looked."""
        if self.writable or self._fd < 0:
            return
        with self._lock:
            if os.fstat(self._fd).st_size != self._end:
                self._end = self._scan(self._end)

    # -- lookups -------------------------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._index) + len(self._pending)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._index or key in self._pending

    @property
    def size(self) -> int:
        """Bytes the journal file holds (committed records and header)."""
        return self._end

    def get(self, key: bytes) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The stored rows ``(n_tokens, *row_shape)`` and pooled vector (None without) of sentence ``key``
        (its :func:`~elmo_cache.text.tokenize.sentence_key`, UTF-8), or None when it is not written back.
        A record is checked against its CRC as it is read: a damaged one is a :class:`CacheFormatError`."""
        with self._lock:
            queued = self._pending.get(key)
            entry = self._index.get(key)
        if queued is not None:
            return queued[1], queued[2]
        if entry is None:
            return None
        frame = os.pread(self._fd, entry.length, entry.offset)
        crc = _FRAME.unpack_from(frame)[1] if len(frame) >= _FRAME.size else None
        body = frame[_FRAME.size :]
        if len(frame) != entry.length or crc32c(body) != crc:
            raise CacheFormatError(
                f"write-back journal {self.path}: the record at byte {entry.offset} fails its CRC (damaged after it "
                "was written); move the journal away"
            )
        return self._decode(body)

    def _decode(self, body: bytes) -> tuple[np.ndarray, np.ndarray | None]:
        layout = self.layout
        key_length, n_tokens = _BODY.unpack_from(body)
        start = _BODY.size + key_length
        stop = start + n_tokens * layout.row_bytes
        rows = np.frombuffer(
            body, dtype=layout.row_dtype, count=n_tokens * int(np.prod(layout.row_shape)), offset=start
        )
        rows = rows.reshape(n_tokens, *layout.row_shape)
        pooled = None
        if layout.pooled_dtype is not None and layout.pooled_shape is not None:
            pooled = np.frombuffer(body, dtype=layout.pooled_dtype, offset=stop).reshape(layout.pooled_shape)
        return rows, pooled

    # -- writing -------------------------------------------------------------------------------------

    def add(self, key: bytes, rows: np.ndarray, pooled: np.ndarray | None = None) -> str:
        """Queue sentence ``key``'s stored rows (and pooled vector) for the next commit: ``"queued"``, ``"exists"``
        (written back or queued already) or ``"full"`` (it would take the journal past ``max_bytes``: not
        written). The record is visible to :meth:`get` at once."""
        layout = self.layout
        rows = np.array(rows, dtype=np.dtype(layout.row_dtype), order="C")  # ours: lookups share it read-only
        rows.setflags(write=False)
        if rows.shape[1:] != layout.row_shape:
            raise ValueError(f"rows of shape {rows.shape[1:]} in a journal of rows {layout.row_shape}")
        parts = [_BODY.pack(len(key), rows.shape[0]), key, rows.tobytes()]
        if layout.pooled_dtype is not None:
            assert pooled is not None
            pooled = np.array(pooled, dtype=np.dtype(layout.pooled_dtype), order="C").reshape(layout.pooled_shape)
            pooled.setflags(write=False)
            parts.append(pooled.tobytes())
        body = b"".join(parts)
        frame = _FRAME.pack(len(body), crc32c(body)) + body
        with self._lock:
            if not self.writable or self._closing:
                raise ValueError(f"write-back journal {self.path} is not open for writing")
            if key in self._index or key in self._pending:
                return "exists"
            queued = sum(len(item[0]) for item in self._pending.values())
            if self._end + queued + len(frame) > self.max_bytes:
                full = True
            else:
                full = False
                self._pending[key] = (frame, rows, pooled)
                if not self._queue:
                    self._oldest = time.monotonic()
                self._queue.append(key)
                self._wake.notify()
        if full:
            self._emit("full", 1)
            return "full"
        return "queued"

    def _emit(self, event: str, value: float) -> None:
        if self._listener is not None:
            try:
                self._listener(event, value)
            except Exception:  # a metric must never stop the writer
                _log.exception("write-back journal listener failed")

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._wake.wait()
                if not self._queue:
                    return  # closing with nothing queued
                delay = self._oldest + self.commit_s - time.monotonic()
                if delay > 0 and not self._closing:
                    self._wake.wait(delay)  # more records join this commit meanwhile
                    if time.monotonic() < self._oldest + self.commit_s and not self._closing:
                        continue
                keys, self._queue = self._queue, []
                frames = [self._pending[key][0] for key in keys]
                start = self._end
            self._commit(keys, frames, start)

    def _commit(self, keys: list[bytes], frames: list[bytes], start: int) -> None:
        data = b"".join(frames)
        began = time.perf_counter()
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(self._fd, data[written:], start + written)
            os.fsync(self._fd)
        except OSError as exc:
            with self._lock:
                for key in keys:
                    self._pending.pop(key, None)
            # A partial write must not stay as a torn record before the next commit's; if even this fails, the
            # next writer drops it at open (a torn tail).
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
            _log.error(
                "write-back journal %s: writing %d sentence(s) failed: %s; their answers were served, they are not "
                "kept (encoded again when asked again)",
                self.path,
                len(keys),
                exc,
            )
            self._emit("failed", len(keys))
            return
        with self._lock:
            pos = start
            for key, frame in zip(keys, frames):
                self._index[key] = _Entry(pos, len(frame))
                self._pending.pop(key, None)
                pos += len(frame)
            self._end = pos
        self._emit("commit_seconds", time.perf_counter() - began)
        self._emit("written", len(keys))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every record queued so far is committed (or failed); False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._lock:
                if not self._pending:
                    return True
                self._oldest = 0.0  # commit now
                self._wake.notify()
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    def close(self) -> None:
        """Commit what is queued, stop the writer and close the file (idempotent)."""
        with self._lock:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fsync_directory(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
