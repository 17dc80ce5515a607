"""CacheDataset + collate: padding, masks, extra fields, and DataLoader workers (fork and spawn)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import elmo_cache
from elmo_cache import CacheDataset, Encoder, collate
from elmo_cache.builder import BuildOptions, build
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.random_model import write_random_model
from elmo_cache.rows.selection import MixSpec
from elmo_cache.text.tokenize import tokenize

LINES = [f"sentence {i} " + " ".join(["tok"] * (i % 7)) for i in range(40)] + ["", "last one"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A layered fp16 HDF5 cache and a mixed fp32 zarr cache of LINES, built for real."""
    directory = tmp_path_factory.mktemp("caches")
    options, weights = write_random_model(directory / "model", "tiny", seed=5)
    encoder = Encoder.load((options, weights))
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    layered = build(
        corpus, BuildOptions(output=directory / "layers.h5", layers="1,2", fp16=True, progress=False), encoder=encoder
    ).path
    mix = MixSpec.from_raw("0.2,0.3,0.5")
    mixed = build(
        corpus, BuildOptions(output=directory / "mix.zarr", mix=mix, chunk_rows=16, progress=False), encoder=encoder
    ).path
    return layered, mixed


@pytest.fixture(scope="module")
def layered(built):
    return built[0]


@pytest.fixture(scope="module")
def mixed(built):
    return built[1]


def test_items_and_fields(layered):
    labels = np.arange(len(LINES)) % 3
    names = [f"s{i}" for i in range(len(LINES))]
    ds = CacheDataset(layered, labels, names)
    assert len(ds) == len(LINES)
    vectors, label, name = ds[4]
    with elmo_cache.open(layered) as cache:
        np.testing.assert_array_equal(vectors, cache[4])
    assert (label, name) == (labels[4], "s4")
    plain = CacheDataset(layered)
    assert isinstance(plain[0], np.ndarray)
    with pytest.raises(InvalidParameterError, match=r"extra field 1 has 3 items but cache .* has 42 sentences"):
        CacheDataset(layered, labels, [1, 2, 3])


def test_collate_layered(layered):
    labels = np.arange(len(LINES)) % 3
    ds = CacheDataset(layered, labels, [f"s{i}" for i in range(len(LINES))])
    items = [ds[i] for i in (40, 6, 1)]  # empty, 8 tokens, 3 tokens
    batch = collate(items)
    assert batch.vectors.shape == (3, 2, 8, 32) and batch.vectors.dtype == torch.float32
    assert batch.lengths.tolist() == [0, 8, 3]
    assert batch.mask.dtype == torch.bool and batch.mask.sum(1).tolist() == [0, 8, 3]
    for b, (array, *_) in enumerate(items):
        n = array.shape[1]
        np.testing.assert_array_equal(batch.vectors[b, :, :n].numpy(), array.astype(np.float32))
        assert not batch.vectors[b, :, n:].any()
    assert batch.fields[0].tolist() == [labels[40], labels[6], labels[1]]
    assert batch.fields[1] == ["s40", "s6", "s1"]


def test_collate_mixed(mixed):
    ds = CacheDataset(mixed)
    batch = collate([ds[i] for i in range(5)])
    assert batch.vectors.shape == (5, max(len(tokenize(LINES[i])) for i in range(5)), 32)
    assert batch.fields == ()
    np.testing.assert_array_equal(batch.vectors[2, :4].numpy(), ds[2])
    assert batch.mask[2].tolist() == [True] * 4 + [False] * (batch.vectors.shape[1] - 4)


def _batches(dataset, **kwargs):
    loader = DataLoader(dataset, batch_size=5, shuffle=False, collate_fn=collate, **kwargs)
    return list(loader)


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_workers_give_the_same_batches(layered, mixed, context):
    # spawn starts fresh interpreters (seconds each): one cache is enough to prove the pickling
    for path in (layered, mixed) if context == "fork" else (mixed,):
        labels = torch.arange(len(LINES))
        ds = CacheDataset(path, labels)
        ds[0]  # the parent has opened its cache: workers must open their own
        serial = _batches(ds)
        parallel = _batches(ds, num_workers=2, multiprocessing_context=context)
        assert len(serial) == len(parallel) == 9
        for a, b in zip(serial, parallel):
            assert torch.equal(a.vectors, b.vectors)
            assert torch.equal(a.mask, b.mask)
            assert torch.equal(a.fields[0], b.fields[0])


def test_dataset_indices_are_sentence_numbers(layered):
    """dataset[True] is no sentence 1 and no label 1; numpy integers still index (issue 33, item 8)."""
    labels = list(range(len(LINES)))
    ds = CacheDataset(layered, labels)
    for bad in (True, np.True_, 1.0, "1", [1, 2], np.array([1, 2]), slice(0, 2)):
        with pytest.raises(TypeError, match="sentence numbers"):
            ds[bad]
    vectors, label = ds[np.int64(4)]
    with elmo_cache.open(layered) as cache:
        np.testing.assert_array_equal(vectors, cache[4])
    assert label == 4
