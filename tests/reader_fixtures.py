"""Fixtures and helpers the reader tests share: a real tiny model, a corpus, caches built from it."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from elmo_cache import Encoder
from elmo_cache.builder import BuildOptions, build
from elmo_cache.model.random_model import write_random_model
from elmo_cache.rows.selection import MixSpec
from elmo_cache.text.tokenize import tokenize
from tests._build_fixtures import RawMix

LINES = [
    "the cat sat on the mat .",
    "",
    "a dog barked",
    "the   cat sat on the mat .",  # same sentence as line 0 after tokenisation
    "\ufeffBOM line here",
    "one",
    "a much longer sentence that spans several chunks of rows in the zarr store when chunks are small",
    "a dog barked",
    "tail",
]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Encoder:
    options, weights = write_random_model(tmp_path_factory.mktemp("model"), "tiny", seed=3)
    return Encoder.load((options, weights))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def activations(encoder) -> list[np.ndarray]:
    return encoder.embed_batch([tokenize(line) for line in LINES])


@pytest.fixture
def make_cache(tmp_path, corpus, encoder):
    """Build a real cache of LINES (zarr chunks of 5 rows in files of 10, so sentences straddle files)."""

    def make(
        *, fmt="zarr", layers=(0, 1, 2), mix=None, dtype="float32", dedupe=False, compress=False, name="cache"
    ) -> Path:
        options = BuildOptions(
            output=tmp_path / (name + (".zarr" if fmt == "zarr" else ".h5")),
            layers=None if mix else ",".join(map(str, layers)),
            mix=MixSpec.from_raw(mix[0], gamma=mix[1]) if mix else None,
            fp16=dtype == "float16",
            compression="zstd" if compress else None,
            chunk_rows=5 if fmt == "zarr" else None,
            shard_rows=10 if fmt == "zarr" else None,
            dedupe=dedupe,
            progress=False,
        )
        return build(corpus, options, encoder=encoder).path

    return make


def direct(path: Path, i: int) -> np.ndarray:
    """Sentence i read with zarr / h5py themselves, independently of elmo_cache's reader."""
    if path.is_dir():
        import zarr

        group = zarr.open_group(str(path), mode="r")
        offset, length = int(group["offsets"][i]), int(group["lengths"][i])
        block = group["vectors"][offset : offset + length]
    else:
        with h5py.File(path, "r") as f:
            offset, length = int(f["offsets"][i]), int(f["lengths"][i])
            block = f["vectors"][offset : offset + length]
    return block.transpose(1, 0, 2) if block.ndim == 3 else block


def expected(act: np.ndarray, *, layers=(0, 1, 2), mix=None) -> np.ndarray:
    """The vectors a cache of ``act`` answers; a mix computed with numpy from its raw numbers, not by MixSpec."""
    if mix is not None:
        return RawMix(tuple(mix[0]), gamma=mix[1]).rows(act)
    return act[list(layers)]
