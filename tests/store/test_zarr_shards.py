"""The zarr writer's vectors files (shards of whole chunks): crash windows, and the public primitives
(``create_group``, ``write_vectors_file``, ``finish_group``) giving the same bytes as ``ZarrWriter``."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest

import elmo_cache
from elmo_cache import store
from elmo_cache.store import Layout, Progress
from elmo_cache.store import zarr as zarr_store
from elmo_cache.store.format import staging_path
from elmo_cache.store.zarr import maps as zarr_maps
from elmo_cache.verify.checks import verify
from tests.contracts.store import DIM, _append, _metadata, _sentences

ROW = (2, DIM)


def layout(compression: str | None = None) -> Layout:
    return Layout("zarr", ROW, "float32", chunk_rows=3, compression=compression, shard_rows=6)


def write(output: Path, sentences, lay: Layout, *, crash=None, commit_every: int = 2) -> store.ZarrWriter:
    """Write and commit ``sentences``; ``crash(writer)`` is installed before the last commit."""
    progress = Progress(identity={"fmt": "zarr"})
    writer = store.ZarrWriter.create(
        output, lay, progress, _metadata(progress, complete=False, n_unique=0, row_shape=ROW)
    )
    rows = 0
    for k in range(0, len(sentences), commit_every):
        rows = _append(writer, sentences[k : k + commit_every], rows, k, ROW)
        if crash is not None and k + commit_every >= len(sentences):
            crash(writer)
        writer.commit(done=k + commit_every >= len(sentences))
    return writer


def finish(writer) -> Path:
    hashes, _ = writer.index()
    return writer.finalize(_metadata(writer.progress, complete=True, n_unique=len(hashes), row_shape=ROW))


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def check(output: Path, sentences) -> None:
    with elmo_cache.open(output) as cache:
        assert len(cache) == len(sentences)
        for i, expected in enumerate(sentences):
            np.testing.assert_array_equal(cache[i], expected.transpose(1, 0, 2))
    assert verify(output).ok


class Crash(Exception):
    pass


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_crash_after_finishing_files_but_before_the_commit_is_cut_back(tmp_path, monkeypatch, compression):
    sentences = _sentences(12, seed=3)
    reference = finish(write(tmp_path / "ref.zarr", sentences, layout(compression)))
    output = tmp_path / "c.zarr"

    def crash(writer):
        def fail(*args, **kwargs):
            raise Crash

        # progress.json is never written: the files finished by this commit must not count.
        monkeypatch.setattr("elmo_cache.store.staging.atomic_write_json", fail)

    with pytest.raises(Crash):
        write(output, sentences, layout(compression), crash=crash)
    monkeypatch.undo()
    committed = store.load_progress(output)
    assert 0 < committed.lines < 12
    resumed = store.ZarrWriter.resume(output, layout(compression), committed)
    _append(resumed, sentences[committed.lines :], committed.rows, committed.lines, ROW)
    resumed.commit(done=True)
    finish(resumed)
    check(output, sentences)
    assert files(output) == files(reference)


def test_a_failed_write_of_one_file_among_those_written_side_by_side_loses_nothing_committed(tmp_path, monkeypatch):
    """One append spans several vectors files, written by separate threads: when one of those writes fails (a
    full disk), the append raises that error once every other piece is done, and a resume from the last commit
    writes the same cache as an uninterrupted writer."""
    sentences = _sentences(12, seed=4)
    reference = finish(write(tmp_path / "ref.zarr", sentences, layout()))
    output = tmp_path / "c.zarr"
    real = zarr_store.writer._append_to
    spanned: list[int] = []

    def failing_second_piece(path, data):
        spanned.append(len(spanned))
        if len(spanned) == 2:  # the second file of the first append that spans several
            raise OSError(28, "No space left on device")
        real(path, data)

    def crash(writer):
        monkeypatch.setattr(zarr_store.writer, "_append_to", failing_second_piece)

    progress = Progress(identity={"fmt": "zarr"})
    writer = store.ZarrWriter.create(
        output, layout(), progress, _metadata(progress, complete=False, n_unique=0, row_shape=ROW)
    )
    rows = _append(writer, sentences[:4], 0, 0, ROW)
    writer.commit()
    crash(writer)
    with pytest.raises(OSError, match="No space left"):
        _append(writer, sentences[4:], rows, 4, ROW)  # 8 sentences of 1-4 rows: several 6-row files
    assert len(spanned) >= 3  # the pieces after the failed one were written too, before the error came
    writer.close()
    monkeypatch.undo()
    committed = store.load_progress(output)
    assert committed.lines == 4
    resumed = store.ZarrWriter.resume(output, layout(), committed)
    _append(resumed, sentences[4:], committed.rows, 4, ROW)
    resumed.commit(done=True)
    finish(resumed)
    check(output, sentences)
    assert files(output) == files(reference)


def test_a_crash_after_the_commit_but_before_publishing_is_finished_on_resume(tmp_path, monkeypatch):
    sentences = _sentences(12, seed=5)
    reference = finish(write(tmp_path / "ref.zarr", sentences, layout()))
    output = tmp_path / "c.zarr"

    def crash(writer):
        def fail():
            raise Crash

        monkeypatch.setattr(writer, "_after_commit", fail)

    with pytest.raises(Crash):
        write(output, sentences, layout(), crash=crash)
    committed = store.load_progress(output)
    assert committed.lines == 12 and committed.rows >= 6
    assert list((staging_path(output) / ".build").glob("shard-*.ready"))  # finished, not yet in place
    resumed = store.ZarrWriter.resume(output, layout(), committed)
    finish(resumed)
    check(output, sentences)
    assert files(output) == files(reference)


@pytest.mark.parametrize("compression", [None, "blosc-lz4"])
def test_primitives_write_the_same_cache_as_the_writer(tmp_path, compression):
    """What a distributed build does: files written in any order by anyone, then finished once."""
    sentences = _sentences(13, seed=8)
    lay = layout(compression)
    writer = write(tmp_path / "staged.zarr", sentences, lay)
    arrays, n_rows = writer.small_arrays(), writer.progress.rows
    rows = np.concatenate(sentences)
    meta = _metadata(writer.progress, complete=True, n_unique=len(arrays["index/hashes"]), row_shape=ROW)
    reference = finish(writer)

    staging = tmp_path / "other.zarr.partial"
    zarr_store.create_group(staging, lay, n_rows, _metadata(writer.progress, complete=False, n_unique=0, row_shape=ROW))
    zarr_store.create_group(staging, lay, n_rows, {})  # a rerun: nothing happens
    per_file = zarr_store.vectors_file_rows(lay)
    n_files = -(-n_rows // per_file)
    assert n_files >= 3
    sums = {}
    for k in reversed(range(n_files)):
        sums[k] = zarr_store.write_vectors_file(staging, lay, n_rows, k, rows[k * per_file : (k + 1) * per_file])
    with pytest.raises(ValueError, match="holds 6 rows"):
        zarr_store.write_vectors_file(staging, lay, n_rows, 0, rows[:5])
    output = zarr_store.finish_group(staging, tmp_path / "other.zarr", arrays, meta, sums)
    check(output, sentences)
    assert files(output) == files(reference)
    # Readable by whoever may read the rest of the cache (a temporary file of mkstemp's would be 0600).
    modes = {p.stat().st_mode & 0o777 for p in output.rglob("*") if p.is_file()}
    assert len(modes) == 1, modes


def test_create_group_refuses_another_shape(tmp_path):
    staging = tmp_path / "x.zarr.partial"
    zarr_store.create_group(staging, layout(), 10, {})
    with pytest.raises(elmo_cache.CacheFormatError, match="shape"):
        zarr_store.create_group(staging, layout(), 11, {})


def test_a_damaged_shard_index_is_found_by_open(tmp_path):
    output = finish(write(tmp_path / "c.zarr", _sentences(12, seed=6), layout()))
    with elmo_cache.open(output) as cache:
        last = cache._vectors.n_chunks - 1
    shard = output / "vectors" / "c" / str(last) / "0" / "0"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # inside the (offset, size) pairs
    shard.write_bytes(bytes(data))
    with pytest.raises(elmo_cache.CacheFormatError, match=f"shard {last} of array 'vectors'.*CRC-32C"):
        elmo_cache.open(output)
    assert not verify(output).ok


def test_more_files_than_the_open_files_limit(tmp_path, monkeypatch):
    """Files beyond the bound are closed and opened again as needed; no descriptor leaks."""
    monkeypatch.setattr(zarr_maps, "_max_open_files", lambda: 4)
    sentences = _sentences(40, seed=9)
    output = finish(write(tmp_path / "c.zarr", sentences, layout()))
    gc.collect()
    before = len(os.listdir("/proc/self/fd"))
    with elmo_cache.open(output) as cache:
        assert cache._vectors.n_chunks > 10
        for _ in range(2):
            for i, expected in enumerate(sentences):
                np.testing.assert_array_equal(cache[i], expected.transpose(1, 0, 2))
            assert len(cache._vectors._files) == 4
            # Each of the seven arrays holds at most 4 descriptors.
            assert len(os.listdir("/proc/self/fd")) - before <= 4 * 7
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before  # none of the reader's descriptors is left
