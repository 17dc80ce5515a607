"""elmo_cache.compat.ElmoEmbedder: allennlp 0.9's ElmoEmbedder API, its own tests' checks ported onto
the bilm-tf golden fixture and generated models, and the stateless default."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from conftest import requires_cuda
from reference_elmo import ReferenceElmo

from elmo_cache import Encoder
from elmo_cache.compat import ElmoEmbedder
from elmo_cache.errors import InvalidParameterError, ModelNotFoundError
from elmo_cache.model import hub
from elmo_cache.model.random_model import write_random_model

SENTENCES = [
    line.split()
    for line in (
        "Michael went to the store to buy some eggs .",
        "Joel rolled down the street on his skateboard .",
        "test / this is a first sentence",
        "Take a look , then , at Tuesday 's elections in New York City , New Jersey and Virginia :",
    )
]
# The stateless path agrees with a lone encoding within float32 round-off of the word cache (~1e-7).
ATOL = 1e-6
# bilm-tf's outputs against any float32 implementation (tests/encoder/test_encoder.py: GOLDEN_ATOL).
GOLDEN_ATOL = 2e-6


@pytest.fixture(scope="module")
def golden_files(golden_dir):
    return golden_dir / "options.json", golden_dir / "lm_weights.hdf5"


@pytest.fixture(scope="module")
def golden_batches(golden_dir):
    """allennlp 0.9's reorganisation of the fixture: batch i is sentence i of each of the three lists."""
    lists = json.loads((golden_dir / "sentences.json").read_text())
    sentences, expected = [], []
    for i in range(len(lists[0])):
        for k in range(len(lists)):
            sentences.append(lists[k][i].split())
            with h5py.File(golden_dir / f"lm_embeddings_{k}.hdf5", "r") as f:
                both = f[str(i)][()]
            expected.append(np.concatenate([both[0], both[1]], axis=-1))
    return sentences, expected


@pytest.fixture(scope="module")
def embedder(tiny_model):
    return ElmoEmbedder(*tiny_model)


def test_stateful_matches_the_ten_stateful_tensorflow_batches(golden_files, golden_batches):
    """0.9's test_embeddings_are_as_expected: embed_sentences in batches of 3 carries state as bilm-tf did."""
    sentences, expected = golden_batches
    embedder = ElmoEmbedder(*golden_files, stateful=True)
    embeddings = list(embedder.embed_sentences(sentences, 3))
    assert len(embeddings) == len(sentences) == 30
    for vectors, top in zip(embeddings, expected):
        assert vectors.dtype == np.float32 and vectors.shape == (3, top.shape[0], 32)
        np.testing.assert_allclose(vectors[2], top, atol=GOLDEN_ATOL, rtol=0)


def test_stateless_matches_the_cold_first_batch_and_repeats_itself(golden_files, golden_batches):
    """The default starts every sentence cold: it is bilm-tf's first batch whatever came before, so the
    same sentence gives the same vectors on every call (the cold-start fix)."""
    sentences, expected = golden_batches
    embedder = ElmoEmbedder(*golden_files)
    embeddings = list(embedder.embed_sentences(sentences, 3))
    for k in range(3):
        np.testing.assert_allclose(embeddings[k][2], expected[k], atol=GOLDEN_ATOL, rtol=0)
    # From batch 1 on bilm-tf read a warm state: a stateless encoding must differ from it.
    assert max(np.abs(embeddings[k][2] - expected[k]).max() for k in range(3, 30)) > 1e-3
    again = list(embedder.embed_sentences(reversed(sentences), 7))[::-1]
    for first, second in zip(embeddings, again):
        np.testing.assert_allclose(first, second, atol=ATOL, rtol=0)


def test_stateful_carries_state_and_reset_forgets_it(tiny_model):
    embedder = ElmoEmbedder(*tiny_model, stateful=True)
    first = embedder.embed_sentence(SENTENCES[0])
    second = embedder.embed_sentence(SENTENCES[0])
    assert np.abs(first[1:] - second[1:]).max() > 1e-3  # the LSTM layers read the carried state
    np.testing.assert_allclose(first[0], second[0], atol=ATOL, rtol=0)  # layer 0 has no state
    embedder.reset_state()
    np.testing.assert_allclose(embedder.embed_sentence(SENTENCES[0]), first, atol=ATOL, rtol=0)


def test_vectors_are_the_reference_computation(embedder, tiny_model):
    reference = ReferenceElmo(*tiny_model)
    for sentence, vectors in zip(SENTENCES, embedder.embed_batch(SENTENCES)):
        np.testing.assert_allclose(vectors, reference.embed(sentence), atol=1e-5, rtol=0)


