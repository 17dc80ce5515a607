"""``serve --write-back``: misses kept in the cache's journal, in process (real tiny model, real caches)."""

from __future__ import annotations

import asyncio
import errno
import os

import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.writeback import AloneEncoder
from elmo_cache.encoder import batch_free
from elmo_cache.encoder.batch_free import rows_batch_free
from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.model import bilm as bilm_module
from elmo_cache.reader.writeback import open_journal
from elmo_cache.server import create_app, load_resources
from elmo_cache.server.writeback import key_of
from elmo_cache.store import journal as journal_module
from elmo_cache.store.journal import journal_path
from elmo_cache.text.tokenize import tokenize
from elmo_cache.verify.checks import verify
from tests.server_helpers import LINES, UNSEEN, decode, metric, run, serving, settings


@pytest.fixture(scope="module")
def encoder(tiny_model):
    return elmo_cache.Encoder.load(tiny_model, device="cpu")


def _build(path, encoder, lines, **options):
    corpus = path.with_name(path.name + ".txt")
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    build(corpus, BuildOptions(output=path, device="cpu", progress=False, **options), encoder=encoder)
    return elmo_cache.open(path)


def _fresh_row(tmp_path, encoder, line, **options):
    """What a fresh build of ``line`` stores: its stored rows (undecoded) and its pooled vector (or None)."""
    path = tmp_path / f"fresh-{abs(hash((line, str(sorted(options.items())))))}.zarr"
    cache = _build(path, encoder, [line], **options)
    raw = cache._sentence(0, stored=True)
    rows = np.asarray(raw.transpose(1, 0, 2) if cache.kind == "layers" else raw)
    pooled = None if cache.pool is None else np.asarray(cache.sentence_vector(0))
    return cache, rows, pooled


def _wb_settings(cache_path, **overrides):
    return settings(cache_path=cache_path, write_back=True, write_back_commit_ms=5.0, **overrides)


CASES = {
    "float32": {},
    "fp16-layers-1-2": {"layers": (1, 2), "fp16": True},
    "int8": {"quantize": "int8"},
    "mix-fp16-pool-mean": {"mix": "0.2,0.3,0.5", "fp16": True, "pool": "mean"},
    "int8-pool-max-hdf5": {"quantize": "int8", "pool": "max", "format": "hdf5"},
    "pq": {"quantize": "pq:4"},
}


