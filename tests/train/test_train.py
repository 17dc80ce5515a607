"""elmo-cache train / perplexity: the bilm-tf recipe in PyTorch, its file layout, resuming, and perplexity."""

from __future__ import annotations

import json
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
from conftest import requires_cuda

from elmo_cache import Encoder
from elmo_cache.cli.main import cli
from elmo_cache.errors import CacheExistsError, CorpusError, InvalidParameterError
from elmo_cache.model.chars import word_char_ids
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.weights import load_weights, weight_shapes
from elmo_cache.train import TrainOptions, perplexity, train
from elmo_cache.train.bilm import TrainableBiLM, _by_length
from elmo_cache.train.data import TokenizedCorpus
from elmo_cache.train.files import load_trained_model
from elmo_cache.train.presets import train_preset
from elmo_cache.train.softmax import LogUniformSampler, _SampledSoftmax
from elmo_cache.train.vocab import Vocabulary

SUBJECTS = ["the cat", "a dog", "my neighbour", "the old sailor", "every child", "our teacher"]
VERBS = ["saw", "liked", "followed", "painted", "ignored", "visited"]
OBJECTS = ["the harbour", "a red kite", "the small garden", "its shadow", "the morning train", "an empty house"]


def _write_corpus(path: Path, n_sentences: int, seed: int = 0) -> Path:
    """A small language with structure an LSTM can learn in a few dozen steps."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n_sentences):
        s, v, o = rng.choice(SUBJECTS), rng.choice(VERBS), rng.choice(OBJECTS)
        tail = " , and then it rained ." if rng.random() < 0.3 else " ."
        lines.append(f"{s} {v} {o}{tail}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TINY = TrainOptions(preset="tiny", batch_size=8, unroll=10, num_sampled=16, min_count=1, progress=False)


def _tiny_cli_args(corpus: Path, output: Path, max_steps: int) -> list[str]:
    """``elmo-cache train`` arguments equal to :data:`TINY` with ``max_steps``."""
    return [
        "train", str(corpus), "-o", str(output), "--preset", "tiny", "--batch-size", "8", "--unroll", "10",
        "--num-sampled", "16", "--min-count", "1", "--max-steps", str(max_steps), "--no-progress", "--threads", "1",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("train_corpus") / "train.txt", 600)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus) -> Path:
    output = tmp_path_factory.mktemp("trained")
    train(corpus, output, replace(TINY, max_steps=150))
    return output


def test_training_lowers_held_out_perplexity(tmp_path, corpus):
    held_out = _write_corpus(tmp_path / "held_out.txt", 60, seed=1)
    output = tmp_path / "model"
    first = train(corpus, output, replace(TINY, max_steps=1))
    before = perplexity(output, held_out)
    result = train(corpus, output, replace(TINY, max_steps=150))
    after = perplexity(output, held_out)
    assert first.steps == 1 and result.resumed_from_step == 1 and result.steps == 150
    assert result.history[-1]["loss"] < result.history[0]["loss"] or len(result.history) == 1
    assert after.forward < 0.25 * before.forward and after.backward < 0.25 * before.backward, (before, after)
    # ~35 word types but little freedom (about 3 choices per slot): far below uniform once trained.
    assert after.mean < 6


def test_resumed_run_takes_the_same_steps_as_an_uninterrupted_one(tmp_path, corpus):
    whole = tmp_path / "whole"
    split = tmp_path / "split"
    train(corpus, whole, replace(TINY, max_steps=7))
    train(corpus, split, replace(TINY, max_steps=3))
    resumed = train(corpus, split, replace(TINY, max_steps=7))
    assert resumed.resumed_from_step == 3
    with h5py.File(whole / "weights.hdf5") as a, h5py.File(split / "weights.hdf5") as b:
        for name in weight_shapes(ModelOptions.from_file(whole / "options.json")):
            np.testing.assert_allclose(a[name][()], b[name][()], rtol=0, atol=1e-6, err_msg=name)


def test_kill_9_then_the_same_command_continues_from_the_checkpoint(tmp_path, corpus):
    output = tmp_path / "model"
    command = [
        sys.executable, "-c", "from elmo_cache.cli.main import main; main()",
        *_tiny_cli_args(corpus, output, 100000), "--checkpoint-minutes", "0.0001",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    checkpoint = output / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1].decode()
        if checkpoint.is_file() and torch.load(checkpoint, weights_only=True)["step"] >= 3:
            break
        time.sleep(0.2)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = torch.load(checkpoint, weights_only=True)["step"]
    assert killed_at >= 3
    # Every file of the model directory is whole after the kill (written by rename).
    Encoder.load((output / "options.json", output / "weights.hdf5"), device="cpu")
    finish = [
        *command[: command.index("--max-steps") + 1],
        str(killed_at + 5),
        *command[command.index("--max-steps") + 2 :],
    ]
    done = subprocess.run(finish, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"resumed at step {killed_at}" in done.stdout
    assert torch.load(checkpoint, weights_only=True)["step"] == killed_at + 5
    # ... and it took the same steps as an uninterrupted run of as many steps.
    whole = tmp_path / "whole"
    train(corpus, whole, replace(TINY, max_steps=killed_at + 5, threads=1))
    with h5py.File(whole / "weights.hdf5") as a, h5py.File(output / "weights.hdf5") as b:
        for name in weight_shapes(ModelOptions.from_file(whole / "options.json")):
            np.testing.assert_allclose(a[name][()], b[name][()], rtol=0, atol=1e-6, err_msg=name)


def test_weight_file_is_the_bilm_tf_layout(trained):
    options = ModelOptions.from_file(trained / "options.json")
    with h5py.File(trained / "weights.hdf5") as f:
        names = set()
        f.visititems(lambda name, obj: names.add(name) if isinstance(obj, h5py.Dataset) else None)
        assert names == set(weight_shapes(options))
        for name, shape in weight_shapes(options).items():
            assert f[name].shape == shape and f[name].dtype == np.float32, name
        assert f["char_embed"].shape[0] == 261
    # (That B holds no forget bias is checked by the Encoder test below: the Encoder adds +1 itself.)
    _, vocab = load_trained_model(trained)
    with h5py.File(trained / "softmax.hdf5") as f:
        assert f["softmax/W"].shape == (len(vocab), options.projection_dim)
        assert f["softmax/b"].shape == (len(vocab),)
    assert (trained / "vocab.txt").read_text().splitlines()[:3] == ["<S>", "</S>", "<UNK>"]
    assert json.loads((trained / "options.json").read_text())["char_cnn"]["n_characters"] == 262
    load_weights(trained / "weights.hdf5", options)  # the inference loader's own name and shape checks


def _trainer_layers(model: TrainableBiLM, tokens: list[str]) -> list[np.ndarray]:
    """The trainer's own forward pass over one sentence from the zero state, as (3, n, 2P)."""
    words = ["<S>", *tokens, "</S>"]
    table = torch.from_numpy(np.stack([word_char_ids(w) - 1 for w in words])).int()
    n = len(words)
    ids = torch.stack([torch.arange(n), torch.arange(n).flip(0)]).unsqueeze(1)
    with torch.no_grad():
        embedded, outputs, _ = model(ids, table, model.zero_state(1))
    layers = [torch.cat([embedded[0, 0], embedded[0, 0]], dim=1)]
    layers += [torch.cat([out[0, 0], out[1, 0].flip(0)], dim=1) for out in outputs]
    return [layer[1:-1].numpy() for layer in layers]


