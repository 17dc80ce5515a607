"""elmo_cache.builder.update: ``build --update`` brings a cache to a new version of its corpus, encoding only the
windows that changed, and ends with the bytes a fresh build of the new corpus writes."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

import elmo_cache
import elmo_cache.text.corpus as corpus_module
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.encoding import WindowCutter
from elmo_cache.encoder.batch_free import rows_batch_free
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.rows.selection import MixSpec
from elmo_cache.store import load_progress, open_cache_arrays, staging_path
from elmo_cache.store.format import BUILD_DIR
from elmo_cache.text.tokenize import sentence_hash, tokenize
from elmo_cache.verify.checks import verify
from tests._build_fixtures import corpus_lines, failing_on, raw_arrays, write_corpus

# Windows of about 320 tokens (20 lines): a few hundred lines make dozens of windows.
SIZES = {"batch_tokens": 40, "window_batches": 8}
WINDOW_TOKENS = SIZES["batch_tokens"] * SIZES["window_batches"]
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


def expected_encoded(old: list[str], new: list[str], batch_free: bool, dedupe: bool = False) -> tuple[int, int]:
    """(windows, lines) of ``new`` an update must encode: the windows no window of ``old`` holds, whole; on a
    batch-free device, of those windows only the lines (non-empty, with ``dedupe`` their first occurrence) whose
    tokens no line of ``old`` has, and the windows holding any."""
    window_tokens = SIZES["batch_tokens"] * SIZES["window_batches"]
    before = set(windows_of(old, window_tokens))
    windows = windows_of(new, window_tokens)
    changed = [k for k, w in enumerate(windows) if w not in before]
    if not batch_free:
        return len(changed), sum(len(windows[k]) for k in changed)
    known = {" ".join(tokenize(line)) for line in old}
    first: dict[str, int] = {}
    for k, window in enumerate(windows):
        for key in window:
            first.setdefault(key, k)
    todo = [
        [key for key in windows[k] if key and key not in known and (not dedupe or first[key] == k)] for k in changed
    ]
    if dedupe:  # a key's first occurrence only, even when it repeats within its window
        todo = [list(dict.fromkeys(keys)) for keys in todo]
    return sum(1 for keys in todo if keys), sum(len(keys) for keys in todo)


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


def assert_same_bytes(updated: Path, fresh: Path, *, build_folder_left: bool = False) -> None:
    """Every stored byte of ``updated`` is ``fresh``'s but for the build's record. ``build_folder_left``: a publish
    killed before the published cache's build folder went (the next build removes it) may leave that too."""
    meta_u, arrays_u = raw_arrays(updated)
    meta_f, arrays_f = raw_arrays(fresh)
    assert comparable(meta_u) == comparable(meta_f)
    assert sorted(arrays_u) == sorted(arrays_f)
    for name, want in arrays_f.items():
        assert arrays_u[name].dtype == want.dtype, name
        assert arrays_u[name].tobytes() == want.tobytes(), name
    if updated.is_dir():  # zarr: every file, the vectors shards and checksums.json included
        files_u = {p.relative_to(updated): p.read_bytes() for p in updated.rglob("*") if p.is_file()}
        if build_folder_left:
            files_u = {name: data for name, data in files_u.items() if name.parts[0] != BUILD_DIR}
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


def built(tmp_path: Path, encoder, suffix: str, edit: str, extra: dict, seed: int):
    """A cache of N corpus lines built with ``extra`` options: ``(old lines, edited lines, corpus, output,
    options)``; the corpus file still holds the old lines."""
    old = corpus_lines(N, seed=seed)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / f"c{suffix}"
    options = {**SIZES, "progress": False, **extra}
    build(corpus, BuildOptions(output=output, **options), encoder=encoder)
    return old, edited(old, edit), corpus, output, options


@pytest.mark.parametrize(("suffix", "edit", "extra"), CASES)
def test_an_update_equals_a_fresh_build_and_encodes_only_the_changed_windows(
    tmp_path, tiny_encoder, suffix, edit, extra
):
    old, new, corpus, output, options = built(tmp_path, tiny_encoder, suffix, edit, extra, seed=11)
    reader = elmo_cache.open(output)  # open during the update: it keeps reading the old cache
    old_first = np.array(reader[0]) if not extra.get("pool_only") else reader.sentence_vector(0)

    write_corpus(corpus, new)
    batch_free = rows_batch_free(tiny_encoder)  # checked once per encoder: not in the update's count below
    with counting(tiny_encoder) as update_encoded:
        summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    fresh = tmp_path / f"fresh{suffix}"
    with counting(tiny_encoder) as fresh_encoded:
        build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)

    assert_same_bytes(output, fresh)
    assert not staging_path(output).exists() and verify(output).ok
    assert summary.updated and summary.n_sentences == len(new)
    assert summary.lines_encoded + summary.lines_reused == len(new)
    assert summary.batch_free is batch_free
    windows, lines = expected_encoded(old, new, summary.batch_free, bool(extra.get("dedupe")))
    if extra.get("dedupe") and not summary.batch_free:  # a window whose repeats' first occurrences moved is encoded
        assert summary.windows_encoded >= windows
    else:
        assert (summary.windows_encoded, summary.lines_encoded) == (windows, lines)
    assert summary.windows_encoded <= 4 < summary.windows_reused
    if summary.batch_free:  # only the new and edited lines went to the encoder
        assert update_encoded[0] == lines
    else:
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


