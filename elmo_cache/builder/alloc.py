"""Memory of a long build: glibc's heap kept from creeping, and window buffers used again.

glibc serves a ``malloc`` of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap``, returned to the
system on ``free``, and smaller ones from its heap arenas (one per thread), where freed blocks stay
resident and fragment. The threshold is dynamic by default: each freed mapped block raises it to that
block's size (up to 32 MiB). A build frees and reallocates tensors and arrays of 1-32 MiB for every batch
from several threads (torch intermediates, the rows of each batch), so with the defaults its resident heap
crept up window after window (anonymous memory at the end of a 250k-token build with the bundled model:
786 MB with the defaults, 229 MB with the threshold fixed at 1 MiB; benchmarks/RESULTS.md).

A threshold of 1 MiB bounded memory but made every block of 1 MiB or more a fresh mapping, and filling
fresh memory costs a page fault per 4 KiB (0.43 GB/s on this project's 2-core CPU against 8.15 GB/s for
memory used before): builds with the bundled model ran 1.4x longer (1.07x with the Original shape, whose
model work dwarfs its allocations). So the heap now serves blocks up to 32 MiB again and keeps
them while a window is encoded (:func:`fix_mmap_threshold`, with the trim threshold the dynamic default
would reach, so that the top of the heap is not handed back and faulted in again batch after batch), and
:func:`trim_heap` hands every arena's free pages back once per window: memory cannot creep from window to
window, and only the first touch per window pays the faults (bundled model, 1M tokens: 99 s and 0.24 GB of
anonymous memory at the end, against 142 s and 0.25 GB with the 1 MiB threshold; benchmarks/RESULTS.md
"The build's heap").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import threading

import numpy as np

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "WindowBuffers", "fix_mmap_threshold", "trim_heap"]

MMAP_THRESHOLD = 32 << 20
"""Bytes from which glibc maps a block of its own (returned on free) once :func:`fix_mmap_threshold` ran: the
largest the dynamic threshold reaches on 64-bit glibc, fixed so that it stays there."""
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD
"""Free bytes at the top of the heap that glibc keeps instead of returning them at once (its dynamic default
sets twice the mmap threshold; a fixed threshold would leave it at 128 KiB)."""

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
_done = False


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (has ``mallopt`` and ``malloc_trim``), else None (musl, macOS...)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = (ctypes.c_size_t,), ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` and its trim threshold at :data:`TRIM_THRESHOLD`
    (once per process); False where not glibc. A build then calls :func:`trim_heap` once per window."""
    global _done
    if _done:
        return True
    libc = _glibc()
    if libc is None:
        return False
    _done = bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    return _done


def trim_heap() -> bool:
    """Hand the free pages of every glibc heap arena back to the system (``malloc_trim(0)``); False where not
    glibc. Once per window: what a window's batches freed does not stay resident into the next."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)  # its result says whether any memory went back: none may have been free
    return True


class WindowBuffers:
    """Buffers for windows' rows, handed out again once the writer is done with them.

    A window's rows (up to ~1 GB at the CUDA defaults) would otherwise be a fresh mapping each time (see the
    threshold above), and the host then pays a page fault for every 4 KiB it fills: filling fresh memory ran at
    0.43 GB/s on this project's CPU and 2.51 GB/s on an H100 machine's, against 8.15 and 5.99 GB/s for memory
    filled before (``benchmarks/bench_disk.py``). At most ``keep`` free buffers are held (a build has three
    windows alive: one encoded, one queued, one written), so resident memory stays at the build's peak.

    Thread-safe: the encoding thread takes (:meth:`empty`), the writer thread gives back (:meth:`release`) once
    it has written the rows and kept no reference to them.
    """

    def __init__(self, keep: int = 3):
        self.keep = keep
        self._free: list[np.ndarray] = []  # uint8 blocks, smallest first
        self._lent: dict[int, np.ndarray] = {}  # the address of each array handed out -> its block
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialised array of ``shape`` and ``dtype`` (as ``numpy.empty``), in a block used before where
        one is free and large enough."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        with self._lock:
            fitting = next((i for i, block in enumerate(self._free) if block.nbytes >= nbytes), None)
            block = self._free.pop(fitting) if fitting is not None else None
        if block is None:
            # Windows vary in size: a margin saves a new block for a window slightly larger than the last.
            block = np.empty(nbytes + nbytes // 4, dtype=np.uint8)
        array = block[:nbytes].view(dtype).reshape(shape)
        if nbytes:
            with self._lock:
                self._lent[array.ctypes.data] = block
        return array

    def release(self, array: np.ndarray) -> None:
        """Take back an array :meth:`empty` handed out (anything else is ignored); the caller keeps no
        reference to it or to views of it."""
        with self._lock:
            block = self._lent.pop(array.ctypes.data, None) if array.size else None
            if block is None:
                return
            self._free.append(block)
            self._free.sort(key=lambda b: b.nbytes)
            if len(self._free) > self.keep:
                self._free.pop(0)  # the smallest: the larger serve every window it would
