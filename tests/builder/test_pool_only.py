"""Pool-only caches (``build --pool M --pool-only``): the pooled vectors *instead of* the token vectors.

The pooled rows of a pool-only cache must be the bytes of the same build with the token vectors beside them
(both containers, dedupe, a quantised cache); every read of token vectors refuses, naming the way out."""

from __future__ import annotations

import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.options import disk_bytes
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.store.format import POOL_ONLY_FORMAT_VERSION
from elmo_cache.verify.checks import verify
from tests._build_fixtures import assert_same_cache, corpus_lines, raw_arrays, write_corpus

LINES = corpus_lines(30, seed=8)


def no_full_cache(output) -> bool:
    """Nothing but the output's own staging was ever beside it: no hidden full ``--pool`` cache (the strip that
    wrote one at ``.<name>.pool-only-full<suffix>`` is gone)."""
    return not list(output.parent.glob(f".{output.name}*"))


def _pair(tmp_path, encoder, suffix: str, **extra):
    """The same build with the token vectors beside the pooled ones, and pool-only: their paths."""
    corpus = write_corpus(tmp_path / "c.txt", LINES)
    beside, only = tmp_path / f"beside{suffix}", tmp_path / f"only{suffix}"
    common = dict(progress=False, batch_tokens=64, **extra)
    build(corpus, BuildOptions(output=beside, **common), encoder=encoder)
    summary = build(corpus, BuildOptions(output=only, pool_only=True, **common), encoder=encoder)
    assert summary.path == only and summary.n_rows == 0 and not summary.already_complete
    return corpus, beside, only


@pytest.mark.parametrize(
    ("suffix", "extra"),
    [
        (".zarr", {"pool": "mean", "dedupe": True, "fp16": True}),
        (".h5", {"pool": "max", "dedupe": True}),
        (".h5", {"pool": "first-last", "fp16": True, "layers": "0,2"}),
        (".zarr", {"pool": "mean", "quantize": "int8"}),
    ],
)
def test_pooled_rows_are_the_beside_builds_byte_for_byte(tmp_path, tiny_encoder, suffix, extra):
    _, beside, only = _pair(tmp_path, tiny_encoder, suffix, **extra)
    meta_b, full = raw_arrays(beside)
    meta_o, stripped = raw_arrays(only)
    assert stripped["pooled"].tobytes() == full["pooled"].tobytes() and stripped["pooled"].dtype == full["pooled"].dtype
    assert stripped["vectors"].shape == (0, *full["vectors"].shape[1:])
    for name in ("offsets", "lengths", "index/hashes", "index/rows", "tokens/bytes", "tokens/offsets"):
        assert np.array_equal(stripped[name], full[name]), name
    assert meta_o["pool"] == {**meta_b["pool"], "only": True}
    assert meta_o["format_version"] == POOL_ONLY_FORMAT_VERSION
    assert (
        meta_o["n_rows"] == 0 and meta_o["n_tokens"] == meta_b["n_tokens"] and meta_o["n_unique"] == meta_b["n_unique"]
    )
    assert no_full_cache(only)
    report = verify(only)
    assert report.ok, report
    b, o = elmo_cache.open(beside), elmo_cache.open(only)
    for i, line in enumerate(LINES):
        assert o.sentence_vector(i).tobytes() == b.sentence_vector(i).tobytes()
        if line.split():
            assert o.sentence_vector(line).tobytes() == b.sentence_vector(line).tobytes()
    # What it saves on disk: at least every token row (zarr pads a last shard, HDF5 adds nothing per dataset).
    saved = disk_bytes(beside) - disk_bytes(only)
    assert saved >= full["vectors"].nbytes > 0


