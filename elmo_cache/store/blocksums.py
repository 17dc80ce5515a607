"""Block checksums: a CRC-32C per block of rows of every array, checked on a block's first read.

The whole-file CRC-32s of ``checksums.json`` (zarr files up to 256 MiB) and of ``checksums.datasets``
(whole HDF5 datasets) are what ``verify`` checks; they are too coarse for a reader, which would have to
read a whole file to serve one sentence. So both writers also store, for each array, the CRC-32C of each
block of its rows (``vectors``: a zarr chunk, ~3 MiB, or ~4 MiB of rows in HDF5; the 1-D arrays:
:data:`~elmo_cache.store.format.SMALL_BLOCK_ROWS` entries), in a small uint32 array
(:data:`~elmo_cache.store.format.BLOCK_SUMS`). A reader checks a block the first time any row of it
is read (:class:`BlockGuard`) and never again: warm reads pay one ``bytearray`` lookup.

A sum is of the rows that exist (a zarr edge chunk's padding is not summed), as little-endian C-order
bytes, so the same rows have the same sums in zarr (raw or compressed) and HDF5. CRC-32C rather than
zlib's CRC-32: google-crc32c runs it in hardware (~4-5 GB/s here against ~1 for zlib).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

from elmo_cache.errors import CacheCorruptError, CacheFormatError
from elmo_cache.store.format import ARRAYS, BLOCK_SUMS_ALGORITHM, SMALL_BLOCK_ROWS, block_sums_name

__all__ = [
    "crc32c",
    "block_sums",
    "sums_digest",
    "BlockSummer",
    "BlockGuard",
    "guards",
    "write_sums_file",
    "read_sums_file",
]


def _bytes(data: Any) -> np.ndarray:
    """``data`` (an array, bytes or a buffer) as a read-only uint8 array of its little-endian C-order bytes
    (google-crc32c takes only read-only buffers)."""
    if isinstance(data, np.ndarray):
        array = np.ascontiguousarray(data)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        raw = array.reshape(-1).view(np.uint8)
    else:
        raw = np.frombuffer(data, dtype=np.uint8)
    if raw.flags.writeable:
        raw = raw.view()
        raw.setflags(write=False)
    return raw


def crc32c(data: Any, value: int = 0) -> int:
    """CRC-32C of ``data``'s bytes (little-endian), continuing from ``value``."""
    raw = _bytes(data)
    return int(google_crc32c.extend(value, raw)) if raw.size else value


def sums_digest(sums: Any) -> str:
    """The digest the metadata records of one array's block sums (``checksums.blocks.digests``): the CRC-32C
    of the uint32 sums as little-endian bytes, as 8 hex digits. It binds the sums to the metadata: a sibling
    cache's metadata, or the sums of another build copied with their data, no longer match."""
    return f"{crc32c(np.asarray(sums, dtype='<u4')):08x}"


def block_sums(data: np.ndarray, block_rows: int) -> np.ndarray:
    """The CRC-32C of each block of ``block_rows`` rows of ``data`` (the last block may be shorter)."""
    n = len(data)
    return np.array([crc32c(data[b : b + block_rows]) for b in range(0, n, block_rows)], dtype=np.uint32)


class BlockSummer:
    """Block sums of rows that arrive in pieces of any size (the zarr writer appends what the encoder gives)."""

    def __init__(self, block_bytes: int):
        self.block_bytes = int(block_bytes)
        self.sums: list[int] = []
        self._crc = 0
        self._fill = 0

    def update(self, data: Any) -> None:
        raw = _bytes(data)
        pos, n = 0, raw.size
        while pos < n:
            take = min(n - pos, self.block_bytes - self._fill)
            self._crc = int(google_crc32c.extend(self._crc, raw[pos : pos + take]))
            self._fill += take
            pos += take
            if self._fill == self.block_bytes:
                self.sums.append(self._crc)
                self._crc = self._fill = 0

    def pad_block(self) -> None:
        """Complete a partial last block with zero bytes: the block of a vectors file that ends short of the array,
        whose padding reads as zeros."""
        if self._fill:
            self.update(bytes(self.block_bytes - self._fill))

    def finish(self) -> np.ndarray:
        """The sums of every block, the last partial one included."""
        if self._fill:
            self.sums.append(self._crc)
            self._crc = self._fill = 0
        return np.array(self.sums, dtype=np.uint32)


