"""elmo_cache.builder.corpus_record: a cache records the corpus it was built from, and a build over another
version of it is refused with what changed, never answered with "nothing to do" and stale rows."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build, corpus_record
from elmo_cache.builder.corpus_record import CorpusChanges, compare
from elmo_cache.errors import CorpusChangedError
from elmo_cache.text.tokenize import sentence_hash, tokenize
from tests._build_fixtures import corpus_lines, write_corpus


def keys(lines: list[str]) -> np.ndarray:
    return np.array([sentence_hash(tokenize(line)) for line in lines], dtype=np.uint64)


# -- compare ------------------------------------------------------------------------------------


def test_compare_counts_changes_like_a_line_diff():
    old = np.arange(100, dtype=np.uint64)
    assert compare(old, old.copy()) is None
    edited = old.copy()
    edited[[10, 11, 50]] = [1000, 1001, 1002]
    assert compare(old, edited) == CorpusChanges(changed=3, added=0, removed=0, first=10)
    assert compare(old, np.concatenate([old, [500, 501]])) == CorpusChanges(0, 2, 0, 100)
    assert compare(old, np.delete(old, [5, 6])) == CorpusChanges(0, 0, 2, 5)
    assert compare(old, np.insert(old, 40, [700])) == CorpusChanges(0, 1, 0, 40)
    assert compare(old, old[:0]) == CorpusChanges(0, 0, 100, 0)
    # An interrupted build stored a prefix: lines past it are still to build, not additions.
    assert compare(old[:30], old, stored_is_prefix=True) is None
    assert compare(old[:30], np.insert(old, 3, [9999]), stored_is_prefix=True) == CorpusChanges(0, 1, 0, 3)


def test_compare_of_huge_differences_counts_from_the_common_ends(monkeypatch):
    monkeypatch.setattr(corpus_record, "_DIFF_LINES", 10)
    old = np.arange(1000, dtype=np.uint64)
    new = old.copy()
    new[100:200] += 5000  # one edited region of 100 lines
    assert compare(old, new) == CorpusChanges(100, 0, 0, 100)
    assert compare(old, np.concatenate([old[:100], old[150:]])) == CorpusChanges(0, 0, 50, 100)


# -- the record and the build -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_metadata_records_the_lines_and_their_digest(tmp_path, tiny_encoder, suffix):
    lines = corpus_lines(30, seed=2)
    corpus = write_corpus(tmp_path / "c.txt", lines)
    output = tmp_path / f"c{suffix}"
    build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    expected = hashlib.blake2b(keys(lines).astype("<u8").tobytes(), digest_size=16).hexdigest()
    assert elmo_cache.open(output).metadata["corpus"] == {"lines": 30, "digest": f"blake2b-128:{expected}"}
    assert corpus_record.stored_line_hashes(output).tolist() == keys(lines).tolist()


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_build_over_another_version_of_the_corpus_is_refused_and_loses_nothing(tmp_path, tiny_encoder, suffix):
    lines = corpus_lines(40, seed=3)
    corpus = write_corpus(tmp_path / "c.txt", lines)
    output = tmp_path / f"c{suffix}"
    options = BuildOptions(output=output, progress=False)
    build(corpus, options, encoder=tiny_encoder)
    files = {p: p.read_bytes() for p in ([output] if output.is_file() else sorted(output.rglob("*"))) if p.is_file()}
    # The same tokens with other spacing are the same corpus: nothing to do.
    write_corpus(corpus, ["  ".join(line.split()) + " " for line in lines])
    assert build(corpus, options, encoder=tiny_encoder).already_complete
    cases = [
        (
            lines[:7] + ["an edited line"] + lines[8:],
            r"1 line changed, 0 added, 0 removed; the first difference is at line 8",
        ),
        (
            lines + ["one more", "and another"],
            r"0 lines changed, 2 added, 0 removed; the first difference is at line 41",
        ),
        (lines[:20] + lines[25:], r"0 lines changed, 0 added, 5 removed; the first difference is at line 21"),
    ]
    for new, what in cases:
        write_corpus(corpus, new)
        with pytest.raises(CorpusChangedError, match=rf"built from another version of .*c\.txt .*: {what}\. Its row i"):
            build(corpus, options, encoder=tiny_encoder)
    after = {p: p.read_bytes() for p in ([output] if output.is_file() else sorted(output.rglob("*"))) if p.is_file()}
    assert after == files  # the refusal touched nothing
    summary = build(corpus, BuildOptions(output=output, overwrite=True, progress=False), encoder=tiny_encoder)
    assert summary.n_sentences == 35 and not summary.already_complete


def test_the_cli_refuses_an_edited_corpus_plainly(tmp_path, tiny_model):
    from elmo_cache.cli.main import cli

    corpus = write_corpus(tmp_path / "c.txt", ["the cat sat", "a dog barked", "hello"])
    model = ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"]
    runner = CliRunner()
    first = runner.invoke(cli, ["build", str(corpus), "-o", str(tmp_path / "c.zarr"), *model])
    assert first.exit_code == 0, first.output
    write_corpus(corpus, ["the cat sat", "a dog meowed", "hello"])
    again = runner.invoke(cli, ["build", str(corpus), "-o", str(tmp_path / "c.zarr"), *model])
    assert again.exit_code == 1 and "Traceback" not in again.output
    assert "1 line changed, 0 added, 0 removed; the first difference is at line 2" in again.output
    assert elmo_cache.open(tmp_path / "c.zarr").tokens(1) == ["a", "dog", "barked"]  # untouched