def test_reads_of_token_vectors_refuse_naming_sentence_vector(tmp_path, tiny_encoder):
    _, _, only = _pair(tmp_path, tiny_encoder, ".zarr", pool="mean")
    cache = elmo_cache.open(only)
    assert cache.pool_only and cache.pool is not None and cache.pool.only
    message = r"stores only pooled vectors \(--pool-only, pool 'mean'\), no token vectors; use cache.sentence_vector"
    empty = next(i for i, line in enumerate(LINES) if not line.split())
    for read in (lambda: cache[0], lambda: cache[empty], lambda: cache.get(LINES[0]), lambda: list(cache)):
        with pytest.raises(InvalidParameterError, match=message):
            read()
    with pytest.raises(InvalidParameterError, match=r"pool: .* stores only 'mean' pooled vectors .* to compute 'max'"):
        cache.sentence_vector(0, pool="max")
    assert cache.sentence_vector(0, pool="mean") is not None and cache.tokens(0) == LINES[0].split()
    assert cache.find(LINES[0]) == 0 and LINES[0] in cache


def test_pool_only_needs_a_pool_and_is_part_of_the_identity(tmp_path, tiny_encoder):
    corpus = write_corpus(tmp_path / "c.txt", LINES[:6])
    with pytest.raises(InvalidParameterError, match=r"pool_only: --pool-only .* needs --pool"):
        build(corpus, BuildOptions(output=tmp_path / "x.zarr", pool_only=True, progress=False), encoder=tiny_encoder)
    output = tmp_path / "c.zarr"
    build(corpus, BuildOptions(output=output, pool="mean", pool_only=True, progress=False), encoder=tiny_encoder)
    again = build(
        corpus, BuildOptions(output=output, pool="mean", pool_only=True, progress=False), encoder=tiny_encoder
    )
    assert again.already_complete and again.n_rows == 0
    with pytest.raises(CacheExistsError, match=r"pool: \{'method': 'mean', 'dtype': 'float32', 'only': True\} there"):
        build(corpus, BuildOptions(output=output, pool="mean", progress=False), encoder=tiny_encoder)


def test_verify_notes_the_skipped_recompute_and_samples_pools(tmp_path, tiny_encoder):
    _, _, only = _pair(tmp_path, tiny_encoder, ".h5", pool="mean", fp16=True, dedupe=True)
    report = verify(only, sample=6, encoder=tiny_encoder)
    assert report.ok, report
    assert any("not recomputed from token vectors (a --pool-only cache stores none)" in note for note in report.notes)
    assert report.sampled == 6 and any(
        "stored mean vectors match the mean of a fresh encoding" in c for c in report.checks
    )
    # The zero-row layout passes for the cache that says it is pool-only; its bounds are still checked.
    assert any("offsets and lengths consistent (deduplicated)" in check for check in report.checks)


def test_sample_catches_a_wrong_pool(tmp_path, tiny_encoder, monkeypatch):
    """--sample re-encodes: a fresh encoding that differs from the stored pools is caught (the check can fail)."""
    _, _, only = _pair(tmp_path, tiny_encoder, ".zarr", pool="max")
    real = tiny_encoder.embed_batch
    monkeypatch.setattr(tiny_encoder, "embed_batch", lambda lists: [a + 0.01 for a in real(lists)])
    report = verify(only, sample=4, encoder=tiny_encoder)
    assert not report.ok
    assert "the stored max vector differs from the max of a fresh encoding by up to 0.01" in report.problems[0]


