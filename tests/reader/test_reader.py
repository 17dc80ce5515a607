"""elmo_cache.open: round trips for every layout, lookups, memory mapping."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest

import elmo_cache
from elmo_cache.errors import (
    CacheCorruptError,
)
from elmo_cache.text.tokenize import tokenize
from tests.reader_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    LINES,
    activations,
    corpus,
    direct,
    encoder,
    expected,
    make_cache,
)

LAYOUTS = [
    pytest.param(dict(fmt="zarr"), id="zarr-all-fp32"),
    pytest.param(dict(fmt="zarr", layers=(1, 2), dtype="float16"), id="zarr-12-fp16"),
    pytest.param(dict(fmt="zarr", layers=(0,), dedupe=True), id="zarr-0-dedupe"),
    pytest.param(dict(fmt="zarr", mix=((0.2, 0.3, 0.5), 1.5), dtype="float16"), id="zarr-mix-fp16"),
    pytest.param(dict(fmt="zarr", layers=(0, 2), compress=True, dedupe=True), id="zarr-02-compressed-dedupe"),
    pytest.param(dict(fmt="zarr", mix=((0.1, 0.1, 0.8), 1.0), compress=True), id="zarr-mix-compressed"),
    pytest.param(dict(fmt="hdf5"), id="hdf5-all-fp32"),
    pytest.param(dict(fmt="hdf5", layers=(2,), dtype="float16", dedupe=True), id="hdf5-2-fp16-dedupe"),
    pytest.param(dict(fmt="hdf5", mix=((0.5, 0.25, 0.25), 0.7)), id="hdf5-mix-fp32"),
    pytest.param(dict(fmt="hdf5", mix=((0.3, 0.3, 0.4), 2.0), dtype="float16", dedupe=True), id="hdf5-mix-fp16-dedupe"),
]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_round_trip(make_cache, activations, layout):
    path = make_cache(**layout)
    layers = layout.get("layers", (0, 1, 2))
    mix = layout.get("mix")
    dtype = layout.get("dtype", "float32")
    with elmo_cache.open(path) as cache:
        assert len(cache) == len(LINES)
        assert cache.kind == ("mix" if mix else "layers")
        assert cache.layers == (None if mix else tuple(layers))
        assert cache.dtype == np.dtype(dtype)
        assert cache.dim == 32
        assert cache.complete
        assert cache.format == layout["fmt"]
        assert cache.metadata["n_sentences"] == len(LINES)
        assert cache.metadata["dedupe"] == layout.get("dedupe", False)
        np.testing.assert_array_equal(cache.lengths, [len(tokenize(line)) for line in LINES])
        for i, act in enumerate(activations):
            want = expected(act, layers=layers, mix=mix)
            got = cache[i]
            assert got.dtype == np.dtype(dtype)
            assert got.shape == want.shape
            # exactly the stored bytes, as zarr / h5py read them ...
            np.testing.assert_array_equal(got, direct(path, i))
            # ... which are the encoder's vectors (fp32 up to batch-dependent BLAS rounding; fp16 rounding)
            if dtype == "float16":
                # half a float16 unit in the last place, of a float32 value within batch round-off (1e-5)
                np.testing.assert_allclose(got.astype(np.float32), want, rtol=2**-11, atol=1e-5)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if layout.get("dedupe"):
            assert cache.metadata["n_rows"] < cache.metadata["n_tokens"]
        # lookups by text and by tokens, first occurrence for repeats
        assert cache.find(LINES[3]) == 0
        assert cache.find(tokenize(LINES[7])) == 2
        assert cache.find("BOM line here") == 4
        assert cache.find("not in the corpus") is None
        assert cache.get("not in the corpus") is None
        np.testing.assert_array_equal(cache.get("tail"), cache[8])
        assert "one" in cache and "two" not in cache


def test_indexing(make_cache):
    with elmo_cache.open(make_cache(layers=(1, 2))) as cache:
        n = len(cache)
        np.testing.assert_array_equal(cache[-1], direct(cache.path, n - 1))
        np.testing.assert_array_equal(cache[-n], direct(cache.path, 0))
        assert cache[1].shape == (2, 0, 32)  # the empty line
        part = cache[2:6:2]
        assert isinstance(part, list) and len(part) == 2
        np.testing.assert_array_equal(part[1], cache[4])
        picked = cache[np.array([6, 0, -1])]
        assert [p.shape[1] for p in picked] == [len(tokenize(LINES[6])), 7, 1]
        mask = np.zeros(n, dtype=bool)
        mask[[3, 5]] = True
        assert [p.shape[1] for p in cache[mask]] == [7, 1]
        assert cache[[]] == []
        for bad in (n, -n - 1, [0, n]):
            with pytest.raises(IndexError, match=f"out of range.*{n} sentences"):
                cache[bad]
        with pytest.raises(TypeError, match="cache.get"):
            cache["the cat"]
        assert not cache[0].flags.writeable
        assert sum(1 for _ in cache) == n


def test_zarr_vectors_are_memory_mapped_and_chunk_straddling_reads(make_cache):
    path = make_cache()
    with elmo_cache.open(path) as cache:
        assert is_mapped(cache._vectors._load_chunk(0)) and is_mapped(cache[2])
        offsets = np.asarray(cache._offsets)
        starts, stops = offsets // 10, (offsets + cache.lengths - 1) // 10
        assert np.any((stops > starts) & (cache.lengths > 0))  # some sentences straddle files
        for i in range(len(cache)):
            np.testing.assert_array_equal(cache[i], direct(path, i))


def is_mapped(array: np.ndarray) -> bool:
    """Whether an array is a view of a memory map (not a copy in process memory)."""
    import mmap

    base = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def test_hdf5_arrays_are_memory_mapped(make_cache):
    with elmo_cache.open(make_cache(fmt="hdf5")) as cache:
        assert is_mapped(cache[0]) and is_mapped(cache.lengths)
        assert is_mapped(cache._hashes) and is_mapped(cache._offsets)


def test_missing_zarr_vectors_file_is_an_error_not_zeros(make_cache):
    """zarr itself reads an absent shard as the fill value (zeros); a finished cache must refuse it: the
    sentences of that file raise, naming the file, and the others still read right."""
    import zarr

    path = make_cache()
    with elmo_cache.open(path) as cache:
        before = [np.array(cache[i]) for i in range(len(cache))]
        offsets, lengths = np.array(cache._offsets), np.array(cache.lengths)
    (path / "vectors" / "c" / "1" / "0" / "0").unlink()
    reference = zarr.open_array(store=str(path), path="vectors", mode="r")[...]
    assert not reference[10:20].any() and reference[:10].any()  # what zarr would have served
    hit = 0
    with elmo_cache.open(path) as cache:
        for i, expected in enumerate(before):
            start, stop = int(offsets[i]), int(offsets[i] + lengths[i])
            if stop > start and start < 20 and stop > 10:
                with pytest.raises(CacheCorruptError, match=r"vectors/c/1/0/0: file 1 of array 'vectors' is missing"):
                    cache[i]
                hit += 1
            else:
                np.testing.assert_array_equal(cache[i], expected)
    assert hit


def test_v2_chunk_key_encoding(make_cache):
    import zarr

    path = make_cache()
    with elmo_cache.open(path) as cache:
        before = list(cache)
    data = zarr.open_array(store=str(path), path="vectors", mode="r")[...]
    shutil.rmtree(path / "vectors")
    group = zarr.open_group(str(path), mode="r+")
    array = group.create_array(
        "vectors",
        shape=data.shape,
        chunks=(4, 3, 32),
        dtype=data.dtype,
        compressors=None,
        chunk_key_encoding={"name": "v2", "separator": "."},
    )
    array[...] = data
    assert (path / "vectors" / "1.0.0").is_file()
    with elmo_cache.open(path) as cache:
        assert isinstance(cache._vectors._load_chunk(1), np.ndarray) and cache._vectors.chunk_rows == 4
        for i, sentence in enumerate(before):
            np.testing.assert_array_equal(cache[i], sentence)


def test_close_context_manager_and_pickle(make_cache):
    path = make_cache(fmt="hdf5")
    cache = elmo_cache.open(path)
    clone = pickle.loads(pickle.dumps(cache))
    np.testing.assert_array_equal(clone[2], cache[2])
    kept = cache[0]
    want = np.array(kept)
    with cache:
        pass
    assert cache.closed
    with pytest.raises(ValueError, match="closed"):
        cache[0]
    np.testing.assert_array_equal(kept, want)  # arrays handed out stay valid


def test_index_types_are_checked(make_cache):
    """A bool, a float or a numeric string is no sentence number (``True`` used to read sentence 1);
    numpy integers and integer or boolean arrays still index (issue 33, item 8)."""
    with elmo_cache.open(make_cache(layers=(1, 2))) as cache:
        n = len(cache)
        for bad in (True, False, np.True_, np.array(True), 1.0, np.float64(2), "1", b"1", None, 1 + 0j):
            with pytest.raises(TypeError):
                cache[bad]
        for bad in (True, 1.0, "1", np.float32(3)):
            with pytest.raises(TypeError, match="sentence numbers are integers"):
                cache.tokens(bad)
            if not isinstance(bad, str):  # a string is a text to look up there
                with pytest.raises(TypeError):
                    cache.sentence_vector(bad, pool="mean")
        for good in (np.int64(4), np.int32(4), np.uint8(4), np.intp(4 - n)):
            np.testing.assert_array_equal(cache[good], direct(cache.path, 4))
        assert cache.tokens(np.int64(0)) == tokenize(LINES[0])
        np.testing.assert_array_equal(cache.sentence_vector(np.int64(0), pool="mean"), cache.sentence_vector(0, "mean"))
        for picked in (cache[np.array([4, 0], dtype=np.int64)], cache[[4, 0]], cache[np.array([4, 0], np.uint16)]):
            np.testing.assert_array_equal(picked[0], direct(cache.path, 4))
            np.testing.assert_array_equal(picked[1], direct(cache.path, 0))
        mask = np.zeros(n, dtype=bool)
        mask[[0, 4]] = True
        for chosen in (cache[mask], cache[mask.tolist()]):
            assert len(chosen) == 2
            np.testing.assert_array_equal(chosen[1], direct(cache.path, 4))
        with pytest.raises(TypeError, match="integer/boolean arrays"):
            cache[np.array([1.0, 2.0])]
