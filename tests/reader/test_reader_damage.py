"""elmo_cache.open on bad caches: clear errors naming the problem, never a wrong vector."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.errors import (
    CacheCorruptError,
    CacheFormatError,
    CacheNotFoundError,
    CorpusError,
    ElmoCacheError,
    IncompleteCacheError,
)
from elmo_cache.verify.checks import verify
from tests.reader_fixtures import (  # noqa: F401 (fixtures: pytest finds them by name)
    LINES,
    activations,
    corpus,
    direct,
    encoder,
    expected,
    make_cache,
)

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
    with pytest.raises(CacheFormatError, match=r"unsupported format_version 7.*\[1, 2, 3, 4, 5\]"):
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
    from elmo_cache.store.blocksums import block_sums, sums_digest
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
    sums = block_sums(offsets, SMALL_BLOCK_ROWS)
    replace_array(path, "blocksums/offsets", sums)
    # Sums replaced after the build no longer match the digest the metadata records of them.
    with (
        elmo_cache.open(path) as cache,
        pytest.raises(CacheCorruptError, match=r"block sums of array 'offsets' have digest .* metadata records"),
    ):
        cache[4]
    meta = elmo_cache.open(path).metadata
    meta["checksums"]["blocks"]["digests"]["offsets"] = sums_digest(sums)
    set_metadata(path, checksums=meta["checksums"])
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
        del meta["checksums"]["blocks"], meta["checksums_required"]  # as written before block sums
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


def _flip_row(path: Path, row: int) -> None:
    """Flip one bit of a float of row ``row`` of a make_cache zarr cache's vectors (raw chunks of 5 rows in
    shard files of 10, back to back from the file's start)."""
    meta = json.loads((path / "zarr.json").read_text())["attributes"]["elmo_cache"]
    assert meta["chunk_rows"] == 5 and meta["compression"] is None
    row_bytes = 3 * meta["dim"] * 4  # three float32 layers
    shard = path / "vectors" / "c" / str(row // 10) / "0" / "0"
    with open(shard, "r+b") as f:
        f.seek((row % 10) * row_bytes + 4 * 7 + 2)  # a middle byte of the 8th float: a visible change
        byte = f.read(1)[0]
        f.seek(-1, 1)
        f.write(bytes([byte ^ 0x40]))


# LINES[6] (18 tokens) is rows 21..38: blocks 4..7 of 5 rows; LINES[5] is row 20 (block 4), LINES[7] rows
# 39..41 (block 7).
STRADDLING = 6


def test_a_straddling_sentence_is_checked_beyond_its_first_block(make_cache):
    """Damage in the second block of a sentence whose first block already passed (through another sentence)
    is found, never returned as a vector."""
    path = make_cache(fmt="zarr")
    with elmo_cache.open(path) as cache:
        assert (cache.lengths[5], cache.lengths[STRADDLING]) == (1, 18)
    _flip_row(path, 26)  # block 5
    with elmo_cache.open(path) as cache:
        np.testing.assert_array_equal(cache[5], direct(path, 5))  # block 4 passes
        with pytest.raises(CacheCorruptError, match=r"rows 25\.\.30 \(block 5\) of array 'vectors' fail"):
            cache[STRADDLING]
    report = verify(path)
    assert not report.ok and "CRC-32" in report.problems[0]


def test_a_sentence_spanning_three_blocks_is_checked_in_its_middle_block(make_cache):
    """Blocks 4 and 7 pass through the sentences before and after; block 5, only ever read by LINES[6], is damaged."""
    path = make_cache(fmt="zarr")
    _flip_row(path, 26)
    with elmo_cache.open(path) as cache:
        np.testing.assert_array_equal(cache[5], direct(path, 5))
        np.testing.assert_array_equal(cache[7], direct(path, 7))
        with pytest.raises(CacheCorruptError, match=r"\(block 5\) of array 'vectors' fail"):
            cache[STRADDLING]


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


# -- files that change under an open reader (issue 33) ----------------------------------------

_READ_THROUGH_A_TRUNCATION = """
import os, sys
import numpy as np
import elmo_cache

path, victim, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
cache = elmo_cache.open(path)
before = [np.array(cache[i]) for i in range(len(cache))]  # every file read once (mapped, by older readers)
os.truncate(victim, keep)
failed, message = [], ""
for i in range(len(cache)):
    try:
        vectors = cache[i]
        float(np.asarray(vectors, dtype=np.float64).sum())  # touch every byte
        assert np.array_equal(vectors, before[i]), f"sentence {i} changed"
    except elmo_cache.CacheCorruptError as exc:
        failed.append(i)
        message = str(exc)
print(len(failed), failed[:1], message, sep="\\n")
"""


def _cut_inside_vectors(path: Path) -> tuple[Path, int]:
    """The file holding the first rows of 'vectors' and a length that cuts through sentence 0's rows."""
    if path.is_dir():
        return path / "vectors" / "c" / "0" / "0" / "0", 64
    with h5py.File(path, "r") as f:
        return path, int(f["vectors"].id.get_offset()) + 64


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_a_file_truncated_under_an_open_reader_is_an_error_not_a_crash(make_cache, fmt):
    """A mapped reader died with SIGBUS (exit 135) when a file shrank under it; now the reads of the lost rows
    raise CacheCorruptError naming the file, and every other sentence still reads what it read before.
    In a child process: on a reader that maps files the crash must not take pytest down."""
    import subprocess
    import sys

    path = make_cache(fmt=fmt)
    victim, keep = _cut_inside_vectors(path)
    child = subprocess.run(
        [sys.executable, "-c", _READ_THROUGH_A_TRUNCATION, str(path), str(victim), str(keep)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, f"reader died (exit {child.returncode}): {child.stderr[-2000:]}"
    count, first, message = child.stdout.strip().split("\n", 2)
    assert int(count) >= 1 and first == "[0]", child.stdout
    assert str(victim) in message and "truncated" in message and "'vectors'" in message


def test_a_zarr_file_replaced_under_an_open_reader(make_cache, tmp_path, monkeypatch):
    """A file renamed over by another of the same size (other rows, a valid shard index): while the reader keeps
    the file open it reads the bytes it checked (a consistent view); opened again, the other file is an error,
    never its rows (its block was checked the first time and is not checked again)."""
    from elmo_cache.store.zarr import maps as zarr_maps

    path = make_cache()
    shard = path / "vectors" / "c" / "1" / "0" / "0"
    original = shard.read_bytes()
    replacement = tmp_path / "replacement"

    def replace() -> None:
        replacement.write_bytes(bytes(255 - x for x in original[:64]) + original[64:])  # rows changed, index kept
        replacement.replace(shard)

    with elmo_cache.open(path) as cache:
        inside = int(np.flatnonzero((np.asarray(cache._offsets) // 10 == 1) & (cache.lengths > 0))[0])
        first = np.array(cache[inside])
        replace()
        np.testing.assert_array_equal(cache[inside], first)  # the descriptor it holds: the old file
    shard.write_bytes(original)
    monkeypatch.setattr(zarr_maps, "_max_open_files", lambda: 1)  # every other file read closes this one
    with elmo_cache.open(path) as cache:
        np.testing.assert_array_equal(cache[inside], first)
        np.testing.assert_array_equal(cache[0], direct(path, 0))  # shard 0: shard 1 is closed
        replace()
        with pytest.raises(CacheCorruptError, match="c/1/0/0: file 1 of array 'vectors' is not the file this reader"):
            cache[inside]
        np.testing.assert_array_equal(cache[0], direct(path, 0))  # the rest still reads