@pytest.mark.parametrize("case", list(CASES))
def test_written_back_hit_equals_a_fresh_build(tmp_path, encoder, case):
    """A miss is answered, kept, and from then on answered from the journal with the bytes a fresh build of that
    sentence stores; the first live answer already equals the later hits; ``Cache.get`` finds it too."""
    from elmo_cache.rows.selection import MixSpec

    options = dict(CASES[case])
    if "mix" in options:
        options["mix"] = MixSpec.from_raw(options["mix"])
    suffix = ".h5" if options.get("format") == "hdf5" else ".zarr"
    cache = _build(tmp_path / f"served{suffix}", encoder, LINES, **options)
    app = create_app(_wb_settings(cache.path), encoder=encoder, cache=cache)
    pooled_asked = cache.pool.method if cache.pool is not None else None

    async def scenario(client):
        first, second = [], []
        for line in UNSEEN:
            params = {"sentence": line, "format": "npy"}
            first.append(await client.get("/embed", params=params))
        assert app.state.service.writeback.journal.flush(10)
        for line in UNSEEN:
            second.append(await client.get("/embed", params={"sentence": f" {line}  ", "format": "npy"}))
        pooled = []
        if pooled_asked:
            for line in UNSEEN:
                params = {"sentence": line, "format": "npy", "pool": pooled_asked}
                pooled.append(await client.get("/embed", params=params))
        return first, second, pooled, (await client.get("/metrics")).text

    first, second, pooled, text = run(app, scenario)
    assert [r.headers["x-elmo-source"] for r in first] == ["live"] * 3
    assert [r.headers["x-elmo-source"] for r in second] == ["cache"] * 3
    assert metric(text, "elmo_cache_writeback_written_total") == 3
    assert metric(text, "elmo_cache_writeback_hits_total") == 3 + len(pooled)
    assert metric(text, "elmo_cache_cache_misses_total") == 3
    assert metric(text, "elmo_cache_live_sentences_total") == 3
    reopened = elmo_cache.open(cache.path)
    if cache.codec.training_vectors is not None:
        # A trained codec (pq): a fresh build of one line would train other codebooks, so there is no fresh
        # build to compare with; the kept codes are the cache's codebooks' codes of the sentence encoded alone,
        # and every answer, live or hit, decodes them.
        for k, line in enumerate(UNSEEN):
            assert decode(second[k]).tobytes() == decode(first[k]).tobytes() == reopened.get(line).tobytes()
            alone = AloneEncoder.for_cache(encoder, cache).encode(tokenize(line))
            assert alone.rows.dtype == np.uint8
            np.testing.assert_array_equal(reopened.get(line), cache.sentence_from_rows(alone.rows))
        reopened.close()
        return
    for k, line in enumerate(UNSEEN):
        fresh, rows, fresh_pooled = _fresh_row(tmp_path, encoder, line, **{**options, "format": "zarr"})
        with open_journal(cache) as journal:
            kept_rows, kept_pooled = journal.get(key_of(tokenize(line)))
        assert kept_rows.dtype == rows.dtype and kept_rows.tobytes() == rows.tobytes()
        if fresh_pooled is not None:
            assert kept_pooled.tobytes() == fresh_pooled.tobytes()
            assert decode(pooled[k]).tobytes() == fresh_pooled.tobytes()
        want = np.asarray(fresh[0])
        assert decode(second[k]).tobytes() == want.tobytes()  # a hit on it: the fresh build's vector
        assert decode(first[k]).tobytes() == want.tobytes()  # and so was the live answer
        assert reopened.get(line).tobytes() == want.tobytes()  # the library's lookups consult the journal
        if fresh_pooled is not None:
            assert reopened.sentence_vector(line).tobytes() == fresh_pooled.tobytes()
        if fresh.pool is None or fresh.pool.method != "mean":  # a pool computed from the rows, as for a hit
            assert reopened.sentence_vector(line, pool="mean").tobytes() == fresh.sentence_vector(0, "mean").tobytes()
        assert reopened.find(line) is None  # it has no sentence number
    reopened.close()


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_pool_only_cache_keeps_the_pooled_vectors_of_its_misses(tmp_path, encoder, suffix):
    """A --pool-only cache stores no token rows: write-back keeps each miss's pooled vector (records of rows of no
    values), a later pooled request is a hit with the bytes a fresh build stores, a token request still goes live
    (and is kept for its pool), and the library's lookups answer as for a cached sentence."""
    options = {"pool": "max", "pool_only": True, "fp16": True}
    cache = _build(tmp_path / f"p{suffix}", encoder, LINES, **options)
    app = create_app(_wb_settings(cache.path), encoder=encoder, cache=cache)

    async def scenario(client):
        asked = [{"sentence": line, "format": "npy", "pool": "max"} for line in UNSEEN[:2]]
        first = [await client.get("/embed", params=params) for params in asked]
        tokens = await client.get("/embed", params={"sentence": UNSEEN[2], "format": "npy"})
        assert app.state.service.writeback.journal.flush(10)
        second = [await client.get("/embed", params=params) for params in asked]
        kept_by_tokens = await client.get("/embed", params={"sentence": UNSEEN[2], "format": "npy", "pool": "max"})
        again = await client.get("/embed", params={"sentence": UNSEEN[2], "format": "npy"})
        return first, tokens, second, kept_by_tokens, again, (await client.get("/metrics")).text

    first, tokens, second, kept_by_tokens, again, text = run(app, scenario)
    assert [r.headers["x-elmo-source"] for r in first] == ["live", "live"]
    assert [r.headers["x-elmo-source"] for r in second] == ["cache", "cache"]
    assert tokens.headers["x-elmo-source"] == again.headers["x-elmo-source"] == "live"  # no token rows to keep
    assert kept_by_tokens.headers["x-elmo-source"] == "cache"
    assert decode(again).tobytes() == decode(tokens).tobytes()
    assert metric(text, "elmo_cache_writeback_written_total") == 3
    assert metric(text, "elmo_cache_writeback_hits_total") == 3
    report = verify(cache.path)  # the journal's records read back whole under the pool-only layout
    assert report.ok and any("write-back journal" in check and "3 sentences" in check for check in report.checks)
    reopened = elmo_cache.open(cache.path)
    for k, line in enumerate(UNSEEN):
        with _build(tmp_path / f"fresh-{k}{suffix}", encoder, [line], **options) as fresh:
            fresh_pooled = np.asarray(fresh.sentence_vector(0))
        with open_journal(cache) as journal:
            rows, pooled = journal.get(key_of(tokenize(line)))
        assert rows.shape == (len(tokenize(line)), 0) and pooled.tobytes() == fresh_pooled.tobytes()
        hit = second[k] if k < 2 else kept_by_tokens
        assert decode(hit).tobytes() == fresh_pooled.tobytes()
        assert reopened.sentence_vector(line).tobytes() == fresh_pooled.tobytes()
        with pytest.raises(InvalidParameterError, match="pool-only"):
            reopened.get(line)  # as for a cached sentence: no token vectors
        with pytest.raises(InvalidParameterError, match="pool-only"):
            reopened.sentence_vector(line, pool="mean")
    reopened.close()


