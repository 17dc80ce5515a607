"""elmo_cache.builder.alloc: glibc's heap kept within a window and handed back at its end, window buffers used
again, and a build that uses them stores what one without does."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import elmo_cache.builder.encoding as encoding
import elmo_cache.builder.local as local
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.alloc import MMAP_THRESHOLD, WindowBuffers
from tests._build_fixtures import assert_same_cache, corpus_lines, write_corpus
from tests._glibc import MALLINFO2, needs_mallinfo2

# Run in a child: the thresholds are the whole process's. Prints what the heap did with blocks of each size.
_HEAP = (
    MALLINFO2
    + """
import sys
from elmo_cache.builder.alloc import MMAP_THRESHOLD, fix_mmap_threshold, trim_heap

libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)

def anon():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))

assert fix_mmap_threshold()
if sys.argv[1] == "mapped":
    for size in (16 << 20, MMAP_THRESHOLD + (1 << 20)):  # a batch's block (1-32 MiB), and a larger one
        before = libc.mallinfo2().hblkhd
        block = libc.malloc(size)
        print(libc.mallinfo2().hblkhd - before)
        libc.free(block)
else:
    size = 4 << 20
    blocks = [libc.malloc(size) for _ in range(40)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    before = anon()
    for block in blocks[:-1]:  # the last one stays in use, above the freed ones: nothing is at the heap's top
        libc.free(block)
    if sys.argv[1] == "trim":
        assert trim_heap()
    print(before - anon())
"""
)


def _heap(case: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", _HEAP, case], capture_output=True, text=True, check=True).stdout
    return [int(line) for line in out.split()]


@needs_mallinfo2
def test_the_heap_serves_blocks_under_the_threshold_and_maps_larger_ones():
    under, over = _heap("mapped")
    assert under == 0  # 16 MiB from the heap: used again by the next batch, no fresh pages
    assert over >= MMAP_THRESHOLD  # its own mapping, returned on free


@needs_mallinfo2
def test_trimming_hands_the_pages_a_window_freed_back_to_the_system():
    freed = 39 * (4 << 20)
    (kept,) = _heap("keep")
    (trimmed,) = _heap("trim")
    # RssAnon given back between the blocks filled and the blocks freed: without a trim the freed blocks stay
    # resident (the heap's top is in use, so no automatic trim reaches them); a trim hands them back.
    assert kept < freed // 4
    assert trimmed > freed * 3 // 4


def test_every_window_ends_with_the_heap_trimmed(tmp_path, tiny_encoder, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(120, seed=5))
    trims = 0
    windows = 0

    def counted_trim():
        nonlocal trims
        trims += 1
        return True

    class Counting(WindowBuffers):
        def empty(self, shape, dtype):
            nonlocal windows
            windows += 1
            return super().empty(shape, dtype)

    monkeypatch.setattr(encoding, "trim_heap", counted_trim)
    monkeypatch.setattr(local, "WindowBuffers", Counting)
    options = BuildOptions(output=tmp_path / "out.zarr", batch_tokens=32, window_batches=1, progress=False)
    build(corpus, options, encoder=tiny_encoder)
    assert windows >= 10 and trims == windows


def address(array: np.ndarray) -> int:
    return array.ctypes.data


def test_a_released_block_serves_the_next_window_that_fits():
    buffers = WindowBuffers()
    first = buffers.empty((100, 2, 8), np.float16)
    first[...] = 1
    spot = address(first)
    buffers.release(first)
    smaller = buffers.empty((90, 2, 8), np.float16)
    assert address(smaller) == spot and smaller.shape == (90, 2, 8) and smaller.dtype == np.float16
    # While it is lent, another window gets other memory.
    other = buffers.empty((90, 2, 8), np.float16)
    assert address(other) != spot
    other[...] = 2
    assert np.all(smaller.view(np.uint16) == np.float16(1).view(np.uint16))


def test_a_window_larger_than_every_free_block_gets_a_new_one():
    buffers = WindowBuffers()
    small = buffers.empty((10, 4), np.float32)
    buffers.release(small)
    large = buffers.empty((1000, 4), np.float32)
    assert address(large) != address(small) and large.nbytes == 16000
    buffers.release(large)
    # The small block is still there for a small window; the large one serves the large ones.
    assert address(buffers.empty((10, 4), np.float32)) == address(small)
    assert address(buffers.empty((900, 4), np.float32)) == address(large)


def test_at_most_keep_free_blocks_are_held_the_largest_kept():
    buffers = WindowBuffers(keep=2)
    lent = [buffers.empty((n, 8), np.float32) for n in (10, 20, 30)]
    spots = [address(a) for a in lent]
    for array in lent:
        buffers.release(array)
    # The two largest stay: windows of 25 and 15 rows get them, the smallest block is gone.
    got = {address(buffers.empty((25, 8), np.float32)), address(buffers.empty((15, 8), np.float32))}
    assert got == {spots[1], spots[2]}


def test_arrays_it_did_not_lend_are_ignored():
    buffers = WindowBuffers()
    foreign = np.empty((50, 8), np.float32)
    buffers.release(foreign)
    buffers.release(np.empty((0, 8), np.float32))
    assert address(buffers.empty((50, 8), np.float32)) != address(foreign)
    empty = buffers.empty((0, 8), np.float32)
    assert empty.shape == (0, 8)
    buffers.release(empty)


def test_releasing_twice_lends_a_block_once():
    buffers = WindowBuffers()
    array = buffers.empty((10, 8), np.float32)
    buffers.release(array)
    buffers.release(array)
    a, b = buffers.empty((10, 8), np.float32), buffers.empty((10, 8), np.float32)
    assert address(a) != address(b)


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_a_build_uses_few_blocks_for_many_windows_and_stores_what_fresh_memory_would(
    tmp_path, tiny_encoder, monkeypatch, fmt
):
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(120, seed=3))
    suffix = ".zarr" if fmt == "zarr" else ".h5"
    blocks: set[int] = set()
    windows = 0

    class Counting(WindowBuffers):
        def empty(self, shape, dtype):
            nonlocal windows
            array = super().empty(shape, dtype)
            windows += 1
            blocks.add(address(array))
            return array

    def options(name):
        return BuildOptions(output=tmp_path / (name + suffix), batch_tokens=32, window_batches=1, progress=False)

    monkeypatch.setattr(local, "WindowBuffers", Counting)
    build(corpus, options("reused"), encoder=tiny_encoder)
    assert windows >= 10 and len(blocks) <= 4  # three windows alive at once, and a larger one now and then
    # Every window in fresh memory: the same bytes.
    monkeypatch.setattr(local, "WindowBuffers", lambda: WindowBuffers(keep=0))
    build(corpus, options("fresh"), encoder=tiny_encoder)
    assert_same_cache(tmp_path / ("reused" + suffix), tmp_path / ("fresh" + suffix))
