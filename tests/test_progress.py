"""Progress of long phases (elmo_cache.progress): redrawn on a terminal, whole lines without carriage returns
in a log; and every long phase of build, export, elmo, verify and the codebook training shows one."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from elmo_cache.cli.main import cli
from elmo_cache.errors import InvalidParameterError
from elmo_cache.progress import PROGRESS_SECONDS_ENV, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_whole_lines_and_a_terminal_the_redrawn_bar(monkeypatch):
    monkeypatch.setenv(PROGRESS_SECONDS_ENV, "0")
    log = io.StringIO()
    with progress_bar(total=5, desc="encoding", unit=" sent", stream=log) as bar:
        for _ in range(5):
            bar.update(1)
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n") and len(lines) >= 5
    assert lines[-1].startswith("encoding: 100%") and "5/5" in lines[-1]
    terminal = Terminal()
    with progress_bar(total=5, desc="encoding", unit=" sent", stream=terminal) as bar:
        bar.update(5)
    assert "\r" in terminal.getvalue()


def test_a_log_line_at_most_every_interval(monkeypatch):
    monkeypatch.delenv(PROGRESS_SECONDS_ENV, raising=False)  # 30 s: a quick phase writes its first and last line
    log = io.StringIO()
    with progress_bar(total=1000, desc="exporting", unit=" sent", stream=log) as bar:
        for _ in range(1000):
            bar.update(1)
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "0/1000" in lines[0] and "1000/1000" in lines[1]
    monkeypatch.setenv(PROGRESS_SECONDS_ENV, "soon")
    with pytest.raises(InvalidParameterError, match=f"{PROGRESS_SECONDS_ENV} is 'soon'; it must be a number"):
        progress_bar(total=1, desc="x", unit=" x", stream=io.StringIO())
    monkeypatch.delenv(PROGRESS_SECONDS_ENV)
    disabled = io.StringIO()
    with progress_bar(total=3, desc="x", unit=" x", stream=disabled, disable=True) as bar:
        bar.update(3)
    assert disabled.getvalue() == ""


def test_build_with_pq_into_a_log_shows_every_phase_without_carriage_returns(tmp_path, tiny_model):
    pytest.importorskip("faiss")
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"the cat {i} sat on the mat .\n" for i in range(40)), encoding="utf-8")
    command = [sys.executable, "-c", "from elmo_cache.cli.main import main; main()", "build", str(corpus)]
    command += ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"]
    command += ["--quantize", "pq:4", "--codebook-sample", "100"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    for phase in ("encoding the codebook sample", "training pq:4 codebooks", "encoding: 100%"):
        assert phase in done.stderr, done.stderr


def test_export_elmo_and_verify_show_their_phases(tmp_path, tiny_model, monkeypatch):
    monkeypatch.setenv(PROGRESS_SECONDS_ENV, "0")
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat\na dog ran far\nhello\n", encoding="utf-8")
    model = ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1])]
    runner = CliRunner()
    built = runner.invoke(cli, ["build", str(corpus), *model, "--device", "cpu", "--no-progress"])
    assert built.exit_code == 0, built.output
    cache = tmp_path / "c.zarr"
    exported = runner.invoke(cli, ["export", str(cache), str(tmp_path / "c.h5")])
    assert exported.exit_code == 0 and "exporting: 100%" in exported.stderr, exported.output
    embedded = runner.invoke(cli, ["elmo", str(corpus), str(tmp_path / "e.h5"), "--top", *model])
    assert embedded.exit_code == 0 and "embedding: 100%" in embedded.stderr, embedded.output
    checked = runner.invoke(cli, ["verify", str(cache), "--sample", "2", "--corpus", str(corpus), *model])
    assert checked.exit_code == 0, checked.output
    for phase in ("checking checksums", "scanning vectors", "reading the corpus", "re-encoding the sample"):
        assert phase in checked.stderr, checked.stderr
    quiet = runner.invoke(cli, ["verify", str(cache), "--no-progress"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert "\r" not in exported.stderr + embedded.stderr + checked.stderr