def test_a_sentence_not_finite_once_stored_is_marked_not_refused(encoder):
    """What a build would refuse (float16 overflows under a loud mix) is encoded anyway and marked ``finite=False``:
    write-back leaves it out, and the live answer is still made from the encoder's float32 output."""
    from elmo_cache.rows.codecs import FLOAT16
    from elmo_cache.rows.selection import MixSpec, Selection

    tokens = tokenize(UNSEEN[0])
    loud = AloneEncoder(encoder, Selection(layers=None, mix=MixSpec.from_raw([1, 1, 1], gamma=1e6)), FLOAT16, None)
    alone = loud.encode(tokens)
    assert alone.finite is False
    assert alone.acts.dtype == np.float32 and alone.acts.shape == (3, len(tokens), encoder.output_dim)
    assert np.isfinite(alone.acts).all()
    assert alone.rows.dtype == np.float16 and not np.isfinite(alone.rows).all()
    quiet = AloneEncoder(encoder, Selection(layers=None, mix=MixSpec.from_raw([1, 1, 1])), FLOAT16, None)
    assert quiet.encode(tokens).finite is True


def test_write_back_is_refused_where_its_rows_would_not_be_the_caches(tmp_path, encoder, tiny_model):
    from elmo_cache.model.random_model import write_random_model

    cache = _build(tmp_path / "c.zarr", encoder, LINES)
    other = elmo_cache.Encoder.load(write_random_model(tmp_path, "tiny", seed=7), device="cpu")
    with pytest.raises(InvalidParameterError, match="weights_sha256"):
        load_resources(_wb_settings(cache.path), encoder=other, cache=cache)
    with pytest.raises(InvalidParameterError, match="needs the model that built"):
        load_resources(_wb_settings(cache.path, precision="bf16"), cache=cache)
    with pytest.raises(InvalidParameterError, match="name the cache"):
        load_resources(settings(write_back=True), encoder=encoder)
    # A journal written for another cache (other layers) is refused by the server, ignored by a reader.
    layers = _build(tmp_path / "l.zarr", encoder, LINES, layers=(2,))
    open_journal(layers, journal_path(cache.path), writable=True).close()
    app = create_app(_wb_settings(cache.path), encoder=encoder, cache=cache)

    async def start():
        async with serving(app):
            pass

    with pytest.raises(CacheFormatError, match="written for another cache: its layers differ"):
        asyncio.run(start())
    with pytest.warns(UserWarning, match="another cache"):
        assert elmo_cache.open(cache.path).get(UNSEEN[0]) is None


