"""elmo_cache.builder.encoding: a window's rows put together on the device store the bytes the host path stores.

On CUDA a window whose rows fit on the device is put together there (each batch's rows go to their places with
``index_copy_``) and crosses to the host in one copy; otherwise each batch crosses and the host places its rows.
The choice is ``WindowEncoder._window_on_device``; here it is forced on a CPU so that both paths run in CI (the
CUDA case is tests/encoder/test_cuda.py::test_a_window_put_together_on_the_gpu_stores_what_the_host_path_stores).
"""

from __future__ import annotations

import pytest

from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.encoding import WindowEncoder
from elmo_cache.errors import InvalidParameterError
from elmo_cache.rows.selection import MixSpec
from tests._build_fixtures import assert_same_cache, corpus_lines, write_corpus

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
