"""``elmo-cache build/info/verify/export`` through click's CliRunner: exit codes and messages."""

from __future__ import annotations

import gzip
import json
import re

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.text.tokenize import tokenize
from tests._build_fixtures import corpus_lines, raw_arrays, write_corpus

LINES = corpus_lines(20, seed=7)


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.txt", LINES)


@pytest.fixture
def model_args(tiny_model):
    return ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"]


def run(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


def test_build_writes_beside_the_corpus_and_summarises(corpus, model_args, tiny_encoder):
    result = run("build", corpus, "--layers", "1,2", "--fp16", "--no-progress", *model_args)
    assert result.exit_code == 0, result.output
    output = corpus.with_suffix(".zarr")
    assert f"building {output}" in result.stderr
    assert f"wrote {output} (zarr): 20 sentences" in result.stdout and "tokens/s" in result.stdout
    with elmo_cache.open(output) as cache:
        assert cache.metadata["layers"] == [1, 2] and cache.metadata["dtype"] == "float16"
        reference = tiny_encoder.embed_sentence(tokenize(LINES[0]))
        np.testing.assert_allclose(cache[0].astype(np.float32), reference[1:], rtol=2.0**-11, atol=1e-6)
    again = run("build", corpus, "--layers", "1,2", "--fp16", "--no-progress", *model_args)
    assert again.exit_code == 0 and "already complete" in again.stdout


def test_build_with_mix_gzip_hdf5_and_progress(tmp_path, corpus, model_args, tiny_encoder):
    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(corpus.read_bytes()))
    output = tmp_path / "mixed.h5"
    result = run("build", packed, "-o", output, "--mix", "1,2,3", "--mix-softmax", "--gamma", "0.5", *model_args)
    assert result.exit_code == 0, result.output
    assert "sent" in result.stderr  # the progress bar
    meta, _ = raw_arrays(output)
    assert meta["kind"] == "mix" and meta["mix"]["softmax"] is True and meta["mix"]["raw"] == [1.0, 2.0, 3.0]
    assert meta["mix"]["gamma"] == 0.5 and abs(sum(meta["mix"]["weights"]) - 1) < 1e-12


def test_build_from_stdin(tmp_path, corpus, model_args):
    output = tmp_path / "stdin.zarr"
    result = run("build", "-", "-o", output, "--no-progress", *model_args, input=corpus.read_bytes())
    assert result.exit_code == 0, result.output
    meta, _ = raw_arrays(output)
    assert meta["n_sentences"] == 20 and meta["build"]["input"]["path"] == "-"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layers", "5"], r"layer 5 does not exist; choose from \[0, 1, 2\]"),
        (["--layers", "1", "--mix", "1,1,1"], "exclusive"),
        (["--gamma", "2"], "only apply with --mix"),
        (["--mix", "1,2"], "expected 3 numbers"),
        (["--compression", "lz77"], r"choose from \['none', 'zstd'"),
        (["--format", "hdf5", "--compression", "zstd"], "only zarr caches can be compressed"),
        (["--errors", "ignore"], r"choose from \['strict', 'replace'\]"),
        (["--precision", "fp8"], "precision"),
        (["--device", "tpu"], "device"),
    ],
)
def test_user_mistakes_exit_1_with_a_message(corpus, model_args, args, message):
    result = run("build", corpus, "--no-progress", *model_args, *args)
    assert result.exit_code == 1, result.output
    error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and re.search(message, error[0]), result.stderr
    assert "Traceback" not in result.output


def test_missing_corpus_bad_utf8_and_half_a_model(tmp_path, corpus, tiny_model):
    missing = run("build", tmp_path / "nope.txt", "--no-progress")
    assert missing.exit_code == 1 and "corpus not found" in missing.stderr
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nnot \xff ok\n")
    result = run("build", bad, "--no-progress", "--options-file", tiny_model[0], "--weight-file", tiny_model[1])
    assert result.exit_code == 1 and "bad.txt, line 2: invalid UTF-8" in result.stderr
    half = run("build", corpus, "--no-progress", "--options-file", tiny_model[0])
    assert half.exit_code == 1 and "go together" in half.stderr


