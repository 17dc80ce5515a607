"""Keeping the C heap of a long build from growing: a fixed glibc mmap threshold.

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

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold"]

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
