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
from elmo_cache.store.columns import Column
from elmo_cache.store.format import block_sums_name
from elmo_cache.text.tokenize import sentence_hash
from elmo_cache.verify.checks import verify
from tests.contracts.store import DIM, _metadata, _sentences, _tokens

# Declared here, in the test only: the writers know nothing of it.
WIDTHS = Column("extra/widths", "float32", (3,), array="extra/widths", optional=True, block_rows=4)


def _layout(fmt: str, column: Column):
    chunked = store.get_container(fmt).chunked
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
    output = tmp_path / ("c" + store.get_container(fmt).suffixes[0])
    _build(output, fmt, WIDTHS, sentences)
    _, arrays = store.open_arrays(output, (WIDTHS.array, block_sums_name(WIDTHS.array)))[1:]
    np.testing.assert_array_equal(np.asarray(arrays[WIDTHS.array][:]), _values(sentences, 0))
    assert len(arrays[block_sums_name(WIDTHS.array)]) == -(-len(sentences) // WIDTHS.block_rows)
    with elmo_cache.open(output) as cache:  # the rest of the cache reads as ever
        assert cache.metadata["checksums"]["blocks"]["rows"][WIDTHS.array] == WIDTHS.block_rows
        for i, s in enumerate(sentences):
            np.testing.assert_array_equal(cache[i], s.transpose(1, 0, 2))
    # HDF5's verify still opens only the arrays store.format lists (ARRAYS, OPTIONAL_ARRAYS), so it names an
    # undeclared dataset missing from its view; zarr's checksums.json covers every file.
    assert verify(output).ok or fmt == "hdf5"


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
