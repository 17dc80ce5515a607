"""The build's corpus-sized structures stay on disk: the sentence index sorted in runs, tokens/offsets copied."""

from __future__ import annotations

import numpy as np
import pytest

from elmo_cache.store.sentence_index import index_in_memory, sort_index
from elmo_cache.store.staging import offsets_after_zero


@pytest.mark.parametrize("n, run_items", [(0, 4), (5, 8), (1000, 64), (1000, 1000), (1001, 1000), (5000, 7)])
def test_sort_index_in_runs_equals_sorting_in_memory(tmp_path, n, run_items):
    rng = np.random.default_rng(n)
    # Few distinct values, so repeats cross run and block boundaries; extremes included.
    values = np.array([0, 1, 2**64 - 1, 12345, 2**63], dtype=np.uint64)
    hashes = values[rng.integers(0, len(values), n)] if n else np.empty(0, np.uint64)
    hashes[: n // 3] = rng.integers(0, 2**63, n // 3, dtype=np.uint64)
    want = index_in_memory(hashes)
    got = sort_index(lambda a, b: hashes[a:b], n, tmp_path / "index", run_items=run_items)
    assert got[0].dtype == np.uint64 and got[1].dtype == np.int64
    np.testing.assert_array_equal(np.asarray(got[0]), want[0])
    np.testing.assert_array_equal(np.asarray(got[1]), want[1])


def test_sort_index_reads_at_most_a_run_at_a_time(tmp_path):
    hashes = np.random.default_rng(0).integers(0, 50, 10_000, dtype=np.uint64)
    reads: list[int] = []

    def read(a: int, b: int) -> np.ndarray:
        reads.append(b - a)
        return hashes[a:b]

    got = sort_index(read, len(hashes), tmp_path / "index", run_items=512)
    assert max(reads) <= 512 and sum(reads) == len(hashes)
    np.testing.assert_array_equal(np.asarray(got[1]), index_in_memory(hashes)[1])
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == ["index-hashes.bin", "index-rows.bin"]


def test_offsets_after_zero(tmp_path):
    ends = np.cumsum(np.arange(1, 11, dtype=np.int64))
    ends.tofile(tmp_path / "ends.bin")
    got = offsets_after_zero(tmp_path / "ends.bin", 7, tmp_path / "out.bin")
    np.testing.assert_array_equal(got, np.concatenate([[0], ends[:7]]))


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_build_with_index_and_dedupe_on_disk_writes_the_same_cache(tmp_path, tiny_model, monkeypatch, fmt):
    from elmo_cache.builder import BuildOptions, build, dedupe
    from elmo_cache.store import open_with_library, sentence_index
    from tests._build_fixtures import corpus_lines, write_corpus

    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(300))

    def run(name: str) -> dict[str, np.ndarray]:
        options = BuildOptions(
            output=tmp_path / f"{name}.{'zarr' if fmt == 'zarr' else 'h5'}",
            options_file=tiny_model[0],
            weight_file=tiny_model[1],
            dedupe=True,
            progress=False,
            batch_tokens=256,
        )
        _, _, arrays, close = open_with_library(build(corpus, options).path)
        try:
            return {name: np.array(array[...]) for name, array in arrays.items() if array is not None}
        finally:
            close()

    reference = run("memory")
    monkeypatch.setattr(sentence_index, "RUN_ITEMS", 7)
    monkeypatch.setattr(dedupe, "MEMORY_ITEMS", 3)  # dedupe's first occurrences spill to disk after 3
    runs = run("runs")
    assert sorted(runs) == sorted(reference) and len(reference["index/hashes"]) < len(reference["offsets"])
    for name in reference:
        np.testing.assert_array_equal(runs[name], reference[name], err_msg=name)


def test_seen_sentences_on_disk_answer_as_in_memory(tmp_path):
    from elmo_cache.builder.dedupe import SeenSentences

    rng = np.random.default_rng(1)
    memory, disk = SeenSentences(), SeenSentences(tmp_path / "seen", memory_items=50)
    universe = rng.permutation(np.arange(1, 5000, dtype=np.uint64) * np.uint64(2**50 + 3))
    added = 0
    for _ in range(40):
        hashes = universe[added : added + int(rng.integers(0, 60))]
        added += len(hashes)
        columns = (hashes, rng.integers(0, 10**9, len(hashes)), rng.integers(1, 99, len(hashes)).astype(np.int32))
        checks = rng.integers(0, 2**63, len(hashes), dtype=np.uint64)
        for seen in (memory, disk):
            seen.add(*columns, checks)
        ask = rng.choice(universe[: added + 100], 300)
        for a, b in zip(memory.lookup(ask), disk.lookup(ask)):
            np.testing.assert_array_equal(a, b)
    # Bounded: at most memory_items entries in memory, the rest in O(log n) files.
    assert sum(len(run[0]) for run in disk.runs) < 50 and 1 <= len(disk.disk) <= 8
    disk.close()
    assert not (tmp_path / "seen").exists()


def test_seen_sentences_rebuild_on_disk_equals_in_memory(tmp_path, monkeypatch):
    from elmo_cache.builder import dedupe

    monkeypatch.setattr(dedupe, "_REBUILD_LINES", 16)
    monkeypatch.setattr(dedupe, "MEMORY_ITEMS", 5)
    rng = np.random.default_rng(2)
    hashes = rng.integers(0, 40, 500).astype(np.uint64)
    lengths = np.where(hashes % 7 == 0, 0, 1 + hashes % 5).astype(np.int32)
    offsets = np.arange(500, dtype=np.int64) * 3
    keys = lambda i: str(int(hashes[i])).encode()  # noqa: E731
    memory = dedupe.SeenSentences.rebuild(hashes, offsets, lengths, keys)
    disk = dedupe.SeenSentences.rebuild(hashes, offsets, lengths, keys, tmp_path / "seen")
    everything = np.arange(45, dtype=np.uint64)
    for a, b in zip(memory.lookup(everything), disk.lookup(everything)):
        np.testing.assert_array_equal(a, b)
    found, got_offsets, _, _ = memory.lookup(everything)
    for h in range(40):  # the first non-empty occurrence of each hash
        lines = np.flatnonzero((hashes == h) & (lengths > 0))
        assert found[h] == bool(len(lines)) and (not len(lines) or got_offsets[h] == offsets[lines[0]])


def test_resume_with_dedupe_on_disk_equals_an_uninterrupted_build(tmp_path, tiny_encoder, monkeypatch):
    from elmo_cache.builder import BuildOptions, build, dedupe
    from elmo_cache.store import load_progress, open_with_library
    from tests._build_fixtures import corpus_lines, failing_on, write_corpus

    monkeypatch.setattr(dedupe, "MEMORY_ITEMS", 4)
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(160, seed=3))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False, dedupe=True)

    def arrays(path) -> dict[str, np.ndarray]:
        _, _, found, close = open_with_library(path)
        try:
            return {name: np.array(array[...]) for name, array in found.items() if array is not None}
        finally:
            close()

    reference = build(corpus, BuildOptions(output=tmp_path / "reference.zarr", **options), encoder=tiny_encoder)
    output = tmp_path / "resumed.zarr"
    for fail_at in (6, 9):  # crashes after some commits: the rerun rebuilds the dedupe state from them
        with failing_on(tiny_encoder, fail_at), pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert 0 < load_progress(output).lines < 160
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    want, got = arrays(reference.path), arrays(output)
    assert len(want["index/hashes"]) < len(want["offsets"])  # repeats were shared
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