def test_encoder_reproduces_the_trainers_forward_pass(trained):
    model, _ = load_trained_model(trained)
    encoder = Encoder.load((trained / "options.json", trained / "weights.hdf5"), device="cpu")
    for tokens in (["the", "cat", "saw", "its", "shadow", "."], ["unseen", "x" * 80, "Ünïcödé", "rained"], ["a"]):
        got = encoder.embed_sentence(tokens)
        for layer, expected in enumerate(_trainer_layers(model, tokens)):
            np.testing.assert_allclose(got[layer], expected, rtol=0, atol=1e-5, err_msg=f"layer {layer}")


def test_short_word_char_cnn_equals_the_full_width_one():
    options = train_preset("tiny")
    torch.manual_seed(0)
    model = TrainableBiLM(options, vocab_size=10)
    words = ["a", "cat", "x" * 14, "y" * 15, "z" * 30, "w" * 60, "<S>", "é"]
    ids = torch.from_numpy(np.stack([word_char_ids(w) - 1 for w in words])).int()
    assert len(_by_length(ids, options)) == 2  # both groups are exercised
    with torch.no_grad():
        fast = model.token_embeddings(ids)
        full = model._pooled_filters(ids, torch.relu)
        for k in range(options.n_highway):
            gate = torch.sigmoid(full @ model.highway_weights[2 * k] + model.highway_biases[2 * k])
            full = (
                gate * torch.relu(full @ model.highway_weights[2 * k + 1] + model.highway_biases[2 * k + 1])
                + (1 - gate) * full
            )
        full = full @ model.proj_weight + model.proj_bias
    np.testing.assert_allclose(fast.numpy(), full.numpy(), rtol=0, atol=1e-6)