@pytest.mark.parametrize("edit", ["append", "change"])
def test_an_update_splits_again_only_the_lines_from_its_first_change_on(tmp_path, tiny_encoder, monkeypatch, edit):
    """The corpus check splits every line; the reader thread then takes the lines before the first change from the
    cache's stored tokens (the PTB rules cost far more than reading them), and the cache is a fresh build's."""
    old = corpus_lines(N, seed=14)
    new = edited(old, edit)
    first = len(old) if edit == "append" else len(old) // 2
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    options = {**SIZES, "progress": False, "tokenize": "ptb"}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    write_corpus(corpus, new)
    split = [0]
    original = corpus_module.tokenizer_for

    def counting_tokenizer(tokenization):
        tokenizer = original(tokenization)

        def counted(text):
            split[0] += threading.current_thread().name == "elmo-cache-reader"
            return tokenizer(text)

        return counted

    monkeypatch.setattr(corpus_module, "tokenizer_for", counting_tokenizer)
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert summary.updated and summary.lines_reused > 0
    assert split[0] == len(new) - first
    monkeypatch.undo()
    fresh = tmp_path / "fresh.zarr"
    build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)


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


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_resumed_update_equals_an_uninterrupted_one(tmp_path, tiny_encoder, suffix):
    """An update killed after it committed windows it reused whole (linked files, or HDF5 rows taken from the old
    file) resumes from its commit and ends with a fresh build's bytes."""
    old = corpus_lines(N, seed=13)
    fifth = len(old) // 5
    new = [*old[:fifth], "a new line . inserted early", *old[fifth:-fifth], "and one late .", *old[-fifth:]]
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / f"c{suffix}"
    options = {**SIZES, "progress": False, "commit_seconds": 0}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    write_corpus(corpus, new)
    rows_batch_free(tiny_encoder)  # the update's check, done before the encoder fails
    # The early line's window is encoded; the late line's fails, after the windows between.
    with failing_on(tiny_encoder, holding=["and", "one", "late", "."]), pytest.raises(RuntimeError, match="crash"):
        build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert staging_path(output).exists()
    # Committed before the crash: windows reused whole after the early line (their files or rows to take).
    extra = json.loads((staging_path(output) / BUILD_DIR / "progress.json").read_text(encoding="utf-8"))["extra"]
    assert len(extra["hdf5_taken"]) > 1 if suffix == ".h5" else extra["window_links"], extra
    with elmo_cache.open(output) as cache:  # the old cache is still there, whole
        assert len(cache) == len(old) and verify(output).ok
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and summary.updated
    assert (summary.files_linked if suffix == ".zarr" else summary.rows_taken) > 0
    fresh = tmp_path / f"fresh{suffix}"
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
        "version": 3,
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


def test_a_cache_of_an_encoder_that_did_not_round_its_products_is_refused(tmp_path, tiny_encoder, monkeypatch):
    """Windows version 1: the rows of an encoder before it rounded its products' row counts (other last bits)."""
    from elmo_cache.builder import encoding, local

    old = corpus_lines(40, seed=15)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    with monkeypatch.context() as patch:
        patch.setattr(local, "windows_entry", lambda *args: {**encoding.windows_entry(*args), "version": 1})
        build(corpus, BuildOptions(output=output, progress=False, **SIZES), encoder=tiny_encoder)
    assert elmo_cache.open(output).metadata["windows"]["version"] == 1
    write_corpus(corpus, edited(old, "append"))
    with pytest.raises(CacheExistsError, match="windows version 1; this one updates versions 2 and 3.*--overwrite"):
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
    old_rows = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder).n_rows
    files = sorted((output / "vectors" / "c").rglob("*"))
    inodes = {p.relative_to(output): p.stat().st_ino for p in files if p.is_file()}
    assert len(inodes) > 10
    write_corpus(corpus, new)

    def failing(sentences):
        raise RuntimeError("simulated crash")

    batch_free = rows_batch_free(tiny_encoder)  # the update's check, done before the encoder fails
    tiny_encoder.encode_flat = failing  # an append: the first window to encode is near the end
    try:
        with pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    finally:
        del tiny_encoder.encode_flat
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert summary.updated and summary.resumed_from > 0 and summary.files_linked > 10
    assert "vectors files kept as they were" in str(summary)
    if batch_free:  # every file wholly before the first appended row, the old last window's included
        assert summary.files_linked == old_rows // 256
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


