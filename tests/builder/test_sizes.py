"""Default zarr chunking (elmo_cache/builder/sizes.py): the byte rules, and small corpora in small chunks
(issue 35, item 9) that a resume and a rebuild find again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import elmo_cache
from elmo_cache import Encoder
from elmo_cache.builder import BuildOptions, build, default_chunk_rows, default_shard_rows
from elmo_cache.builder.sizes import SMALL_CORPUS_CHUNKS
from elmo_cache.errors import CacheExistsError
from elmo_cache.text.corpus import Corpus
from elmo_cache.verify.checks import verify
from tests._build_fixtures import assert_same_cache, corpus_lines, failing_on, raw_arrays, write_corpus

# The bundled model's three float32 layers of 256: the byte rule gives 1024 rows (3 MiB) per chunk.
BUNDLED_ROW_BYTES = 3 * 256 * 4


def disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def bundled_encoder(bundled_model):
    return Encoder.load(bundled_model, device="cpu")


def test_the_corpus_rule_caps_the_byte_rule_at_the_corpus_rounded_to_16_rows():
    assert default_chunk_rows(BUNDLED_ROW_BYTES) == 1024  # no corpus size known: the byte rule alone
    assert [default_chunk_rows(BUNDLED_ROW_BYTES, n) for n in (0, 1, 5, 16, 17, 600, 1010, 1024)] == [
        16, 16, 16, 16, 32, 608, 1024, 1024
    ]  # fmt: skip
    # Past one chunk: equal chunks, each within the byte rule, padded by under 16 rows.
    assert [default_chunk_rows(BUNDLED_ROW_BYTES, n) for n in (1025, 2110, 3000, 4096)] == [528, 704, 1008, 1024]
    assert default_chunk_rows(BUNDLED_ROW_BYTES, 10**6) == 1024  # a large corpus keeps the byte rule
    assert default_shard_rows(1024, BUNDLED_ROW_BYTES) == 16 * 1024  # 48 MiB: the row cap (MAX_SHARD_ROWS)
    assert default_shard_rows(512, 6144) == 21 * 512  # the Original's fp16 layers: 63 MiB, whole chunks in 64 MiB
    assert default_chunk_rows(64) == 1024 and default_shard_rows(1024, 64) == 16 * 1024  # small rows: the caps
    assert default_shard_rows(16, BUNDLED_ROW_BYTES, 5) == 16  # one chunk's shard: an index of one entry
    assert default_shard_rows(608, BUNDLED_ROW_BYTES, 600) == 608
    assert default_shard_rows(1024, BUNDLED_ROW_BYTES, 3000) == 3 * 1024
    assert default_shard_rows(1024, BUNDLED_ROW_BYTES, 10**9) == 16 * 1024


def test_count_tokens_stops_past_its_limit_and_knows_no_pipe(tmp_path):
    corpus = write_corpus(tmp_path / "c.txt", ["a b c", "", "d e"])
    assert Corpus(corpus).count_tokens(5) == 5
    assert Corpus(corpus).count_tokens(4) is None
    assert Corpus(corpus, tokenize="ptb").count_tokens(10) == 5
    assert Corpus("-").count_tokens(100) is None  # stdin is read once, by the build


def test_a_5_token_zarr_cache_is_small_on_disk_and_reads_its_vectors(tmp_path, bundled_encoder):
    corpus = write_corpus(tmp_path / "c.txt", ["The cat sat on mats"])
    cache = build(corpus, BuildOptions(output=tmp_path / "c.zarr", progress=False), encoder=bundled_encoder).path
    # Measured: 3,159,911 bytes before (one 1024-row chunk, padded), 61,983 after; HDF5 is 33,912.
    assert disk_bytes(cache) < 200_000
    with elmo_cache.open(cache) as opened:
        assert (opened.metadata["chunk_rows"], opened.metadata["shard_rows"]) == (16, 16)
        np.testing.assert_array_equal(opened[0], bundled_encoder.embed_sentence(["The", "cat", "sat", "on", "mats"]))
    assert verify(cache).ok


def test_a_corpus_past_a_few_default_chunks_keeps_the_byte_rules(tmp_path, bundled_encoder):
    assert SMALL_CORPUS_CHUNKS * default_chunk_rows(BUNDLED_ROW_BYTES) == 4096
    corpus = write_corpus(tmp_path / "c.txt", [f"{i} " + " ".join(["word"] * 9) for i in range(420)])
    cache = build(corpus, BuildOptions(output=tmp_path / "c.zarr", progress=False), encoder=bundled_encoder).path
    meta, _ = raw_arrays(cache)
    assert meta["n_tokens"] == 4200  # not counted to the end: the scan stopped past 4096
    assert (
        (meta["chunk_rows"], meta["shard_rows"])
        == (1024, default_shard_rows(1024, BUNDLED_ROW_BYTES))
        == (
            1024,
            16 * 1024,
        )
    )


def test_options_asked_for_win_and_a_defaulted_shard_still_fits_the_corpus(tmp_path, tiny_encoder):
    corpus = write_corpus(tmp_path / "c.txt", ["a b c d e"])
    both = build(corpus, BuildOptions(output=tmp_path / "b.zarr", chunk_rows=64, shard_rows=128, progress=False),
                 encoder=tiny_encoder).path  # fmt: skip
    chunk = build(corpus, BuildOptions(output=tmp_path / "c.zarr", chunk_rows=64, progress=False),
                  encoder=tiny_encoder).path  # fmt: skip
    assert (raw_arrays(both)[0]["chunk_rows"], raw_arrays(both)[0]["shard_rows"]) == (64, 128)
    assert (raw_arrays(chunk)[0]["chunk_rows"], raw_arrays(chunk)[0]["shard_rows"]) == (64, 64)


def test_a_resumed_build_chunks_as_its_first_run(tmp_path, tiny_encoder):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False)
    reference = build(corpus, BuildOptions(output=tmp_path / "reference.zarr", **options), encoder=tiny_encoder)
    meta, _ = raw_arrays(reference.path)
    # 1,342 tokens of 384-byte rows: two chunks of 672 rows (the row cap is 1,024), in one file of 1,344 rows.
    assert meta["n_tokens"] == 1342 and (meta["chunk_rows"], meta["shard_rows"]) == (672, 1344)
    output = tmp_path / "resumed.zarr"
    for fail_at in (7, 3):
        with failing_on(tiny_encoder, fail_at), pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0
    assert_same_cache(output, reference.path)


def test_a_cache_or_interrupted_build_of_other_chunking_is_this_build_when_none_is_asked(tmp_path, tiny_encoder):
    """Caches built under other defaults (earlier versions: one 8192-row chunk here) are not refused as built
    with other options; an interrupted one resumes in its own chunking."""
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False)
    old = dict(chunk_rows=8192, shard_rows=8192)
    complete = build(corpus, BuildOptions(output=tmp_path / "complete.zarr", **options, **old), encoder=tiny_encoder)
    again = build(corpus, BuildOptions(output=complete.path, **options), encoder=tiny_encoder)
    assert again.already_complete
    output = tmp_path / "resumed.zarr"
    with failing_on(tiny_encoder, 5), pytest.raises(RuntimeError, match="simulated crash"):
        build(corpus, BuildOptions(output=output, **options, **old), encoder=tiny_encoder)
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0
    meta, arrays = raw_arrays(output)
    assert (meta["chunk_rows"], meta["shard_rows"]) == (8192, 8192)
    _, want = raw_arrays(complete.path)
    for name, array in want.items():
        np.testing.assert_array_equal(arrays[name], array, err_msg=name)
    # --overwrite replaces what is there: nothing is adopted.
    rebuilt = build(corpus, BuildOptions(output=complete.path, overwrite=True, **options), encoder=tiny_encoder)
    assert (raw_arrays(rebuilt.path)[0]["chunk_rows"], raw_arrays(rebuilt.path)[0]["shard_rows"]) == (672, 1344)
    # A chunking asked for is still compared: the cache there is not one of 16-row chunks.
    with pytest.raises(CacheExistsError, match="chunk_rows: 8192 there, 16 now"):
        build(corpus, BuildOptions(output=output, chunk_rows=16, **options), encoder=tiny_encoder)
