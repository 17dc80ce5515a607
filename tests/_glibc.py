"""What the heap tests share: whether this C library is glibc with ``mallinfo2``, and the lines a child script
starts with to read it (the heap's settings are the whole process's, so those tests measure in a child)."""

from __future__ import annotations

import ctypes
import sys

import pytest

__all__ = ["MALLINFO2", "has_mallinfo2", "needs_mallinfo2"]

MALLINFO2 = """
import ctypes

class Info(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
"""
"""Child-script lines that bind ``libc`` (glibc) with ``libc.mallinfo2()`` returning its fields by name."""


def has_mallinfo2() -> bool:
    """Whether this C library is glibc 2.33 or later (mallopt, malloc_trim, mallinfo2)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


needs_mallinfo2 = pytest.mark.skipif(not has_mallinfo2(), reason="needs glibc's mallinfo2 (libc.so.6, glibc 2.33+)")
