"""Resuming: an interrupted build (exception, failed finish, kill -9) rerun ends with the uninterrupted cache."""

from __future__ import annotations

import importlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elmo_cache.builder import BuildOptions, build
from elmo_cache.errors import CacheExistsError, CorpusChangedError, ElmoCacheError
from elmo_cache.store import load_progress, staging_path
from elmo_cache.verify.checks import verify
from tests._build_fixtures import assert_same_cache, corpus_lines, failing_on, write_corpus


@pytest.mark.parametrize(
    ("fmt", "extra"),
    [
        ("zarr", {"chunk_rows": 16, "shard_rows": 48, "pool": "max"}),
        # pooled rows of repeats are copied at the finish: after a resume too
        ("hdf5", {"dedupe": True, "fp16": True, "layers": "0,2", "pool": "mean"}),
    ],
)
def test_resume_after_a_crash_equals_an_uninterrupted_build(tmp_path, tiny_encoder, fmt, extra):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    suffix = ".zarr" if fmt == "zarr" else ".h5"
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False, **extra)
    reference = tmp_path / ("reference" + suffix)
    build(corpus, BuildOptions(output=reference, **options), encoder=tiny_encoder)

    output = tmp_path / ("resumed" + suffix)
    for fail_at in (7, 3, 11):  # three crashes, each after some commits of the run before
        with failing_on(tiny_encoder, fail_at), pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
        assert not output.exists()
    committed = load_progress(output).lines
    assert 0 < committed < 120
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from == committed and summary.n_sentences == 120
    assert not staging_path(output).exists()
    assert_same_cache(output, reference)
    assert verify(output).ok


@pytest.mark.parametrize(
    ("fmt", "extra"),
    [
        ("zarr", {"chunk_rows": 16, "shard_rows": 48, "pool": "max"}),
        ("hdf5", {"dedupe": True, "fp16": True, "layers": "0,2", "pool": "mean"}),
    ],
)
def test_resume_over_garbage_past_the_commit_point_equals_an_uninterrupted_build(tmp_path, tiny_encoder, fmt, extra):
    """What a kill -9 leaves past the last commit (bytes appended to every staged file, a vectors file of rows
    never published) is cut off: the resumed cache holds the uninterrupted build's bytes, array by array."""
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    suffix = ".zarr" if fmt == "zarr" else ".h5"
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False, **extra)
    reference = tmp_path / ("reference" + suffix)
    build(corpus, BuildOptions(output=reference, **options), encoder=tiny_encoder)

    output = tmp_path / ("resumed" + suffix)
    with failing_on(tiny_encoder, 5), pytest.raises(RuntimeError, match="simulated crash"):
        build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    committed = load_progress(output).lines
    assert 0 < committed < 120
    staging = staging_path(output)
    rng = random.Random(7)
    staged = sorted(staging.glob(".build/*.bin"))
    assert len(staged) >= 6
    for path in staged:  # an odd number of bytes: no whole item of any column
        with open(path, "ab") as f:
            f.write(bytes(rng.randrange(256) for _ in range(1001)))
    if fmt == "zarr":
        beyond = staging / "vectors" / "c" / "9" / "0" / "0"
        beyond.parent.mkdir(parents=True)
        beyond.write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from == committed and summary.n_sentences == 120
    assert_same_cache(output, reference)
    assert verify(output).ok


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_a_failed_finish_is_retried(tmp_path, tiny_encoder, monkeypatch, fmt):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(40, seed=2))
    output = tmp_path / ("c.zarr" if fmt == "zarr" else "c.h5")
    # The module whose finish is made to fail: zarr's file writing, or the HDF5 container.
    module = importlib.import_module("elmo_cache.store.zarr.write" if fmt == "zarr" else "elmo_cache.store.hdf5.writer")

    def failing(*args, **kwargs):
        raise OSError(28, "No space left on device")

    # Fail the last step of finishing: zarr renames the staging folder, HDF5 syncs cache.h5 first.
    if fmt == "zarr":
        monkeypatch.setattr(module.os, "rename", failing)
    else:
        monkeypatch.setattr(module, "fsync_path", failing)
    with pytest.raises(ElmoCacheError, match="cannot finish .* rerun the same command"):
        build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    assert not output.exists() and load_progress(output).done
    monkeypatch.undo()
    summary = build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    assert summary.resumed_from == 40 and verify(output).ok
    assert not staging_path(output).exists()


def test_resume_refuses_a_changed_corpus_and_other_options(tmp_path, tiny_encoder):
    lines = corpus_lines(60, seed=4)
    corpus = write_corpus(tmp_path / "c.txt", lines)
    output = tmp_path / "c.zarr"
    options = BuildOptions(output=output, batch_tokens=40, window_batches=1, commit_seconds=0, progress=False)
    with failing_on(tiny_encoder, 9), pytest.raises(RuntimeError):
        build(corpus, options, encoder=tiny_encoder)
    committed = load_progress(output).lines
    assert committed > 3
    with pytest.raises(
        CacheExistsError, match=r"interrupted build with other options \(dtype: 'float32' there, 'float16' now"
    ):
        build(corpus, BuildOptions(output=output, fp16=True, progress=False), encoder=tiny_encoder)
    same = {"batch_tokens": 40, "window_batches": 1, "progress": False}
    with pytest.raises(CacheExistsError, match=r"other options \(pool: None there, \{'method': 'mean'"):
        build(corpus, BuildOptions(output=output, pool="mean", **same), encoder=tiny_encoder)
    lines[2] = "this line changed"
    write_corpus(corpus, lines)
    stored = (
        rf"c\.txt, line 3: differs from the line the interrupted build stored: the corpus changed since the build "
        rf"was interrupted \(1 line changed, 0 added, 0 removed; the first difference is at line 3, among the "
        rf"{committed} lines it stored\)"
    )
    with pytest.raises(CorpusChangedError, match=stored):
        build(corpus, options, encoder=tiny_encoder)
    write_corpus(corpus, lines[:2] + lines[3:])  # a committed line removed (a deletion, not 57 changes)
    with pytest.raises(
        CorpusChangedError, match="0 lines changed, 0 added, 1 removed; the first difference is at line 3"
    ):
        build(corpus, options, encoder=tiny_encoder)
    write_corpus(corpus, lines[:2])  # shorter than what was committed
    with pytest.raises(CorpusChangedError, match=rf"c\.txt has 2 lines but the interrupted build stored {committed}"):
        build(corpus, options, encoder=tiny_encoder)
    write_corpus(corpus, lines)
    summary = build(corpus, BuildOptions(output=output, overwrite=True, progress=False), encoder=tiny_encoder)
    assert summary.resumed_from == 0 and summary.n_sentences == 60


