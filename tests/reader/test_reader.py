"""elmo_cache.open: round trips for every layout, lookups, memory mapping."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

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


def test_zarr_chunk_straddling_reads(make_cache):
    path = make_cache()
    with elmo_cache.open(path) as cache:
        offsets = np.asarray(cache._offsets)
        starts, stops = offsets // 10, (offsets + cache.lengths - 1) // 10
        assert np.any((stops > starts) & (cache.lengths > 0))  # some sentences straddle files
        for i in range(len(cache)):
            np.testing.assert_array_equal(cache[i], direct(path, i))


def mapped_files() -> set[str]:
    """The files this process has memory-mapped now (Linux /proc/self/maps)."""
    with open("/proc/self/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc/self/maps")
@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_no_file_of_the_cache_is_mapped(make_cache, fmt):
    """Reads copy out of the files (elmo_cache.store.positioned): a file truncated under a mapping would
    kill the reader with SIGBUS. Every kind of read leaves no mapping of any file of the cache, and what
    it returned owns its memory."""
    path = make_cache(fmt=fmt)
    with elmo_cache.open(path) as cache:
        returned = [cache[i] for i in range(len(cache))]
        returned += [cache.lengths, cache.sentence_vector(0, pool="mean"), np.asarray(cache._hashes)]
        assert cache.find(LINES[0]) == 0 and cache.tokens(2) == ["a", "dog", "barked"]
        root = str(path.resolve())
        assert not {name for name in mapped_files() if name.startswith(root)}
        for array in returned:
            base = array
            while getattr(base, "base", None) is not None:
                base = base.base
            assert isinstance(base, np.ndarray)  # not an mmap, memoryview or memmap


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
        for mixed in ([True, 2], (0, np.True_), [4, False]):  # numpy would read the bool as 1 or 0
            with pytest.raises(TypeError, match="integer/boolean arrays"):
                cache[mixed]


def test_text_lookups_split_as_the_build_did(tmp_path, corpus, encoder):
    """A PTB-tokenised cache finds a sentence whatever spacing its text has; a whitespace one as before."""
    from elmo_cache.builder import BuildOptions, build

    text = tmp_path / "ptb.txt"
    text.write_text('The cat\'s on the mat.\nHe said, "no."\n', encoding="utf-8")
    ptb = build(text, BuildOptions(output=tmp_path / "p.zarr", tokenize="ptb", progress=False), encoder=encoder).path
    plain = build(text, BuildOptions(output=tmp_path / "w.zarr", progress=False), encoder=encoder).path
    with elmo_cache.open(ptb) as cache, elmo_cache.open(plain) as other:
        assert cache.tokenization == "ptb" and other.tokenization == "whitespace"
        # zarr caches are version 5 (their windows start vectors files), which holds version 3's keys.
        assert cache.metadata["format_version"] == other.metadata["format_version"] == 5
        assert cache.tokens(0) == ["The", "cat", "'s", "on", "the", "mat", "."]
        assert other.tokens(0) == ["The", "cat's", "on", "the", "mat."]
        for query in ("The cat's on the mat.", "The cat 's on the mat .", "  The cat's   on the mat. "):
            assert cache.find(query) == 0
            np.testing.assert_array_equal(cache.get(query), cache[0])
            assert query in cache
        assert cache.find('He said , " no . "') == 1
        assert other.find("The cat 's on the mat .") is None and other.find("The cat's on the mat.") == 0
        np.testing.assert_array_equal(
            cache.sentence_vector("The cat's on the mat.", pool="mean"), cache.sentence_vector(0, pool="mean")
        )
        assert cache.find(["The", "cat's", "on", "the", "mat."]) is None  # a token list is taken as it is
    from elmo_cache.verify.checks import verify

    # verify --corpus reads the corpus the way the cache records it was split
    assert verify(ptb, corpus=text).ok and verify(plain, corpus=text).ok
    text.write_text('The cat\'s on the mat!\nHe said, "no."\n', encoding="utf-8")
    assert not verify(ptb, corpus=text).ok
