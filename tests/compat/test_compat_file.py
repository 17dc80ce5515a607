"""ElmoEmbedder.embed_file and ``elmo-cache elmo``: allennlp 0.9's elmo command tests, ported, and the
errors it gives on input it refuses."""

from __future__ import annotations

import gzip
import io
import json

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from elmo_cache.cli.main import cli
from elmo_cache.compat import ElmoEmbedder
from elmo_cache.errors import CorpusError, InvalidParameterError

SENTENCES = [
    "Michael went to the store to buy some eggs .",
    "Joel rolled down the street on his skateboard .",
    "test / this is a first sentence",
    "Take a look , then , at Tuesday 's elections in New York City , New Jersey and Virginia :",
]
# Sentences batched in a file against the same sentence alone: the word cache's round-off (~1e-7).
ATOL = 1e-6


@pytest.fixture(scope="module")
def embedder(tiny_model):
    return ElmoEmbedder(*tiny_model)


def _write(path, lines, end="\n"):
    path.write_text("".join(line + end for line in lines), encoding="utf-8")
    return path


def _run(tiny_model, *args):
    options, weights = tiny_model
    return CliRunner().invoke(
        cli, ["elmo", *map(str, args), "--options-file", str(options), "--weight-file", str(weights)]
    )


@pytest.mark.parametrize("flag", ["--all", "--top", "--average"])
def test_one_sentence_each_output_format(tmp_path, tiny_model, embedder, flag):
    """0.9's test_{all,top,average}_embedding_works (a file without a final newline)."""
    source = tmp_path / "sentences.txt"
    source.write_text(SENTENCES[0], encoding="utf-8")
    result = _run(tiny_model, source, tmp_path / "out.hdf5", flag)
    assert result.exit_code == 0, result.output
    assert "1 sentences" in result.output
    vectors = embedder.embed_sentence(SENTENCES[0].split())
    expected = {"--all": vectors, "--top": vectors[2], "--average": (vectors[0] + vectors[1] + vectors[2]) / 3}[flag]
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        assert set(f.keys()) == {"0", "sentence_to_index"}
        assert f["0"].dtype == np.float32 and f["0"].shape == expected.shape
        np.testing.assert_allclose(f["0"][()], expected, atol=ATOL, rtol=0)
        assert json.loads(f["sentence_to_index"][0]) == {SENTENCES[0]: "0"}
        assert f["sentence_to_index"].shape == (1,)


def test_a_batch_keyed_by_line_number(tmp_path, tiny_model, embedder):
    """0.9's test_batch_embedding_works, with batches smaller than the file."""
    result = _run(tiny_model, _write(tmp_path / "s.txt", SENTENCES), tmp_path / "out.hdf5", "--all", "--batch-size", 3)
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "out.hdf5", "r") as f:
        assert set(f.keys()) == {"0", "1", "2", "3", "sentence_to_index"}
        for key, sentence in zip("0123", SENTENCES):
            assert f[key].shape == (3, len(sentence.split()), 32)
            np.testing.assert_allclose(f[key][()], embedder.embed_sentence(sentence.split()), atol=ATOL, rtol=0)
        assert json.loads(f["sentence_to_index"][0]) == {s: str(i) for i, s in enumerate(SENTENCES)}


def test_sentences_as_keys(tmp_path, tiny_model):
    """0.9's test_batch_embedding_works_with_sentences_as_keys: no sentence_to_index then."""
    lines = SENTENCES[:2] + ["  padded line\t"]
    result = _run(
        tiny_model, _write(tmp_path / "s.txt", lines, "\r\n"), tmp_path / "o.h5", "--all", "--use-sentence-keys"
    )
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert set(f.keys()) == {*SENTENCES[:2], "padded line"}
        for sentence in SENTENCES[:2]:
            assert f[sentence].shape == (3, len(sentence.split()), 32)


def test_forget_sentences(tmp_path, tiny_model):
    """0.9's test_batch_embedding_works_with_forget_sentences."""
    result = _run(tiny_model, _write(tmp_path / "s.txt", SENTENCES), tmp_path / "o.h5", "--top", "--forget-sentences")
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert set(f.keys()) == {"0", "1", "2", "3"}
        assert [f[k].shape for k in "0123"] == [(len(s.split()), 32) for s in SENTENCES]


def test_repeated_sentences_each_get_a_dataset(tmp_path, tiny_model):
    """0.9's test_duplicate_sentences: two datasets, and the index maps the sentence to its last line."""
    lines = [SENTENCES[0], SENTENCES[0]]
    result = _run(tiny_model, _write(tmp_path / "s.txt", lines), tmp_path / "o.h5", "--all")
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "o.h5", "r") as f:
        assert set(f.keys()) == {"0", "1", "sentence_to_index"}
        np.testing.assert_allclose(f["0"][()], f["1"][()], atol=ATOL, rtol=0)
        assert json.loads(f["sentence_to_index"][0]) == {SENTENCES[0]: "1"}


def test_empty_lines_are_refused_by_line_number(tmp_path, tiny_model):
    """0.9's test_empty_sentences_raise_errors; here before anything is written."""
    output = tmp_path / "o.h5"
    output.write_bytes(b"earlier output")
    result = _run(tiny_model, _write(tmp_path / "s.txt", ["A", "", "  ", "B"]), output, "--all")
    assert result.exit_code == 1
    assert "s.txt: empty lines 2, 3 (counting from 1)" in result.output
    assert "Traceback" not in result.output
    assert output.read_bytes() == b"earlier output"
    assert set(tmp_path.iterdir()) == {tmp_path / "s.txt", output}  # no temporary file left