def write_sums_file(path: Path, sums: np.ndarray) -> None:
    """Write ``sums`` (uint32, little-endian) to ``path`` atomically and durably (temporary name of its own:
    two writers of one vectors file, a redone part and a stale worker, never share a temporary file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(np.ascontiguousarray(sums, dtype="<u4").tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_sums_file(path: Path, count: int | None) -> np.ndarray | None:
    """The ``count`` sums stored at ``path`` (None: however many it holds), or None when the file is absent or of
    another length."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) % 4 or (count is not None and len(data) != 4 * count):
        return None
    return np.frombuffer(data, dtype="<u4").astype(np.uint32)


class BlockGuard:
    """Checks each block of one array against its stored CRC-32C the first time it is read.

    ``ok[b]`` is 1 once block ``b`` passed; callers test it inline (the hot path) and call :meth:`check`
    only when it is 0. Two threads may both check a block before either marks it: a benign race (the
    block is summed twice), never a wrong answer, so no lock.

    ``digest`` (metadata ``checksums.blocks.digests``; None in caches written before it): before the first
    block is checked the whole sums array is read once (4 bytes per block) and its :func:`sums_digest`
    compared with it, so sums that are not this cache's (with their data from another build, or under a
    sibling's metadata) fail on the first read instead of vouching for the wrong rows.
    """

    def __init__(self, where: str, name: str, array: Any, block_rows: int, sums: Any, digest: str | None = None):
        self.where, self.name = where, name
        self.block_rows = int(block_rows)
        self.n = int(array.shape[0])
        self.n_blocks = -(-self.n // self.block_rows)
        self.ok = bytearray(self.n_blocks)
        # Blocks not yet checked: at 0 a reader may drop its inline test (warm reads then pay nothing).
        self.remaining = self.n_blocks
        self._count_lock = threading.Lock()
        self._sums = sums
        self._digest = digest
        self._sum_at: Callable[[int], Any] = sums.item if digest is None else self._first_sum
        self._read: Callable[[int, int], Any] = (
            array.rows if hasattr(array, "rows") else (lambda start, stop: array[start:stop])
        )

    def _first_sum(self, b: int) -> Any:
        """The sums read whole and their digest checked (once), then sum ``b``."""
        loaded = np.asarray(self._sums, dtype=np.uint32)
        actual = sums_digest(loaded)
        if actual != self._digest:
            raise CacheCorruptError(
                f"{self.where}: the block sums of array {self.name!r} have digest {actual}, but the metadata records "
                f"{self._digest}: the metadata or the sums (with their rows) come from another cache, or were damaged; "
                "run `elmo-cache verify` on it, then rebuild or re-copy it"
            )
        self._sum_at = loaded.item
        return loaded.item(b)

    def check(self, b: int) -> None:
        """Check block ``b``; raises :class:`CacheCorruptError` naming the array, block and rows."""
        start = b * self.block_rows
        stop = min(self.n, start + self.block_rows)
        actual = crc32c(self._read(start, stop))
        expected = int(self._sum_at(b))
        if actual != expected:
            raise CacheCorruptError(
                f"{self.where}: rows {start}..{stop} (block {b}) of array {self.name!r} fail their CRC-32C "
                f"({actual:#010x}, recorded {expected:#010x}): the stored bytes changed after the build (a bit flip, "
                "a partial copy or sync); run `elmo-cache verify` on the cache, then rebuild or re-copy it"
            )
        with self._count_lock:  # two threads may pass the same block: count it once
            if not self.ok[b]:
                self.ok[b] = 1
                self.remaining -= 1

    def check_rows(self, start: int, stop: int) -> None:
        """Check every block holding a row of ``start:stop`` not checked yet."""
        if stop <= start:
            return  # no row read (an empty sentence or text)
        size = self.block_rows
        for b in range(start // size, (stop - 1) // size + 1):
            if not self.ok[b]:
                self.check(b)

    def check_all(self) -> None:
        for b in range(self.n_blocks):
            if not self.ok[b]:
                self.check(b)

    def searchsorted(self, value: Any) -> int:
        """Leftmost insertion point of ``value`` in this sorted 1-D array, checking every block it reads
        (a flipped hash in a block the search only passes through must not steer it to a miss)."""
        read, size = self._read, self.block_rows
        lo, hi = 0, self.n_blocks
        if hi == 0:
            return 0
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if not self.ok[mid]:
                self.check(mid)
            if read(mid * size, mid * size + 1)[0] < value:
                lo = mid
            else:
                hi = mid
        if not self.ok[lo]:
            self.check(lo)
        block = read(lo * size, min(self.n, (lo + 1) * size))
        return lo * size + int(np.searchsorted(block, value, side="left"))


def guards(where: Any, meta: dict[str, Any], arrays: dict[str, Any], sums: dict[str, Any]) -> dict[str, BlockGuard]:
    """A guard per array that has block sums (none for caches written before them: an empty dict).

    ``sums`` maps each array name to its sums array (None where absent). Raises :class:`CacheFormatError`
    when the metadata announces sums that are missing or of the wrong length (a partial copy).
    """
    recorded = (meta.get("checksums") or {}).get("blocks") if isinstance(meta.get("checksums"), dict) else None
    if recorded is None:
        return {}
    rows = recorded.get("rows") if isinstance(recorded, dict) else None
    digests = recorded.get("digests") if isinstance(recorded, dict) else None
    if not isinstance(rows, dict) or recorded.get("algorithm") != BLOCK_SUMS_ALGORITHM:
        raise CacheFormatError(
            f"{where}: metadata 'checksums.blocks' is not a {BLOCK_SUMS_ALGORITHM} block listing; the cache is corrupt"
        )
    result = {}
    # Every array opened (store.columns.cache_arrays: the built-in ones and the declared columns' the metadata
    # lists), in that order.
    for name in arrays:
        array = arrays.get(name)
        if array is None or name not in rows:
            continue
        block_rows, stored = rows[name], sums.get(name)
        if not isinstance(block_rows, int) or block_rows <= 0:
            raise CacheFormatError(f"{where}: metadata 'checksums.blocks.rows.{name}' is {block_rows!r}; corrupt")
        want = -(-int(array.shape[0]) // block_rows)
        if stored is None or stored.ndim != 1 or stored.shape[0] != want or np.dtype(stored.dtype).kind != "u":
            shape = None if stored is None else tuple(stored.shape)
            what = "missing" if shape is None else f"of shape {shape}"
            raise CacheCorruptError(
                f"{where}: array {block_sums_name(name)!r} (the block sums of {name!r}) is {what}, "
                f"expected ({want},); the cache is incomplete or damaged (a partial copy?): rebuild or re-copy it"
            )
        digest = digests.get(name) if isinstance(digests, dict) else None
        digest = digest if isinstance(digest, str) else None
        result[name] = BlockGuard(str(where), name, array, block_rows, stored, digest)
    return result


def sums_listing(
    vector_rows: int, optional: dict[str, int] | None = None, sums: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The metadata ``checksums.blocks`` of a cache whose ``vectors`` blocks are ``vector_rows`` rows;
    ``optional`` gives the block rows of the optional arrays it holds (``pooled``); ``sums`` each array's
    block sums, whose :func:`sums_digest` is recorded (``digests``)."""
    rows = {name: vector_rows if name == "vectors" else SMALL_BLOCK_ROWS for name in ARRAYS}
    listing: dict[str, Any] = {"algorithm": BLOCK_SUMS_ALGORITHM, "rows": {**rows, **(optional or {})}}
    if sums is not None:
        listing["digests"] = {name: sums_digest(values) for name, values in sums.items()}
    return listing