def test_concurrent_misses_of_one_sentence_encode_it_once(tmp_path, encoder, monkeypatch):
    """Many requests for the same new sentence at once: one encoding, one record, every answer equal."""
    import threading

    cache = _build(tmp_path / "c.zarr", encoder, LINES)
    app = create_app(_wb_settings(cache.path), encoder=encoder, cache=cache)
    calls = []
    gate = threading.Event()
    real = encoder.encode_flat

    def gated(sentences):
        calls.append([list(s) for s in sentences])
        assert gate.wait(30)
        return real(sentences)

    monkeypatch.setattr(encoder, "encode_flat", gated)
    n = 12

    async def scenario(client):
        asks = [
            asyncio.create_task(client.get("/embed", params={"sentence": UNSEEN[0], "format": "npy"})) for _ in range(n)
        ]
        # Every request but the first waits for the first one's encoding before the encoder may finish.
        for _ in range(2000):
            text = (await client.get("/metrics")).text
            if metric(text, "elmo_cache_writeback_shared_total") == n - 1:
                break
            await asyncio.sleep(0.01)
        gate.set()
        answers = await asyncio.gather(*asks)
        assert app.state.service.writeback.journal.flush(10)
        return answers, (await client.get("/metrics")).text

    answers, text = run(app, scenario)
    assert calls == [[tokenize(UNSEEN[0])]]
    assert metric(text, "elmo_cache_writeback_shared_total") == n - 1
    assert metric(text, "elmo_cache_live_sentences_total") == 1
    assert metric(text, "elmo_cache_writeback_written_total") == 1
    assert len({decode(a).tobytes() for a in answers}) == 1
    assert all(a.status_code == 200 for a in answers)