def test_embed_batch_returns_float32_arrays_in_order(embedder, tiny_model):
    encoder = Encoder.load(tiny_model, device="cpu")
    batch = embedder.embed_batch(SENTENCES)
    assert isinstance(batch, list) and len(batch) == len(SENTENCES)
    for sentence, vectors in zip(SENTENCES, batch):
        assert isinstance(vectors, np.ndarray) and vectors.dtype == np.float32
        assert vectors.shape == (3, len(sentence), 32)
        np.testing.assert_allclose(vectors, encoder.embed_sentence(sentence), atol=ATOL, rtol=0)
        np.testing.assert_array_equal(vectors[0, :, :16], vectors[0, :, 16:])  # the token vector twice


def test_embed_sentence_of_no_tokens_is_empty(embedder):
    """0.9's test_embed_batch_is_empty_sentence (it returned (3, 0, 1024) whatever the model: here the
    model's width)."""
    vectors = embedder.embed_sentence([])
    assert vectors.shape == (3, 0, 32) and vectors.dtype == np.float32


def test_embed_sentences_with_an_empty_sentence(embedder):
    """0.9's test_embed_batch_contains_empty_sentence."""
    test = ["This", "is", "a", "test"]
    embeddings = list(embedder.embed_sentences([test, []]))
    assert [v.shape for v in embeddings] == [(3, 4, 32), (3, 0, 32)]
    np.testing.assert_allclose(embeddings[0], embedder.embed_sentence(test), atol=ATOL)


def test_embed_sentences_is_lazy_and_groups_by_batch_size(embedder, monkeypatch):
    seen = []
    original = embedder.embed_batch
    monkeypatch.setattr(embedder, "embed_batch", lambda batch: seen.append(len(batch)) or original(batch))
    stream = embedder.embed_sentences(iter(SENTENCES + SENTENCES[:1]), batch_size=2)
    assert seen == []
    assert next(stream).shape == (3, len(SENTENCES[0]), 32)
    assert seen == [2]
    assert len(list(stream)) == 4
    assert seen == [2, 2, 1]


def test_batch_to_embeddings_is_padded_with_a_mask(embedder):
    batch = [SENTENCES[2], [], SENTENCES[0]]
    activations, mask = embedder.batch_to_embeddings(batch)
    longest = max(len(s) for s in batch)
    assert isinstance(activations, torch.Tensor) and activations.dtype == torch.float32
    assert activations.shape == (3, 3, longest, 32)
    assert mask.dtype == torch.int64 and mask.shape == (3, longest)
    assert mask.sum(dim=1).tolist() == [len(s) for s in batch]
    for row, (sentence, vectors) in enumerate(zip(batch, embedder.embed_batch(batch))):
        n = len(sentence)
        np.testing.assert_allclose(activations[row, :, :n].numpy(), vectors, atol=ATOL, rtol=0)
        assert not activations[row, :, n:].any()


def test_all_empty_batches_do_not_touch_the_state(tiny_model):
    embedder = ElmoEmbedder(*tiny_model, stateful=True)
    expected = ElmoEmbedder(*tiny_model, stateful=True)
    expected.embed_batch([SENTENCES[0]])
    embedder.embed_batch([SENTENCES[0]])
    assert [v.shape for v in embedder.embed_batch([[], []])] == [(3, 0, 32)] * 2
    activations, mask = embedder.batch_to_embeddings([[]])
    assert activations.shape == (1, 3, 0, 32) and mask.shape == (1, 0)
    np.testing.assert_allclose(embedder.embed_sentence(SENTENCES[1]), expected.embed_sentence(SENTENCES[1]), atol=ATOL)


def test_default_is_the_bundled_model(bundled_model):
    embedder = ElmoEmbedder()
    assert embedder.encoder.name == "bundled" and embedder.output_dim == 256
    assert embedder.embed_sentence(["The", "cat", "sat", "."]).shape == (3, 4, 256)


def test_paths_as_path_objects_and_seqvec_style_characters(tiny_model):
    """SeqVec passes pathlib paths and a protein as a list of one-letter tokens."""
    options, weights = tiny_model
    embedder = ElmoEmbedder(options, weights, cuda_device=-1)
    vectors = embedder.embed_sentence(list("MKTAYIAKQR"))
    assert vectors.shape == (3, 10, 32)
    assert torch.tensor(vectors).sum(dim=0).mean(dim=0).shape == (32,)