def test_existing_cache_with_other_options(corpus, model_args):
    assert run("build", corpus, "--no-progress", *model_args).exit_code == 0
    result = run("build", corpus, "--no-progress", "--layers", "2", *model_args)
    assert result.exit_code == 1 and "built with other options" in result.stderr and "--overwrite" in result.stderr
    assert run("build", corpus, "--no-progress", "--layers", "2", "--overwrite", *model_args).exit_code == 0


def test_chunk_and_shard_rows(tmp_path, corpus, model_args):
    output = tmp_path / "small-files.zarr"
    result = run("build", corpus, "-o", output, "--chunk-rows", 8, "--shard-rows", 32, "--no-progress", *model_args)
    assert result.exit_code == 0, result.output
    meta, _ = raw_arrays(output)
    assert meta["chunk_rows"] == 8 and meta["shard_rows"] == 32
    files = sorted(p.name for p in (output / "vectors" / "c").iterdir())
    assert len(files) == -(-meta["n_rows"] // 32) > 1
    assert "chunk_rows 8, shard_rows 32" in run("info", output).stdout
    bad = run("build", corpus, "-o", tmp_path / "x.zarr", "--chunk-rows", 8, "--shard-rows", 12, *model_args)
    assert bad.exit_code == 1 and "shard_rows: 12 is not a multiple of chunk_rows (8)" in bad.stderr


def test_info_on_a_cache_and_on_an_interrupted_build(tmp_path, corpus, tiny_encoder):
    output = tmp_path / "c.zarr"
    build(corpus, BuildOptions(output=output, dedupe=True, progress=False), encoder=tiny_encoder)
    result = run("info", output)
    assert result.exit_code == 0
    meta, _ = raw_arrays(output)
    assert f"{meta['n_sentences']:,} sentences, {meta['n_tokens']:,} tokens, {meta['n_rows']:,} rows" in result.stdout
    assert "dedupe True" in result.stdout and "complete:     True" in result.stdout
    assert "float32, dedupe" in result.stdout and "tokens:       whitespace" in result.stdout
    assert f"each window's rows start a vectors file of {meta['shard_rows']:,} rows" in result.stdout
    hdf5 = tmp_path / "c.h5"
    build(corpus, BuildOptions(output=hdf5, progress=False), encoder=tiny_encoder)
    assert "rows:" not in run("info", hdf5).stdout  # packed: the vectors array is the sentences' rows
    as_json = run("info", output, "--json")
    assert json.loads(as_json.stdout) == meta

    interrupted = tmp_path / "i.zarr"
    real, calls = tiny_encoder.encode_flat, []

    def crash_on_third(batch):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("crash")
        return real(batch)

    tiny_encoder.encode_flat = crash_on_third
    try:
        with pytest.raises(RuntimeError):
            build(
                corpus,
                BuildOptions(output=interrupted, batch_tokens=20, window_batches=1, commit_seconds=0, progress=False),
                encoder=tiny_encoder,
            )
    finally:
        del tiny_encoder.encode_flat
    result = run("info", interrupted)
    assert result.exit_code == 0 and "interrupted build" in result.stdout and "resume" in result.stdout

    missing = run("info", tmp_path / "none.zarr")
    assert missing.exit_code == 1 and "cache not found" in missing.stderr


def test_verify_ok_sample_and_damage(tmp_path, corpus, tiny_encoder, model_args):
    output = tmp_path / "c.h5"
    build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    result = run("verify", output, "--sample", 4, *model_args)
    assert result.exit_code == 0, result.output
    assert "4 sampled sentences match a fresh encoding" in result.stdout
    with h5py.File(output, "r+") as f:
        f["offsets"][5] = f["offsets"][5] + 1
    broken = run("verify", output)
    assert broken.exit_code == 1 and "failed verification" in broken.stderr and "offsets" in broken.stderr


def test_export(tmp_path, corpus, tiny_encoder):
    output = tmp_path / "c.zarr"
    build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    target = tmp_path / "allennlp.hdf5"
    result = run("export", output, target)
    assert result.exit_code == 0 and "sentence_to_index from" in result.stdout
    with h5py.File(target, "r") as f:
        assert f["0"].shape == (3, len(tokenize(LINES[0])), tiny_encoder.output_dim)
        assert json.loads(f["sentence_to_index"][0])[LINES[0].strip()] == "0"
    again = run("export", output, target)
    assert again.exit_code == 1 and "--overwrite" in again.stderr


def test_progress_moves_while_a_window_is_encoded(tmp_path, tiny_encoder, monkeypatch):
    import tqdm

    updates: list[int] = []

    class Recorder(tqdm.tqdm):
        def update(self, n=1):
            updates.append(n)
            return super().update(n)

    monkeypatch.setattr(tqdm, "tqdm", Recorder)
    lines = corpus_lines(40, seed=3) + ["", LINES[0]]
    corpus = write_corpus(tmp_path / "c.txt", lines)
    # One window of many small batches: the bar must move batch by batch, before the window is written.
    options = BuildOptions(output=tmp_path / "c.zarr", batch_tokens=40, window_batches=1000, dedupe=True)
    build(corpus, options, encoder=tiny_encoder)
    assert len(updates) > 5 and sum(updates) == len(lines)


def test_the_bundled_model_splits_lines_as_its_training_text_was(tmp_path, model_args):
    """No --tokenize: PTB-style for the bundled model (its training text's rules), whitespace for any other;
    the choice is recorded and --tokenize overrides it."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat's on the mat.\n", encoding="utf-8")
    cases = [
        ([], "ptb", ["The", "cat", "'s", "on", "the", "mat", "."]),  # the bundled model
        (["--tokenize", "whitespace"], "whitespace", ["The", "cat's", "on", "the", "mat."]),
        (model_args, "whitespace", ["The", "cat's", "on", "the", "mat."]),
        ([*model_args, "--tokenize", "ptb"], "ptb", ["The", "cat", "'s", "on", "the", "mat", "."]),
    ]
    for k, (args, tokenization, tokens) in enumerate(cases):
        output = tmp_path / f"c{k}.zarr"
        result = run("build", corpus, "-o", output, "--device", "cpu", "--no-progress", *args)
        assert result.exit_code == 0, result.output
        with elmo_cache.open(output) as cache:
            assert cache.tokenization == tokenization and cache.tokens(0) == tokens
    refused = run("build", tmp_path / "c.txt", "--input-format", "tsv", "--tokenize", "ptb", "-o", tmp_path / "t.zarr")
    assert refused.exit_code == 1 and "tokenize: 'ptb' splits lines of text" in refused.output


def test_update_brings_an_edited_corpus_up_to_date(tmp_path, model_args):
    lines = corpus_lines(200, seed=8)
    corpus = write_corpus(tmp_path / "grows.txt", lines)
    sizes = ["--batch-tokens", "40", "--window-batches", "8", "--no-progress", *model_args]
    assert run("build", corpus, *sizes).exit_code == 0
    write_corpus(corpus, [*lines, "one more line", "and another ."])
    refused = run("build", corpus, *sizes)
    assert refused.exit_code == 1 and "0 changed, 2 added" in refused.stderr.replace("lines ", "")
    assert "Pass --update" in refused.stderr
    updated = run("build", corpus, "--update", *sizes)
    assert updated.exit_code == 0, updated.output
    assert re.search(r"updated: 1 of \d+ windows encoded \(\d+ lines\), the rows of \d+ lines reused", updated.stdout)
    with elmo_cache.open(corpus.with_suffix(".zarr")) as cache:
        assert len(cache) == 202 and cache.tokens(201) == ["and", "another", "."]
    assert "--update" in run("build", "--help").stdout
    both = run("build", corpus, "--update", "--overwrite", *sizes)
    assert both.exit_code == 1 and "pass one of them" in both.stderr
