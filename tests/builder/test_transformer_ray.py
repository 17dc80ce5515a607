"""The ray engine builds a Transformer model's cache byte-equal to the local build's (as
tests/builder/test_distributed.py checks for ELMo): the workers load the model from the files the driver resolved."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("transformers")

import elmo_cache  # noqa: E402
from elmo_cache.builder import BuildOptions, build  # noqa: E402
from elmo_cache.builder.ray.engine import build_distributed  # noqa: E402
from elmo_cache.verify.checks import verify  # noqa: E402
from tests._build_fixtures import corpus_lines, write_corpus  # noqa: E402
from tests.builder.test_distributed import assert_same_cache  # noqa: E402

LINES = corpus_lines(400, seed=5)
SMALL = {"batch_tokens": 512, "window_batches": 2, "chunk_rows": 256, "shard_rows": 1024, "device": "cpu"}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.mark.parametrize("extra", [{"pool": "mean"}, {"mix": "0.1,0.2,0.3,0.4", "quantize": "int8"}])
def test_ray_cache_is_the_local_one_byte_for_byte(tiny_transformers, tmp_path, extra):
    corpus = write_corpus(tmp_path / "corpus.txt", LINES)
    spec = f"hf:{tiny_transformers['xlmr']},subword=last,stride=5"
    if "mix" in extra:
        extra = {**extra, "mix": elmo_cache.MixSpec.from_raw(extra["mix"], n_layers=4)}

    def options(output):
        return BuildOptions(output=output, model=spec, progress=False, **SMALL, **extra)

    build(corpus, options(tmp_path / "local.zarr"))
    summary = build_distributed(corpus, options(tmp_path / "ray.zarr"), workers=2, parts=3, cpus_per_worker=0.5)
    assert summary.engine == "ray" and summary.parts_run == 3
    assert_same_cache(tmp_path / "ray.zarr", tmp_path / "local.zarr")
    assert verify(tmp_path / "ray.zarr", sample=4, corpus=corpus).ok