# -- kill -9 at random moments --------------------------------------------------------------------


def _command(corpus: Path, output: Path, model: tuple[Path, Path], extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-c",
        "from elmo_cache.cli.main import main; main()",
        "build",
        str(corpus),
        "-o",
        str(output),
        "--options-file",
        str(model[0]),
        "--weight-file",
        str(model[1]),
        "--batch-tokens",
        "48",
        "--window-batches",
        "1",
        "--commit-seconds",
        "0",
        "--no-progress",
        "--device",
        "cpu",
        *extra,
    ]


def _committed(output: Path) -> int:
    try:
        return json.loads((staging_path(output) / ".build" / "progress.json").read_text())["lines"]
    except (OSError, ValueError, KeyError):
        return -1


def _wait(process: subprocess.Popen, output: Path, seconds: float, lines: int) -> None:
    """Until ``seconds`` pass, the build has committed ``lines`` lines, or it has ended."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _committed(output) < lines and process.poll() is None:
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize(
    "suffix,extra",
    [
        # zarr has the most state to resume (shards, chunks, tail; small files: windows of a few hundred tokens)
        (
            ".zarr",
            [
                "--chunk-rows",
                "16",
                "--shard-rows",
                "64",
                "--dedupe",
                "--fp16",
                "--layers",
                "1,2",
                "--pool",
                "first-last",
            ],
        ),
        # HDF5 resumes by truncating its datasets to the last commit
        (".h5", ["--dedupe", "--mix", "0.2,0.3,0.5"]),
    ],
)
def test_kill_9_at_random_moments(tmp_path, tiny_model, suffix, extra):
    rng = random.Random(1234)
    # Enough lines for several commits between start-up and the end of the build.
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(4000, seed=9))
    output = tmp_path / ("c" + suffix)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = _command(corpus, output, tiny_model, extra)

    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    # Kill delays scale with this machine's speed: fixed ones let a fast CPU finish before the kill.
    whole_run = time.monotonic() - started
    reference = tmp_path / "reference"
    shutil.move(output, reference)

    kills = resumed_kills = 0
    for attempt in range(5):
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        before = _committed(output)
        if attempt == 0:
            # Anywhere, start-up included; but by progress as well as by time, since the load of a shared
            # machine can make this run much faster than the timed one, which would then finish unkilled.
            _wait(process, output, rng.uniform(0.2, 0.8) * whole_run, int(rng.uniform(0.1, 0.6) * 4000))
        else:
            _wait(process, output, 60, before + 1)  # until this run has committed something of its own
            _wait(process, output, rng.uniform(0.0, 0.05) * whole_run, before + 400)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
            resumed_kills += before > 0
        _, err = process.communicate(timeout=60)
        if process.returncode == 0:
            break
        assert process.returncode == -signal.SIGKILL, err
    else:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    assert kills >= 2 and resumed_kills >= 1, (kills, resumed_kills)
    assert not staging_path(output).exists()
    assert_same_cache(reference, output)


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_resume_of_windows_cut_another_way_says_so_and_records_no_rule(tmp_path, tiny_encoder, suffix, caplog):
    """A build started by an elmo-cache that cut windows by count (its progress records no rule): the resumed
    cache holds every line but claims no window rule, so an update refuses it instead of reusing rows whose
    windows it would misjudge."""
    from elmo_cache.store import read_metadata
    from elmo_cache.store.format import BUILD_DIR, PROGRESS_FILE

    lines = corpus_lines(120, seed=5)
    corpus = write_corpus(tmp_path / "c.txt", lines)
    output = tmp_path / ("c" + suffix)
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False)
    with failing_on(tiny_encoder, 7), pytest.raises(RuntimeError, match="simulated crash"):
        build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    progress_file = staging_path(output) / BUILD_DIR / PROGRESS_FILE
    recorded = json.loads(progress_file.read_text(encoding="utf-8"))
    assert recorded["windows"]["cut"] == "content-defined" and recorded["lines"] > 0
    del recorded["windows"]
    progress_file.write_text(json.dumps(recorded), encoding="utf-8")

    with caplog.at_level("WARNING", logger="elmo_cache.builder"):
        summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from == recorded["lines"] and summary.n_sentences == 120
    assert "cut into windows another way" in caplog.text and str(output) in caplog.text
    assert "windows" not in read_metadata(output)
    assert verify(output).ok
    write_corpus(corpus, [*lines, "one more line ."])
    with pytest.raises(ElmoCacheError, match="windows"):
        build(corpus, BuildOptions(output=output, update=True, **options), encoder=tiny_encoder)
