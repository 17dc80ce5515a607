"""Training's promises beyond one run: --time-limit stops cleanly and resumes exactly, raising
--epochs continues a finished run as if it had been asked for from the start, and every preset
builds the model its name promises."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace

import h5py
import numpy as np
import pytest
import torch
from test_train import TINY, _write_corpus

from elmo_cache import Encoder
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.random_model import PRESETS as PUBLISHED
from elmo_cache.model.weights import weight_shapes
from elmo_cache.train import train
from elmo_cache.train.bilm import TrainableBiLM
from elmo_cache.train.presets import TRAIN_PRESETS


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _write_corpus(tmp_path_factory.mktemp("lifecycle") / "train.txt", 200, seed=4)


def assert_same_weights(a_dir, b_dir) -> None:
    names = weight_shapes(ModelOptions.from_file(a_dir / "options.json"))
    with h5py.File(a_dir / "weights.hdf5") as a, h5py.File(b_dir / "weights.hdf5") as b:
        for name in names:
            np.testing.assert_allclose(a[name][()], b[name][()], rtol=0, atol=1e-6, err_msg=name)


def test_time_limit_stops_cleanly_and_the_rerun_takes_the_same_steps(tmp_path, corpus):
    whole, limited = tmp_path / "whole", tmp_path / "limited"
    train(corpus, whole, replace(TINY, max_steps=6))
    stopped = train(corpus, limited, replace(TINY, max_steps=6, time_limit=0.0))  # stops after its first step
    assert stopped.steps == 1 and not stopped.finished
    Encoder.load((limited / "options.json", limited / "weights.hdf5"), device="cpu")  # whole files
    done = train(corpus, limited, replace(TINY, max_steps=6))
    assert done.resumed_from_step == 1 and done.steps == 6 and done.finished
    assert_same_weights(whole, limited)


def test_raising_epochs_continues_a_finished_run(tmp_path, corpus):
    two, one_then_two = tmp_path / "two", tmp_path / "one_then_two"
    straight = train(corpus, two, replace(TINY, epochs=2))
    first = train(corpus, one_then_two, replace(TINY, epochs=1))
    assert first.finished and first.epoch == 1 and 2 * first.steps == straight.steps
    again = train(corpus, one_then_two, replace(TINY, epochs=1))  # nothing left to do
    assert again.steps == first.steps and again.resumed_from_step == first.steps
    more = train(corpus, one_then_two, replace(TINY, epochs=2))
    assert more.resumed_from_step == first.steps and more.steps == straight.steps and more.epoch == 2
    assert_same_weights(two, one_then_two)


@pytest.mark.parametrize("preset", ["base", "small"])
def test_small_presets_train_and_load_in_the_encoder(tmp_path, corpus, preset):
    output = tmp_path / preset
    result = train(corpus, output, replace(TINY, preset=preset, batch_size=2, unroll=3, max_steps=1))
    assert result.steps == 1
    options = TRAIN_PRESETS[preset]
    encoder = Encoder.load((output / "options.json", output / "weights.hdf5"), device="cpu")
    assert encoder.output_dim == 2 * options.projection_dim
    assert encoder.embed_sentence(["the", "cat"]).shape == (3, 2, 2 * options.projection_dim)


@pytest.mark.parametrize("preset", ["small", "medium", "original"])
def test_published_presets_have_the_published_shapes(preset):
    options = TRAIN_PRESETS[preset]
    assert options == PUBLISHED[preset]
    with torch.device("meta"):  # the Original's 93M parameters, without allocating them
        model = TrainableBiLM(options, vocab_size=10)
    datasets = {name: tuple(view.shape) for name, view in model._dataset_views().items()}
    softmax = {name: datasets.pop(name) for name in ("softmax/W", "softmax/b")}
    assert datasets == weight_shapes(options)
    assert softmax == {"softmax/W": (10, options.projection_dim), "softmax/b": (10,)}
    expected = {"small": (1024, 128), "medium": (2048, 256), "original": (4096, 512)}[preset]
    assert (options.lstm_dim, options.projection_dim) == expected


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_checkpoints_and_the_rerun_equals_an_uninterrupted_run(tmp_path, corpus, signum):
    """A real signal to a real `elmo-cache train` process while it steps (no periodic checkpoint is due):
    it finishes the step, writes the checkpoint, exits 128 + the signal; the same command then finishes and
    its weights are those of a run never interrupted (checked after SIGTERM, what schedulers send)."""
    output = tmp_path / "model"
    args = [
        "train", str(corpus), "-o", str(output), "--preset", "tiny", "--batch-size", "8", "--unroll", "10",
        "--num-sampled", "16", "--min-count", "1", "--threads", "1", "--checkpoint-minutes", "60",
    ]  # fmt: skip
    cli = [sys.executable, "-c", "from elmo_cache.cli.main import main; main()"]
    # stderr is a pipe, so the bar writes lines: one per step here (elmo_cache.progress).
    environment = {**os.environ, "ELMO_CACHE_PROGRESS_SECONDS": "0"}
    process = subprocess.Popen(
        [*cli, *args, "--epochs", "10000", "--max-steps", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
    )
    seen = bytearray()

    def read() -> None:
        assert process.stderr is not None
        while chunk := process.stderr.read1(4096):
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    # The progress bar counts steps: wait for the third, so the signal lands between steps well past setup.
    while not re.search(rb"\b([3-9]|\d\d+)/100000\b", bytes(seen)):
        assert process.poll() is None, bytes(seen)[-2000:].decode(errors="replace")
        assert time.monotonic() < deadline, bytes(seen)[-2000:].decode(errors="replace")
        time.sleep(0.05)
    assert not (output / "checkpoint.pt").exists()  # none was due: the one found below is the signal's
    process.send_signal(signum)
    stdout, _ = process.communicate(timeout=120)
    reader.join(timeout=10)
    assert process.returncode == 128 + signum, bytes(seen)[-2000:].decode(errors="replace")
    stopped_at = torch.load(output / "checkpoint.pt", weights_only=True)["step"]
    assert stopped_at >= 3
    assert f"stopped by {signum.name}, checkpoint written" in stdout.decode() and f"after {stopped_at} steps" in (
        stdout.decode()
    )
    if signum is signal.SIGINT:
        return  # the same stop as SIGTERM's: the rerun's equality is checked once, for SIGTERM
    done = subprocess.run(
        [*cli, *args, "--epochs", "10000", "--max-steps", str(stopped_at + 4), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and f"resumed at step {stopped_at}" in done.stdout, done.stderr
    whole = tmp_path / "whole"
    train(corpus, whole, replace(TINY, epochs=10000, max_steps=stopped_at + 4, threads=1))
    assert_same_weights(whole, output)
