"""elmo_cache.builder.encoding: a window's rows put together on the device store the bytes the host path stores,
and a batch encoded on its own (``BatchEncoder``, the per-batch path of a build) stores a build's bytes.

On CUDA a window whose rows fit on the device is put together there (each batch's rows go to their places with
``index_copy_``) and crosses to the host in one copy; otherwise each batch crosses and the host places its rows.
The choice is ``WindowEncoder._window_on_device``; here it is forced on a CPU so that both paths run in CI (the
CUDA case is tests/encoder/test_cuda.py::test_a_window_put_together_on_the_gpu_stores_what_the_host_path_stores).
"""

from __future__ import annotations

import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.encoding import BatchEncoder, WindowEncoder
from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.codecs import FLOAT16, FLOAT32
from elmo_cache.rows.pooling import Pool
from elmo_cache.rows.selection import MixSpec, Selection
from tests._build_fixtures import assert_same_cache, corpus_lines, raw_arrays, write_corpus

STORAGE = {
    "fp16 layers": {"layers": (1, 2), "fp16": True},
    "int8": {"quantize": "int8"},
    "mix, pooled": {"mix": MixSpec.from_raw([0.2, 0.3, 0.5], gamma=1.5), "pool": "mean"},
    "dedupe": {"dedupe": True},
}


@pytest.mark.parametrize("storage", sorted(STORAGE))
@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_window_put_together_on_the_device_stores_what_the_host_path_stores(
    tmp_path, tiny_encoder, monkeypatch, storage, suffix
):
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(60, seed=11))
    placed: list[bool] = []
    real = WindowEncoder._window_on_device

    def forced(on_device):
        def choose(self, nbytes):
            assert real(self, nbytes) is False  # a CPU: the host path unless forced
            placed.append(on_device)
            return on_device

        return choose

    def run(name, on_device):
        monkeypatch.setattr(WindowEncoder, "_window_on_device", forced(on_device))
        options = BuildOptions(
            output=tmp_path / (name + suffix), batch_tokens=48, window_batches=2, progress=False, **STORAGE[storage]
        )
        build(corpus, options, encoder=tiny_encoder)
        return options.output

    host = run("host", False)
    device = run("device", True)
    assert placed.count(True) >= 3 and placed.count(False) >= 3  # several windows each way
    assert_same_cache(device, host)


def test_a_non_finite_value_in_a_window_put_together_on_the_device_names_its_line(tmp_path, tiny_encoder, monkeypatch):
    lines = corpus_lines(20, seed=7)
    corpus = write_corpus(tmp_path / "corpus.txt", lines)
    monkeypatch.setattr(WindowEncoder, "_window_on_device", lambda self, nbytes: True)
    options = BuildOptions(
        output=tmp_path / "c.zarr", mix=MixSpec.from_raw([1, 1, 1], gamma=1e6), fp16=True, progress=False
    )
    with pytest.raises(InvalidParameterError, match=r"corpus.txt, line \d+: not finite once stored: .*--fp16"):
        build(corpus, options, encoder=tiny_encoder)
    assert not (tmp_path / "c.zarr").exists()


ALONE = {
    "float32": {},
    "fp16 layers, pooled": {"layers": (1, 2), "fp16": True, "pool": "max"},
    "fp16 mix, pooled": {"mix": MixSpec.from_raw([0.2, 0.3, 0.5], gamma=1.5), "fp16": True, "pool": "mean"},
}


@pytest.mark.parametrize("storage", sorted(ALONE))
def test_a_one_sentence_batch_stores_what_a_fresh_one_line_build_stores(tmp_path, tiny_encoder, storage):
    line = "the cat sat on the naïve mat , Zürich 42 !"
    corpus = write_corpus(tmp_path / "one.txt", [line])
    options = BuildOptions(output=tmp_path / "one.zarr", progress=False, **ALONE[storage])
    build(corpus, options, encoder=tiny_encoder)
    _, arrays = raw_arrays(options.output)
    with elmo_cache.open(options.output) as cache:
        batches = BatchEncoder(tiny_encoder, Selection.from_metadata(cache.metadata), cache.codec, cache.pool)
    tiny_encoder.encode_flat([["dogs", "bark", "loudly"]])  # history the encoding must not depend on ...
    tiny_encoder.clear_word_cache()  # ... once the caller empties the word cache, as a window starts
    done = batches.encode([line.split()])
    assert done.nonfinite is None
    assert done.rows is not None and done.rows.dtype == arrays["vectors"].dtype
    assert done.rows.tobytes() == arrays["vectors"].tobytes()
    assert done.flat.shape == (3, len(line.split()), tiny_encoder.output_dim)
    if "pool" in ALONE[storage]:
        assert done.pooled is not None and done.pooled.dtype == np.float32
        assert done.pooled_stored is not None and done.pooled_stored.dtype == arrays["pooled"].dtype
        assert done.pooled_stored.tobytes() == arrays["pooled"].tobytes()
    else:
        assert done.pooled is None and done.pooled_stored is None and "pooled" not in arrays


def test_a_batch_names_its_first_sentence_not_finite_once_stored(tiny_encoder, monkeypatch):
    """A sentence with a row not finite once stored is blamed with that row (its place in the batch's rows); one
    whose pooled vector alone overflows its stored dtype is blamed without a row; the batch is still returned."""
    import torch

    fine, loud = ["the", "cat"], ["dogs", "bark", "loudly"]
    louder = Selection(layers=None, mix=MixSpec.from_raw([1, 1, 1], gamma=1e6))
    assert BatchEncoder(tiny_encoder, louder, FLOAT16, None).encode([fine, loud]).nonfinite == (0, 0)
    plain = BatchEncoder(tiny_encoder, Selection(), FLOAT16, None)
    assert plain.encode([fine, loud]).nonfinite is None

    pooled = BatchEncoder(tiny_encoder, louder, FLOAT32, Pool("max", "float16")).encode([loud])
    assert pooled.nonfinite == (0, None)  # float32 rows are finite: only the float16 pool overflows
    assert pooled.rows is not None and np.isfinite(pooled.rows).all()
    assert pooled.pooled is not None and np.isfinite(pooled.pooled).all()
    assert pooled.pooled_stored is not None and not np.isfinite(pooled.pooled_stored).all()
    skipped = BatchEncoder(tiny_encoder, louder, FLOAT16, Pool("max", "float32"), token_rows=False)
    assert skipped.encode([loud]).nonfinite is None  # a pool-only cache stores no token rows to check

    real = tiny_encoder.encode_flat

    def broken(sentences):
        flat, offsets = real(sentences)
        flat[:, int(offsets[1]) + 1] = torch.nan  # the second sentence's second token
        return flat, offsets

    monkeypatch.setattr(tiny_encoder, "encode_flat", broken)
    with torch.inference_mode():  # the encoder's tensors are inference tensors: changed in place only there
        broke = plain.encode([fine, loud, fine])
    assert broke.nonfinite == (1, 3)
    assert broke.rows is not None and not np.isfinite(broke.rows[3]).any() and np.isfinite(broke.rows[:3]).all()