def test_a_full_journal_or_a_failing_disk_still_answers(tmp_path, encoder, monkeypatch, caplog):
    """At its byte bound the journal stops growing; a write that fails (ENOSPC) loses only that record: the
    answers are served, the failure is logged and counted, and later writes go on once the disk has room."""
    cache = _build(tmp_path / "c.zarr", encoder, LINES)
    path = journal_path(cache.path)
    # Room for the header and about one record of the longest unseen sentence.
    with open_journal(cache, path, writable=True) as journal:
        header = journal.size
    os.remove(path)
    record = 8 + 8 + 40 + 3 * 32 * 4 * 7  # frame, body header, key, rows of 7 tokens
    app = create_app(
        _wb_settings(cache.path, write_back_max_bytes=max(4096, header + record + 10)), encoder=encoder, cache=cache
    )
    many = [f"w{k} " * 40 for k in range(4)]  # 40 tokens each: 15 KiB, past the bound after the first

    async def full(client):
        answers = [await client.get("/embed", params={"sentence": line}) for line in many]
        app.state.service.writeback.journal.flush(10)
        again = await client.get("/embed", params={"sentence": many[0]})
        return answers, again, (await client.get("/metrics")).text

    with caplog.at_level("WARNING", logger="elmo_cache.server"):
        answers, again, text = run(app, full)
    assert all(a.status_code == 200 and a.json()["source"] == "live" for a in answers)
    assert again.json()["source"] == "live"  # nothing fitted: 40-token rows are over the bound
    assert metric(text, "elmo_cache_writeback_full_total") == 5
    assert metric(text, "elmo_cache_writeback_written_total") == 0
    assert os.path.getsize(path) <= max(4096, header + record + 10)
    assert "reached --write-back-max-bytes" in caplog.text

    os.remove(path)
    app = create_app(_wb_settings(cache.path), encoder=encoder, cache=cache)
    real_pwrite = os.pwrite
    failing = {"on": True}

    def pwrite(fd, data, offset):
        if failing["on"] and offset > 0:  # the header goes in; records find the disk full
            real_pwrite(fd, data[: len(data) // 2], offset)  # a partial write first, as a filling disk does
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(journal_module.os, "pwrite", pwrite)

    async def disk_full(client):
        first = await client.get("/embed", params={"sentence": UNSEEN[0]})
        journal = app.state.service.writeback.journal
        journal.flush(10)
        assert os.path.getsize(path) == journal.size  # the partial write was cut back at once
        after = await client.get("/embed", params={"sentence": UNSEEN[0]})
        app.state.service.writeback.journal.flush(10)
        failing["on"] = False  # room again
        third = await client.get("/embed", params={"sentence": UNSEEN[0]})
        app.state.service.writeback.journal.flush(10)
        fourth = await client.get("/embed", params={"sentence": UNSEEN[0]})
        return first, after, third, fourth, (await client.get("/metrics")).text

    caplog.clear()
    with caplog.at_level("ERROR", logger="elmo_cache.writeback"):
        first, after, third, fourth, text = run(app, disk_full)
    assert first.status_code == after.status_code == third.status_code == fourth.status_code == 200
    assert [r.json()["source"] for r in (first, after, third, fourth)] == ["live", "live", "live", "cache"]
    assert metric(text, "elmo_cache_writeback_failures_total") == 2
    assert metric(text, "elmo_cache_writeback_written_total") == 1
    assert "No space left on device" in caplog.text
    with open_journal(cache) as journal:  # the partial writes were cut off: one clean record
        assert len(journal) == 1 and journal.dropped_tail == 0


def test_metrics_and_info_describe_the_journal(tmp_path, encoder):
    cache = _build(tmp_path / "c.zarr", encoder, LINES)
    app = create_app(_wb_settings(cache.path), encoder=encoder, cache=cache)

    async def scenario(client):
        await client.post("/embed", json={"sentences": [LINES[0], UNSEEN[1], UNSEEN[1], UNSEEN[2]]})
        app.state.service.writeback.journal.flush(10)
        return (await client.get("/metrics")).text, (await client.get("/info")).json()

    text, info = run(app, scenario)
    assert info["write_back"] == {
        "journal": str(journal_path(cache.path)),
        "sentences": 2,
        "bytes": os.path.getsize(journal_path(cache.path)),
        "max_bytes": 1 << 30,
        "commit_ms": 5.0,
        "shared_batches": rows_batch_free(encoder),
    }
    assert metric(text, "elmo_cache_cache_hits_total") == 1
    assert metric(text, "elmo_cache_cache_misses_total") == 3
    assert metric(text, "elmo_cache_live_sentences_total") == 2  # the repeat in one request is encoded once
    assert metric(text, "elmo_cache_writeback_written_total") == 2
    assert metric(text, "elmo_cache_writeback_bytes") == os.path.getsize(journal_path(cache.path))


LONGER = [
    "The committee said on Tuesday that the new rules would apply to every school in the region from next year .",
    "Nobody at the meeting could explain why the figures published in March differed so much from the earlier ones .",
    "A spokesman for the company declined to comment on the report , saying only that talks were continuing .",
    "Heavy rain is expected across the north of the country tonight , with strong winds along the coast .",
    "short one",
]


@pytest.fixture(scope="module")
def bundled():
    return elmo_cache.Encoder.load("bundled", device="cpu")


@pytest.fixture
def unrounded(bundled):
    """The bundled model on an encoder that does not round its products' rows (elmo_cache.model.bilm): the rows of
    a device where a sentence's last bits change when it shares a batch with others (this CPU's fp32 products of
    1-3 rows, benchmarks/RESULTS.md "Batch invariance")."""
    bundled.bilm.row_multiple = bundled.bilm.word_multiple = 1
    bundled.clear_word_cache()
    batch_free._checked.pop(bundled, None)  # the check's answer is per encoder: this one now computes otherwise
    yield bundled
    bundled.bilm.row_multiple, bundled.bilm.word_multiple = bilm_module.ROW_MULTIPLE, bilm_module.WORD_MULTIPLE
    bundled.clear_word_cache()
    batch_free._checked.pop(bundled, None)


def test_misses_of_one_request_are_each_kept_as_a_fresh_build_of_it(tmp_path, unrounded):
    """Where a sentence's last bits depend on its batch, encoding each miss alone shows: three misses of one
    request, kept byte for byte as three fresh builds, where the live batch without write-back differs."""
    bundled = unrounded
    cache = _build(tmp_path / "c.zarr", bundled, LINES)
    app = create_app(_wb_settings(cache.path), encoder=bundled, cache=cache)

    async def scenario(client):
        response = await client.post("/embed", json={"sentences": LONGER, "format": "npy"})
        assert response.status_code == 200 and response.headers["x-elmo-sources"] == ",".join(["live"] * len(LONGER))
        assert app.state.service.writeback.journal.flush(10)

    run(app, scenario)
    batched = bundled.embed_batch([tokenize(line) for line in LONGER])
    differs = 0
    with open_journal(cache) as journal:
        for line, live in zip(LONGER, batched):
            _, rows, _ = _fresh_row(tmp_path, bundled, line)
            kept, _ = journal.get(key_of(tokenize(line)))
            assert kept.tobytes() == rows.tobytes()
            differs += live.transpose(1, 0, 2).tobytes() != rows.tobytes()
    assert differs > 0  # the batched live answers are not the fresh build's bytes: the test can tell


def test_on_a_batch_free_device_live_answers_are_the_fresh_builds_bytes(tmp_path, bundled):
    """The encoder rounds its products' rows, so where the device's check passes a sentence answered live inside a
    batch of others holds the bytes a fresh build of it stores (and those a build of the whole corpus stores)."""
    if not rows_batch_free(bundled):
        pytest.skip("this device's rows depend on their batch (elmo_cache.encoder.batch_free)")
    bundled.clear_word_cache()
    batched = bundled.embed_batch([tokenize(line) for line in LONGER])
    together = _build(tmp_path / "all.zarr", bundled, LONGER)
    for k, (line, live) in enumerate(zip(LONGER, batched)):
        _, rows, _ = _fresh_row(tmp_path, bundled, line)
        assert live.transpose(1, 0, 2).tobytes() == rows.tobytes()
        assert np.asarray(together._sentence(k, stored=True)).transpose(1, 0, 2).tobytes() == rows.tobytes()


def test_where_rows_are_batch_free_the_misses_of_a_request_share_one_batch(tmp_path, bundled, monkeypatch):
    """Rows that are the same bits in any batch need no batch of their own: a request's misses are encoded in one
    encoder call (counted with the check forced, so on any CPU) and, where the check really passes, each is kept
    with the bytes a fresh build of it stores."""
    really = rows_batch_free(bundled)
    cache = _build(tmp_path / "c.zarr", bundled, LINES)
    app = create_app(_wb_settings(cache.path), encoder=bundled, cache=cache)
    monkeypatch.setattr(batch_free, "rows_batch_free", lambda encoder: True)
    calls = []
    original = bundled.encode_flat
    monkeypatch.setattr(bundled, "encode_flat", lambda sentences: calls.append(len(sentences)) or original(sentences))

    async def scenario(client):
        response = await client.post("/embed", json={"sentences": LONGER, "format": "npy"})
        assert response.status_code == 200 and response.headers["x-elmo-sources"] == ",".join(["live"] * len(LONGER))
        assert app.state.service.writeback.journal.flush(10)

    run(app, scenario)
    assert calls == [len(LONGER)]
    monkeypatch.undo()
    if not really:
        pytest.skip("this device's rows depend on their batch: misses are encoded one by one here")
    with open_journal(cache) as journal:
        for line in LONGER:
            _, rows, _ = _fresh_row(tmp_path, bundled, line)
            kept, _ = journal.get(key_of(tokenize(line)))
            assert kept.tobytes() == rows.tobytes()
