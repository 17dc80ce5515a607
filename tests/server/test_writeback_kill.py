"""``serve --write-back`` for real: a server process killed with SIGKILL, and one stopped with Ctrl-C, then the
journal reopened; the CLI's refusals."""

from __future__ import annotations

import signal
import subprocess
import time

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.reader.writeback import open_journal
from elmo_cache.server.writeback import key_of
from elmo_cache.store.journal import journal_path
from elmo_cache.text.tokenize import tokenize
from tests.server_helpers import interrupt, start_serve

LINES = ["The cat sat on the mat .", "hello world", "Colourless green ideas sleep furiously ."]


@pytest.fixture
def cache(tmp_path, tiny_model):
    encoder = elmo_cache.Encoder.load(tiny_model, device="cpu")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    build(corpus, BuildOptions(output=tmp_path / "corpus.zarr", device="cpu", progress=False), encoder=encoder)
    return elmo_cache.open(tmp_path / "corpus.zarr")


def _serve(cache, tiny_model, commit_ms: float) -> tuple[subprocess.Popen, str]:
    return start_serve(cache.path, tiny_model, "--write-back", "--write-back-commit-ms", str(commit_ms))


def _ask(client: httpx.Client, sentences: list[str]) -> list[float]:
    """Each sentence asked in turn (a miss each); when each answer came back."""
    acknowledged = []
    for sentence in sentences:
        response = client.get("/embed", params={"sentence": sentence, "format": "npy"})
        assert response.status_code == 200 and response.headers["x-elmo-source"] == "live", response.text
        acknowledged.append(time.monotonic())
    return acknowledged


COMMIT_MS = 200.0


def test_kill_9_loses_at_most_the_misses_of_the_last_commit_interval(cache, tiny_model):
    """SIGKILL right after a burst of answered misses: every miss answered more than COMMIT_MS (plus a generous
    margin for the commit itself) before the kill is in the journal, byte for byte as served, what is kept is
    a prefix of the answered order (commits append in order), and the journal reopens cleanly."""
    early = [f"early sentence number {k} here" for k in range(6)]
    late = [f"late sentence number {k} there" for k in range(6)]
    proc, url = _serve(cache, tiny_model, COMMIT_MS)
    try:
        with httpx.Client(base_url=url, timeout=30.0) as client:
            answered = _ask(client, early)
            time.sleep(COMMIT_MS / 1000 + 1.5)  # the early ones are now well past their commit
            answered += _ask(client, late)
            served = {s: client.get("/embed", params={"sentence": s, "format": "npy"}).content for s in early[:2]}
            proc.send_signal(signal.SIGKILL)
            killed = time.monotonic()
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    order = early + late
    with open_journal(cache, writable=True) as journal:  # the writer's open: a torn tail would be cut here
        kept = [s for s in order if key_of(tokenize(s)) in journal]
        assert kept == order[: len(kept)], "the journal keeps a prefix of the answered misses"
        due = [s for s, when in zip(order, answered) if killed - when > COMMIT_MS / 1000 + 1.0]
        assert set(due) <= set(kept) and set(early) <= set(due)
        for sentence, body in served.items():  # a hit after the commit was answered from the journal
            rows, _ = journal.get(key_of(tokenize(sentence)))
            np.testing.assert_array_equal(cache.sentence_from_rows(rows), np.load(__import__("io").BytesIO(body)))
    # A torn tail, as a kill in the middle of a write leaves one: dropped at the next open, nothing else lost.
    path = journal_path(cache.path)
    whole = path.read_bytes()
    frame_start = whole.rfind(b"early sentence number 0 here") - 16
    path.write_bytes(whole + whole[frame_start : frame_start + 40])
    with open_journal(cache, writable=True) as journal:
        assert journal.dropped_tail == 40 and [s for s in order if key_of(tokenize(s)) in journal] == kept
    assert path.read_bytes() == whole


def test_a_clean_shutdown_commits_every_answered_miss(cache, tiny_model):
    """Ctrl-C drains and closes the journal: even with a commit interval of a minute nothing answered is lost."""
    sentences = [f"sentence {k} asked before the shutdown" for k in range(5)]
    proc, url = _serve(cache, tiny_model, 60_000)
    with httpx.Client(base_url=url, timeout=30.0) as client:
        _ask(client, sentences)
        metrics = client.get("/metrics").text
    assert "elmo_cache_writeback_written_total 0.0" in metrics  # nothing committed yet
    interrupt(proc)
    assert proc.returncode == 0
    with open_journal(cache) as journal:
        assert len(journal) == 5 and journal.dropped_tail == 0
    reopened = elmo_cache.open(cache.path)
    assert reopened.get(sentences[3]) is not None and reopened.find(sentences[3]) is None


def test_serve_refuses_write_back_plainly(cache, tiny_model, tmp_path):
    runner = CliRunner()
    model = ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"]
    result = runner.invoke(cli, ["serve", "--write-back", *model])
    assert result.exit_code == 1 and "name the cache to serve" in result.output
    journal_path(cache.path).write_bytes(b"something else entirely")
    result = runner.invoke(cli, ["serve", str(cache.path), "--write-back", *model])
    assert result.exit_code == 1 and "not an elmo-cache write-back journal" in result.output
    assert "Traceback" not in result.output
