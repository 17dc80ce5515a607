"""``verify`` checks the write-back journal beside a cache, when there is one."""

from __future__ import annotations

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.writeback import AloneEncoder
from elmo_cache.reader.writeback import open_journal
from elmo_cache.store.journal import journal_path
from elmo_cache.text.tokenize import tokenize
from elmo_cache.verify import verify

LINES = ["The cat sat on the mat .", "hello world"]


def _cache(tmp_path, encoder, name, **options):
    corpus = tmp_path / f"{name}.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    build(corpus, BuildOptions(output=tmp_path / name, device="cpu", progress=False, **options), encoder=encoder)
    return elmo_cache.open(tmp_path / name)


def test_verify_checks_the_journal(tmp_path, tiny_model):
    encoder = elmo_cache.Encoder.load(tiny_model, device="cpu")
    cache = _cache(tmp_path, encoder, "c.zarr")
    assert not any("journal" in check for check in verify(cache.path).checks)  # none: nothing said
    alone = AloneEncoder.for_cache(encoder, cache)
    with open_journal(cache, writable=True) as journal:
        for line in ("a new line", "another new one here"):
            encoded = alone.encode(tokenize(line))
            journal.add(" ".join(tokenize(line)).encode(), encoded.rows, encoded.pooled)
    report = verify(cache.path)
    assert report.ok and any("write-back journal c.zarr.writeback: 2 sentences" in check for check in report.checks)
    path = journal_path(cache.path)
    path.write_bytes(path.read_bytes() + b"\x10\x00\x00\x00torn")
    report = verify(cache.path)
    assert report.ok and any("ends with 8 bytes that are not whole records" in note for note in report.notes)
    other = _cache(tmp_path, encoder, "other.zarr", layers=(1,))
    path.rename(journal_path(other.path))
    report = verify(other.path)
    assert not report.ok and "written for another cache: its layers differ" in report.problems[0]
