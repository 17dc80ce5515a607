"""elmo_cache.builder.alloc: window buffers used again, and a build that uses them stores what one without does."""

from __future__ import annotations

import numpy as np
import pytest

import elmo_cache.builder.local as local
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.alloc import WindowBuffers
from tests._build_fixtures import assert_same_cache, corpus_lines, write_corpus


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
