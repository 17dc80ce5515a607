"""A per-sentence column added by declaration alone (elmo_cache.store.columns): written by both containers'
writers, cut back to the commit on resume, read back, checked by block sums; staged as chunk files (moved
into a zarr group at the finish) it has the bytes of the same column copied in."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import elmo_cache
from elmo_cache import store
from elmo_cache.store import Progress
from elmo_cache.store.columns import Column, cache_arrays, declared_arrays, sentence_columns
from elmo_cache.store.format import ARRAYS, OPTIONAL_ARRAYS, block_sums_name
from elmo_cache.store.registry import get_container
from elmo_cache.text.tokenize import sentence_hash
from elmo_cache.verify.checks import verify
from tests.contracts.store import DIM, _metadata, _sentences, _tokens

# Declared here, in the test only: the writers know nothing of it.
WIDTHS = Column("extra/widths", "float32", (3,), array="extra/widths", optional=True, block_rows=4)


def _layout(fmt: str, column: Column):
    chunked = get_container(fmt).chunked
    layout = store.Layout(fmt, (2, DIM), "float32", 3 if chunked else None, None, 6 if chunked else None)
    return dataclasses.replace(layout, columns=(column,))


def _values(sentences, first: int) -> np.ndarray:
    return np.array([[first + k, len(s), 0.5] for k, s in enumerate(sentences)], dtype=np.float32)


def _append(writer, sentences, rows: int, first: int, column: Column) -> int:
    lengths = np.array([len(s) for s in sentences], dtype=np.int32)
    offsets = rows + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    tokens = _tokens(sentences, first)
    hashes = np.array([sentence_hash(t) for t in tokens], dtype=np.uint64)
    values = {column.name: _values(sentences, first)}
    writer.append(np.concatenate(sentences), offsets, lengths, hashes, tokens, **values)
    return rows + int(lengths.sum())


def _build(output, fmt: str, column: Column, sentences) -> None:
    layout = _layout(fmt, column)
    progress = Progress(identity={"fmt": fmt})
    meta = _metadata(progress, complete=False, n_unique=0, row_shape=layout.row_shape)
    writer = store.writer_class(fmt).create(output, layout, progress, meta)
    rows = _append(writer, sentences[:6], 0, 0, column)
    writer.commit()
    _append(writer, sentences[6:9], rows, 6, column)  # never committed: a crash
    staged = writer.columns[column.name]
    writer.close()

    def staged_bytes() -> int:
        paths = [p for p, _ in staged.files(9)] if column.staged_in_chunks else [staged.path]  # type: ignore[attr-defined]
        return sum(p.stat().st_size for p in paths if p.exists())

    assert staged_bytes() == 9 * staged.item_bytes  # the uncommitted sentences are there
    writer = store.writer_class(fmt).resume(output, layout, writer.progress)
    assert writer.progress.lines == 6 and staged_bytes() == 6 * staged.item_bytes  # cut back to the commit
    assert len(writer.columns[column.name].read_range(0, 6)) == 6
    with pytest.raises(ValueError, match="declares column"):
        writer.append(
            np.concatenate(sentences[6:7]),
            np.array([rows]),
            np.array([len(sentences[6])], np.int32),
            np.array([1], np.uint64),
            _tokens(sentences[6:7], 6),
        )
    rows = _append(writer, sentences[6:], rows, 6, column)
    writer.commit(done=True)
    hashes, _ = writer.index()
    writer.finalize(_metadata(writer.progress, complete=True, n_unique=len(hashes), row_shape=layout.row_shape))


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_a_column_declared_alone_is_written_cut_back_on_resume_and_read_back(tmp_path, fmt):
    sentences = _sentences(11, seed=5)
    output = tmp_path / ("c" + get_container(fmt).suffixes[0])
    _build(output, fmt, WIDTHS, sentences)
    _, arrays = store.open_arrays(output, (WIDTHS.array, block_sums_name(WIDTHS.array)))[1:]
    np.testing.assert_array_equal(np.asarray(arrays[WIDTHS.array][:]), _values(sentences, 0))
    assert len(arrays[block_sums_name(WIDTHS.array)]) == -(-len(sentences) // WIDTHS.block_rows)
    with elmo_cache.open(output) as cache:  # the rest of the cache reads as ever
        assert cache.metadata["checksums"]["blocks"]["rows"][WIDTHS.array] == WIDTHS.block_rows
        assert cache._guards[WIDTHS.array].block_rows == WIDTHS.block_rows  # its blocks are checked on read
        for i, s in enumerate(sentences):
            np.testing.assert_array_equal(cache[i], s.transpose(1, 0, 2))
    report = verify(output)
    assert report.ok, report


def test_the_built_in_columns_declare_the_arrays_of_format_md():
    assert {"vectors", *declared_arrays(sentence_columns())} == set(ARRAYS)
    assert cache_arrays(None) == (*ARRAYS, *OPTIONAL_ARRAYS)
    # A declared column is known from the metadata that lists its block sums; names that are not array paths
    # (a damaged or hostile metadata) are never opened.
    meta = {"checksums": {"blocks": {"rows": {"vectors": 1, WIDTHS.array: 4, "../x": 1, "/etc": 1}}}}
    assert cache_arrays(meta) == (*ARRAYS, *OPTIONAL_ARRAYS, WIDTHS.array)


def test_a_column_staged_as_chunk_files_is_moved_into_zarr_with_the_bytes_of_a_copy(tmp_path):
    sentences = _sentences(11, seed=6)
    moved = dataclasses.replace(WIDTHS, chunk_rows=4, staged_in_chunks=True)  # 3 chunks, the last padded
    copied = dataclasses.replace(WIDTHS, chunk_rows=4)
    _build(tmp_path / "moved.zarr", "zarr", moved, sentences)
    _build(tmp_path / "copied.zarr", "zarr", copied, sentences)
    files = sorted(
        p.relative_to(tmp_path / "copied.zarr") for p in (tmp_path / "copied.zarr").rglob("*") if p.is_file()
    )
    assert [f for f in files if f.parts[:2] == ("extra", "widths")]
    for rel in files:
        assert (tmp_path / "moved.zarr" / rel).read_bytes() == (tmp_path / "copied.zarr" / rel).read_bytes(), rel
    _, arrays = store.open_arrays(tmp_path / "moved.zarr", (WIDTHS.array,))[1:]
    np.testing.assert_array_equal(np.asarray(arrays[WIDTHS.array][:]), _values(sentences, 0))


def test_a_column_staged_as_chunk_files_is_copied_into_hdf5_a_file_at_a_time_with_the_bytes_of_a_copy(
    tmp_path, monkeypatch
):
    import elmo_cache.store.hdf5.writer as hdf5_writer

    sentences = _sentences(11, seed=6)
    staged = dataclasses.replace(WIDTHS, chunk_rows=4, staged_in_chunks=True)
    copied = dataclasses.replace(WIDTHS, chunk_rows=4)
    _build(tmp_path / "copied.h5", "hdf5", copied, sentences)
    # Files of 1, 1, 2, 2, 4 and 8 rows (the last one partial), each deleted once copied.
    monkeypatch.setattr(hdf5_writer, "_FIRST_FILE_BYTES", staged.row_bytes)
    monkeypatch.setattr(hdf5_writer, "_GROW_EVERY", 2)
    _build(tmp_path / "staged.h5", "hdf5", staged, sentences)
    assert (tmp_path / "staged.h5").read_bytes() == (tmp_path / "copied.h5").read_bytes()
    _, arrays = store.open_arrays(tmp_path / "staged.h5", (WIDTHS.array,))[1:]
    np.testing.assert_array_equal(np.asarray(arrays[WIDTHS.array][:]), _values(sentences, 0))


def test_a_chunked_column_with_growing_files_appends_reads_and_is_cut_back(tmp_path):
    from elmo_cache.store.durable import ChunkedColumn, ChunkedRows

    column = ChunkedColumn(tmp_path / "c.bin", "int32", (2,), 2, grow_every=3, max_file_rows=6)
    assert [column.rows_in_file(k) for k in range(8)] == [2, 2, 2, 4, 4, 4, 6, 6]
    assert [column.file_start(k) for k in range(8)] == [0, 2, 4, 6, 10, 14, 18, 24]
    assert [column.locate(i) for i in (0, 1, 2, 5, 6, 9, 10, 18, 23, 24)] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (2, 1),
        (3, 0),
        (3, 3),
        (4, 0),
        (6, 0),
        (6, 5),
        (7, 0),
    ]
    values = np.arange(40, dtype=np.int32).reshape(20, 2)
    column.open(0)
    column.append(values[:7])
    column.append(values[7:20])
    column.sync()
    column.close()
    assert [(p.name, n) for p, n in column.files(20)] == [
        ("c.bin", 2),
        ("c.1.bin", 2),
        ("c.2.bin", 2),
        ("c.3.bin", 4),
        ("c.4.bin", 4),
        ("c.5.bin", 4),
        ("c.6.bin", 2),
    ]
    assert [p.stat().st_size for p, _ in column.files(20)] == [16, 16, 16, 32, 32, 32, 16]
    np.testing.assert_array_equal(column.read_range(3, 19), values[3:19])
    rows = column.read(20)
    assert isinstance(rows, ChunkedRows)
    np.testing.assert_array_equal(rows[11], values[11])
    rows[11] = values[0]
    rows.flush()
    np.testing.assert_array_equal(column.read_range(11, 12), values[:1])
    column.open(9)  # a resume at the commit of 9 items: the files past it are dropped, the one holding it cut
    column.close()
    assert [p.stat().st_size for p, _ in column.files(9)] == [16, 16, 16, 24]
    assert not (tmp_path / "c.4.bin").exists()
