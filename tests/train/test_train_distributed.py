"""Data-parallel training on the CPU (gloo, 2 processes of 1 thread each): N processes take the steps one
process takes over the same global batches, a kill -9 of one rank stops the job and the same command
resumes it, and wrong numbers of processes are refused plainly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_train import TINY, _tiny_cli_args, _write_corpus

from elmo_cache.cli.main import cli
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.weights import weight_shapes
from elmo_cache.train import train
from elmo_cache.train.data import TokenizedCorpus, count_tokens
from elmo_cache.train.launch import launch
from elmo_cache.train.vocab import Vocabulary

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not built in")

# Dropout off: with it, each rank draws its own masks and the runs are equal in law only.
# The CPU (gloo) path, also on a machine with a GPU, where the default device would be CUDA.
EXACT = replace(TINY, dropout=0.0, threads=1, device="cpu")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("dist_corpus") / "train.txt", 300, seed=2)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, corpus) -> tuple[Path, object]:
    output = tmp_path_factory.mktemp("two_ranks")
    return output, train(corpus, output, replace(EXACT, batch_size=4, nproc=2, max_steps=6))


def assert_same_weights(a_dir: Path, b_dir: Path, atol: float = 1e-6) -> None:
    names = weight_shapes(ModelOptions.from_file(a_dir / "options.json"))
    with h5py.File(a_dir / "weights.hdf5") as a, h5py.File(b_dir / "weights.hdf5") as b:
        for name in names:
            np.testing.assert_allclose(a[name][()], b[name][()], rtol=0, atol=atol, err_msg=name)
    with h5py.File(a_dir / "softmax.hdf5") as a, h5py.File(b_dir / "softmax.hdf5") as b:
        for name in ("softmax/W", "softmax/b"):
            np.testing.assert_allclose(a[name][()], b[name][()], rtol=0, atol=atol, err_msg=name)


def test_ranks_rows_are_the_global_batch_cut_in_rank_order(tmp_path, corpus):
    vocab = Vocabulary.from_counts(count_tokens(corpus), min_count=1)
    data = TokenizedCorpus.from_file(corpus, vocab)
    for reset_share in (None, 0.5):
        whole = list(data.epoch_batches(3, 1, 8, 5, start=2, reset_share=reset_share))
        parts = [
            list(data.epoch_batches(3, 1, 8, 5, start=2, reset_share=reset_share, part=slice(r * 4, r * 4 + 4)))
            for r in (0, 1)
        ]
        assert len(whole) == len(parts[0]) == len(parts[1]) > 3
        for k, batch in enumerate(whole):
            for field in ("inputs", "targets", "weights") + (() if reset_share is None else ("resets",)):
                joined = np.concatenate(
                    [getattr(parts[r][k], field) for r in (0, 1)], axis=1 if field != "resets" else 0
                )
                np.testing.assert_array_equal(joined, getattr(batch, field), err_msg=field)
            # Every rank knows the whole batch's prediction count (the loss's denominator).
            for r in (0, 1):
                np.testing.assert_array_equal(parts[r][k].counts, batch.weights.sum(axis=(1, 2)))


def test_two_processes_take_the_steps_of_one_over_the_same_global_batches(tmp_path, corpus, two_ranks):
    output, result = two_ranks
    single = train(corpus, tmp_path / "one", replace(EXACT, batch_size=8, max_steps=6))
    assert result.steps == single.steps == 6 and result.finished
    assert result.tokens == single.tokens  # both count the global batch's predictions
    assert result.loss == pytest.approx(single.loss, rel=1e-5)
    assert_same_weights(output, tmp_path / "one")
    two_ckpt = torch.load(output / "checkpoint.pt", weights_only=True)
    one_ckpt = torch.load(tmp_path / "one" / "checkpoint.pt", weights_only=True)
    # Rank 0's checkpoint holds the global batch's LSTM state: both ranks' rows, in rank order.
    for (h2, c2), (h1, c1) in zip(two_ckpt["lstm_state"], one_ckpt["lstm_state"]):
        assert h2.shape == h1.shape == (2, 8, h1.shape[2])
        torch.testing.assert_close(h2, h1, rtol=0, atol=1e-5)
        torch.testing.assert_close(c2, c1, rtol=0, atol=1e-5)
    assert len(two_ckpt["torch_rngs"]) == 2 and two_ckpt["fingerprint"]["world_size"] == 2


def test_wrong_numbers_of_processes_are_refused_plainly(tmp_path, corpus, two_ranks, monkeypatch):
    output, _ = two_ranks
    with pytest.raises(InvalidParameterError, match="nproc: must be >= 1"):
        train(corpus, tmp_path / "a", replace(EXACT, nproc=0))
    # A run of two processes resumes with two only (the global batch and each rank's place are the run's).
    with pytest.raises(CacheExistsError, match=r"world_size differ\) \(it was trained by 2 process"):
        train(corpus, output, replace(EXACT, batch_size=4, max_steps=8))
    with pytest.raises(CacheExistsError, match="world_size"):
        launch(corpus, output, replace(EXACT, batch_size=4, max_steps=8, nproc=3))  # refused before any process starts
    # More processes on a node than GPUs: refused before any starts (a node with one GPU, simulated).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(InvalidParameterError, match="need as many GPUs"):
        train(corpus, tmp_path / "b", replace(EXACT, nproc=2, device="cuda"))
    with pytest.raises(InvalidParameterError, match="names one GPU"):
        train(corpus, tmp_path / "b", replace(EXACT, nproc=2, device="cuda:0"))
    monkeypatch.undo()
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "x",
        "MASTER_PORT": "1",
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidParameterError, match="already rank 0 of 2 started by torchrun"):
        train(corpus, tmp_path / "c", replace(EXACT, nproc=2))


def test_too_little_text_for_the_global_batch_is_reported_from_the_ranks(tmp_path):
    # Enough text for 12 rows of one process, not for 2 x 12: every rank finds it and says so, once.
    text = _write_corpus(tmp_path / "small.txt", 20, seed=3)
    assert train(text, tmp_path / "one", replace(EXACT, batch_size=12, max_steps=1)).steps == 1
    result = CliRunner().invoke(
        cli, [*_tiny_cli_args(text, tmp_path / "two", 1), "--batch-size", "12", "--nproc", "2", "--device", "cpu"]
    )
    assert result.exit_code == 1, result.output
    assert "too little text for batch_size 12 x 2 processes" in result.output and "--nproc" in result.output
    assert "Traceback" not in result.output


def test_kill_9_of_one_rank_stops_the_job_and_the_same_command_resumes(tmp_path, corpus):
    output = tmp_path / "model"
    steps = 30
    command = [
        sys.executable, "-c", "from elmo_cache.cli.main import main; main()",
        *_tiny_cli_args(corpus, output, steps), "--batch-size", "4", "--dropout", "0", "--nproc", "2",
        "--device", "cpu", "--checkpoint-minutes", "0.0001",
    ]  # fmt: skip
    env = {**os.environ, "ELMO_CACHE_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    checkpoint = output / "checkpoint.pt"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            if checkpoint.is_file() and torch.load(checkpoint, weights_only=True)["step"] >= 3:
                break
            time.sleep(0.05)
        victim = torch.load(checkpoint, weights_only=True)["machine"]["pids"][1]  # rank 1's process
        os.kill(victim, signal.SIGKILL)
        _, stderr = process.communicate(timeout=30)  # the launcher stops rank 0 too and returns
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1
    assert f"rank 1 (pid {victim}) was killed by SIGKILL" in stderr and "run the same command to resume" in stderr
    killed_at = torch.load(checkpoint, weights_only=True)["step"]
    assert 3 <= killed_at < steps
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert f"resumed at step {killed_at}" in done.stdout and f"after {steps} steps" in done.stdout
    # ... and the weights are those of one uninterrupted process over the same global batches.
    train(corpus, tmp_path / "one", replace(EXACT, batch_size=8, max_steps=steps))
    assert_same_weights(output, tmp_path / "one", atol=1e-5)


def test_cli_help_states_the_global_batch_and_the_learning_rate():
    result = CliRunner().invoke(cli, ["train", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--nproc" in text and "global batch is --batch-size x N rows" in text
    assert "learning rate is unchanged" in text and "torchrun --nnodes" in text
