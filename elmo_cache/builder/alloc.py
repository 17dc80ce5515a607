"""Memory of a long build: a fixed glibc mmap threshold, and window buffers used again.

glibc serves a ``malloc`` of at least ``M_MMAP_THRESHOLD`` bytes with its own ``mmap``, returned to the
system on ``free``. The threshold is dynamic by default: each freed mapped block raises it to that
block's size (up to 32 MiB), after which blocks of that size come from the heap arenas instead, and
there, once freed, they stay resident and fragment (one arena per thread). A build frees and
reallocates tensors and arrays of 1-32 MiB for every batch from several threads (torch intermediates,
the rows of each batch), so its resident heap crept up batch after batch: with the bundled model,
anonymous memory at the end of a 250k-token build was 786 MB with the default, 229 MB with the
threshold fixed at 1 MiB (benchmarks/RESULTS.md, "Bounded build memory"). Setting the threshold once
turns the dynamic adjustment off for the process; blocks of 1 MiB and more then cost one ``mmap`` each,
negligible next to the encoding they serve.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import threading

import numpy as np

__all__ = ["MMAP_THRESHOLD", "WindowBuffers", "fix_mmap_threshold"]

MMAP_THRESHOLD = 1 << 20
"""Bytes from which glibc maps a block of its own (returned on free) once :func:`fix_mmap_threshold` ran."""

_M_MMAP_THRESHOLD = -3  # malloc.h
_done = False


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at :data:`MMAP_THRESHOLD` (once per process); False where not glibc."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt, nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    _done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return _done


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
