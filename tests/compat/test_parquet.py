"""``export --format parquet`` (elmo_cache.compat.parquet): real caches of a tiny model written as Parquet and
read back with pyarrow (and Hugging Face datasets where installed), every vector compared with the cache's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.compat import parquet
from elmo_cache.compat.export import export
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.rows.selection import MixSpec

pq = pytest.importorskip("pyarrow.parquet")

LINES = ["The cat sat on the mat .", "", "A dog ran", "hello world", "Colourless green ideas sleep furiously ."]


@pytest.fixture(scope="module")
def caches(tmp_path_factory, tiny_encoder):
    folder = tmp_path_factory.mktemp("parquet")
    corpus = folder / "c.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    layered = build(
        corpus, BuildOptions(output=folder / "l.zarr", layers="1,2", fp16=True, progress=False), encoder=tiny_encoder
    ).path
    mixed = build(
        corpus,
        BuildOptions(output=folder / "m.h5", mix=MixSpec.from_raw("0.2,0.3,0.5"), quantize="int8", progress=False),
        encoder=tiny_encoder,
    ).path
    return layered, mixed


def test_each_row_is_a_sentence_with_its_tokens_and_the_cache_s_vectors(caches, tmp_path):
    for path in caches:
        output = tmp_path / f"{path.stem}.parquet"
        summary = export(path, output)  # the suffix picks parquet
        assert summary.format == "parquet" and summary.n_sentences == len(LINES) and "as Parquet" in str(summary)
        table = pq.read_table(output)
        assert table.column_names == ["line", "tokens", "vectors"]
        rows = table.to_pylist()
        with elmo_cache.open(path) as cache:
            assert json.loads(table.schema.metadata[b"elmo_cache"])["dim"] == cache.dim
            for i, row in enumerate(rows):
                assert row["line"] == i and row["tokens"] == cache.tokens(i)
                want = np.asarray(cache[i], dtype=np.float32)
                got = np.asarray(row["vectors"], dtype=np.float32).reshape(want.shape)
                np.testing.assert_array_equal(got, want)  # float16 widened exactly, int8 decoded as cache[i]
        assert rows[1]["tokens"] == [] and np.asarray(rows[1]["vectors"]).size == 0


def test_small_row_groups_read_back_the_same(caches, tmp_path, monkeypatch):
    monkeypatch.setattr(parquet, "ROW_GROUP_VALUES", 100)  # a row group per sentence or two
    output = tmp_path / "small.parquet"
    export(caches[0], output)
    assert pq.ParquetFile(output).num_row_groups >= 4
    with elmo_cache.open(caches[0]) as cache:
        for i, row in enumerate(pq.read_table(output).to_pylist()):
            np.testing.assert_array_equal(np.asarray(row["vectors"], np.float32).reshape(cache[i].shape), cache[i])


def test_hugging_face_datasets_reads_it_as_tensors_of_the_sentence_s_shape(caches, tmp_path):
    datasets = pytest.importorskip("datasets")
    output = tmp_path / "l.parquet"
    export(caches[0], output)
    dataset = datasets.Dataset.from_parquet(str(output)).with_format("numpy")
    with elmo_cache.open(caches[0]) as cache:
        for i in (0, 2, 4):
            np.testing.assert_array_equal(np.asarray(dataset[i]["vectors"], np.float32), cache[i])


def test_the_cli_and_its_refusals(caches, tmp_path):
    output = tmp_path / "out.data"
    done = CliRunner().invoke(cli, ["export", str(caches[0]), str(output), "--format", "parquet"])
    assert done.exit_code == 0, done.output
    assert pq.read_table(output).num_rows == len(LINES)
    again = CliRunner().invoke(cli, ["export", str(caches[0]), str(output), "--format", "parquet"])
    assert again.exit_code == 1 and "exists; pass --overwrite" in again.output
    with pytest.raises(CacheExistsError):
        export(caches[0], output, format="parquet")
    with pytest.raises(InvalidParameterError, match="only the HDF5 export takes a corpus"):
        export(caches[0], tmp_path / "x.parquet", corpus=tmp_path / "c.txt")
    with pytest.raises(InvalidParameterError, match=r"format: 'csv' is not one of \['hdf5', 'parquet'\]"):
        export(caches[0], tmp_path / "x.csv", format="csv")
    assert not (tmp_path / "x.parquet").exists() and not list(tmp_path.glob("*.tmp"))


def test_without_pyarrow_the_error_says_what_to_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.split(".")[0] == "pyarrow":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(InvalidParameterError, match=r'pip install "elmo-cache\[parquet\]"'):
        parquet.require_pyarrow()
