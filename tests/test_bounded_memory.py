"""The build's corpus-sized structures stay on disk: the sentence index sorted in runs, tokens/offsets copied."""

from __future__ import annotations

import numpy as np
import pytest

from elmo_cache.store._sort import index_in_memory, sort_index
from elmo_cache.store._staging import offsets_after_zero


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
def test_build_with_the_index_sorted_in_runs_writes_the_same_cache(tmp_path, tiny_model, monkeypatch, fmt):
    from elmo_cache.builder import BuildOptions, build
    from elmo_cache.store import _sort, open_with_library
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
    monkeypatch.setattr(_sort, "RUN_ITEMS", 7)
    runs = run("runs")
    assert sorted(runs) == sorted(reference) and len(reference["index/hashes"]) < len(reference["offsets"])
    for name in reference:
        np.testing.assert_array_equal(runs[name], reference[name], err_msg=name)
