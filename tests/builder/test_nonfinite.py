"""Nothing non-finite is ever stored: a build refuses it after the storage cast, naming the line and option."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.selection import MixSpec
from elmo_cache.store import load_progress
from tests._build_fixtures import corpus_lines, write_corpus

LINES = corpus_lines(20, seed=7)


@pytest.fixture
def corpus(tmp_path):
    return write_corpus(tmp_path / "corpus.txt", LINES)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--gamma", "1e6", "--fp16"], "--fp16"),  # float16 overflows past 65504
        (["--gamma", "1e39", "--quantize", "int8"], "--gamma"),  # the float32 mix overflows: int8's scale is inf
        (["--gamma", "1e6", "--fp16", "--pool", "mean", "--pool-only"], "--fp16"),
    ],
)
def test_cli_build_refuses_non_finite_values(tmp_path, corpus, tiny_model, extra, named):
    output = tmp_path / "c.zarr"
    model = ["--options-file", tiny_model[0], "--weight-file", tiny_model[1], "--device", "cpu", "--no-progress"]
    args = ["build", corpus, "-o", output, "--mix", "1,1,1", *extra, *model]
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 1, result.output
    assert re.search(rf"{re.escape(str(corpus))}, line \d+: not finite once stored", result.output), result.output
    assert named in result.output and "Traceback" not in result.output
    assert not output.exists()


def test_a_broken_model_is_refused_at_its_line_and_what_was_committed_is_kept(
    tmp_path, corpus, tiny_encoder, monkeypatch
):
    import torch

    bad = LINES[12].split()
    bad_line = next(i + 1 for i, line in enumerate(LINES) if line.split() == bad)  # its first occurrence, 1-based
    real = tiny_encoder.encode_flat

    def broken(sentences):
        flat, offsets = real(sentences)
        for k, sentence in enumerate(sentences):
            if list(sentence) == bad:
                flat[:, int(offsets[k])] = torch.nan
        return flat, offsets

    output = tmp_path / "c.h5"
    options = BuildOptions(output=output, batch_tokens=40, window_batches=1, commit_seconds=0, progress=False)
    monkeypatch.setattr(tiny_encoder, "encode_flat", broken)
    with pytest.raises(InvalidParameterError, match=rf"corpus.txt, line {bad_line}: .*the model's vectors"):
        build(corpus, options, encoder=tiny_encoder)
    assert not output.exists()
    committed = load_progress(output).lines
    assert 0 < committed < bad_line  # the windows before it were committed, and stay resumable
    monkeypatch.undo()
    summary = build(corpus, options, encoder=tiny_encoder)
    assert summary.resumed_from == committed
    assert summary.n_sentences == len(LINES)


def test_library_build_names_the_mix(tmp_path, corpus, tiny_encoder):
    options = BuildOptions(
        output=tmp_path / "c.zarr", mix=MixSpec.from_raw([1, 1, 1], gamma=1e6), fp16=True, progress=False
    )
    with pytest.raises(InvalidParameterError, match=r"line \d+: .*lower --gamma or the --mix weights, or drop --fp16"):
        build(corpus, options, encoder=tiny_encoder)
    assert not (tmp_path / "c.zarr").exists()
