"""elmo_cache.open: round trips for every layout, lookups, and clear errors on bad caches."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import elmo_cache
from elmo_cache import Encoder
from elmo_cache.builder import BuildOptions, build
from elmo_cache.errors import (
    CacheCorruptError,
    CacheFormatError,
    CacheNotFoundError,
    CorpusError,
    ElmoCacheError,
    IncompleteCacheError,
)
from elmo_cache.model.random_model import write_random_model
from elmo_cache.selection import MixSpec
from elmo_cache.text.tokenize import tokenize
from elmo_cache.verify import verify

LINES = [
    "the cat sat on the mat .",
    "",
    "a dog barked",
    "the   cat sat on the mat .",  # same sentence as line 0 after tokenisation
    "\ufeffBOM line here",
    "one",
    "a much longer sentence that spans several chunks of rows in the zarr store when chunks are small",
    "a dog barked",
    "tail",
]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Encoder:
    options, weights = write_random_model(tmp_path_factory.mktemp("model"), "tiny", seed=3)
    return Encoder.load((options, weights))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def activations(encoder) -> list[np.ndarray]:
    return encoder.embed_batch([tokenize(line) for line in LINES])


@pytest.fixture
def make_cache(tmp_path, corpus, encoder):
    """Build a real cache of LINES (zarr chunks of 5 rows in files of 10, so sentences straddle files)."""

    def make(
        *, fmt="zarr", layers=(0, 1, 2), mix=None, dtype="float32", dedupe=False, compress=False, name="cache"
    ) -> Path:
        options = BuildOptions(
            output=tmp_path / (name + (".zarr" if fmt == "zarr" else ".h5")),
            layers=None if mix else ",".join(map(str, layers)),
            mix=MixSpec.from_raw(mix[0], gamma=mix[1]) if mix else None,
            fp16=dtype == "float16",
            compression="zstd" if compress else None,
            chunk_rows=5 if fmt == "zarr" else None,
            shard_rows=10 if fmt == "zarr" else None,
            dedupe=dedupe,
            progress=False,
        )
        return build(corpus, options, encoder=encoder).path

    return make


def direct(path: Path, i: int) -> np.ndarray:
    """Sentence i read with zarr / h5py themselves, independently of elmo_cache's reader."""
    if path.is_dir():
        import zarr

        group = zarr.open_group(str(path), mode="r")
        offset, length = int(group["offsets"][i]), int(group["lengths"][i])
        block = group["vectors"][offset : offset + length]
    else:
        with h5py.File(path, "r") as f:
            offset, length = int(f["offsets"][i]), int(f["lengths"][i])
            block = f["vectors"][offset : offset + length]
    return block.transpose(1, 0, 2) if block.ndim == 3 else block


def expected(act: np.ndarray, *, layers=(0, 1, 2), mix=None) -> np.ndarray:
    import torch

    if mix is not None:
        return MixSpec.from_raw(mix[0], gamma=mix[1]).apply(torch.from_numpy(act)).numpy()
    return act[list(layers)]


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
                np.testing.assert_allclose(got.astype(np.float32), want, rtol=2**-10, atol=1e-4)
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


# -- bad caches ------------------------------------------------------------------------------


def set_metadata(path: Path, **changes) -> None:
    if path.is_dir():
        meta_file = path / "zarr.json"
        group = json.loads(meta_file.read_text())
        group["attributes"]["elmo_cache"].update(changes)
        meta_file.write_text(json.dumps(group))
    else:
        with h5py.File(path, "r+") as f:
            meta = json.loads(f.attrs["elmo_cache"])
            meta.update(changes)
            f.attrs["elmo_cache"] = json.dumps(meta)


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_incomplete_cache(make_cache, fmt):
    path = make_cache(fmt=fmt)
    set_metadata(path, complete=False)
    with pytest.raises(IncompleteCacheError, match="has not finished.*running the same build command again") as info:
        elmo_cache.open(path)
    assert str(path) in str(info.value)
    with elmo_cache.open(path, allow_incomplete=True) as cache:
        assert cache.complete is False
        np.testing.assert_array_equal(cache[0], direct(path, 0))


