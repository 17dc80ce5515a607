"""builder/plan.py: options checked against each other and the corpus before anything is written, the
output path, the defaults that wait for the model's width, and the identity a cache is compared by."""

from __future__ import annotations

from pathlib import Path

import pytest

from elmo_cache.builder.options import BuildOptions
from elmo_cache.builder.plan import (
    comparable_identity,
    default_output,
    differences,
    identity,
    make_plan,
    resolve_output,
)
from elmo_cache.errors import InvalidParameterError
from elmo_cache.text.corpus import Corpus
from tests._build_fixtures import corpus_lines, write_corpus

MODEL = {"name": "tiny", "weights_sha256": "ab" * 32, "options": {"lstm": {"dim": 8}}}


@pytest.fixture
def corpus(tmp_path) -> Corpus:
    return Corpus(write_corpus(tmp_path / "news.txt", corpus_lines(5)))


def test_the_default_output_sits_beside_the_corpus_with_the_containers_suffix():
    assert default_output("data/news.txt", "zarr") == Path("data/news.zarr")
    assert default_output("data/news.txt.gz", "zarr") == Path("data/news.zarr")
    assert default_output("data/news.txt", "hdf5") == Path("data/news.h5")
    assert default_output("data/news", "hdf5") == Path("data/news.h5")


def test_the_format_comes_from_the_suffix_or_the_option_and_they_must_agree(corpus, tmp_path):
    assert make_plan(corpus, BuildOptions(output=tmp_path / "x.h5")).format == "hdf5"
    assert make_plan(corpus, BuildOptions(format="hdf5")).output == tmp_path / "news.h5"
    assert make_plan(corpus, BuildOptions()).format == "zarr"  # the registry's first container
    with pytest.raises(InvalidParameterError, match=r"format: --format zarr contradicts the output suffix '\.h5'"):
        make_plan(corpus, BuildOptions(output=tmp_path / "x.h5", format="zarr"))
    with pytest.raises(InvalidParameterError, match="format.*choose from"):
        make_plan(corpus, BuildOptions(format="parquet"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (BuildOptions(output="s3://bucket/x.zarr"), "output: 's3://bucket/x.zarr' is a URL"),
        (BuildOptions(batch_tokens=0), "batch_tokens: must be positive, got 0"),
        (BuildOptions(precision="fp8"), r"precision: 'fp8' is not valid; choose from \["),
        (BuildOptions(initial_state="carry"), "initial_state: 'carry' is not valid for a build"),
        (BuildOptions(window_batches=0), "window_batches: must be positive, got 0"),
        (BuildOptions(commit_seconds=-1), "commit_seconds: must be >= 0, got -1"),
        (BuildOptions(fp16=True, quantize="int8"), "fp16, quantize: --quantize int8 stores codes"),
        (BuildOptions(codebook_sample=100), "codebook_sample: 100 is not a positive number of token rows"),
        (BuildOptions(quantize="pq:4", codebook_sample=0), "codebook_sample: 0 is not a positive number"),
        (BuildOptions(pool_only=True), r"pool_only: --pool-only .* needs --pool \(one of \["),
        (BuildOptions(input_format="tsv"), "input_format: the options say 'tsv' but the corpus given was opened as"),
        (BuildOptions(output="x.parquet"), r"output: 'x.parquet' ends in '\.parquet', another file format's suffix"),
        (BuildOptions(output="v.npy"), r"Name the output with one of those suffixes, or pass --format"),
        (BuildOptions(layers="1,1"), r"layers: layer 1 is listed twice in '1,1'"),
        (BuildOptions(layers=(2, 0, 2)), r"layers: layer 2 is listed twice in \[2, 0, 2\]"),
    ],
)
def test_each_bad_option_is_refused_by_name_before_anything_is_written(corpus, tmp_path, options, message):
    with pytest.raises(InvalidParameterError, match=message):
        make_plan(corpus, options)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["news.txt"]


def test_another_format_s_suffix_is_taken_when_the_format_is_named_and_dotted_names_pass(corpus, tmp_path):
    assert make_plan(corpus, BuildOptions(output=tmp_path / "x.parquet", format="zarr")).format == "zarr"
    assert make_plan(corpus, BuildOptions(output=tmp_path / "news.v2")).format == "zarr"


def test_the_corpus_is_never_its_own_output_and_stdin_needs_an_output(corpus, tmp_path):
    with pytest.raises(InvalidParameterError, match="is the corpus itself"):
        make_plan(corpus, BuildOptions(output=corpus.path))
    with pytest.raises(InvalidParameterError, match="stdin needs -o/--output"):
        make_plan(Corpus("-"), BuildOptions())


def test_resolve_output_is_the_path_build_writes(corpus, tmp_path):
    assert resolve_output(corpus.path, BuildOptions()) == tmp_path / "news.zarr"
    assert resolve_output(corpus, BuildOptions(output=tmp_path / "o.h5")) == tmp_path / "o.h5"


def test_chunk_and_shard_rows_wait_for_the_models_width(corpus, tmp_path):
    plan = make_plan(corpus, BuildOptions())
    assert plan.chunk_rows is None and plan.shard_rows is None
    wide, narrow = plan.with_model(1024), plan.with_model(32)
    assert wide.chunk_rows and wide.shard_rows and wide.shard_rows % wide.chunk_rows == 0
    assert narrow.chunk_rows > wide.chunk_rows  # the rules are in bytes: narrower rows, more of them
    hdf5 = make_plan(corpus, BuildOptions(output=tmp_path / "x.h5"))
    bound = hdf5.with_model(1024)
    assert bound.dim == 1024 and bound.chunk_rows is None and bound.shard_rows is None  # not chunked
    with pytest.raises(InvalidParameterError, match="shard_rows: 100 is not a multiple of chunk_rows"):
        make_plan(corpus, BuildOptions(chunk_rows=64, shard_rows=100)).with_model(32)


def test_stored_dtype_and_row_shape_follow_the_options(corpus):
    assert make_plan(corpus, BuildOptions()).row_shape(32) == (3, 32)
    assert make_plan(corpus, BuildOptions(layers=(2,))).row_shape(32) == (1, 32)
    assert make_plan(corpus, BuildOptions(fp16=True)).dtype == "float16"
    mixed = make_plan(corpus, BuildOptions(mix="1,1,1"))
    assert mixed.row_shape(32) == (32,) and mixed.dtype == "float32"
    int8 = make_plan(corpus, BuildOptions(quantize="int8"))
    assert int8.dtype == "int8" and int8.row_shape(32) == (3, 32 + 4)  # codes, then the float32 scale's bytes


def test_the_identity_names_what_the_cache_holds_and_only_what_changes_vectors_is_compared(corpus):
    plan = make_plan(corpus, BuildOptions(layers=(1, 2))).with_model(32)
    ident = identity(plan, MODEL, 32, dedupe=True)
    assert ident["layers"] == [1, 2] and ident["dim"] == 32 and ident["container"] == "zarr"
    assert "quantization" not in ident and "pool" not in ident  # float caches' metadata as it always was
    moved = {**ident, "model": {**MODEL, "directory": "/elsewhere"}}
    assert comparable_identity(moved) == comparable_identity(ident)  # where the model came from does not matter
    assert differences(ident, moved) == ""
    other = identity(make_plan(corpus, BuildOptions(layers=(2,))).with_model(32), MODEL, 32, dedupe=True)
    assert "layers" in differences(ident, other)
    pooled = identity(make_plan(corpus, BuildOptions(pool="mean")).with_model(32), MODEL, 32, dedupe=True)
    assert pooled["pool"]["method"] == "mean"
