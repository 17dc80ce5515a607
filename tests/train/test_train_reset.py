"""Training for the encoder's mode (``reset_share``): rows of whole sentences, a share of them read
from the zero state; and perplexity from the encoder's warm state."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from test_train import TINY, _tiny_cli_args, _trainer_layers, _write_corpus
from test_train_lifecycle import assert_same_weights

from elmo_cache import Encoder
from elmo_cache.cli.main import cli
from elmo_cache.errors import InvalidParameterError
from elmo_cache.train import perplexity, train
from elmo_cache.train.data import TokenizedCorpus
from elmo_cache.train.evaluate import warm_state
from elmo_cache.train.files import load_trained_model
from elmo_cache.train.vocab import BOS, EOS, Vocabulary


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("reset_corpus") / "train.txt", 400, seed=7)


@pytest.fixture(scope="module")
def data(corpus) -> TokenizedCorpus:
    words = sorted({w for line in corpus.read_text().splitlines() for w in line.split()})
    return TokenizedCorpus.from_file(corpus, Vocabulary([BOS, EOS, "<UNK>", *words]))


def _epoch(data: TokenizedCorpus, share: float | None, epoch: int = 0):
    return list(data.epoch_batches(seed=3, epoch=epoch, batch_size=8, unroll=10, reset_share=share))


def test_the_share_changes_which_sentence_starts_reset_and_nothing_else(data):
    bos, eos = data.vocab.id(BOS), data.vocab.id(EOS)
    none, half, every = _epoch(data, 0.0), _epoch(data, 0.5), _epoch(data, 1.0)
    assert len(none) == len(half) == len(every) == data.batches_per_epoch(8, 10, 0.5) > 5
    for a, b, c in zip(none, half, every):
        for field in ("inputs", "targets", "weights"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
            np.testing.assert_array_equal(getattr(a, field), getattr(c, field))
        starts = (a.inputs[0] == bos) & (a.inputs[1] == eos)  # where both directions begin a sentence
        assert not a.resets.any()
        assert not (b.resets & ~starts).any() and not (c.resets & ~starts).any()
        np.testing.assert_array_equal(c.resets, starts)
    # Every row begins at a sentence start, and about half of the starts reset.
    assert (none[0].inputs[0, :, 0] == bos).all() and (none[0].inputs[1, :, 0] == eos).all()
    drawn = sum(int(b.resets.sum()) for b in half) / sum(int(c.resets.sum()) for c in every)
    assert 0.35 < drawn < 0.65, drawn


def test_sentence_rows_cover_the_epoch_without_overlap_and_vary_by_epoch(data):
    per_epoch = data.batches_per_epoch(8, 10, 1.0)
    first, second = _epoch(data, 1.0, epoch=0), _epoch(data, 1.0, epoch=1)
    assert len(first) == len(second) == per_epoch  # the same count whatever the shuffle
    assert not np.array_equal(first[0].inputs, second[0].inputs)
    rows = np.concatenate([b.inputs[0] for b in first], axis=1)  # (8, read length)
    read = sum(int((r != data.vocab.id(BOS)).sum()) for r in rows)
    assert read > 0.9 * (data.n_tokens + data.n_sentences)  # at most one longest sentence lost per row
    assert data.batches_per_epoch(8, 10, None) >= per_epoch


def test_a_reset_inside_the_window_reads_the_sentence_as_the_encoder_does(tmp_path, corpus):
    output = tmp_path / "model"
    train(corpus, output, replace(TINY, max_steps=20, reset_share=0.5))
    model, vocab = load_trained_model(output)
    model.eval()
    data = TokenizedCorpus.from_file(corpus, vocab)
    batch = next(b for b in _epoch(data, 1.0) if b.resets[:, 1:].any())
    row, t = (int(i) for i in np.argwhere(batch.resets[:, 1:])[0])
    t += 1  # a sentence that begins mid-window, after text that would otherwise be carried in
    inputs = torch.from_numpy(batch.inputs).long()
    table = torch.from_numpy(data.char_ids).int()
    state = [(torch.randn_like(h), torch.randn_like(c)) for h, c in model.zero_state(8)]
    with torch.no_grad():
        _, reset_out, _ = model(inputs, table, state, torch.from_numpy(batch.resets))
        _, carried_out, _ = model(inputs, table, state)
    forward_ids = batch.inputs[0, row, t:]
    ends = np.flatnonzero(forward_ids == data.vocab.id(EOS))
    length = int(ends[0]) if len(ends) else len(forward_ids)  # the tokens of this sentence inside the window
    tokens = [data.types[i] for i in forward_ids[1:length]]
    alone = _trainer_layers(model, tokens)  # this sentence from zeros, on its own
    for layer in (1, 2):
        got = reset_out[layer - 1][0, row, t + 1 : t + length].numpy()
        np.testing.assert_allclose(got, alone[layer][: length - 1, : got.shape[1]], rtol=0, atol=1e-5)
        carried = carried_out[layer - 1][0, row, t + 1 : t + length].numpy()
        assert np.abs(carried - got).max() > 1e-3  # without the reset, the carried state shows


def test_resume_with_reset_share_takes_the_same_steps(tmp_path, corpus):
    options = replace(TINY, reset_share=0.5)
    whole, split = tmp_path / "whole", tmp_path / "split"
    train(corpus, whole, replace(options, max_steps=8))
    train(corpus, split, replace(options, max_steps=3))
    resumed = train(corpus, split, replace(options, max_steps=8))
    assert resumed.resumed_from_step == 3
    assert_same_weights(whole, split)
    with pytest.raises(Exception, match="reset_share"):
        train(corpus, split, replace(options, max_steps=9, reset_share=0.25))  # a fixed setting
    with pytest.raises(InvalidParameterError, match="reset_share"):
        train(corpus, tmp_path / "bad", replace(options, reset_share=1.5))


def test_warm_perplexity_starts_from_the_encoders_warm_state(tmp_path, corpus):
    output = tmp_path / "model"
    train(corpus, output, replace(TINY, max_steps=20))
    model, _ = load_trained_model(output)
    encoder = Encoder.load((output / "options.json", output / "weights.hdf5"), device="cpu", initial_state="warm")
    for layer, (h, c) in enumerate(warm_state(model)):
        np.testing.assert_allclose(h.numpy(), encoder.start_state[0][layer].numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(c.numpy(), encoder.start_state[1][layer].numpy(), rtol=0, atol=1e-5)
    held_out = _write_corpus(tmp_path / "held_out.txt", 30, seed=2)
    zero, warm = perplexity(output, held_out, mode="sentence"), perplexity(output, held_out, mode="warm")
    assert warm.predictions == zero.predictions and warm.forward != zero.forward


def test_cli_reset_share(tmp_path, corpus):
    runner = CliRunner()
    args = _tiny_cli_args(corpus, tmp_path / "m", 2)
    done = runner.invoke(cli, [*args, "--reset-share", "0.5"])
    assert done.exit_code == 0, done.output
    bad = runner.invoke(cli, [*args, "--reset-share", "2"])
    assert bad.exit_code == 2 and "--reset-share" in bad.output
    warm = runner.invoke(cli, ["perplexity", str(tmp_path / "m"), str(corpus), "--mode", "warm", "--json"])
    assert warm.exit_code == 0 and '"mode": "warm"' in warm.output
