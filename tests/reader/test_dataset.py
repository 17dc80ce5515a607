"""CacheDataset + collate: padding, masks, extra fields, and DataLoader workers (fork and spawn)."""

from __future__ import annotations

import functools

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
    assert batch.vectors.shape == (3, 2, 8, 32) and batch.vectors.dtype == torch.float16  # the fp16 cache's own
    assert batch.lengths.tolist() == [0, 8, 3]
    assert batch.mask.dtype == torch.bool and batch.mask.sum(1).tolist() == [0, 8, 3]
    for b, (array, *_) in enumerate(items):
        n = array.shape[1]
        np.testing.assert_array_equal(batch.vectors[b, :, :n].numpy(), array)
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


# -- issue 35, item 8: named fields, collate's dtype, the bucketing sampler --------------------------


def test_fields_by_name_come_back_by_name_and_still_by_position(layered):
    labels = torch.arange(len(LINES)) % 3
    ids = [f"s{i}" for i in range(len(LINES))]
    ds = CacheDataset(layered, labels=labels, ids=ids)
    item = ds[6]
    assert set(item) == {"vectors", "labels", "ids"} and item["ids"] == "s6"
    batch = collate([ds[i] for i in (40, 6, 1)])
    assert torch.equal(batch.labels, labels[[40, 6, 1]]) and batch.ids == ["s40", "s6", "s1"]
    assert torch.equal(batch.fields["labels"], batch.fields[0]) and batch.fields.as_dict()["ids"] == batch.ids
    vectors, mask, lengths, fields = batch  # the 4-tuple of before still unpacks
    assert vectors is batch.vectors and mask is batch.mask
    assert lengths.tolist() == [0, 8, 3] and fields.names == ("labels", "ids")
    moved = batch.to("cpu")
    assert moved.ids == batch.ids and torch.equal(moved.labels, batch.labels)
    with pytest.raises(AttributeError, match=r"no attribute 'label'; its named fields are \['labels', 'ids'\]"):
        batch.label  # noqa: B018
    with pytest.raises(KeyError, match="'label': not a field of this batch"):
        batch.fields["label"]
    assert collate([CacheDataset(layered, labels)[i] for i in (1, 2)]).fields.names == ()


def test_named_fields_travel_through_workers(layered):
    ds = CacheDataset(layered, labels=torch.arange(len(LINES)))
    loader = DataLoader(ds, batch_size=5, collate_fn=collate, num_workers=2, multiprocessing_context="fork")
    batches = list(loader)
    assert torch.equal(torch.cat([b.labels for b in batches]), torch.arange(len(LINES)))


def test_field_names_are_checked(layered):
    labels = list(range(len(LINES)))
    with pytest.raises(InvalidParameterError, match=r"'mask' cannot name a field.*reserved names are \['vectors'"):
        CacheDataset(layered, mask=labels)
    with pytest.raises(InvalidParameterError, match="by position or by name, not both"):
        CacheDataset(layered, labels, ids=labels)
    with pytest.raises(InvalidParameterError, match=r"extra field ids has 3 items but cache .* has 42"):
        CacheDataset(layered, ids=[1, 2, 3])


@pytest.fixture(scope="module")
def bundled_caches(tmp_path_factory, bundled_model):
    """An fp16 and an int8 zarr cache of a few LINES, built with the bundled (trained) model."""
    directory = tmp_path_factory.mktemp("bundled")
    encoder = Encoder.load(bundled_model, device="cpu")
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(LINES[:8]) + "\n", encoding="utf-8")
    made = {}
    for name, extra in (("fp16", {"fp16": True}), ("int8", {"quantize": "int8"})):
        options = BuildOptions(output=directory / f"{name}.zarr", progress=False, device="cpu", **extra)
        made[name] = build(corpus, options, encoder=encoder).path
    return made


def test_collate_keeps_a_float16_cache_float16_unless_asked(bundled_caches):
    ds = CacheDataset(bundled_caches["fp16"])
    items = [ds[i] for i in (6, 0, 3)]
    assert items[0].dtype == np.float16
    default = collate(items)
    assert default.vectors.dtype == torch.float16 and default.vectors.shape == (3, 3, 8, 256)
    for b, array in enumerate(items):
        n = array.shape[1]
        np.testing.assert_array_equal(default.vectors[b, :, :n].numpy(), array)  # the stored bits, not a round trip
        assert not default.vectors[b, :, n:].any()
    assert torch.equal(collate(items, dtype="stored").vectors, default.vectors)  # "stored" is the default, spelled
    as_float32 = collate(items, dtype=torch.float32)
    assert as_float32.vectors.dtype == torch.float32
    assert torch.equal(as_float32.vectors, default.vectors.float())  # float16 -> float32 is exact
    # Through a DataLoader as the README writes it: the default, and float32 asked for by functools.partial.
    loader = DataLoader(ds, batch_size=4, collate_fn=collate)
    assert {b.vectors.dtype for b in loader} == {torch.float16}
    loader = DataLoader(ds, batch_size=4, collate_fn=functools.partial(collate, dtype=torch.float32))
    assert {b.vectors.dtype for b in loader} == {torch.float32}


