"""elmo_cache.encoder.batch_free: whether a sentence's rows are the same bits alone and in any batch, checked on
the device at hand (an update copies single sentences' rows only where they are)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from elmo_cache import Encoder
from elmo_cache.encoder import batch_free
from elmo_cache.encoder.batch_free import probe_batches, rows_batch_free


def test_the_probe_holds_each_probe_sentence_in_batches_of_other_sentences():
    probes, batches = probe_batches()
    assert len(batches) == 2
    for batch in batches:
        assert all(sum(s is p for s in batch) == 1 for p in probes)  # each once, by identity (the check finds it)
        assert len(batch) > len(probes)
    assert max(len(s) for s in probes) > max(len(s) for s in batches[0] if all(s is not p for p in probes))


def test_rows_that_depend_on_their_batch_are_found(tiny_model):
    """An encoder whose rows move in their last bit with the batch's size: refused, whatever this CPU's GEMMs do."""
    encoder = Encoder.load(tiny_model, device="cpu")
    original = encoder.encode_flat

    def batch_dependent(sentences):
        flat, offsets = original(sentences)
        return flat * (1 + len(sentences) * 2.0**-20), offsets

    encoder.encode_flat = batch_dependent
    assert rows_batch_free(encoder) is False


def test_the_answer_is_checked_once_per_encoder_and_thread_count(tiny_model, monkeypatch):
    encoder = Encoder.load(tiny_model, device="cpu")
    probes, batches = probe_batches()
    seen = [0]
    original = encoder.encode_flat

    def counted(sentences):
        seen[0] += 1
        return original(sentences)

    encoder.encode_flat = counted
    first = rows_batch_free(encoder)
    assert seen[0] == len(probes) + len(batches) or first is False  # a failing check stops at the first difference
    assert rows_batch_free(encoder) is first and seen[0] <= len(probes) + len(batches)
    threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads + 1)
    calls = seen[0]
    rows_batch_free(encoder)
    assert seen[0] > calls


def test_an_encoder_that_carries_its_state_between_batches_is_not_batch_free(tiny_model):
    encoder = Encoder.load(tiny_model, device="cpu", initial_state="carry")
    assert rows_batch_free(encoder) is False


def test_the_check_compares_what_the_encoder_gives(tiny_model):
    """Where the check says batch-free, a sentence encoded alone and inside a batch of others is the same bits,
    here checked on sentences of its own (not the probe's)."""
    encoder = Encoder.load(tiny_model, device="cpu")
    if not rows_batch_free(encoder):
        pytest.skip("this device's rows depend on their batch: the update encodes whole windows here")
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in range(50)]
    sentences = [list(rng.choice(words, size=int(n))) for n in rng.integers(1, 30, size=40)]
    together = batch_free._encoded(encoder, sentences)
    for k in (0, 7, 19, 39):
        alone = batch_free._encoded(encoder, [sentences[k]])[0]
        assert torch.equal(alone, together[k])