def test_sentence_keys_refuse_repeats_and_slashes(tmp_path, tiny_model):
    repeated = _run(
        tiny_model, _write(tmp_path / "a.txt", ["x y", "z", "x y"]), tmp_path / "o.h5", "--all", "--use-sentence-keys"
    )
    assert repeated.exit_code == 1 and "line 3 repeats line 1" in repeated.output
    slashed = _run(
        tiny_model, _write(tmp_path / "b.txt", SENTENCES + ["."]), tmp_path / "o.h5", "--top", "--use-sentence-keys"
    )
    assert slashed.exit_code == 1 and "line 3, 5 cannot be an HDF5 key" in slashed.output
    assert not (tmp_path / "o.h5").exists()


def test_exactly_one_output_format_flag(tmp_path, tiny_model):
    source = _write(tmp_path / "s.txt", SENTENCES[:1])
    for flags in ([], ["--all", "--top"]):
        result = _run(tiny_model, source, tmp_path / "o.h5", *flags)
        assert result.exit_code == 2 and "exactly one of --all, --top, --average" in result.output


def test_cli_errors_name_the_problem(tmp_path, tiny_model):
    source = _write(tmp_path / "s.txt", SENTENCES[:1])
    missing = _run(tiny_model, tmp_path / "nope.txt", tmp_path / "o.h5", "--all")
    assert missing.exit_code == 1 and "corpus not found" in missing.output and "nope.txt" in missing.output
    no_folder = _run(tiny_model, source, tmp_path / "no" / "o.h5", "--all")
    assert no_folder.exit_code == 1 and "folder" in no_folder.output and "does not exist" in no_folder.output
    batch = _run(tiny_model, source, tmp_path / "o.h5", "--all", "--batch-size", 0)
    assert batch.exit_code == 2 and "--batch-size" in batch.output


def test_stateful_flag_carries_state_through_the_file(tmp_path, tiny_model):
    source = _write(tmp_path / "s.txt", SENTENCES)
    assert _run(tiny_model, source, tmp_path / "a.h5", "--all", "--batch-size", 2, "--stateful").exit_code == 0
    assert _run(tiny_model, source, tmp_path / "b.h5", "--all", "--batch-size", 2).exit_code == 0
    stateful = ElmoEmbedder(*tiny_model, stateful=True)
    expected = list(stateful.embed_sentences([s.split() for s in SENTENCES], batch_size=2))
    with h5py.File(tmp_path / "a.h5", "r") as carried, h5py.File(tmp_path / "b.h5", "r") as cold:
        for key, vectors in zip("0123", expected):
            np.testing.assert_allclose(carried[key][()], vectors, atol=ATOL, rtol=0)
        # The second batch read a carried state: it differs from the cold encoding.
        assert np.abs(carried["2"][()] - cold["2"][()]).max() > 1e-3
        np.testing.assert_allclose(carried["0"][()], cold["0"][()], atol=ATOL, rtol=0)


def test_embed_file_reads_open_files_and_gzip(tmp_path, embedder):
    text = "\n".join(SENTENCES[:2]) + "\n"
    from_text = embedder.embed_file(io.StringIO(text), tmp_path / "t.h5", "average", batch_size=1)
    assert (from_text.n_sentences, from_text.output_format, from_text.sentence_to_index) == (2, "average", True)
    embedder.embed_file(io.BytesIO(text.encode()), tmp_path / "b.h5", "average")
    with gzip.open(tmp_path / "s.txt.gz", "wt", encoding="utf-8") as f:
        f.write(text)
    g_path = tmp_path / "g.h5"
    embedder.embed_file(tmp_path / "s.txt.gz", g_path, "average")
    with h5py.File(tmp_path / "t.h5", "r") as a, h5py.File(tmp_path / "b.h5", "r") as b, h5py.File(g_path) as g:
        for key in "01":
            np.testing.assert_allclose(a[key][()], b[key][()], atol=ATOL, rtol=0)
            np.testing.assert_array_equal(b[key][()], g[key][()])  # same batches, same bytes


def test_embed_file_refuses_bad_arguments(tmp_path, embedder):
    source = _write(tmp_path / "s.txt", SENTENCES[:1])
    with pytest.raises(InvalidParameterError, match=r"output_format: 'mean' is not one of \['all', 'top', 'average'\]"):
        embedder.embed_file(source, tmp_path / "o.h5", "mean")
    with pytest.raises(InvalidParameterError, match="batch_size"):
        embedder.embed_file(source, tmp_path / "o.h5", batch_size=0)
    with pytest.raises(CorpusError, match=r"line 2: invalid UTF-8"):
        embedder.embed_file(io.BytesIO(b"fine\nbad \xff byte\n"), tmp_path / "o.h5")
    with pytest.raises(InvalidParameterError, match="is a directory"):
        embedder.embed_file(source, tmp_path)
    assert not (tmp_path / "o.h5").exists()


def test_model_flag_names_a_model_directory(tmp_path, tiny_model, embedder):
    source = _write(tmp_path / "s.txt", SENTENCES[:2])
    result = CliRunner().invoke(
        cli, ["elmo", str(source), str(tmp_path / "o.h5"), "--top", "--model", str(tiny_model[0].parent)]
    )
    assert result.exit_code == 0, result.output
    with h5py.File(tmp_path / "o.h5", "r") as f:
        np.testing.assert_allclose(f["1"][()], embedder.embed_sentence(SENTENCES[1].split())[2], atol=ATOL, rtol=0)
