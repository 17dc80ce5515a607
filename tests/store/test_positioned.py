"""elmo_cache.store.positioned: arrays read by position from files, checked against numpy on the same bytes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from elmo_cache.errors import CacheCorruptError
from elmo_cache.store import positioned
from elmo_cache.store.hdf5.read import DatasetRows
from elmo_cache.store.positioned import OpenFile, PositionedRows


class Striped(PositionedRows):
    """Chunk c of ``chunk_rows`` rows in file c (what the zarr readers do), for the interface alone."""

    def __init__(self, directory, data: np.ndarray, chunk_rows: int):
        super().__init__("striped", data.shape, data.dtype, chunk_rows)
        self.files = []
        for c in range(self.n_chunks):
            path = directory / f"chunk{c}"
            path.write_bytes(np.ascontiguousarray(data[c * chunk_rows : (c + 1) * chunk_rows]).tobytes())
            self.files.append(OpenFile(str(path), os.open(path, os.O_RDONLY)))

    def _source(self, c):
        return self.files[c], 0


def _dataset(tmp_path, data: np.ndarray, offset: int = 100) -> DatasetRows:
    path = tmp_path / "data.bin"
    path.write_bytes(b"\xee" * offset + data.tobytes() + b"\xee" * 7)
    return DatasetRows("values", data.shape, data.dtype, OpenFile(str(path), os.open(path, os.O_RDONLY)), offset)


@pytest.mark.parametrize("chunk_rows", [1, 3, 7, 1000])
def test_rows_items_and_indexing_equal_numpy(tmp_path, chunk_rows):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((23, 2, 5)).astype(np.float16)
    array = Striped(tmp_path, data, chunk_rows)
    for start in range(0, 24, 2):
        for stop in range(start, 24, 3):
            got = array.rows(start, stop)
            np.testing.assert_array_equal(got, data[start:stop])
            assert not got.flags.writeable
    np.testing.assert_array_equal(array[5], data[5])
    np.testing.assert_array_equal(array[-1], data[-1])
    np.testing.assert_array_equal(array[2:20:3], data[2:20:3])
    np.testing.assert_array_equal(array[[4, 0, 22]], data[[4, 0, 22]])
    whole = np.asarray(array)
    assert whole.flags.writeable  # a fresh array of the caller's
    np.testing.assert_array_equal(whole, data)
    with pytest.raises(IndexError, match="out of range"):
        array[23]


def test_one_dimensional_arrays_are_read_a_page_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(positioned, "PAGE_BYTES", 64)  # 8 int64 entries a page
    monkeypatch.setattr(positioned, "PAGE_CACHE_BYTES", 3 * 64)
    data = np.arange(100, dtype=np.int64) * 3
    array = _dataset(tmp_path, data)
    assert [array.item(i) for i in range(100)] == data.tolist()
    assert array[37] == data[37]
    assert len(array._pages) <= 3  # bounded: first in, first out


def test_searchsorted_is_numpys(tmp_path, monkeypatch):
    monkeypatch.setattr(positioned, "PAGE_BYTES", 32)  # 4 uint64 hashes a page: many pages
    rng = np.random.default_rng(1)
    data = np.sort(rng.integers(0, 2**64, size=50, dtype=np.uint64))
    data[10:14] = data[10]  # repeats: the leftmost is found
    array = _dataset(tmp_path, data)
    probes = [*data.tolist(), 0, 2**64 - 1, *(rng.integers(0, 2**64, size=50, dtype=np.uint64).tolist())]
    for value in probes:
        assert array.searchsorted(np.uint64(value)) == int(np.searchsorted(data, np.uint64(value), side="left"))
    assert _dataset(tmp_path, np.empty(0, dtype=np.uint64)).searchsorted(np.uint64(5)) == 0


def test_a_file_truncated_after_opening_is_an_error_naming_the_rows(tmp_path):
    data = np.arange(40, dtype=np.float32).reshape(10, 4)
    array = _dataset(tmp_path, data, offset=16)
    np.testing.assert_array_equal(array.rows(0, 10), data)
    os.truncate(tmp_path / "data.bin", 16 + 5 * 16 + 3)  # rows 0..4 whole, row 5 cut
    np.testing.assert_array_equal(array.rows(0, 5), data[:5])  # what is still there reads right
    ends = r"data.bin: the file ends at byte 99, but rows 4..7 of dataset 'values'"
    with pytest.raises(CacheCorruptError, match=ends):
        array.rows(4, 7)
    with pytest.raises(CacheCorruptError, match="truncated"):
        array[9]


def test_reads_keep_reading_a_file_renamed_over(tmp_path):
    """The descriptor is the file that was opened: a file renamed over it is not read (a consistent view)."""
    data = np.arange(12, dtype=np.int32)
    array = _dataset(tmp_path, data)
    other = tmp_path / "other.bin"
    other.write_bytes(b"\x00" * 200)
    other.replace(tmp_path / "data.bin")
    np.testing.assert_array_equal(array.rows(0, 12), data)


def test_descriptors_close_when_nothing_reads_through_them(tmp_path):
    import gc

    array = _dataset(tmp_path, np.arange(5, dtype=np.int64))
    fd = array._where[0].fd
    link = f"/proc/self/fd/{fd}"
    assert os.readlink(link) == str(tmp_path / "data.bin")
    part = array.rows(0, 2)
    del array
    gc.collect()
    assert not os.path.exists(link) or os.readlink(link) != str(tmp_path / "data.bin")
    assert part.tolist() == [0, 1]  # what was read stays valid
