"""The write-back journal file: records, reopening, torn tails, identity, the byte bound, one writer."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.store.journal import Journal, RecordLayout, encoding_identity

IDENTITY = {"kind": "layers", "layers": [0, 1, 2], "dim": 4, "dtype": "float16", "model": {"weights_sha256": "ab"}}
LAYOUT = RecordLayout(row_dtype="<f2", row_shape=(3, 4), pooled_dtype="<f2", pooled_shape=(3, 4))


def _rows(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 4)).astype("<f2"), rng.standard_normal((3, 4)).astype("<f2")


def _writer(path, **kwargs) -> Journal:
    return Journal(path, IDENTITY, LAYOUT, writable=True, commit_ms=kwargs.pop("commit_ms", 1.0), **kwargs)


def test_records_are_read_back_after_reopening(tmp_path):
    path = tmp_path / "c.zarr.writeback"
    with _writer(path) as journal:
        for k in range(5):
            assert journal.add(f"sentence {k}".encode(), *_rows(k, k + 1)) == "queued"
        assert journal.add(b"sentence 0", *_rows(9, 1)) == "exists"
        rows, pooled = journal.get(b"sentence 3")  # queued: visible at once
        assert rows.tobytes() == _rows(3, 4)[0].tobytes()
    with Journal(path, IDENTITY, LAYOUT) as reader:
        assert len(reader) == 5 and reader.dropped_tail == 0
        for k in range(5):
            rows, pooled = reader.get(f"sentence {k}".encode())
            want_rows, want_pooled = _rows(k, k + 1)
            assert rows.shape == (k + 1, 3, 4) and rows.tobytes() == want_rows.tobytes()
            assert pooled.tobytes() == want_pooled.tobytes()
        assert reader.get(b"absent") is None


def test_a_torn_tail_is_dropped_at_open_and_writing_goes_on(tmp_path, caplog):
    path = tmp_path / "j.writeback"
    with _writer(path) as journal:
        for k in range(3):
            journal.add(f"s{k}".encode(), *_rows(k, 2))
    whole = path.read_bytes()
    with _writer(path) as journal:
        journal.add(b"s3", *_rows(3, 2))
    record = path.read_bytes()[len(whole) :]
    for cut in (1, 7, 8, 20, len(record) - 1):
        path.write_bytes(whole + record[:cut])  # a record cut by a kill, anywhere
        with Journal(path, IDENTITY, LAYOUT) as reader:  # a reader skips it, touches nothing
            assert len(reader) == 3 and reader.dropped_tail == cut
        assert path.stat().st_size == len(whole) + cut
        with caplog.at_level(logging.WARNING, logger="elmo_cache.writeback"), _writer(path) as journal:
            assert len(journal) == 3 and journal.dropped_tail == cut
            assert path.stat().st_size == len(whole)  # cut off at open
            journal.add(b"s4", *_rows(4, 1))
        assert f"dropped {cut} bytes" in caplog.text
        caplog.clear()
        with Journal(path, IDENTITY, LAYOUT) as reader:
            assert len(reader) == 4 and reader.dropped_tail == 0
            assert reader.get(b"s4")[0].tobytes() == _rows(4, 1)[0].tobytes()
    # A record that fails its CRC is dropped with everything after it (its frame cannot be trusted).
    damaged = bytearray(whole + record)
    damaged[len(whole) + 12] ^= 0x01
    path.write_bytes(bytes(damaged))
    with _writer(path) as journal:
        assert len(journal) == 3 and journal.dropped_tail == len(record)


def test_a_record_damaged_after_it_was_indexed_is_an_error_not_a_wrong_vector(tmp_path):
    path = tmp_path / "j.writeback"
    with _writer(path) as journal:
        journal.add(b"s0", *_rows(0, 3))
    reader = Journal(path, IDENTITY, LAYOUT)
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFormatError, match="fails its CRC"):
        reader.get(b"s0")
    reader.close()


def test_a_journal_of_another_cache_is_refused(tmp_path):
    path = tmp_path / "j.writeback"
    _writer(path).close()
    other = {**IDENTITY, "layers": [2]}
    with pytest.raises(CacheFormatError, match="written for another cache: its layers differ"):
        Journal(path, other, LAYOUT)
    with pytest.raises(CacheFormatError, match="written for another cache"):
        Journal(path, IDENTITY, RecordLayout("<f4", (3, 4), "<f2", (3, 4)))
    (tmp_path / "not").write_bytes(b"hello world, not a journal")
    with pytest.raises(CacheFormatError, match="not an elmo-cache write-back journal"):
        Journal(tmp_path / "not", IDENTITY, LAYOUT)
    data = bytearray(path.read_bytes())
    data[20] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CacheFormatError, match="header is damaged"):
        Journal(path, IDENTITY, LAYOUT)


def test_the_encoding_identity_ignores_the_corpus_and_storage_details():
    meta = {
        **IDENTITY,
        "model": {"weights_sha256": "ab", "name": "x", "directory": "/a"},
        "corpus": {"lines": 3, "digest": "d1"},
        "n_sentences": 3,
        "chunk_rows": 10,
        "compression": None,
        "build": {"seconds": 1},
    }
    moved = {**meta, "model": {**meta["model"], "directory": "/b"}, "corpus": {"lines": 4}, "n_sentences": 4}
    assert encoding_identity(meta) == encoding_identity(moved)
    assert encoding_identity(meta) != encoding_identity({**meta, "dtype": "float32"})
    assert encoding_identity(meta) != encoding_identity({**meta, "model": {"weights_sha256": "cd"}})

    def sums(digest: str) -> dict:
        return {"blocks": {"digests": {"quantization/codebooks": digest}}}

    pq = {**meta, "quantization": {"scheme": "pq"}, "checksums": sums("1")}
    retrained = {**pq, "checksums": sums("2")}
    assert encoding_identity(pq) != encoding_identity(retrained)


def test_the_byte_bound_is_never_passed(tmp_path):
    path = tmp_path / "j.writeback"
    events = []
    with _writer(path, max_bytes=2000, listener=lambda e, v: events.append(e)) as journal:
        header = journal.size
        statuses = [journal.add(f"s{k}".encode(), *_rows(k, 10)) for k in range(20)]
    record = 8 + 8 + 2 + 10 * 24 + 24
    fits = (2000 - header) // record
    assert statuses == ["queued"] * fits + ["full"] * (20 - fits)
    assert events.count("full") == 20 - fits and events.count("written") >= 1
    assert path.stat().st_size == header + fits * record <= 2000


def test_one_writer_at_a_time(tmp_path):
    path = tmp_path / "j.writeback"
    with _writer(path):
        with pytest.raises(InvalidParameterError, match="another process is writing it"):
            _writer(path)
        Journal(path, IDENTITY, LAYOUT).close()  # readers are welcome
    _writer(path).close()  # released on close


def test_a_reader_sees_what_a_writer_commits_later(tmp_path):
    path = tmp_path / "j.writeback"
    writer = _writer(path)
    reader = Journal(path, IDENTITY, LAYOUT)
    writer.add(b"late", *_rows(1, 2))
    assert writer.flush(10)
    assert reader.get(b"late") is None
    reader.refresh()
    assert reader.get(b"late")[0].tobytes() == _rows(1, 2)[0].tobytes()
    writer.close()
    reader.close()
    assert os.path.exists(path)


def test_a_disk_full_as_the_journal_is_created_is_a_plain_refusal(tmp_path, monkeypatch):
    import errno

    from elmo_cache.store import journal as journal_module

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_module.os, "pwrite", full)
    with pytest.raises(InvalidParameterError, match="cannot prepare it: No space left on device"):
        _writer(tmp_path / "j.writeback")