def test_missing_and_foreign_paths(tmp_path):
    with pytest.raises(CacheNotFoundError, match="nope.zarr"):
        elmo_cache.open(tmp_path / "nope.zarr")
    text = tmp_path / "corpus.txt"
    text.write_text("hello world\n")
    with pytest.raises(CacheFormatError, match="corpus.txt.*neither a zarr v3 directory nor an HDF5 file"):
        elmo_cache.open(text)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(CacheFormatError, match="empty_dir.*without zarr.json"):
        elmo_cache.open(tmp_path / "empty_dir")
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["x"] = np.arange(3)
    with pytest.raises(CacheFormatError, match="other.h5.*not an elmo-cache store"):
        elmo_cache.open(tmp_path / "other.h5")
    # every error here is also catchable as the library's base class
    with pytest.raises(ElmoCacheError):
        elmo_cache.open(tmp_path / "other.h5")


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_unsupported_version_and_bad_metadata(make_cache, fmt):
    path = make_cache(fmt=fmt)
    set_metadata(path, format_version=7)
    with pytest.raises(CacheFormatError, match=r"unsupported format_version 7.*\[1, 2\]"):
        elmo_cache.open(path)
    set_metadata(path, format_version=2, kind="layered", dtype="float64")
    with pytest.raises(CacheFormatError, match="kind 'layered'.*dtype 'float64'"):
        elmo_cache.open(path)


def replace_array(path: Path, name: str, data: np.ndarray | None) -> None:
    """Replace (or with None, delete) one array of a cache."""
    if path.is_dir():
        import zarr

        shutil.rmtree(path / name)
        if data is not None:
            group = zarr.open_group(str(path), mode="r+")
            group.create_array(
                name, shape=data.shape, chunks=(max(1, data.shape[0]),), dtype=data.dtype, compressors=None
            )[...] = data
    else:
        with h5py.File(path, "r+") as f:
            del f[name]
            if data is not None:
                f.create_dataset(name, data=data)


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_corrupt_arrays(make_cache, fmt):
    n = len(LINES)
    cases = [
        ("offsets", None, "array 'offsets' is missing"),
        ("lengths", np.zeros(n, np.int64), "array 'lengths' has dtype int64, expected int32"),
        ("lengths", np.zeros(n - 1, np.int32), "'offsets'.*'lengths'.*same length"),
        ("index/hashes", None, "array 'index/hashes' is missing"),
    ]
    original = make_cache(fmt=fmt)
    for k, (name, data, message) in enumerate(cases):
        path = original.with_name(f"c{k}{original.suffix}")
        (shutil.copytree if fmt == "zarr" else shutil.copy)(original, path)
        replace_array(path, name, data)
        with pytest.raises(CacheFormatError, match=message) as info:
            elmo_cache.open(path)
        assert str(path) in str(info.value)


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_offsets_beyond_vectors(make_cache, fmt):
    from elmo_cache.store._blocksums import block_sums
    from elmo_cache.store.format import SMALL_BLOCK_ROWS

    path = make_cache(fmt=fmt)
    with elmo_cache.open(path) as cache:
        offsets = np.array(cache._offsets)
    offsets[5] = cache._n_rows  # sentence 5 has one token: now it points past the end
    replace_array(path, "offsets", offsets)
    # Damage after the build: the block sum of 'offsets' catches it on the first read of the block.
    with (
        elmo_cache.open(path) as cache,
        pytest.raises(CacheCorruptError, match=r"rows 0\.\.\d+ \(block 0\) of array 'offsets' fail"),
    ):
        cache[4]
    # Wrong offsets with matching sums (a writer's bug): the bounds still refuse rows past the end, and
    # verify finds the inconsistency. (The consecutive-rows check is left to caches without block sums:
    # with them, a bit flip is the sums' job, and warm reads stay within 1.2x of unchecked ones.)
    replace_array(path, "blocksums/offsets", block_sums(offsets, SMALL_BLOCK_ROWS))
    with elmo_cache.open(path) as cache:
        np.testing.assert_array_equal(cache[3], direct(path, 3))
        np.testing.assert_array_equal(cache[4], direct(path, 4))  # its own offset and length are right
        with pytest.raises(CacheFormatError, match=r"sentence 5 spans rows .* 'vectors' has \d+ rows"):
            cache[5]
    assert not verify(path).ok


def test_a_cache_without_block_sums_checks_consecutive_rows(make_cache):
    """Caches built before block sums: a damaged offset is caught by the rows' consecutiveness."""
    from elmo_cache.store.format import metadata_checksum

    path = make_cache(fmt="hdf5")
    with h5py.File(path, "r+") as f:
        meta = json.loads(f.attrs["elmo_cache"])
        del meta["checksums"]["blocks"]
        for name in [name for name in f if name.startswith("blocksums")]:
            del f[name]
        meta["checksums"]["metadata"] = metadata_checksum(meta)
        f.attrs["elmo_cache"] = json.dumps(meta)
        f["offsets"][5] = f["offsets"][5] + 1
    with elmo_cache.open(path) as cache:
        assert not cache._guards
        np.testing.assert_array_equal(cache[3], direct(path, 3))
        with pytest.raises(CacheFormatError, match=r"sentence 4 ends at row \d+ but the next one starts at row"):
            cache[4]


