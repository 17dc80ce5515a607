"""ElmoEmbedder(stateful=True) carries the LSTM state as allennlp does, checked two ways:

* against allennlp 2.10.1's own ``_ElmoBiLm`` (the module 0.9's ElmoEmbedder wraps, the same
  computation and state bookkeeping), loaded from its wheel by ``tests/allennlp_reference.py``:
  skipped unless ``ALLENNLP_2_10_1_WHEEL`` names the wheel (``pip download allennlp==2.10.1 --no-deps``);
* always, against a plain float64 reference written from allennlp's documented semantics
  (``_EncoderBase``): the state is kept per batch row; a batch reads the states of its first rows
  (zeros for rows never used) and replaces them with its final states, whatever order the lengths
  sort the rows into; rows past a smaller batch keep theirs; an empty sentence beside others is read
  as ``<S> </S>``; a batch of empty sentences alone reads nothing (0.9 returned it unrun).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from allennlp_reference import WHEEL_ENV, load_reference, reference_embeddings
from reference_elmo import ReferenceElmo

from elmo_cache.compat import ElmoEmbedder

WORDS = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "barked", "loudly", "at", "cars", ",", "and", "."]


def _sentence(rng: np.random.Generator, longest: int = 12) -> list[str]:
    return list(rng.choice(WORDS, size=int(rng.integers(1, longest))))


def _batches(seed: int) -> list[list[list[str]]]:
    """Batches that grow, shrink, re-sort their rows by length, and hold empty sentences."""
    rng = np.random.default_rng(seed)
    return [
        [_sentence(rng) for _ in range(3)],
        [_sentence(rng) for _ in range(2)],  # rows 0-1 carry on, row 2 waits
        [_sentence(rng), [], _sentence(rng), _sentence(rng), _sentence(rng)],  # rows 3-4 start cold
        [[]],  # nothing to read
        [_sentence(rng, 4), _sentence(rng, 20), _sentence(rng, 8), _sentence(rng)],
        [_sentence(rng) for _ in range(5)],
    ]


@pytest.mark.parametrize("model", ["tiny_model", "clipping_model"])
def test_stateful_matches_the_documented_row_semantics(model, request):
    files = request.getfixturevalue(model)
    reference = ReferenceElmo(*files)
    embedder = ElmoEmbedder(*files, stateful=True)
    rows: dict[int, dict] = {}
    worst = 0.0
    for batch in _batches(seed=5):
        got = embedder.embed_batch(batch)
        if all(not sentence for sentence in batch):
            assert [v.shape for v in got] == [(3, 0, 32)] * len(batch)
            continue
        for row, (sentence, vectors) in enumerate(zip(batch, got)):
            expected = reference.embed(sentence, rows.setdefault(row, {}))
            assert vectors.shape == expected.shape
            worst = max(worst, float(np.abs(vectors - expected).max(initial=0.0)))
    assert worst <= 1e-5
    if model == "clipping_model":  # the clips take part in what is carried
        assert reference.cell_clips > 1000 and reference.proj_clips > 1000
    # The state matters: a stateless encoding of the last batch differs from the carried one.
    stateless = ElmoEmbedder(*files).embed_batch(batch)
    assert max(float(np.abs(a - b).max(initial=0.0)) for a, b in zip(got, stateless)) > 1e-3


@pytest.fixture(scope="module")
def allennlp():
    wheel = os.environ.get(WHEEL_ENV)
    if not wheel:  # the one capability these tests need (.ci/run downloads the wheel and sets it)
        pytest.skip(f"set {WHEEL_ENV} to allennlp-2.10.1-py3-none-any.whl (pip download allennlp==2.10.1 --no-deps)")
    reference = load_reference()
    if reference is None:
        pytest.fail(f"{WHEEL_ENV}={wheel}: no such file")
    return reference


@pytest.mark.parametrize("model", ["tiny_model", "clipping_model"])
def test_stateful_matches_allennlp_elmo_bilm(allennlp, model, request):
    files = request.getfixturevalue(model)
    bilm = allennlp.elmo._ElmoBiLm(str(files[0]), str(files[1]))
    bilm.eval()
    embedder = ElmoEmbedder(*files, stateful=True)
    worst = 0.0
    for batch in _batches(seed=11) + _batches(seed=12):
        if all(not sentence for sentence in batch):
            continue  # allennlp fails on such a batch; 0.9's ElmoEmbedder returned it unrun
        expected, expected_mask = reference_embeddings(allennlp, bilm, batch)
        activations, mask = embedder.batch_to_embeddings(batch)
        assert torch.equal(mask, expected_mask.long())
        worst = max(worst, float((activations - expected).abs().max()))
    assert worst <= 1e-5


def test_stateful_matches_allennlp_elmo_bilm_on_the_bundled_model(allennlp, bundled_model):
    """The README's figure for a trained model (2e-6 measured), within the same 1e-5."""
    files = (str(bundled_model.options_file), str(bundled_model.weight_file))
    bilm = allennlp.elmo._ElmoBiLm(*files)
    bilm.eval()
    embedder = ElmoEmbedder(*files, stateful=True)
    worst = 0.0
    for batch in _batches(seed=14):
        if all(not sentence for sentence in batch):
            continue
        expected, _ = reference_embeddings(allennlp, bilm, batch)
        activations, _ = embedder.batch_to_embeddings(batch)
        worst = max(worst, float((activations - expected).abs().max()))
    assert worst <= 1e-5


def test_stateless_matches_a_fresh_allennlp_elmo_bilm_per_batch(allennlp, tiny_model):
    embedder = ElmoEmbedder(*tiny_model)
    for batch in _batches(seed=13):
        if all(not sentence for sentence in batch):
            continue
        bilm = allennlp.elmo._ElmoBiLm(str(tiny_model[0]), str(tiny_model[1]))
        expected, _ = reference_embeddings(allennlp, bilm, batch)
        activations, _ = embedder.batch_to_embeddings(batch)
        assert float((activations - expected).abs().max()) <= 1e-5