def test_collate_casts_to_any_float_and_refuses_others(layered, mixed):
    items = [CacheDataset(layered)[i] for i in (40, 6, 1)]
    bf16 = collate(items, dtype=torch.bfloat16)
    assert bf16.vectors.dtype == torch.bfloat16
    assert torch.equal(bf16.vectors, collate(items, dtype=torch.float32).vectors.to(torch.bfloat16))
    assert collate([CacheDataset(mixed)[0]]).vectors.dtype == torch.float32  # a float32 cache stays float32
    with pytest.raises(InvalidParameterError, match=r"dtype: torch.int8 is not a choice; use 'stored'"):
        collate(items, dtype=torch.int8)
    with pytest.raises(InvalidParameterError, match=r"dtype: 'float16' is not a choice"):
        collate(items, dtype="float16")  # a string other than "stored": refused, not taken as a dtype name


def test_collate_decodes_a_quantised_cache_to_float32(bundled_caches):
    ds = CacheDataset(bundled_caches["int8"])
    items = [ds[i] for i in range(4)]
    decoded = collate(items)
    assert decoded.vectors.dtype == torch.float32  # codes decode to float32 whatever the default keeps
    with elmo_cache.open(bundled_caches["int8"]) as cache:
        for b in range(4):
            n = cache.lengths[b]
            np.testing.assert_array_equal(decoded.vectors[b, :, :n].numpy(), cache[b])
    assert torch.equal(collate(items, dtype=torch.float16).vectors, decoded.vectors.half())


def _padding(lengths, batches):
    return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches)


def test_bucketing_covers_every_sentence_once_with_less_padding(layered):
    from elmo_cache import BucketBatchSampler

    lengths = np.random.default_rng(0).integers(0, 60, size=1000)
    sampler = BucketBatchSampler(lengths, batch_size=16, pool_batches=10, seed=3)
    epoch0, epoch1 = list(sampler), list(sampler)
    for batches in (epoch0, epoch1):
        assert sorted(i for b in batches for i in b) == list(range(1000))
        assert all(len(b) <= 16 for b in batches) and len(batches) == len(sampler) == 63
    assert epoch0 != epoch1  # each iteration is the next epoch
    sampler.set_epoch(0)
    assert list(sampler) == epoch0  # an epoch's batches depend on the seed and the epoch only
    random_batches = [list(range(i, min(i + 16, 1000))) for i in range(0, 1000, 16)]
    assert _padding(lengths, epoch0) * 5 < _padding(lengths, random_batches)
    dropped = BucketBatchSampler(lengths, batch_size=16, pool_batches=10, drop_last=True)
    assert len(list(dropped)) == len(dropped) == 62 and all(len(b) == 16 for b in dropped)
    fixed = BucketBatchSampler(lengths, batch_size=16, shuffle=False)
    assert list(fixed) == list(fixed)


def test_bucketing_reads_a_cache_s_lengths_and_feeds_a_dataloader(layered):
    from elmo_cache import BucketBatchSampler

    ds = CacheDataset(layered, labels=torch.arange(len(LINES)))
    sampler = BucketBatchSampler(ds, batch_size=4, seed=1)
    with elmo_cache.open(layered) as cache:
        assert sampler.lengths.tolist() == cache.lengths.tolist()
        assert BucketBatchSampler(layered, batch_size=4).lengths.tolist() == cache.lengths.tolist()
    sampler.set_epoch(5)
    serial = list(DataLoader(ds, batch_sampler=sampler, collate_fn=collate))
    sampler.set_epoch(5)
    parallel = list(
        DataLoader(ds, batch_sampler=sampler, collate_fn=collate, num_workers=2, multiprocessing_context="fork")
    )
    assert [b.labels.tolist() for b in serial] == [b.labels.tolist() for b in parallel]
    assert sorted(torch.cat([b.labels for b in serial]).tolist()) == list(range(len(LINES)))
    for batch in serial:
        assert batch.lengths.tolist() == [len(tokenize(LINES[i])) for i in batch.labels.tolist()]
    with pytest.raises(InvalidParameterError, match="batch_size: must be a positive integer, got 0"):
        BucketBatchSampler(ds, batch_size=0)
    with pytest.raises(InvalidParameterError, match="one non-negative token count per item"):
        BucketBatchSampler([1.5, 2.0], batch_size=2)