# -- kill -9 at any moment of an update ---------------------------------------------------------------------------

# The update runs in a child process that counts its calls of os.fsync and os.unlink and SIGKILLs itself at the
# one KILL_AT names ("fsync:N", "unlink:N"): every step of an update that matters for a crash (a link, a commit,
# the finish, the publish, the old cache's removal) syncs or removes something, so these counts walk its timeline
# deterministically, whatever the machine's speed. Nothing of it is in the library: the child patches itself.
_KILLABLE = """
import atexit, os, signal, sys
plan = os.environ.get("KILL_AT", "")
counts = {"fsync": 0, "unlink": 0, "rename": 0}

def counted(name, original):
    target = int(plan.split(":")[1]) if plan.startswith(name + ":") else 0

    def call(*args, **kwargs):
        counts[name] += 1
        if counts[name] == target:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)

    return call

os.fsync = counted("fsync", os.fsync)
os.unlink = counted("unlink", os.unlink)
os.rename = counted("rename", os.rename)
atexit.register(lambda: sys.stderr.write("CALLS fsync:%(fsync)d unlink:%(unlink)d rename:%(rename)d\\n" % counts))
if os.environ.get("NO_EXCHANGE"):  # as a system without renameat2's exchange: the publish renames the cache aside
    import elmo_cache.store.durable
    elmo_cache.store.durable._exchange = lambda a, b: False
from elmo_cache.cli.main import main
main()
"""


def _update_command(corpus: Path, output: Path, model: tuple[Path, Path], extra: list[str]) -> list[str]:
    sizes = ["--batch-tokens", str(SIZES["batch_tokens"]), "--window-batches", str(SIZES["window_batches"])]
    return [
        *(sys.executable, "-c", _KILLABLE, "build", str(corpus), "-o", str(output), "--update"),
        *("--options-file", str(model[0]), "--weight-file", str(model[1]), *sizes),
        *("--commit-seconds", "0", "--no-progress", "--device", "cpu", *extra),
    ]


