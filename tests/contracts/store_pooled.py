"""The store contract for pooled sentence vectors (``build --pool``): what every container must do with the
per-sentence ``pooled`` array. A container's test class inherits :class:`PooledStoreContract` beside
:class:`tests.contracts.store.StoreContract`, whose hooks (``data_of``, ``where``, ``delete_array``, ``layout``,
``output``) it uses; this module holds no test of its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import elmo_cache
from elmo_cache import store
from elmo_cache.errors import CacheCorruptError, CacheFormatError
from elmo_cache.rows.pooling import Pool, pool_rows
from elmo_cache.store import Progress
from elmo_cache.store.format import POOLED_ARRAY
from elmo_cache.text.tokenize import sentence_hash
from elmo_cache.verify.checks import verify
from tests.contracts.store import DIM, _metadata, _sentences, _tokens


class PooledStoreContract:
    """Pooled vectors written beside the token rows: read back, covered by both checksums, cut back on resume."""

    fmt: str

    def write_pooled(self, output: Path, sentences: list[np.ndarray], method: str = "mean", *, stop_after: int = -1):
        """Write ``sentences`` (float32 ``(n, 2, DIM)``) with their ``method`` pool; returns the pools written.
        ``stop_after`` >= 0: commit that many pairs of sentences, append one more pair uncommitted, and stop there
        (the writer closed, as a killed build leaves it)."""
        pool = Pool(method, "float32")
        layout = dataclasses.replace(self.layout(), pooled_shape=pool.shape((2, DIM)), pooled_dtype="float32")
        progress = Progress(identity={"fmt": self.fmt})
        meta = _metadata(progress, complete=False, n_unique=0, row_shape=layout.row_shape) | {
            "pool": pool.to_metadata()
        }
        writer = store.writer_class(self.fmt).create(output, layout, progress, meta)
        pools = [pool_rows(s, method) for s in sentences]
        rows = 0
        for pair, k in enumerate(range(0, len(sentences), 2)):
            chunk = sentences[k : k + 2]
            lengths = np.array([len(s) for s in chunk], dtype=np.int32)
            offsets = rows + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
            tokens = _tokens(chunk, k)
            hashes = np.array([sentence_hash(t) for t in tokens], dtype=np.uint64)
            writer.append(np.concatenate(chunk), offsets, lengths, hashes, tokens, np.stack(pools[k : k + 2]))
            rows += int(lengths.sum())
            if pair == stop_after:
                writer.close()
                return writer, pools
            writer.commit(done=k + 2 >= len(sentences))
        hashes, _ = writer.index()
        final = _metadata(writer.progress, complete=True, n_unique=len(hashes), row_shape=layout.row_shape)
        writer.finalize(final | {"pool": pool.to_metadata()})
        return writer, pools

    @pytest.mark.parametrize("method", ["mean", "max", "first-last"])
    def test_pooled_vectors_read_back(self, output, method):
        sentences = _sentences(9, seed=30)
        sentences[1] = sentences[1][:0]  # an empty sentence: a zero vector
        _, pools = self.write_pooled(output, sentences, method)
        with elmo_cache.open(output) as cache:
            assert cache.pool == Pool(method, "float32")
            for i, want in enumerate(pools):
                got = cache.sentence_vector(i)
                assert got.shape == ((2, 2 * DIM) if method == "first-last" else (2, DIM))
                np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(cache.sentence_vector(_tokens(sentences)[i]), want)  # by token list
                # Computed from the token rows by the same function: the same bits (float32 rows).
                np.testing.assert_array_equal(cache.sentence_vector(i, pool=method), want)
            assert not cache.sentence_vector(1).any() and len(cache.tokens(1)) == 0
        assert verify(output).ok

    def test_a_flipped_bit_in_the_pooled_vectors_is_found_by_reads_and_verify(self, output):
        self.write_pooled(output, _sentences(8, seed=31))
        file, offset = self.data_of(output, POOLED_ARRAY)
        data = bytearray(file.read_bytes())
        data[offset + 2] ^= 0x10  # sentence 0's first value
        file.write_bytes(bytes(data))
        report = verify(output)
        assert not report.ok
        assert self.where(POOLED_ARRAY) in report.problems[0] and "CRC-32" in report.problems[0], str(report)
        with elmo_cache.open(output) as cache:
            assert cache[0] is not None  # the token vectors are undamaged
            with pytest.raises(CacheCorruptError, match=f"array {POOLED_ARRAY!r} fail their CRC-32C"):
                cache.sentence_vector(0)

    def test_a_missing_pooled_array_is_found_by_open_and_verify(self, output):
        self.write_pooled(output, _sentences(6, seed=32))
        self.delete_array(output, POOLED_ARRAY)
        with pytest.raises(CacheFormatError, match=f"array {POOLED_ARRAY!r} is missing but the metadata says"):
            elmo_cache.open(output)
        assert not verify(output).ok

    def test_resume_cuts_the_pooled_vectors_back_to_the_commit(self, output):
        sentences = _sentences(8, seed=33)
        writer, _ = self.write_pooled(output, sentences, stop_after=2)  # pairs 0, 1 committed, pair 2 not
        column = writer.pooled
        assert (
            column is not None and column.path.stat().st_size == 6 * column.item_bytes
        )  # the uncommitted pair is there
        resumed = store.writer_class(self.fmt).resume(output, writer.layout, writer.progress)
        assert resumed.progress.lines == 4 and column.path.stat().st_size == 4 * column.item_bytes
        resumed.close()

    def test_caches_without_pooled_vectors_compute_them_and_say_how(self, output):
        sentences = _sentences(5, seed=34)
        self.write(output, sentences)  # type: ignore[attr-defined]
        with elmo_cache.open(output) as cache:
            assert cache.pool is None and "pool" not in cache.metadata
            assert POOLED_ARRAY not in cache.metadata["checksums"]["blocks"]["rows"]
            with pytest.raises(
                elmo_cache.InvalidParameterError, match=r"pool: .*built without --pool.*\['mean', 'max', 'first-last'\]"
            ):
                cache.sentence_vector(0)
            for i, x in enumerate(sentences):
                np.testing.assert_array_equal(cache.sentence_vector(i, pool="max"), pool_rows(x, "max"))
            with pytest.raises(elmo_cache.InvalidParameterError, match=r"pool: 'median' is not valid; choose from"):
                cache.sentence_vector(0, pool="median")
