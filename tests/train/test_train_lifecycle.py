"""Training's promises beyond one run: --time-limit stops cleanly and resumes exactly, raising
--epochs continues a finished run as if it had been asked for from the start, and every preset
builds the model its name promises."""

from __future__ import annotations

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
