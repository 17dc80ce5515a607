"""One contract, two containers: every test runs over zarr and HDF5 (zarr-python's StoreTests is the model).

A container module (``elmo_cache.store.zarr`` / ``.hdf5``) must write a cache through its
``Writer`` that its own reader (``open_arrays``), ``read_metadata``, ``open_with_library`` and
:class:`elmo_cache.reader.Cache` all read back the same, crash-safely and atomically.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import elmo_cache
from elmo_cache import store
from elmo_cache.store import Layout, Progress
from elmo_cache.store.format import ARRAYS, FORMAT_NAME, FORMAT_VERSION, INDEX_DTYPES, decode_metadata, staging_path

DIM = 4


def _metadata(progress: Progress, *, complete: bool, n_unique: int, row_shape: tuple[int, ...]) -> dict:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "complete": complete,
        "kind": "layers" if len(row_shape) == 2 else "mix",
        "layers": [1, 2] if len(row_shape) == 2 else None,
        "mix": None
        if len(row_shape) == 2
        else {"weights": [0.2, 0.3, 0.5], "gamma": 1.0, "raw": None, "softmax": False},
        "dim": DIM,
        "dtype": "float32",
        "n_sentences": progress.lines,
        "n_tokens": progress.tokens,
        "n_rows": progress.rows,
        "n_unique": n_unique,
    }


def _sentences(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(0, 6)), 2, DIM)).astype(np.float32) for _ in range(n)]


class StoreContract:
    """The tests; a subclass names the container in ``fmt``."""

    fmt: str

    @pytest.fixture
    def output(self, tmp_path) -> Path:
        return tmp_path / ("c.zarr" if self.fmt == "zarr" else "c.h5")

    def layout(self, row_shape=(2, DIM)) -> Layout:
        return Layout(self.fmt, row_shape, "float32", 3 if self.fmt == "zarr" else None, None)

    def write(self, output: Path, sentences: list[np.ndarray], *, commit_every: int = 2, finalize: bool = True):
        layout = self.layout(sentences[0].shape[1:] if sentences else (2, DIM))
        progress = Progress(identity={"test": True})
        writer = store.writer_class(self.fmt).create(
            output, layout, progress, _metadata(progress, complete=False, n_unique=0, row_shape=layout.row_shape)
        )
        rows = 0
        for k in range(0, len(sentences), commit_every):
            batch = sentences[k : k + commit_every]
            lengths = np.array([len(s) for s in batch], dtype=np.int32)
            offsets = rows + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            hashes = np.arange(k, k + len(batch), dtype=np.uint64) * np.uint64(7919) + np.uint64(1)
            vectors = np.concatenate(batch) if batch else np.empty((0, *layout.row_shape), np.float32)
            writer.append(vectors, offsets, lengths, hashes)
            rows += int(lengths.sum())
            writer.commit(done=k + commit_every >= len(sentences))
        if not finalize:
            writer.close()
            return writer
        hashes, _ = writer.index()
        p = writer.progress
        return writer.finalize(_metadata(p, complete=True, n_unique=len(hashes), row_shape=layout.row_shape))

    # -- the contract ---------------------------------------------------------------------------------

    def test_written_arrays_read_back_through_every_reader(self, output):
        sentences = _sentences(11, seed=1)
        assert self.write(output, sentences) == output
        assert store.detect(output) == self.fmt
        fmt, raw, arrays = store.open_arrays(output, ARRAYS)
        assert fmt == self.fmt and decode_metadata(raw)["complete"] is True
        _, raw_lib, library, close = store.open_with_library(output)
        try:
            for name in ARRAYS:
                np.testing.assert_array_equal(np.asarray(arrays[name][:]), np.asarray(library[name][...]))
                if name in INDEX_DTYPES:
                    assert np.dtype(arrays[name].dtype) == np.dtype(INDEX_DTYPES[name])
            assert decode_metadata(raw_lib) == decode_metadata(raw)
        finally:
            close()
        with elmo_cache.open(output) as cache:
            assert cache.format == self.fmt and len(cache) == 11
            for i, expected in enumerate(sentences):
                np.testing.assert_array_equal(cache[i], expected.transpose(1, 0, 2))

    def test_read_metadata_and_is_store(self, output, tmp_path):
        self.write(output, _sentences(3, seed=2))
        container = store.container(self.fmt)
        assert container.is_store(output)
        assert container.read_metadata(output)["n_sentences"] == 3
        assert store.read_metadata(output) == container.read_metadata(output)
        other = tmp_path / "other"
        other.mkdir()
        (tmp_path / "text.txt").write_text("not a store")
        for foreign in (other, tmp_path / "text.txt", tmp_path / "absent"):
            assert not container.is_store(foreign)
            assert container.read_metadata(foreign) is None

    def test_output_appears_only_when_finished(self, output):
        writer = self.write(output, _sentences(5, seed=3), finalize=False)
        assert not output.exists() and staging_path(output).is_dir()
        assert writer.progress.lines == 5 and writer.progress.done
        with pytest.raises(elmo_cache.IncompleteCacheError):
            store.detect(output)

    def test_resume_drops_what_was_not_committed(self, output):
        sentences = _sentences(6, seed=4)
        writer = self.write(output, sentences[:4], finalize=False)
        committed = writer.progress
        resumed = store.writer_class(self.fmt).resume(output, self.layout(), committed)
        # Appended but never committed: a crash loses it, and a resume must not see it.
        resumed.append(
            np.ones((3, 2, DIM), np.float32),
            np.array([99], np.int64),
            np.array([3], np.int32),
            np.array([5], np.uint64),
        )
        resumed.close()
        again = store.writer_class(self.fmt).resume(output, self.layout(), committed)
        rows = committed.rows
        lengths = np.array([len(s) for s in sentences[4:]], dtype=np.int32)
        offsets = rows + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        again.append(np.concatenate(sentences[4:]), offsets, lengths, np.array([11, 12], np.uint64))
        again.commit(done=True)
        hashes, _ = again.index()
        again.finalize(_metadata(again.progress, complete=True, n_unique=len(hashes), row_shape=(2, DIM)))
        with elmo_cache.open(output) as cache:
            assert len(cache) == 6
            for i, expected in enumerate(sentences):
                np.testing.assert_array_equal(cache[i], expected.transpose(1, 0, 2))

    def test_an_empty_cache(self, output):
        self.write(output, [])
        with elmo_cache.open(output) as cache:
            assert len(cache) == 0 and cache.n_tokens == 0 and cache.find("anything") is None

    def test_mixed_rows(self, output):
        rng = np.random.default_rng(5)
        sentences = [rng.standard_normal((n, DIM)).astype(np.float32) for n in (2, 0, 4)]
        self.write(output, sentences)
        with elmo_cache.open(output) as cache:
            assert cache.kind == "mix" and cache.layers is None
            for i, expected in enumerate(sentences):
                np.testing.assert_array_equal(cache[i], expected)


class TestZarrStore(StoreContract):
    fmt = "zarr"


class TestHdf5Store(StoreContract):
    fmt = "hdf5"
