"""One writer per output: a second build is refused with who is building, a killed build never
blocks the next one, and opening a cache under construction says it is being built."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.errors import IncompleteCacheError, OutputLockedError
from elmo_cache.store.format import staging_path
from elmo_cache.store.lock import check_held, current_builder, lock_path, output_lock
from tests._build_fixtures import corpus_lines, write_corpus
from tests.builder.test_resume import _command

LINES = corpus_lines(40, seed=11)


def _build_from_stdin(output: Path, model: tuple[Path, Path], lines: list[str]) -> subprocess.Popen:
    """A CLI build reading stdin, fed ``lines`` and kept waiting for more (its lock held) until the
    test closes ``process.stdin``."""
    command = _command(Path("-"), output, model, [])  # test_resume's: small windows, commits at each
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdin is not None
    process.stdin.write("\n".join(lines) + "\n")
    process.stdin.flush()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        owner = current_builder(output)
        if owner is not None and owner.pid == process.pid:
            return process
        if process.poll() is not None:
            raise AssertionError(f"the build exited early: {process.communicate()}")
        time.sleep(0.05)
    raise AssertionError("the build did not take its lock in time")


def _committed(output: Path) -> int:
    from elmo_cache.store import load_progress

    progress = load_progress(output)
    return -1 if progress is None else progress.lines


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


def test_a_second_build_is_refused_while_the_first_runs_and_readers_are_told(tmp_path, tiny_model, tiny_encoder):
    output = tmp_path / "c.zarr"
    process = _build_from_stdin(output, tiny_model, LINES[:10])
    try:
        with process.stdin as stream:
            expected = f"is being built by pid {process.pid} on {socket.gethostname()}"

            corpus = write_corpus(tmp_path / "other.txt", LINES)
            with pytest.raises(OutputLockedError, match=expected):
                build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
            # --overwrite cannot take an output away from a running build either.
            with pytest.raises(OutputLockedError, match=expected):
                build(corpus, BuildOptions(output=output, overwrite=True, progress=False), encoder=tiny_encoder)
            result = CliRunner().invoke(
                cli,
                ["build", str(corpus), "-o", str(output), "--options-file", str(tiny_model[0])]
                + ["--weight-file", str(tiny_model[1]), "--device", "cpu", "--no-progress"],
            )
            assert result.exit_code == 1 and expected in result.output, result.output
            assert "Traceback" not in result.output

            with pytest.raises(IncompleteCacheError, match=expected):
                elmo_cache.open(output)
            info = CliRunner().invoke(cli, ["info", str(output)])
            assert info.exit_code == 0 and f"being built by pid {process.pid}" in info.output, info.output
            with pytest.raises(IncompleteCacheError, match=expected):
                elmo_cache.open(staging_path(output))
            # The refused builds left the running one's staging and lock alone.
            assert staging_path(output).is_dir() and current_builder(output).pid == process.pid

            stream.write("\n".join(LINES[10:]) + "\n")
        assert process.wait(timeout=120) == 0, process.stderr.read()
    finally:
        _stop(process)
    assert not lock_path(output).exists()  # released and removed at the end
    assert current_builder(output) is None
    reference = tmp_path / "reference.zarr"
    build(
        write_corpus(tmp_path / "ref.txt", LINES), BuildOptions(output=reference, progress=False), encoder=tiny_encoder
    )
    with elmo_cache.open(output) as got, elmo_cache.open(reference) as want:
        assert len(got) == len(LINES)
        for i in range(len(LINES)):  # other batch sizes: equal up to float32 round-off (README, Determinism)
            np.testing.assert_allclose(got[i], want[i], atol=1e-5, rtol=0)


def test_a_lock_left_by_a_killed_build_never_blocks_the_next(tmp_path, tiny_model, tiny_encoder):
    output = tmp_path / "c.h5"
    process = _build_from_stdin(output, tiny_model, LINES[:10])
    try:
        with process.stdin:
            deadline = time.monotonic() + 60
            while _committed(output) <= 0 and time.monotonic() < deadline:
                time.sleep(0.05)  # small windows: the first lines are committed while stdin stays open
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=30)
            assert process.returncode == -signal.SIGKILL
    finally:
        _stop(process)
    # The killed build could not remove its lock file; the kernel released the lock all the same.
    assert lock_path(output).exists()
    assert json.loads(lock_path(output).read_text())["pid"] == process.pid
    assert current_builder(output) is None
    with pytest.raises(IncompleteCacheError, match="interrupted"):
        elmo_cache.open(output)
    info = CliRunner().invoke(cli, ["info", str(output)])
    assert info.exit_code == 0 and "interrupted build" in info.output, info.output
    # The staging folder itself reports the same committed count, not the zero of its placeholder metadata.
    partial = CliRunner().invoke(cli, ["info", "--json", str(staging_path(output))])
    full = CliRunner().invoke(cli, ["info", "--json", str(output)])
    assert partial.exit_code == 0 and json.loads(partial.output) == json.loads(full.output)
    assert json.loads(full.output)["committed_sentences"] > 0

    corpus = write_corpus(tmp_path / "full.txt", LINES)
    summary = build(corpus, BuildOptions(output=output, overwrite=True, progress=False), encoder=tiny_encoder)
    assert summary.n_sentences == len(LINES)
    assert not lock_path(output).exists()
    with elmo_cache.open(output) as cache:
        np.testing.assert_allclose(cache[3], tiny_encoder.embed_sentence(LINES[3].split()), atol=1e-5, rtol=0)


def test_the_ray_engine_takes_the_same_lock(tmp_path):
    pytest.importorskip("ray")
    corpus = write_corpus(tmp_path / "c.txt", LINES)
    output = tmp_path / "c.zarr"
    # Refused before any cluster starts: the lock is taken first.
    with output_lock(output), pytest.raises(OutputLockedError, match=f"is being built by pid {os.getpid()}"):
        build(corpus, BuildOptions(output=output, progress=False), engine="ray")
    assert not lock_path(output).exists()


def test_lock_errors_are_clear(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OutputLockedError, match="cannot take the build lock"), output_lock(blocker / "sub" / "c.zarr"):
        pass
    # A lock file that someone else wrote (or an empty one) is never mistaken for a held lock.
    output = tmp_path / "c.zarr"
    lock_path(output).write_text("garbage")
    assert current_builder(output) is None
    with output_lock(output):
        owner = current_builder(output)
        assert owner is not None and owner.pid == os.getpid() and owner.host == socket.gethostname()
    assert not lock_path(output).exists()


def test_deleting_the_lock_file_of_a_running_build_never_lets_a_second_one_start(tmp_path, tiny_model, tiny_encoder):
    """The lock survives its file: a second build is still refused with who builds, readers still see
    the build, and the first one finishes a correct cache (issue 33, item 6)."""
    output = tmp_path / "c.zarr"
    process = _build_from_stdin(output, tiny_model, LINES[:10])
    try:
        with process.stdin as stream:
            deadline = time.monotonic() + 60
            while _committed(output) <= 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            lock_path(output).unlink()
            expected = f"is being built by pid {process.pid} on {socket.gethostname()}"

            corpus = write_corpus(tmp_path / "other.txt", LINES)
            for overwrite in (False, True):
                with pytest.raises(OutputLockedError, match=expected):
                    build(
                        corpus, BuildOptions(output=output, overwrite=overwrite, progress=False), encoder=tiny_encoder
                    )
            result = CliRunner().invoke(
                cli,
                ["build", str(corpus), "-o", str(output), "--overwrite", "--options-file", str(tiny_model[0])]
                + ["--weight-file", str(tiny_model[1]), "--device", "cpu", "--no-progress"],
            )
            assert result.exit_code == 1 and expected in result.output, result.output
            assert "Traceback" not in result.output
            # Readers are told too, and the refused builds left the running one's staging alone.
            assert current_builder(output).pid == process.pid
            with pytest.raises(IncompleteCacheError, match=f"being built by pid {process.pid}"):
                elmo_cache.open(output)
            assert staging_path(output).is_dir() and _committed(output) > 0

            stream.write("\n".join(LINES[10:]) + "\n")
        code = process.wait(timeout=120)
        err = process.stderr.read()
        assert code == 0 and "Traceback" not in err, err
    finally:
        _stop(process)
    assert not lock_path(output).exists() and current_builder(output) is None
    with elmo_cache.open(output) as cache:
        assert len(cache) == len(LINES)
        for i in range(len(LINES)):  # another batch size than the reference: float32 round-off (README)
            np.testing.assert_allclose(cache[i], tiny_encoder.embed_sentence(LINES[i].split()), atol=1e-5, rtol=0)


def test_a_holder_whose_lock_file_was_deleted_takes_it_again_at_its_next_commit(tmp_path):
    output = tmp_path / "c.zarr"
    with output_lock(output):
        lock_path(output).unlink()
        assert current_builder(output).pid == os.getpid()  # the guard still names the holder
        check_held(output)  # what the staging Writer calls at every commit
        assert json.loads(lock_path(output).read_text())["pid"] == os.getpid()
        assert current_builder(output).pid == os.getpid()
    assert not lock_path(output).exists() and current_builder(output) is None
    with output_lock(output):  # nothing of the first lock is left behind
        pass


def test_a_second_build_refused_at_the_guard_never_stops_the_holder(tmp_path):
    """A second build on this host creates a fresh lock file where the holder's was deleted and locks it before
    the guard refuses it; the holder committing at that moment waits for it instead of stopping (it did stop:
    the race behind test_deleting_the_lock_file_of_a_running_build_never_lets_a_second_one_start's failures)."""
    import fcntl
    import threading

    output = tmp_path / "c.zarr"
    with output_lock(output):
        lock_path(output).unlink()
        # What a refused build does (output_lock): a fresh file, locked; refused at the guard; its file removed,
        # its lock released.
        fd = os.open(lock_path(output), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)

        def refused_build_lets_go() -> None:
            time.sleep(0.3)
            os.unlink(lock_path(output))
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

        letting_go = threading.Thread(target=refused_build_lets_go)
        letting_go.start()
        try:
            check_held(output)  # the holder's next commit, while the refused build still holds the fresh file
        finally:
            letting_go.join()
        assert json.loads(lock_path(output).read_text())["pid"] == os.getpid()
        assert current_builder(output).pid == os.getpid()
    assert not lock_path(output).exists() and current_builder(output) is None


_HOLD = """
import sys, time, filelock
lock = filelock.FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_holder_whose_lock_file_another_process_holds_now_stops_before_committing(tmp_path):
    """The lock file replaced by one another process holds (a build on another host of a shared
    filesystem, which the guard cannot see): the build stops at its next commit with a clear error."""
    output = tmp_path / "c.zarr"
    with output_lock(output):
        lock_path(output).unlink()
        other = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(lock_path(output))], stdout=subprocess.PIPE, text=True
        )
        try:
            assert other.stdout is not None and other.stdout.readline().strip() == "held"
            with pytest.raises(OutputLockedError, match="was removed or replaced while this build held it"):
                check_held(output)
        finally:
            _stop(other)
    assert lock_path(output).exists()  # the other process's file: not ours to remove


def test_a_writer_stops_at_its_commit_when_its_lock_is_lost(tmp_path, monkeypatch):
    """The staging Writer asks for its lock before a commit syncs or records anything."""
    from elmo_cache.store import staging

    def lost(output):
        raise OutputLockedError(f"{output}: lost")

    monkeypatch.setattr(staging, "check_held", lost)
    writer = staging.Writer.__new__(staging.Writer)  # only what commit reaches before its check
    writer.output = tmp_path / "c.zarr"
    monkeypatch.setattr(writer, "_sync_vectors", lambda: pytest.fail("synced after the lock was lost"))
    with pytest.raises(OutputLockedError, match="lost"):
        writer.commit()