def test_wrong_vector_shape(make_cache):
    path = make_cache(fmt="hdf5", layers=(1, 2))
    set_metadata(path, layers=[0, 1, 2])
    with pytest.raises(CacheFormatError, match=r"'vectors' has shape \(\d+, 2, 32\), expected \(n_rows, 3, 32\)"):
        elmo_cache.open(path)


def test_truncated_zarr_chunk(make_cache):
    path = make_cache()
    # A middle file (rows 20..29) is checked when first read ...
    shard = path / "vectors" / "c" / "2" / "0" / "0"
    shard.write_bytes(shard.read_bytes()[:100])
    with elmo_cache.open(path) as cache:
        inside = int(np.flatnonzero((np.asarray(cache._offsets) // 10 == 2) & (cache.lengths > 0))[0])
        with pytest.raises(CacheFormatError, match="shard 2 of array 'vectors' has 100 bytes"):
            cache[inside]
    # ... the first and the last by open itself.
    last = (json.loads((path / "zarr.json").read_text())["attributes"]["elmo_cache"]["n_rows"] - 1) // 10
    for c in (0, last):
        shard = path / "vectors" / "c" / str(c) / "0" / "0"
        whole = shard.read_bytes()
        shard.write_bytes(whole[:100])
        with pytest.raises(CacheFormatError, match=f"c/{c}/0/0: shard {c} of array 'vectors' has 100 bytes"):
            elmo_cache.open(path)
        shard.write_bytes(whole)


def test_sharded_files_are_what_zarr_writes(make_cache, tmp_path):
    """The writer lays out shards itself (streaming, no copy); zarr must write the very same bytes."""
    import zarr

    path = make_cache()
    vectors = zarr.open_array(store=str(path), path="vectors", mode="r")
    again = zarr.create_array(
        str(tmp_path / "again.zarr"),
        shape=vectors.shape,
        chunks=vectors.chunks,
        shards=vectors.shards,
        dtype=vectors.dtype,
        compressors=None,
        fill_value=0,
    )
    with zarr.config.set({"array.write_empty_chunks": True}):
        again[...] = vectors[...]
    files = sorted(p.relative_to(path / "vectors") for p in (path / "vectors" / "c").rglob("*") if p.is_file())
    assert len(files) == -(-vectors.shape[0] // 10) > 2
    for name in files:
        assert (path / "vectors" / name).read_bytes() == (tmp_path / "again.zarr" / name).read_bytes(), name


def test_shard_laid_out_by_another_tool_is_read(make_cache):
    """A valid shard whose inner chunks are not back to back (here: swapped) is still read right."""
    import google_crc32c

    path = make_cache()
    with elmo_cache.open(path) as cache:
        before = [np.array(cache[i]) for i in range(len(cache))]  # copies: views would see the rewrite
    shard = path / "vectors" / "c" / "0" / "0" / "0"
    data = shard.read_bytes()
    chunk = (len(data) - 2 * 16 - 4) // 2  # two inner chunks, then the index and its CRC-32C
    index = np.frombuffer(data[2 * chunk : -4], dtype="<u8").reshape(2, 2).copy()
    index[:, 0] = index[::-1, 0]
    body = index.tobytes()
    shard.write_bytes(data[chunk : 2 * chunk] + data[:chunk] + body + google_crc32c.value(body).to_bytes(4, "little"))
    with elmo_cache.open(path) as cache:
        for i, expected in enumerate(before):
            np.testing.assert_array_equal(cache[i], expected)


def test_chunked_hdf5_dataset_is_refused(make_cache):
    path = make_cache(fmt="hdf5")
    with h5py.File(path, "r+") as f:
        data = f["vectors"][...]
        del f["vectors"]
        f.create_dataset("vectors", data=data, chunks=True, compression="gzip")
    with pytest.raises(CacheFormatError, match="'vectors' is chunked, compressed or compact.*contiguous"):
        elmo_cache.open(path)


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_interrupted_build_is_reported_as_incomplete(tmp_path, encoder, fmt):
    corpus = tmp_path / "bad.txt"
    corpus.write_bytes(b"good line one\nanother good line\n" * 3 + b"bad \xff byte\nnever read\n")
    output = tmp_path / ("out.zarr" if fmt == "zarr" else "out.h5")
    with pytest.raises(CorpusError):
        build(corpus, BuildOptions(output=output, commit_seconds=0, progress=False), encoder=encoder)
    staging = output.with_name(output.name + ".partial")
    assert staging.is_dir() and not output.exists()
    for path in (output, staging):
        for allow in (False, True):  # nothing readable before the build finishes
            with pytest.raises(IncompleteCacheError, match="interrupted.*running the same build command again") as info:
                elmo_cache.open(path, allow_incomplete=allow)
            assert str(path) in str(info.value)
