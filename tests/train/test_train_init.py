"""--init-from a model with options and weights but no softmax (the published files): its weights carry on
under a fresh softmax over the new corpus's vocabulary, and adapting it to a new domain beats both the
starting model and as many steps from scratch."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_train import OBJECTS, SUBJECTS, TINY, VERBS, _trainer_layers, _write_corpus

from elmo_cache import Encoder
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model import hub
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.random_model import write_random_model
from elmo_cache.model.weights import weight_shapes
from elmo_cache.train import perplexity, train
from elmo_cache.train.data import count_tokens
from elmo_cache.train.files import load_trained_model
from elmo_cache.train.vocab import Vocabulary


def _write_coupled_corpus(path: Path, n_sentences: int, seed: int) -> Path:
    """The words of :func:`_write_corpus` in another "domain": each subject goes with one verb and one
    object, so a sentence is nearly fixed by its first word (the original draws all three freely)."""
    rng = np.random.default_rng(seed)
    lines = []
    for _ in range(n_sentences):
        k = rng.integers(len(SUBJECTS))
        tail = " , and then it rained ." if rng.random() < 0.5 else " ."
        lines.append(f"{SUBJECTS[k]} {VERBS[k]} {OBJECTS[k]}{tail}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("init_corpus") / "train.txt", 300, seed=5)


def test_a_published_model_by_name_starts_with_its_weights_and_a_fresh_softmax(tmp_path, corpus, offline):
    # Stands in for the download of the published 'small' model: options and weights, no softmax.
    folder = tmp_path / "model-cache" / "small"
    options_file, weight_file = write_random_model(folder, "tiny", seed=7, name=hub.PUBLISHED_MODELS["small"].stem)
    output = tmp_path / "adapted"
    result = train(corpus, output, replace(TINY, init_from="small", max_steps=0))
    assert result.steps == 0
    vocab = Vocabulary.load(output / "vocab.txt")
    assert vocab.words == Vocabulary.from_counts(count_tokens(corpus), min_count=1).words  # the new corpus's
    options = ModelOptions.from_file(options_file)
    with h5py.File(weight_file) as start, h5py.File(output / "weights.hdf5") as written:
        for name in weight_shapes(options):
            np.testing.assert_array_equal(written[name][()], start[name][()], err_msg=name)
    with h5py.File(output / "softmax.hdf5") as softmax:
        assert softmax["softmax/W"].shape == (len(vocab), options.projection_dim)
        assert np.abs(softmax["softmax/W"][()]).max() > 0 and not softmax["softmax/b"][()].any()
    # At step 0 the trainer's forward pass is the encoder's on the starting weights.
    model, _ = load_trained_model(output)
    encoder = Encoder.load((options_file, weight_file), device="cpu")
    for tokens in (["the", "cat", "saw", "its", "shadow", "."], ["unseen", "Ünïcödé"]):
        for layer, expected in enumerate(_trainer_layers(model, tokens)):
            np.testing.assert_allclose(encoder.embed_sentence(tokens)[layer], expected, rtol=0, atol=1e-5)


def test_a_directory_without_softmax_takes_a_vocab_file_and_other_models_refuse_it(tmp_path, corpus):
    write_random_model(tmp_path / "start", "tiny", seed=8)  # model_options.json + model_weights.hdf5 only
    vocab_file = tmp_path / "vocab.txt"
    Vocabulary(["<S>", "</S>", "<UNK>", "the", "cat"]).save(vocab_file)
    output = tmp_path / "out"
    train(corpus, output, replace(TINY, init_from=str(tmp_path / "start"), vocab_file=str(vocab_file), max_steps=2))
    assert (output / "vocab.txt").read_text() == vocab_file.read_text()
    with h5py.File(output / "softmax.hdf5") as softmax:
        assert softmax["softmax/W"].shape[0] == 5
    # A model that has a softmax brings its vocabulary: a second one is refused.
    with pytest.raises(InvalidParameterError, match="brings its own vocabulary and softmax"):
        train(corpus, tmp_path / "x", replace(TINY, init_from=str(output), vocab_file=str(vocab_file)))
    with pytest.raises(InvalidParameterError, match="drop options_file"):
        train(corpus, tmp_path / "y", replace(TINY, init_from=str(output), options_file=str(output / "options.json")))


def test_adapting_a_model_without_softmax_beats_the_start_and_scratch_on_the_new_domain(tmp_path, corpus):
    source = tmp_path / "source"
    train(corpus, source, replace(TINY, max_steps=120))  # the "published" model, trained on the old domain
    published = tmp_path / "published"
    published.mkdir()
    for name in ("options.json", "weights.hdf5"):  # all a published model ships
        shutil.copy(source / name, published / name)
    new_domain = _write_coupled_corpus(tmp_path / "new.txt", 300, seed=6)
    held_out = _write_coupled_corpus(tmp_path / "held_out.txt", 60, seed=7)
    # The same words in both domains, so the perplexities are over one vocabulary and compare.
    assert set(Vocabulary.load(source / "vocab.txt").words) == set(count_tokens(new_domain)) | {"<S>", "</S>", "<UNK>"}
    steps = 30
    train(new_domain, tmp_path / "adapted", replace(TINY, init_from=str(published), max_steps=steps))
    train(new_domain, tmp_path / "scratch", replace(TINY, max_steps=steps))
    start = perplexity(source, held_out).mean
    adapted = perplexity(tmp_path / "adapted", held_out).mean
    scratch = perplexity(tmp_path / "scratch", held_out).mean
    # Measured: adapted 2.8, start 4.2, scratch 30.2 (the start's coupling is still to be learnt; from
    # scratch, 30 steps learn little more than word frequencies).
    assert adapted < 0.85 * start and adapted < 0.5 * scratch, (adapted, start, scratch)
