"""elmo_cache.builder.update: ``build --update`` brings a cache to a new version of its corpus, encoding only the
windows that changed, and ends with the bytes a fresh build of the new corpus writes."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.encoding import WindowCutter
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.rows.selection import MixSpec
from elmo_cache.store import staging_path
from elmo_cache.text.tokenize import sentence_hash, tokenize
from elmo_cache.verify.checks import verify
from tests._build_fixtures import corpus_lines, raw_arrays, write_corpus

# Windows of about 320 tokens (20 lines): a few hundred lines make dozens of windows.
SIZES = {"batch_tokens": 40, "window_batches": 8}
N = 500


def edited(lines: list[str], edit: str) -> list[str]:
    extra = corpus_lines(12, seed=99)
    middle = len(lines) // 2
    if edit == "append":
        return lines + [line for line in extra if line]  # ~5% more lines
    if edit == "change":
        return [*lines[:middle], "an edited line in the middle", *lines[middle + 1 :]]
    if edit == "delete":
        return lines[:middle] + lines[middle + 1 :]
    if edit == "insert":
        return [*lines[:middle], "a new line . inserted here", *lines[middle:]]
    raise AssertionError(edit)


def windows_of(lines: list[str], window_tokens: int) -> list[tuple[str, ...]]:
    """The windows a build cuts ``lines`` into, as their lines' keys (the cutter's, independent of the update)."""
    cutter, out = WindowCutter(0, window_tokens), []
    for line in lines:
        tokens = tokenize(line)
        window = cutter.add(tokens, sentence_hash(tokens))
        if window is not None:
            out.append(tuple(" ".join(t) for t in window.tokens))
    window = cutter.flush()
    if window is not None:
        out.append(tuple(" ".join(t) for t in window.tokens))
    return out


def expected_encoded(old: list[str], new: list[str]) -> tuple[int, int]:
    """(windows, lines) of ``new`` that no window of ``old`` holds: what an update must encode."""
    window_tokens = SIZES["batch_tokens"] * SIZES["window_batches"]
    before = set(windows_of(old, window_tokens))
    changed = [w for w in windows_of(new, window_tokens) if w not in before]
    return len(changed), sum(len(w) for w in changed)


@contextmanager
def counting(encoder):
    """Counts the sentences the encoder is given."""
    seen = [0]
    original = encoder.encode_flat

    def encode_flat(sentences):
        seen[0] += len(sentences)
        return original(sentences)

    encoder.encode_flat = encode_flat
    try:
        yield seen
    finally:
        del encoder.encode_flat


def comparable(meta: dict) -> dict:
    """Metadata but for the build's record (arguments, times) and the metadata's own CRC, which covers them."""
    meta = json.loads(json.dumps(meta))
    meta.pop("build")
    meta["checksums"].pop("metadata")
    return meta


def assert_same_bytes(updated: Path, fresh: Path) -> None:
    meta_u, arrays_u = raw_arrays(updated)
    meta_f, arrays_f = raw_arrays(fresh)
    assert comparable(meta_u) == comparable(meta_f)
    assert sorted(arrays_u) == sorted(arrays_f)
    for name, want in arrays_f.items():
        assert arrays_u[name].dtype == want.dtype, name
        assert arrays_u[name].tobytes() == want.tobytes(), name
    if updated.is_dir():  # zarr: every file, the vectors shards and checksums.json included
        files_u = {p.relative_to(updated): p.read_bytes() for p in updated.rglob("*") if p.is_file()}
        files_f = {p.relative_to(fresh): p.read_bytes() for p in fresh.rglob("*") if p.is_file()}
        assert sorted(files_u) == sorted(files_f)
        for name in files_f:
            if name.name != "zarr.json" or name.parent != Path("."):
                assert files_u[name] == files_f[name], name


CASES = [
    (".zarr", "append", {"layers": "1,2"}),
    (".h5", "append", {"fp16": True, "pool": "mean"}),
    (".zarr", "change", {"quantize": "int8", "pool": "max", "chunk_rows": 16, "shard_rows": 64}),
    (".h5", "change", {"layers": "1,2", "fp16": True}),
    (".zarr", "delete", {"fp16": True, "pool": "first-last"}),
    (".h5", "delete", {"quantize": "int8"}),
    (".zarr", "insert", {"mix": MixSpec.from_raw([0.2, 0.3, 0.5], gamma=2.0)}),
    (".h5", "insert", {"layers": "0", "pool": "mean", "pool_only": True}),
    (".zarr", "insert", {"dedupe": True, "layers": "1,2", "pool": "mean"}),
    (".h5", "change", {"dedupe": True, "quantize": "int8"}),
]


@pytest.mark.parametrize(("suffix", "edit", "extra"), CASES)
def test_an_update_equals_a_fresh_build_and_encodes_only_the_changed_windows(
    tmp_path, tiny_encoder, suffix, edit, extra
):
    old = corpus_lines(N, seed=11)
    new = edited(old, edit)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / f"c{suffix}"
    options = {**SIZES, "progress": False, **extra}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    reader = elmo_cache.open(output)  # open during the update: it keeps reading the old cache
    old_first = np.array(reader[0]) if not extra.get("pool_only") else reader.sentence_vector(0)

    write_corpus(corpus, new)
    with counting(tiny_encoder) as update_encoded:
        summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    fresh = tmp_path / f"fresh{suffix}"
    with counting(tiny_encoder) as fresh_encoded:
        build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)

    assert_same_bytes(output, fresh)
    assert not staging_path(output).exists() and verify(output).ok
    assert summary.updated and summary.n_sentences == len(new)
    assert summary.lines_encoded + summary.lines_reused == len(new)
    windows, lines = expected_encoded(old, new)
    if extra.get("dedupe"):  # a window whose repeats' first occurrences moved is encoded too
        assert summary.windows_encoded >= windows
    else:
        assert (summary.windows_encoded, summary.lines_encoded) == (windows, lines)
    assert 0 < summary.windows_encoded <= 4 < summary.windows_reused
    assert 0 < update_encoded[0] <= 0.2 * fresh_encoded[0]
    assert "updated: " in str(summary)
    with elmo_cache.open(output) as cache:
        assert len(cache) == len(new)
        if edit != "append":
            row = len(old) // 2
            assert cache.tokens(row) == tokenize(new[row])
    if not extra.get("pool_only"):
        np.testing.assert_array_equal(np.array(reader[0]), old_first)
    reader.close()


def test_an_update_of_a_pq_cache_equals_a_fresh_build(tmp_path, tiny_encoder):
    """pq codebooks are trained on the corpus's first rows: an edit past them keeps them (rows reused); an edit
    among them changes every code (every window encoded). Both equal a fresh build."""
    old = corpus_lines(N, seed=12)
    options = {**SIZES, "progress": False, "quantize": "pq:4", "codebook_sample": 300}
    for name, new, reused in (("late", edited(old, "append"), True), ("early", ["a first line", *old], False)):
        corpus = write_corpus(tmp_path / f"{name}.txt", old)
        output = tmp_path / f"{name}.zarr"
        build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
        write_corpus(corpus, new)
        summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
        fresh = tmp_path / f"{name}-fresh.zarr"
        build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
        assert_same_bytes(output, fresh)
        assert (summary.lines_reused > 0) is reused, summary


def test_a_resumed_update_equals_an_uninterrupted_one(tmp_path, tiny_encoder):
    old = corpus_lines(N, seed=13)
    new = edited(old, "insert")
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    options = {**SIZES, "progress": False, "commit_seconds": 0}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    write_corpus(corpus, new)
    original = tiny_encoder.encode_flat

    def failing(sentences):
        raise RuntimeError("simulated crash")

    tiny_encoder.encode_flat = failing  # the first window to encode is the inserted line's, mid-corpus
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    finally:
        del tiny_encoder.encode_flat
    assert tiny_encoder.encode_flat == original
    assert staging_path(output).exists()
    with elmo_cache.open(output) as cache:  # the old cache is still there, whole
        assert len(cache) == len(old) and verify(output).ok
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and summary.updated
    fresh = tmp_path / "fresh.zarr"
    build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)


def test_what_an_update_refuses_or_does_not_need(tmp_path, tiny_encoder, monkeypatch):
    old = corpus_lines(60, seed=14)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.h5"
    options = {**SIZES, "progress": False}
    # Nothing at the output: an update is an ordinary build.
    first = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert not first.updated and first.n_sentences == 60
    # The same corpus: nothing to do.
    assert build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder).already_complete
    write_corpus(corpus, edited(old, "append"))
    before = output.read_bytes()
    with pytest.raises(InvalidParameterError, match="--update brings .* --overwrite discards"):
        build(corpus, BuildOptions(output=output, update=True, overwrite=True, **options), encoder=tiny_encoder)
    with pytest.raises(CacheExistsError, match="other options .*an update keeps the cache's options"):
        build(corpus, BuildOptions(output=output, update=True, fp16=True, **options), encoder=tiny_encoder)
    with pytest.raises(InvalidParameterError, match="--batch-tokens 40 --window-batches 8"):
        build(corpus, BuildOptions(output=output, update=True, batch_tokens=64, progress=False), encoder=tiny_encoder)
    with pytest.raises(InvalidParameterError, match="ray engine does not update"):
        build(corpus, BuildOptions(output=output.with_suffix(".zarr"), update=True, **options), engine="ray")
    assert output.read_bytes() == before
    # --batch-tokens left out: the cache's own.
    summary = build(
        corpus, BuildOptions(output=output, update=True, progress=False, window_batches=8), encoder=tiny_encoder
    )
    assert summary.updated and summary.lines_reused > 0
    assert elmo_cache.open(output).metadata["windows"] == {
        "cut": "content-defined",
        "version": 1,
        "window_tokens": 320,
        "batch_tokens": 40,
    }


def test_a_cache_cut_before_content_defined_windows_is_refused(tmp_path, tiny_encoder, monkeypatch):
    from elmo_cache.builder import local

    old = corpus_lines(40, seed=15)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    with monkeypatch.context() as patch:
        patch.setattr(local, "windows_entry", lambda *args: None)  # as a cache of an older elmo-cache
        build(corpus, BuildOptions(output=output, progress=False, **SIZES), encoder=tiny_encoder)
    assert "windows" not in elmo_cache.open(output).metadata
    write_corpus(corpus, edited(old, "change"))
    with pytest.raises(CacheExistsError, match="before windows were cut by content.*--overwrite"):
        build(corpus, BuildOptions(output=output, update=True, progress=False, **SIZES), encoder=tiny_encoder)
    assert len(elmo_cache.open(output)) == 40


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_zarr_update_keeps_the_vectors_files_before_the_change_and_resumes(tmp_path, tiny_encoder, compression):
    """The vectors files wholly before the first changed window are the old cache's own files (hard links: not
    written again), also when the update was interrupted after committing some of their rows and resumed."""
    old = corpus_lines(N, seed=16)
    new = edited(old, "append")
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    options = {**SIZES, "progress": False, "commit_seconds": 0, "chunk_rows": 16, "shard_rows": 256}
    options["compression"] = compression
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    files = sorted((output / "vectors" / "c").rglob("*"))
    inodes = {p.relative_to(output): p.stat().st_ino for p in files if p.is_file()}
    assert len(inodes) > 10
    write_corpus(corpus, new)

    def failing(sentences):
        raise RuntimeError("simulated crash")

    tiny_encoder.encode_flat = failing  # an append: the first window to encode is near the end
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    finally:
        del tiny_encoder.encode_flat
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert summary.updated and summary.resumed_from > 0 and summary.files_linked > 10
    assert "vectors files kept as they were" in str(summary)
    kept = [name for name, inode in inodes.items() if (output / name).stat().st_ino == inode]
    assert len(kept) == summary.files_linked
    fresh = tmp_path / "fresh.zarr"
    build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)
    assert verify(output).ok


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_an_update_to_an_empty_corpus_is_a_fresh_build_of_it(tmp_path, tiny_encoder, suffix):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(40, seed=17))
    output = tmp_path / f"c{suffix}"
    build(corpus, BuildOptions(output=output, progress=False, **SIZES), encoder=tiny_encoder)
    corpus.write_bytes(b"")
    summary = build(corpus, BuildOptions(output=output, update=True, progress=False, **SIZES), encoder=tiny_encoder)
    assert summary.updated and summary.n_sentences == 0 and summary.lines_reused == 0
    fresh = tmp_path / f"fresh{suffix}"
    build(corpus, BuildOptions(output=fresh, progress=False, **SIZES), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)


def test_a_reader_opened_before_an_update_keeps_its_files_and_is_told_when_the_cache_moved_on(tmp_path, tiny_encoder):
    from elmo_cache.errors import CacheReplacedError

    old = corpus_lines(N, seed=11)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    options = {**SIZES, "progress": False, "chunk_rows": 16, "shard_rows": 64}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    reader = elmo_cache.open(output)
    last = len(reader) - 1
    first_before = np.array(reader[0])  # opens the first vectors file (open also checks the first and last)
    last_before = np.array(reader[last])

    write_corpus(corpus, edited(old, "change"))
    build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)

    # The files it already held: the old cache's bytes, as before.
    np.testing.assert_array_equal(reader[0], first_before)
    np.testing.assert_array_equal(reader[last], last_before)
    # A file it opens now would be the new cache's: it says so, and names what to do.
    starts = np.concatenate([[0], np.cumsum(reader.lengths)[:-1]])  # no --dedupe: rows in line order
    middle = next(i for i in range(len(reader)) if reader.lengths[i] and 64 <= starts[i] < 2 * 64)  # file 1
    with pytest.raises(CacheReplacedError, match="replaced after this reader opened it.*open the cache again"):
        reader[middle]
    with elmo_cache.open(output) as fresh_reader:  # opened again: the new cache, whole
        assert verify(output).ok and len(fresh_reader) == len(edited(old, "change"))