def test_uniform_softmax_has_perplexity_equal_to_the_vocabulary_size(tmp_path, trained, corpus):
    model_dir = tmp_path / "uniform"
    model_dir.mkdir()
    for name in ("options.json", "weights.hdf5", "vocab.txt"):
        (model_dir / name).write_bytes((trained / name).read_bytes())
    with h5py.File(trained / "softmax.hdf5") as src, h5py.File(model_dir / "softmax.hdf5", "w") as dst:
        for name in ("softmax/W", "softmax/b"):
            dst.create_dataset(name, data=np.zeros_like(src[name][()]))
    vocab = Vocabulary.load(model_dir / "vocab.txt")
    for mode in ("stream", "sentence"):
        result = perplexity(model_dir, corpus, mode=mode)
        assert result.forward == pytest.approx(len(vocab), rel=1e-5)
        assert result.backward == pytest.approx(len(vocab), rel=1e-5)
        # n tokens + one sentence end per sentence, per direction, in both modes.
        assert result.predictions == result.tokens + result.sentences


def test_evaluation_reads_every_prediction_once_in_rows_that_start_sentences(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("a b c\nd e\nf\ng h i j\nk\n")
    vocab = Vocabulary(["<S>", "</S>", "<UNK>", *"abcdefghijk"])
    data = TokenizedCorpus.from_file(text, vocab)
    for batch_size in (1, 2, 3, 50):
        counted = 0.0
        batches = list(data.evaluation_batches(batch_size, unroll=3))
        first = batches[0].inputs
        assert (first[0, :, 0] == vocab.id("<S>")).all() and (first[1, :, 0] == vocab.id("</S>")).all()
        for batch in batches:
            counted += batch.weights.sum()
        assert counted == 2 * (data.n_tokens + data.n_sentences)


def test_log_uniform_sampler_draws_distinct_ids_with_the_right_frequencies():
    sampler = LogUniformSampler(vocab_size=1000, num_sampled=50, seed=3)
    hits = np.zeros(1000)
    expected = np.zeros(1000)
    for _ in range(400):
        candidates, tries = sampler.sample()
        assert len(set(candidates.tolist())) == 50 and tries >= 50
        hits[candidates] += 1
        expected += np.exp(sampler.log_expected_count(np.arange(1000), tries).numpy())
    # Frequent ids (small) are drawn most; observed counts follow the expected counts.
    assert hits[0] > hits[10] > hits[500]
    for ids in (slice(0, 1), slice(1, 5), slice(5, 50), slice(50, 1000)):
        assert hits[ids].sum() == pytest.approx(expected[ids].sum(), rel=0.08)


def test_sampled_softmax_gradient_matches_autograd():
    torch.manual_seed(0)
    n, s, p = 7, 5, 4
    args = [
        torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in ((n, p), (n, p), (n,), (s, p), (s,))
    ]
    hit_rows, hit_slots = torch.tensor([1, 3]), torch.tensor([2, 0])
    weights = torch.tensor([1, 1, 0, 1, 1, 1, 0.5], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda *a: _SampledSoftmax.apply(*a, hit_rows, hit_slots, weights), args)
    hidden, true_w, true_b, sampled_w, sampled_b = args
    logits = (hidden @ sampled_w.T + sampled_b).index_put(
        (hit_rows, hit_slots), torch.tensor(float("-inf"), dtype=torch.float64)
    )
    true_logit = (hidden * true_w).sum(1) + true_b
    reference = (torch.logsumexp(torch.cat([true_logit[:, None], logits], 1), 1) - true_logit) * weights
    torch.testing.assert_close(_SampledSoftmax.apply(*args, hit_rows, hit_slots, weights), reference)


def test_init_from_continues_a_trained_model_without_its_checkpoint(tmp_path, corpus, trained):
    start = train(corpus, tmp_path / "start", replace(TINY, max_steps=0, init_from=str(trained)))
    assert start.steps == 0
    assert (tmp_path / "start" / "vocab.txt").read_text() == (trained / "vocab.txt").read_text()
    assert perplexity(tmp_path / "start", corpus).mean == pytest.approx(perplexity(trained, corpus).mean, rel=1e-6)
    continued = train(corpus, tmp_path / "continued", replace(TINY, max_steps=20, init_from=str(trained)))
    fresh = train(corpus, tmp_path / "fresh", replace(TINY, max_steps=20))
    assert continued.steps == fresh.steps == 20
    assert perplexity(tmp_path / "continued", corpus).mean < 0.5 * perplexity(tmp_path / "fresh", corpus).mean
    with pytest.raises(InvalidParameterError, match="init_from"):
        train(corpus, tmp_path / "x", replace(TINY, init_from=str(trained), vocab_file=str(trained / "vocab.txt")))


def test_changed_settings_refuse_to_resume_unless_overwrite(tmp_path, corpus):
    output = tmp_path / "model"
    train(corpus, output, replace(TINY, max_steps=2))
    with pytest.raises(CacheExistsError, match="batch_size"):
        train(corpus, output, replace(TINY, max_steps=2, batch_size=4))
    assert train(corpus, output, replace(TINY, max_steps=2, batch_size=4, overwrite=True)).resumed_from_step == 0


def test_bad_input_gives_clear_errors(tmp_path, corpus):
    tiny_text = tmp_path / "tiny.txt"
    tiny_text.write_text("one line only\n")
    with pytest.raises(InvalidParameterError, match="too little text"):
        train(tiny_text, tmp_path / "a", TINY)
    bad_vocab = tmp_path / "vocab.txt"
    bad_vocab.write_text("the\ncat\n")
    with pytest.raises(CorpusError, match="must start with"):
        train(corpus, tmp_path / "b", replace(TINY, vocab_file=str(bad_vocab)))
    not_utf8 = tmp_path / "latin1.txt"
    not_utf8.write_bytes(b"ok line\ncaf\xe9 au lait\n")
    with pytest.raises(CorpusError, match="line 2"):
        train(not_utf8, tmp_path / "c", TINY)
    with pytest.raises(CorpusError, match="corpus not found"):
        train(tmp_path / "missing.txt", tmp_path / "e", TINY)
    with pytest.raises(InvalidParameterError, match="preset"):
        train(corpus, tmp_path / "f", replace(TINY, preset="huge"))
    with pytest.raises(InvalidParameterError, match="dropout"):
        train(corpus, tmp_path / "d", replace(TINY, dropout=1.5))


def test_cli_train_and_perplexity(tmp_path, corpus):
    runner = CliRunner()
    output = tmp_path / "model"
    args = _tiny_cli_args(corpus, output, 3)
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "finished" in result.output and "3 steps" in result.output
    result = runner.invoke(cli, ["perplexity", str(output), str(corpus), "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["predictions"] == figures["tokens"] + figures["sentences"] and figures["mean"] > 1
    result = runner.invoke(cli, [*args, "--batch-size", "4"])  # the last --batch-size wins
    assert result.exit_code == 1 and "other settings" in result.output and "Traceback" not in result.output
    result = runner.invoke(cli, ["perplexity", str(tmp_path), str(corpus)])
    assert result.exit_code == 1 and "options.json is missing" in result.output


@requires_cuda
@pytest.mark.gpu
def test_cuda_training_and_perplexity_agree_with_the_cpu(tmp_path, corpus, trained):
    on_gpu = perplexity(trained, corpus, device="cuda")
    on_cpu = perplexity(trained, corpus, device="cpu")
    assert on_gpu.mean == pytest.approx(on_cpu.mean, rel=1e-4)
    result = train(corpus, tmp_path / "gpu", replace(TINY, max_steps=30, device="cuda"))
    assert result.steps == 30
    # The weights it writes are the official layout and load on the CPU like any other.
    model, _ = load_trained_model(tmp_path / "gpu")
    encoder = Encoder.load((tmp_path / "gpu" / "options.json", tmp_path / "gpu" / "weights.hdf5"), device="cpu")
    tokens = ["the", "cat", "saw", "its", "shadow", "."]
    for layer, expected in enumerate(_trainer_layers(model, tokens)):
        np.testing.assert_allclose(encoder.embed_sentence(tokens)[layer], expected, rtol=0, atol=1e-5)