def test_resume_after_a_crash_equals_an_uninterrupted_build(tmp_path, tiny_encoder):
    from tests._build_fixtures import failing_on

    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False, pool="mean", dedupe=True)
    reference = tmp_path / "reference.zarr"
    build(corpus, BuildOptions(output=reference, pool_only=True, **options), encoder=tiny_encoder)
    output = tmp_path / "resumed.zarr"
    for fail_at in (7, 3):
        with failing_on(tiny_encoder, fail_at), pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, pool_only=True, **options), encoder=tiny_encoder)
        assert not output.exists()
    summary = build(corpus, BuildOptions(output=output, pool_only=True, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and summary.n_rows == 0
    assert_same_cache(output, reference)
    assert verify(output).ok


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_build_writes_no_full_cache_and_a_crash_in_its_finish_is_redone(tmp_path, tiny_encoder, monkeypatch, suffix):
    import elmo_cache.store.hdf5.writer as hdf5_writer
    import elmo_cache.store.zarr.write as zarr_write

    corpus = write_corpus(tmp_path / "c.txt", LINES)
    reference, output = tmp_path / f"r{suffix}", tmp_path / f"o{suffix}"
    options = dict(pool="mean", pool_only=True, dedupe=True, progress=False)
    build(corpus, BuildOptions(output=reference, **options), encoder=tiny_encoder)
    assert no_full_cache(reference)
    # zarr: after the pooled rows were moved into the group (not copied); HDF5: once cache.h5 is written.
    module, name = (zarr_write, "_write_checksums") if suffix == ".zarr" else (hdf5_writer, "fsync_path")

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash in the finish")

    monkeypatch.setattr(module, name, crash)
    with pytest.raises(RuntimeError, match="in the finish"):
        build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert not output.exists() and no_full_cache(output)
    monkeypatch.undo()
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert not summary.already_complete and summary.n_rows == 0
    assert_same_cache(output, reference)
    assert verify(output).ok


def test_export_and_dataset_refuse(tmp_path, tiny_encoder):
    from elmo_cache.compat.export import export
    from elmo_cache.reader.dataset import CacheDataset

    _, _, only = _pair(tmp_path, tiny_encoder, ".h5", pool="mean")
    with pytest.raises(InvalidParameterError, match=r"stores only pooled sentence vectors \(--pool-only\), no token"):
        export(only, tmp_path / "out.hdf5")
    assert not (tmp_path / "out.hdf5").exists()
    with pytest.raises(InvalidParameterError, match=r"path: .* \(--pool-only\).*sentence_vector\(i\)"):
        CacheDataset(only)


def test_cli(tmp_path, tiny_model):
    from click.testing import CliRunner

    from elmo_cache.cli.main import cli

    corpus = write_corpus(tmp_path / "c.txt", LINES[:8])
    model = ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--no-progress"]
    runner = CliRunner()
    bad = runner.invoke(cli, ["build", str(corpus), "-o", str(tmp_path / "x.zarr"), "--pool-only", *model])
    assert bad.exit_code != 0 and "pool_only: --pool-only stores the pooled vectors" in bad.output
    output = str(tmp_path / "c.zarr")
    done = runner.invoke(cli, ["build", str(corpus), "-o", output, "--pool", "max", "--pool-only", *model])
    assert done.exit_code == 0, done.output
    assert "0 rows" in done.output
    info = runner.invoke(cli, ["info", output])
    assert "pooled:       one max vector per sentence, float32 (--pool-only: no token vectors)" in info.output
    assert elmo_cache.open(tmp_path / "c.zarr").sentence_vector(0).shape == (3, 32)


def test_server_answers_the_stored_pool_and_the_rest_live_or_422(tmp_path, tiny_encoder):
    from elmo_cache.server import create_app
    from tests.server_helpers import LINES as SERVED
    from tests.server_helpers import UNSEEN, decode, decode_item, run, settings

    corpus = write_corpus(tmp_path / "s.txt", SERVED)
    path = tmp_path / "s.zarr"
    build(
        corpus, BuildOptions(output=path, pool="mean", pool_only=True, fp16=True, progress=False), encoder=tiny_encoder
    )
    cache = elmo_cache.open(path)
    line = next(text for text in SERVED if text.split())

    async def cache_alone(client):
        stored = cache.sentence_vector(cache.find(line))
        response = await client.get("/embed", params={"sentence": line, "pool": "mean", "format": "npy"})
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(decode(response), stored)  # the stored row, as it is
        body = (await client.get("/embed", params={"sentence": line, "pool": "mean", "layers": "2"})).json()
        assert body["source"] == "cache"
        np.testing.assert_array_equal(decode_item(body), stored[2:3])
        for params in ({"sentence": line}, {"sentence": line, "pool": "max"}):
            refused = await client.get("/embed", params=params)
            assert refused.status_code == 422, refused.text
            assert (
                "stores only mean pooled sentence vectors (--pool-only)" in refused.text and "--model" in refused.text
            )
        missing = await client.get("/embed", params={"sentence": UNSEEN[0], "pool": "mean"})
        assert missing.status_code == 404

    run(create_app(settings(), cache=cache), cache_alone)

    async def with_model(client):
        tokens = (await client.get("/embed", params={"sentence": line})).json()
        assert tokens["source"] == "live" and tokens["shape"][1] == len(line.split())
        other = (await client.get("/embed", params={"sentence": line, "pool": "max"})).json()
        assert other["source"] == "live" and other["pool"] == "max"
        own = (await client.get("/embed", params={"sentence": line, "pool": "mean"})).json()
        assert own["source"] == "cache"

    run(create_app(settings(), encoder=tiny_encoder, cache=cache), with_model)


def test_metadata_of_a_pool_only_cache_is_checked():
    from elmo_cache.errors import CacheFormatError
    from elmo_cache.store.format import parse_metadata

    base = {"format": "elmo-cache", "kind": "mix", "dtype": "float16", "dim": 4, "layers": None, "complete": True}
    pool = {"method": "mean", "dtype": "float16", "only": True}
    assert parse_metadata("c", {**base, "format_version": 4, "pool": pool})["pool"]["only"] is True
    with pytest.raises(CacheFormatError, match=r"pool.only with format_version 2 \(a --pool-only cache is version 4\)"):
        parse_metadata("c", {**base, "format_version": 2, "pool": pool})
    with pytest.raises(CacheFormatError, match=r"'only': true in a --pool-only cache"):
        parse_metadata("c", {**base, "format_version": 4, "pool": {**pool, "only": False}})


def test_pre_tokenised_input_with_spaces_in_tokens(tmp_path, tiny_encoder):
    """Token-list keys (tokens holding spaces) are stored as the build with token vectors stores them."""
    from elmo_cache.text.corpus import Corpus

    sentences = [["New York", "is", "big"], ["New", "York", "is", "big"], ["a b", "c"], [], ["New York", "is", "big"]]
    path = tmp_path / "c.tsv"
    path.write_text("".join("\t".join(tokens) + "\n" for tokens in sentences), encoding="utf-8")
    common = dict(pool="first-last", dedupe=True, input_format="tsv", progress=False)
    beside, only = tmp_path / "b.h5", tmp_path / "o.h5"
    build(Corpus(path, input_format="tsv"), BuildOptions(output=beside, **common), encoder=tiny_encoder)
    build(Corpus(path, input_format="tsv"), BuildOptions(output=only, pool_only=True, **common), encoder=tiny_encoder)
    (_, full), (meta, stripped) = raw_arrays(beside), raw_arrays(only)
    assert meta["format_version"] == POOL_ONLY_FORMAT_VERSION and meta["tokenization"] == "tsv"
    for name in ("pooled", "offsets", "index/hashes", "index/rows", "tokens/bytes"):
        assert stripped[name].tobytes() == full[name].tobytes(), name
    cache = elmo_cache.open(only)
    assert [cache.tokens(i) for i in range(len(sentences))] == sentences
    assert cache.sentence_vector(["New York", "is", "big"]).tobytes() == cache.sentence_vector(0).tobytes()
    assert cache.sentence_vector(["New", "York", "is", "big"]).tobytes() == cache.sentence_vector(1).tobytes()
    assert verify(only).ok


def test_verify_accepts_rowless_offsets_only_for_a_pool_only_cache(tmp_path, tiny_encoder):
    """The structure checks of verify on a pool-only cache's arrays: with the metadata saying pool.only they
    pass; the same arrays in a cache that does not say so (or rows where pool.only says none) are refused."""
    import json

    import h5py

    from elmo_cache.store import open_with_library
    from elmo_cache.verify.checks import _check_structure
    from elmo_cache.verify.report import VerifyReport

    _, _, only = _pair(tmp_path, tiny_encoder, ".h5", pool="mean", dedupe=True)
    fmt, raw, arrays, close = open_with_library(only)
    try:
        meta = json.loads(raw)
        report = VerifyReport(only)
        _check_structure(fmt, meta, arrays, report)
        assert not report.problems, report.problems
        beside_meta = {**meta, "pool": {"method": "mean", "dtype": "float32"}}
        report = VerifyReport(only)
        _check_structure(fmt, beside_meta, arrays, report)
        assert report.problems and "outside vectors (n_rows 0)" in report.problems[0]
        with h5py.File(tmp_path / "rows.h5", "w") as f:  # a contiguous dataset, as the container checks want
            rows = f.create_dataset("vectors", shape=(3, *arrays["vectors"].shape[1:]), dtype=arrays["vectors"].dtype)
            report = VerifyReport(only)
            _check_structure(fmt, {**meta, "n_rows": 3}, {**arrays, "vectors": rows}, report)
        assert report.problems == ["vectors has 3 rows in a --pool-only cache (pool.only), which stores none"]
    finally:
        close()


def _hdf5_layout(path) -> dict:
    """The file's size and each dataset's offset, size and bytes: what "the same bytes" of an HDF5 cache means."""
    import h5py

    raw = path.read_bytes()
    layout: dict = {"file size": len(raw)}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            offset, size = obj.id.get_offset(), obj.id.get_storage_size()
            layout[name] = (offset, size, raw[offset : offset + size] if offset is not None else b"")

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return layout


@pytest.mark.parametrize(("files_copied", "restored_first"), [(1, 0), (3, 0), (3, 2), (5, 1)])
def test_an_hdf5_finish_deletes_the_staged_rows_as_it_copies_and_a_crash_in_it_is_redone(
    tmp_path, tiny_encoder, monkeypatch, files_copied, restored_first
):
    """The finish dies with ``files_copied`` staged files of ``pooled`` copied into cache.h5 (and deleted) and the
    next file's rows written; the next run writes them back from cache.h5 (dying once more after
    ``restored_first`` of them when not 0) and ends with the bytes of an uninterrupted build."""
    import elmo_cache.store.hdf5.writer as hdf5_writer
    from elmo_cache.store.format import BUILD_DIR, staging_path

    corpus = write_corpus(tmp_path / "c.txt", LINES)
    reference, output = tmp_path / "r.h5", tmp_path / "o.h5"
    options = dict(pool="mean", pool_only=True, dedupe=True, progress=False)
    build(corpus, BuildOptions(output=reference, **options), encoder=tiny_encoder)  # the default staged files
    pooled = raw_arrays(reference)[1]["pooled"]
    row_bytes = pooled.nbytes // len(pooled)
    # Staged files of 1, 1, 2, 2, 4, 4, ... rows.
    monkeypatch.setattr(hdf5_writer, "_FIRST_FILE_BYTES", row_bytes)
    monkeypatch.setattr(hdf5_writer, "_GROW_EVERY", 2)
    build_dir = staging_path(output) / BUILD_DIR
    real_write = hdf5_writer._write_at
    writes = []
    staged_at_crash = []

    def crash_in_copy(*args):
        if len(writes) == files_copied:
            staged_at_crash.append({p.name: p.stat().st_size for p in build_dir.glob("pooled*.bin")})
            raise RuntimeError("simulated crash in the finish")
        writes.append(args)
        real_write(*args)

    monkeypatch.setattr(hdf5_writer, "_write_at", crash_in_copy)
    with pytest.raises(RuntimeError, match="in the finish"):
        build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert not output.exists() and (build_dir / hdf5_writer.FINISH_FILE).is_file()
    # The files copied are gone: the staging holds only the rows not yet durably in cache.h5.
    copied_rows = [1, 2, 4, 6, 10][files_copied - 1]
    (staged,) = staged_at_crash
    assert "pooled.bin" not in staged
    assert sum(staged.values()) == (len(pooled) - copied_rows) * row_bytes
    monkeypatch.setattr(hdf5_writer, "_write_at", real_write)
    if restored_first:
        real_restore = hdf5_writer._restore
        restored = []

        def crash_in_restore(*args):
            if len(restored) == restored_first:
                raise RuntimeError("simulated crash in the recovery")
            restored.append(args)
            real_restore(*args)

        monkeypatch.setattr(hdf5_writer, "_restore", crash_in_restore)
        with pytest.raises(RuntimeError, match="in the recovery"):
            build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
        assert not output.exists()
        # Restored last first, cache.h5 cut short behind each file restored.
        assert (staging_path(output) / "cache.h5").stat().st_size == restored[-1][1]
        monkeypatch.setattr(hdf5_writer, "_restore", real_restore)
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and not summary.already_complete
    assert _hdf5_layout(output) == _hdf5_layout(reference)
    assert_same_cache(output, reference)
    assert verify(output).ok
