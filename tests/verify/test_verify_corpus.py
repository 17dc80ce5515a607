"""``verify`` and ``export`` read a corpus only when the caller names one, never the input path a
cache's metadata records: that path is the cache's own claim and may point anywhere."""

from __future__ import annotations

import json

import h5py
import pytest
from click.testing import CliRunner

from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.compat.export import export
from elmo_cache.verify.checks import verify
from tests._build_fixtures import corpus_lines, write_corpus

LINES = corpus_lines(12, seed=5)


@pytest.fixture
def claimed(tmp_path, tiny_encoder):
    """A good cache whose metadata claims to come from a decoy file with other lines."""
    corpus = write_corpus(tmp_path / "corpus.txt", LINES)
    output = tmp_path / "c.h5"
    build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    decoy = write_corpus(tmp_path / "decoy.txt", corpus_lines(12, seed=99))
    with h5py.File(output, "r+") as f:
        meta = json.loads(f.attrs["elmo_cache"])
        meta["build"]["input"]["path"] = str(decoy)  # `build` is outside the metadata checksum: a log
        f.attrs["elmo_cache"] = json.dumps(meta)
    return output, corpus, decoy


def test_verify_ignores_the_recorded_corpus(claimed, tiny_encoder):
    output, corpus, decoy = claimed
    report = verify(output, sample=3, encoder=tiny_encoder)
    assert report.ok and report.corpus is None, str(report)
    # Named, a corpus is read and checked: the true one passes, the decoy fails.
    assert verify(output, corpus=corpus).ok
    bad = verify(output, corpus=decoy)
    assert not bad.ok and bad.corpus == str(decoy)
    result = CliRunner().invoke(cli, ["verify", str(output)])
    assert result.exit_code == 0 and "decoy" not in result.output, result.output


def test_export_ignores_the_recorded_corpus(claimed, tmp_path):
    output, corpus, _ = claimed
    summary = export(output, tmp_path / "a.hdf5")
    assert summary.corpus is None and summary.from_tokens
    with h5py.File(tmp_path / "a.hdf5", "r") as f:
        mapping = json.loads(f["sentence_to_index"][0])
    assert mapping == {" ".join(line.split()): str(i) for i, line in enumerate(LINES)}
    assert export(output, tmp_path / "b.hdf5", corpus=corpus).corpus == str(corpus)