def _run_update(command: list[str], kill_at: str = "", *, exchange: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KILL_AT": kill_at, "NO_EXCHANGE": "" if exchange else "1"}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def _calls(done: subprocess.CompletedProcess) -> dict[str, int]:
    line = next(line for line in done.stderr.splitlines() if line.startswith("CALLS "))
    return {name: int(count) for name, count in (part.split(":") for part in line.split()[1:])}


def _files(path: Path) -> dict[str, bytes]:
    """Every stored byte of a cache: each file of a zarr directory, or the HDF5 file."""
    if path.is_file():
        return {".": path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("suffix", "extra"),
    [
        # Small vectors files: the update links most of them (shared inodes with the old cache) and rewrites the rest.
        (".zarr", ["--chunk-rows", "16", "--shard-rows", "256", "--pool", "mean"]),
        (".h5", ["--fp16", "--dedupe"]),
    ],
)
def test_kill_9_at_any_moment_of_an_update_leaves_a_whole_generation(tmp_path, tiny_model, suffix, extra):
    """kill -9 anywhere in ``build --update`` (the encoding, the links, the commits, the finish, the swap, the old
    cache's removal): the output is at every moment the previous cache, byte for byte, or the new one, whole, and
    both verify; rerunning the update ends with the bytes of an update never interrupted."""
    rng = random.Random(32)
    old = corpus_lines(N, seed=31)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / f"c{suffix}"
    build_command = [arg for arg in _update_command(corpus, output, tiny_model, extra) if arg != "--update"]
    assert _run_update(build_command).returncode == 0
    previous = tmp_path / f"previous{suffix}"
    (shutil.copytree if output.is_dir() else shutil.copyfile)(output, previous)
    previous_bytes = _files(previous)

    write_corpus(corpus, edited(old, "append"))
    command = _update_command(corpus, output, tiny_model, extra)
    done = _run_update(command)
    assert done.returncode == 0, done.stderr
    total = _calls(done)
    reference = tmp_path / f"reference{suffix}"
    output.rename(reference)
    assert verify(reference).ok

    # Kill points spread over the whole update (one in each quarter of its fsyncs), the last fsync (the publish's,
    # once the new cache is in place) and two removals near the end (the old cache being deleted).
    spread = [f"fsync:{rng.randint(total['fsync'] * i // 4 + 1, total['fsync'] * (i + 1) // 4)}" for i in range(4)]
    points = [*spread, f"fsync:{total['fsync']}", f"unlink:{total['unlink'] - 3}", f"unlink:{total['unlink']}"]
    outcomes = []
    for point in points:
        shutil.rmtree(staging_path(output), ignore_errors=True)
        shutil.rmtree(output) if output.is_dir() else output.unlink(missing_ok=True)
        (shutil.copytree if previous.is_dir() else shutil.copyfile)(previous, output)
        killed = _run_update(command, point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr)
        # What a reader finds now: the previous cache, every byte as it was, or the new one, whole.
        assert output.exists(), point
        with elmo_cache.open(output) as cache:
            n = len(cache)
        if n == len(old):
            assert _files(output) == previous_bytes, point
            outcomes.append("previous")
        else:
            assert_same_bytes(output, reference, build_folder_left=True)
            outcomes.append("new")
        assert verify(output).ok, point
        again = _run_update(command)
        assert again.returncode == 0, (point, again.stderr)
        assert_same_bytes(output, reference)
        assert not staging_path(output).exists(), point
    # The kills fell before and after the publish both.
    assert "previous" in outcomes and "new" in outcomes, outcomes


# -- readers opened before an update ------------------------------------------------------------------------------


def _answers(cache, i: int, line: list[str]) -> tuple:
    """Every kind of file a read of sentence ``i`` touches: offsets and lengths, the vectors, the stored tokens,
    the index (a lookup by the line's tokens), the pooled vectors; the block sums guard each of them."""
    return (
        np.array(cache[i]).tobytes(),
        tuple(cache.tokens(i)),
        cache.find(line),
        np.array(cache.sentence_vector(i)).tobytes(),
    )


def _generations(tmp_path: Path, tiny_encoder, suffix: str, **extra) -> tuple[Path, Path, list[list[str]]]:
    """An old cache at ``c<suffix>`` and, at ``new<suffix>``, the cache an update of it to the same lines in
    another order publishes: every file differs while every array keeps its shape, so a read that mixed the two
    could pass any size check."""
    from elmo_cache.text.tokenize import tokenize

    old = [line for line in corpus_lines(N, seed=41) if line.strip()]
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / f"c{suffix}"
    options = {**SIZES, "progress": False, "pool": "mean", **extra}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    shuffled = old[N // 3 :] + old[: N // 3]
    new = tmp_path / f"new{suffix}"
    write_corpus(tmp_path / "d.txt", shuffled)
    build(tmp_path / "d.txt", BuildOptions(output=new, **options), encoder=tiny_encoder)
    return output, new, [tokenize(line) for line in old]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_zarr_reader_never_reads_the_new_cache_even_when_a_publish_races_its_opening(
    tmp_path, tiny_encoder, compression, monkeypatch
):
    """The swap lands between the reader's check of its folder and its opening of a file (the worst moment): every
    answer afterwards is the old cache's or a CacheReplacedError, for every kind of file; none is the new cache's.
    (Compressed arrays are read by zarr through their paths: the same holds.)"""
    from elmo_cache.errors import CacheReplacedError
    from elmo_cache.store.durable import publish_directory
    from elmo_cache.store.zarr import maps

    output, new, lines = _generations(
        tmp_path, tiny_encoder, ".zarr", chunk_rows=16, shard_rows=64, compression=compression
    )
    previous = tmp_path / "previous.zarr"
    shutil.copytree(output, previous)
    with elmo_cache.open(previous) as old_cache:
        expected = [_answers(old_cache, i, line) for i, line in enumerate(lines)]
    reader = elmo_cache.open(output)
    assert _answers(reader, 0, lines[0]) == expected[0]  # some files opened before

    published = []
    real_open = maps._open_file

    def open_after_a_publish(path, array, c):
        if not published:  # the update publishes now, after the reader decided to open this file
            publish_directory(new, output)
            published.append(path)
        return real_open(path, array, c)

    monkeypatch.setattr(maps, "_open_file", open_after_a_publish)
    replaced = same = 0
    for i, line in enumerate(lines):
        try:
            answer = _answers(reader, i, line)
        except CacheReplacedError as exc:
            assert "open the cache again" in str(exc)
            replaced += 1
            continue
        assert answer == expected[i], i
        same += 1
    assert published and replaced and same, (published, replaced, same)
    monkeypatch.undo()
    with elmo_cache.open(output) as fresh:  # opened again: the new cache, whole
        assert fresh.tokens(0) == lines[N // 3]
        assert verify(output).ok


def test_a_zarr_open_that_a_publish_interrupts_is_done_again(tmp_path, tiny_encoder, monkeypatch):
    """The metadata and the arrays' descriptions are read one after another: a publish between them must not pair
    the old cache's metadata with the new cache's arrays. The open sees the folder change and opens again."""
    from elmo_cache.store.durable import publish_directory
    from elmo_cache.store.zarr import read

    output, new, lines = _generations(tmp_path, tiny_encoder, ".zarr", chunk_rows=16, shard_rows=64)
    with elmo_cache.open(new) as new_cache:
        expected = [_answers(new_cache, i, line) for i, line in [(0, lines[N // 3]), (N // 2, lines[0])]]
    real = read._open_array

    def publish_midway(root, name):
        if name == "offsets" and new.exists():
            publish_directory(new, output)
        return real(root, name)

    monkeypatch.setattr(read, "_open_array", publish_midway)
    with elmo_cache.open(output) as cache:
        assert not new.exists()  # it was published during this open
        assert [_answers(cache, i, line) for i, line in [(0, lines[N // 3]), (N // 2, lines[0])]] == expected


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_cache_handed_to_a_worker_after_an_update_is_refused(tmp_path, tiny_encoder, suffix):
    """A cache pickles as its path (DataLoader workers reopen it): a worker that would reopen another cache than
    the one its parent indexed says so instead of reading other rows under the same numbers."""
    import pickle

    from elmo_cache.errors import CacheReplacedError
    from elmo_cache.store.durable import publish_directory

    output, new, _ = _generations(tmp_path, tiny_encoder, suffix)
    reader = elmo_cache.open(output)
    assert len(pickle.loads(pickle.dumps(reader))) == len(reader)  # the same cache: reopened
    handed = pickle.dumps(reader)
    publish_directory(new, output) if suffix == ".zarr" else os.replace(new, output)
    with pytest.raises(CacheReplacedError, match="replaced .* hand it over again"):
        pickle.loads(handed)
    assert len(pickle.loads(pickle.dumps(elmo_cache.open(output)))) == len(reader)


def test_an_hdf5_reader_opened_before_an_update_keeps_the_whole_old_cache(tmp_path, tiny_encoder):
    """An HDF5 update replaces the file by a rename: a reader (ours, or h5py's) holds the old file open, so every
    answer stays the old cache's after the update, the files it had not read yet included."""
    import h5py

    output, new, lines = _generations(tmp_path, tiny_encoder, ".h5", fp16=True)
    previous = tmp_path / "previous.h5"
    shutil.copyfile(output, previous)
    with elmo_cache.open(previous) as old_cache:
        expected = [_answers(old_cache, i, line) for i, line in enumerate(lines)]
    with h5py.File(previous, "r") as f:
        old_datasets = {name: f[name][...] for name in f if isinstance(f[name], h5py.Dataset)}
    reader = elmo_cache.open(output)  # nothing read yet
    library = h5py.File(output, "r")
    os.replace(new, output)  # what an update's publish does
    assert [_answers(reader, i, line) for i, line in enumerate(lines)] == expected
    for name, values in old_datasets.items():
        np.testing.assert_array_equal(library[name][...], values)
    library.close()
    with elmo_cache.open(output) as fresh:  # opened again: the new one
        assert fresh.tokens(0) == lines[N // 3]


# -- the publish where folders cannot be swapped (renamed aside: a moment without a cache at the path) ---------------


@pytest.mark.slow
def test_an_update_killed_between_the_renames_of_its_publish_leaves_the_old_cache_readable(tmp_path, tiny_model):
    """Where renameat2's exchange is missing, the publish renames the old cache aside, then the new one in. A kill
    -9 between the two: a reader of the path reads the old cache (aside, every byte as it was), verify passes, and
    the rerun finishes the publish with the bytes of an update never interrupted, leaving nothing aside."""
    from elmo_cache.store.format import aside_path

    old = corpus_lines(N // 2, seed=51)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    extra = ["--chunk-rows", "16", "--shard-rows", "64"]
    build_command = [arg for arg in _update_command(corpus, output, tiny_model, extra) if arg != "--update"]
    assert _run_update(build_command).returncode == 0
    previous_bytes = _files(output)
    shutil.copytree(output, tmp_path / "previous.zarr")
    write_corpus(corpus, edited(old, "change"))
    command = _update_command(corpus, output, tiny_model, extra)
    done = _run_update(command, exchange=False)
    assert done.returncode == 0, done.stderr
    reference = tmp_path / "reference.zarr"
    output.rename(reference)
    shutil.copytree(tmp_path / "previous.zarr", output)

    # The last rename of the update is the new cache's into the path (the old one went aside just before).
    killed = _run_update(command, f"rename:{_calls(done)['rename']}", exchange=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not output.exists() and aside_path(output).is_dir() and staging_path(output).is_dir()
    with elmo_cache.open(output) as cache:  # waits a moment for the new cache, then reads the old one aside
        assert len(cache) == len(old) and cache.tokens(1) == old[1].split()
    assert _files(aside_path(output)) == previous_bytes
    assert verify(output).ok

    again = _run_update(command, exchange=False)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stderr + again.stdout  # the publish finished; the cache was the new corpus's
    assert not aside_path(output).exists() and not staging_path(output).exists()
    assert_same_bytes(output, reference)


def test_a_reader_in_the_moment_of_a_publish_by_renames_waits_for_the_new_cache(tmp_path, tiny_encoder, monkeypatch):
    """A reader that opens the path while a live publish has the old cache aside and the new one not yet in place
    waits for the new one (the two renames are moments apart) rather than failing: never a missing cache."""
    import threading

    from elmo_cache.store import durable
    from elmo_cache.store.format import aside_path

    output, new, lines = _generations(tmp_path, tiny_encoder, ".zarr", chunk_rows=16, shard_rows=64)
    with elmo_cache.open(new) as new_cache:
        expected = _answers(new_cache, 0, lines[N // 3])
    monkeypatch.setattr(durable, "_exchange", lambda a, b: False)
    real_rename, opened = os.rename, []

    def rename(source, target):
        real_rename(source, target)
        if Path(target) == aside_path(output):  # the old cache is aside: a reader comes now, the publish stalls
            reader = threading.Thread(target=lambda: opened.append(elmo_cache.open(output)))
            reader.start()
            time.sleep(0.3)
            assert reader.is_alive()  # waiting, not failed
            opened.append(reader)

    monkeypatch.setattr(durable.os, "rename", rename)
    durable.publish_directory(new, output)
    monkeypatch.undo()
    opened[0].join(timeout=10)
    cache = opened[1]
    assert _answers(cache, 0, lines[N // 3]) == expected
    assert not aside_path(output).exists() and verify(output).ok


@pytest.mark.parametrize(("suffix", "edit", "extra"), [CASES[0], CASES[9]])
def test_where_rows_depend_on_their_batch_an_update_encodes_the_changed_windows_whole(
    tmp_path, tiny_encoder, monkeypatch, suffix, edit, extra
):
    """A device whose check fails (a GPU may pick its kernels by shape): each changed window is encoded whole, as a
    fresh build encodes it, and the cache is still a fresh build's, byte for byte."""
    from elmo_cache.builder import local

    old, new, corpus, output, options = built(tmp_path, tiny_encoder, suffix, edit, extra, seed=21)
    write_corpus(corpus, new)
    monkeypatch.setattr(local, "rows_batch_free", lambda encoder: False)
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    monkeypatch.undo()
    assert not summary.batch_free and "whole windows encoded" in str(summary)
    windows, lines = expected_encoded(old, new, batch_free=False)
    assert summary.windows_encoded >= windows and summary.lines_encoded >= lines > 0
    if not extra.get("dedupe"):
        assert (summary.windows_encoded, summary.lines_encoded) == (windows, lines)
    fresh = tmp_path / f"fresh{suffix}"
    build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)


def test_on_a_batch_free_device_an_append_encodes_only_its_lines(tmp_path, tiny_encoder, monkeypatch):
    """The old last window (cut by the corpus's end) is not encoded again: its sentences' rows are copied, the
    appended lines alone go to the encoder (counted whatever this CPU's check says: the check is forced here;
    the bytes are compared where the check passes, test_an_update_equals_a_fresh_build...)."""
    from elmo_cache.builder import local

    old = corpus_lines(N, seed=22)
    added = [line for line in corpus_lines(30, seed=98) if line]
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    options = {**SIZES, "progress": False, "pool": "mean"}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    write_corpus(corpus, old + added)
    monkeypatch.setattr(local, "rows_batch_free", lambda encoder: True)
    with counting(tiny_encoder) as encoded:
        summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert summary.batch_free and summary.lines_encoded == encoded[0] == len(added)
    assert summary.lines_reused == len(old) and summary.windows_encoded <= 2
    with elmo_cache.open(output) as cache:
        assert [cache.tokens(len(old) + k) for k in range(len(added))] == [tokenize(line) for line in added]
        assert verify(output).ok


def test_a_sentence_whose_key_collides_with_a_cached_line_is_encoded_not_copied(tmp_path, tiny_encoder, monkeypatch):
    """Keys are 64-bit hashes: a cached line whose key equals an edited line's (forged here) is confirmed by its
    stored tokens before its rows are copied, so the edited line gets its own vectors."""
    from elmo_cache.builder import local, update

    old = corpus_lines(N, seed=23)
    middle = len(old) // 2
    new = [*old[:middle], "an edited line in the middle", *old[middle + 1 :]]
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    options = {**SIZES, "progress": False}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    write_corpus(corpus, new)
    # The cache's line 3 takes the edited line's key, as a collision would give it.
    victim = " ".join(tokenize(old[3])).encode()
    forged = sentence_hash(tokenize(new[middle]))
    original = update.key_hash
    monkeypatch.setattr(update, "key_hash", lambda data: forged if bytes(data) == victim else original(data))
    monkeypatch.setattr(local, "rows_batch_free", lambda encoder: True)
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    monkeypatch.undo()
    assert summary.batch_free and summary.lines_encoded == 1
    with elmo_cache.open(output) as cache:
        edited_rows = np.array(cache[middle])  # (layers, tokens, dim)
    tiny_encoder.clear_word_cache()
    alone = tiny_encoder.embed_batch([tokenize(new[middle])])[0]
    assert edited_rows.shape == alone.shape
    np.testing.assert_allclose(edited_rows, alone, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("edit", "extra"), [("block", {}), ("delete", {"fp16": True, "compression": "zstd"})])
def test_an_edit_in_the_middle_takes_every_later_window_s_vectors_files_whole(tmp_path, tiny_encoder, edit, extra):
    """Each window's rows start a zarr vectors file of their own, so the windows after an edit keep their files
    byte for byte wherever their rows moved: the update hard-links them under their new numbers (same inodes as
    the old cache's) and writes only the changed windows' files, and still equals a fresh build."""
    old, new, corpus, output, options = built(
        tmp_path, tiny_encoder, ".zarr", "delete", {"chunk_rows": 16, "shard_rows": 64, **extra}, seed=41
    )
    if edit == "block":  # 40 lines (~600 rows) in the middle: every later window's rows move by whole files
        new = [*old[: len(old) // 2], *corpus_lines(40, seed=77), *old[len(old) // 2 :]]
    before = {path.stat().st_ino for path in (output / "vectors" / "c").rglob("*") if path.is_file()}
    old_cache = tmp_path / "old.zarr"
    shutil.copytree(output, old_cache)  # its offsets, to see that rows moved
    write_corpus(corpus, new)
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    fresh = tmp_path / "fresh.zarr"
    build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)
    assert verify(output).ok
    # Read through elmo-cache's own reader (files that end short, each block checked against its sum on first
    # touch) every sentence is the one zarr itself reads.
    _, arrays = raw_arrays(output)
    with elmo_cache.open(output) as cache:
        for i in range(len(cache)):
            start, stop = int(arrays["offsets"][i]), int(arrays["offsets"][i] + arrays["lengths"][i])
            rows = arrays["vectors"][start:stop].astype(np.float32)  # token-major; a sentence is layer-major
            np.testing.assert_array_equal(np.asarray(cache[i], dtype=np.float32), np.moveaxis(rows, 0, 1))
    # And the whole array, the rows between windows too: zeros, as zarr reads the chunks a file does not hold.
    _, _, readers, _ = open_cache_arrays(output)
    np.testing.assert_array_equal(np.asarray(readers["vectors"]), arrays["vectors"])

    # The files of every window the edit did not touch (by content: some after it are cut anew) are the old
    # cache's own, whatever their numbers now; only the files of the windows cut anew were written.
    number = {
        path: int(path.relative_to(output / "vectors" / "c").parts[0])
        for path in (output / "vectors" / "c").rglob("*")
        if path.is_file()
    }
    written = {k for path, k in number.items() if path.stat().st_ino not in before}
    _, arrays = raw_arrays(output)
    ends = arrays["offsets"] + arrays["lengths"]
    old_windows, changed, line = set(windows_of(old, WINDOW_TOKENS)), set(), 0
    for window in windows_of(new, WINDOW_TOKENS):
        if window not in old_windows:
            rows = [int(arrays["offsets"][i]) for i in range(line, line + len(window)) if arrays["lengths"][i]]
            changed |= set(range(min(rows) // 64, -(-int(ends[line : line + len(window)].max()) // 64)))
        line += len(window)
    assert written and written <= changed, (sorted(written - changed), summary)
    moved = int(arrays["offsets"][-1]) - int(raw_arrays(old_cache)[1]["offsets"][-1])
    assert moved >= 8 * 64 if edit == "block" else moved % 64 == 0
    assert len(written) < len(number) / 3
    assert summary.files_linked == len(number) - len(written)


def test_a_cache_whose_windows_did_not_start_files_is_updated_to_a_fresh_build(tmp_path, tiny_encoder, monkeypatch):
    """Windows version 2 (an elmo-cache before each window's rows started a vectors file of their own): the same
    rows, packed. An update copies them (its files sit elsewhere: none is linked) and writes a version-3 cache
    equal to a fresh build."""
    from elmo_cache.builder import encoding, local
    from elmo_cache.store import staging

    old = corpus_lines(N, seed=17)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / "c.zarr"
    options = {**SIZES, "progress": False, "chunk_rows": 16, "shard_rows": 64}
    with monkeypatch.context() as patch:
        patch.setattr(local, "windows_entry", lambda *args: {**encoding.windows_entry(*args), "version": 2})
        patch.setattr(staging.Layout, "window_rows", property(lambda layout: 1))
        build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    _, packed = raw_arrays(output)
    assert packed["offsets"].tolist() == np.concatenate([[0], np.cumsum(packed["lengths"])[:-1]]).tolist()
    write_corpus(corpus, edited(old, "insert"))
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    fresh = tmp_path / "fresh.zarr"
    build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)
    assert summary.files_linked == 0 and summary.lines_reused >= len(old) - 40
    assert elmo_cache.open(output).metadata["windows"]["version"] == 3


# -- an HDF5 update takes the rows it reuses from the old file at its finish ----------------------------------------


def _holes_reported(where: Path) -> bool:
    """Whether the file system under ``where`` keeps a file's holes off the disk (st_blocks tells)."""
    probe = where / "sparse.probe"
    with open(probe, "wb") as f:
        f.truncate(8 * 2**20)
    sparse = probe.stat().st_blocks * 512 < 2**20
    probe.unlink()
    return sparse


@pytest.mark.parametrize("edit", ["insert", "append"])
def test_an_hdf5_update_stages_only_the_rows_it_encodes(tmp_path, tiny_encoder, monkeypatch, edit):
    """The rows an HDF5 update reuses (the lines before its first change, every window reused whole) are not
    staged: the staged vectors hold holes there, and the finish copies them from the old file into the new one,
    which still equals a fresh build. Only the windows cut anew are staged."""
    from elmo_cache.store.hdf5.writer import Hdf5Writer

    old, new, corpus, output, options = built(tmp_path, tiny_encoder, ".h5", edit, {}, seed=43)
    staged: dict[str, int] = {}
    finalize = Hdf5Writer.finalize

    def measured(writer, metadata):
        path = writer.build_dir / "vectors.bin"
        staged.update(size=path.stat().st_size, disk=path.stat().st_blocks * 512)
        rows = np.fromfile(path, dtype=np.uint8).reshape(writer.stored_rows, -1)
        staged["zero_rows"] = int((~rows.any(axis=1)).sum())  # never written (an encoded row is never all zeros)
        return finalize(writer, metadata)

    monkeypatch.setattr(Hdf5Writer, "finalize", measured)
    write_corpus(corpus, new)
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    monkeypatch.undo()
    fresh = tmp_path / "fresh.h5"
    build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)

    # The rows the update had to stage, from the windows alone: those of each window no window of the old corpus
    # is, from the first changed line on (the lines before it sit where the old cache holds them).
    # Where rows are batch-free the lines before the first change are taken even inside a window cut anew; where
    # they are not (another CPU), the windows cut anew are encoded, and staged, whole.
    lengths = [len(tokenize(line)) for line in new]
    first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    old_windows, line, to_stage = set(windows_of(old, WINDOW_TOKENS)), 0, 0
    for window in windows_of(new, WINDOW_TOKENS):
        if window not in old_windows:
            to_stage += sum(lengths[max(line, first) if summary.batch_free else line : line + len(window)])
        line += len(window)
    row_bytes = staged["size"] // sum(lengths)
    assert 0 < to_stage < sum(lengths) / 3
    assert summary.rows_taken == sum(lengths) - to_stage == staged["zero_rows"]
    if _holes_reported(tmp_path):
        # Each hole's edges may share a 4 KiB page with staged rows.
        assert staged["disk"] <= to_stage * row_bytes + 2 * 4096 * (summary.windows_reused + 1), (staged, to_stage)


def test_an_hdf5_update_refuses_damage_in_the_rows_it_takes_and_loses_nothing(tmp_path, tiny_encoder):
    """A row the update would take from the old file, damaged there, is found by the old file's block sums at the
    finish: the update stops naming the dataset, the old cache stays in place as it was (damage and all), and
    nothing with fresh sums over the damaged bytes is published."""
    import h5py

    from elmo_cache.errors import CacheCorruptError

    _, new, corpus, output, options = built(tmp_path, tiny_encoder, ".h5", "append", {}, seed=47)
    with h5py.File(output, "r") as f:
        where = f["vectors"].id.get_offset() + 7 * f["vectors"].dtype.itemsize  # row 0: a line before the change
    with open(output, "r+b") as f:
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0x10]))
    damaged = output.read_bytes()
    write_corpus(corpus, new)
    with pytest.raises(CacheCorruptError, match="vectors"):
        build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert output.read_bytes() == damaged


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_an_interrupted_update_of_a_cache_replaced_since_starts_again(tmp_path, tiny_encoder, suffix):
    """An interrupted update takes rows and files from the cache at the output: when another cache was put there
    since (same options, another corpus), the next update does not resume from the first one's commits but starts
    again from the cache it finds, and ends with a fresh build's bytes."""
    old = corpus_lines(N, seed=53)
    corpus = write_corpus(tmp_path / "c.txt", old)
    output = tmp_path / f"c{suffix}"
    options = {**SIZES, "progress": False, "commit_seconds": 0}
    build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    other = tmp_path / f"other{suffix}"
    other_corpus = write_corpus(tmp_path / "o.txt", corpus_lines(N, seed=54))
    build(other_corpus, BuildOptions(output=other, **options), encoder=tiny_encoder)
    fifth = len(old) // 5
    write_corpus(corpus, [*old[:fifth], "a new line . inserted early", *old[fifth:-fifth], "one late .", *old[-fifth:]])
    rows_batch_free(tiny_encoder)  # the update's check, done before the encoder fails
    with failing_on(tiny_encoder, holding=["one", "late", "."]), pytest.raises(RuntimeError, match="simulated crash"):
        build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert load_progress(output).lines > 0  # commits to resume from, were it the same cache
    shutil.rmtree(output) if output.is_dir() else output.unlink()
    other.rename(output)
    summary = build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
    assert summary.updated and summary.resumed_from == 0
    fresh = tmp_path / f"fresh{suffix}"
    build(corpus, BuildOptions(output=fresh, **options), encoder=tiny_encoder)
    assert_same_bytes(output, fresh)