def test_published_model_urls_load_that_model(offline, tmp_path):
    """flair passes the download URLs (another host than elmo-cache's): matched by file name, loaded
    by name from the model folder (files placed there, as a download would)."""
    small = hub.PUBLISHED_MODELS["small"]
    options, weights = hub.local_paths(small)
    options.parent.mkdir(parents=True)
    generated = write_random_model(tmp_path / "generated", "tiny", seed=3)
    options.write_bytes(generated[0].read_bytes())
    weights.write_bytes(generated[1].read_bytes())
    base = "https://s3-us-west-2.amazonaws.com/allennlp/models/elmo/2x1024_128_2048cnn_1xhighway/"
    embedder = ElmoEmbedder(base + options.name, base + weights.name)
    assert embedder.encoder.name == "small"
    expected = Encoder.load(generated, device="cpu").embed_sentence(SENTENCES[0])
    np.testing.assert_allclose(embedder.embed_sentence(SENTENCES[0]), expected, atol=ATOL)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e: e.embed_sentence("a sentence"), "got a string"),
        (lambda e: e.embed_batch(["a sentence"]), "sentence 0: expected a list of tokens"),
        (lambda e: e.embed_batch("a sentence"), "got a string"),
        (lambda e: e.embed_sentences([["a"]], batch_size=0), "batch_size: must be a positive integer"),
        (lambda e: e.batch_to_embeddings([["a"], "b c"]), "sentence 1"),
    ],
)
def test_bad_input_is_refused_by_name(embedder, call, message):
    with pytest.raises(InvalidParameterError, match=message):
        call(embedder)


def test_bad_model_arguments_are_refused(tiny_model):
    with pytest.raises(InvalidParameterError, match="cuda_device"):
        ElmoEmbedder(*tiny_model, cuda_device=-2)
    with pytest.raises(InvalidParameterError, match="cuda_device: 64 does not exist"):
        ElmoEmbedder(*tiny_model, cuda_device=64)
    with pytest.raises(InvalidParameterError, match="options_file and weight_file go together"):
        ElmoEmbedder(tiny_model[0])
    with pytest.raises(ModelNotFoundError, match="download these files and pass their local paths"):
        ElmoEmbedder("https://example.org/my_options.json", "https://example.org/my_weights.hdf5")
    with pytest.raises(ModelNotFoundError):
        ElmoEmbedder(tiny_model[0], tiny_model[1].with_name("missing.hdf5"))


def test_readme_migration_example_runs_offline(offline, tmp_path, monkeypatch, capsys):
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Migrating from allennlp 0.9's `ElmoEmbedder`", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2 and "from elmo_cache.compat import ElmoEmbedder" in blocks[0]
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    assert capsys.readouterr().out.split("\n") == ["(3, 2, 256)", "(3, 0, 256)", "torch.Size([256])", ""]
    with h5py.File(tmp_path / "sentences.hdf5", "r") as f:
        assert set(f.keys()) == {"0", "1", "sentence_to_index"}
        assert (f["0"].shape, f["1"].shape) == ((3, 4, 256), (3, 2, 256))
        assert json.loads(f["sentence_to_index"][0]) == {"The cat sat .": "0", "Hello !": "1"}


@requires_cuda
@pytest.mark.parametrize("stateful", [False, True])
def test_cuda_device_matches_the_cpu(tiny_model, stateful):
    cpu = ElmoEmbedder(*tiny_model, stateful=stateful)
    gpu = ElmoEmbedder(*tiny_model, cuda_device=0, stateful=stateful)
    for batch in (SENTENCES[:3], [SENTENCES[3], []], SENTENCES):
        activations, mask = gpu.batch_to_embeddings(batch)
        assert activations.device.type == "cuda" and mask.device.type == "cuda"
        expected, expected_mask = cpu.batch_to_embeddings(batch)
        assert torch.equal(mask.cpu(), expected_mask)
        assert float((activations.cpu() - expected).abs().max()) <= 1e-5
    for got, expected in zip(gpu.embed_batch(SENTENCES), cpu.embed_batch(SENTENCES)):
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)


def test_without_a_model_it_says_once_per_process_that_it_loads_the_bundled_one(tmp_path):
    """allennlp's ElmoEmbedder() loaded the Original (1024-d): the bundled default is said, once, on stderr."""
    code = (
        "from elmo_cache.compat import ElmoEmbedder\n"
        "a = ElmoEmbedder()\n"
        "b = ElmoEmbedder(model='bundled')\n"
        "c = ElmoEmbedder()\n"
        "print(a.output_dim, c.output_dim)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["256", "256"]
    notices = [line for line in done.stderr.splitlines() if line.startswith("no model named")]
    assert len(notices) == 1, done.stderr
    assert "bundled model 'bundled' (3 layers of 256-d vectors" in notices[0]
    assert "Original ELMo (1024-d)" in notices[0] and "--model original" in notices[0]


def test_a_named_model_says_nothing(tmp_path, tiny_model):
    code = (
        "import sys\nfrom elmo_cache.compat import ElmoEmbedder\n"
        "ElmoEmbedder(model='bundled'); ElmoEmbedder(sys.argv[1], sys.argv[2])\n"
    )
    command = [sys.executable, "-c", code, str(tiny_model[0]), str(tiny_model[1])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0 and "no model named" not in done.stderr, done.stderr
