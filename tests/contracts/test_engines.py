"""One contract for every build engine: the same small build through each registered engine
(:data:`elmo_cache.builder.engine.ENGINES`) writes the same zarr cache, every file byte for byte.

The build is cut small (short windows, shards of a few chunks) so that the ray engine's parts share
vectors files and its container's parallel writer stitches fragments; ``dedupe`` and ``pool`` bring in
the repeats' rows and the pooled array. Only the root metadata's ``build`` log (engine, times, workers)
may differ. An engine whose dependencies are missing (Ray) is skipped, not failed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.engine import ENGINES
from elmo_cache.store.format import ZARR_JSON
from elmo_cache.store.registry import containers
from tests._build_fixtures import corpus_lines, write_corpus

LINES = corpus_lines(600, seed=11)
SMALL = {
    "batch_tokens": 256,
    "window_batches": 2,
    "chunk_rows": 64,
    "shard_rows": 256,
    "device": "cpu",
    "progress": False,
    "dedupe": True,
    "pool": "mean",
}
REFERENCE = ENGINES[0]


def _options(tiny_model: tuple[Path, Path], output: Path) -> BuildOptions:
    return BuildOptions(output=output, options_file=tiny_model[0], weight_file=tiny_model[1], **SMALL)


def _files(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


# The module each engine needs beyond elmo-cache's own requirements: without it, the engine is skipped.
NEEDS = {"ray": "ray"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", LINES)


@pytest.fixture(scope="module")
def built() -> dict[str, Path]:
    """Each engine's cache, built once when a test first asks for it."""
    return {}


def _build(name: str, tiny_model, corpus: Path, built: dict[str, Path], tmp_path_factory) -> Path:
    if name not in built:
        if name in NEEDS:
            pytest.importorskip(NEEDS[name])
        output = tmp_path_factory.mktemp(f"engine-{name}") / "cache.zarr"
        summary = build(corpus, _options(tiny_model, output), engine=name)
        assert summary.engine == name
        built[name] = output
    return built[name]


def test_every_registered_engine_is_tested():
    assert REFERENCE == "local" and set(ENGINES) >= {"local", "ray"}


@pytest.mark.parametrize("name", [e for e in ENGINES if e != REFERENCE])
def test_engine_writes_the_reference_cache_byte_for_byte(name, tiny_model, corpus, built, tmp_path_factory):
    reference = _files(_build(REFERENCE, tiny_model, corpus, built, tmp_path_factory))
    ours = _files(_build(name, tiny_model, corpus, built, tmp_path_factory))
    assert sorted(ours) == sorted(reference)
    # Several vectors files, so that a part cut falls inside some (the ray engine stitches them).
    assert sum(1 for f in reference if f.startswith("vectors/c/")) > 4
    for file, data in reference.items():
        if file == ZARR_JSON:
            meta = json.loads(data)["attributes"]["elmo_cache"]
            theirs = json.loads(ours[file])["attributes"]["elmo_cache"]
            theirs.pop("build"), meta.pop("build")
            assert theirs == meta
        else:
            assert ours[file] == data, file


def test_an_engine_needing_a_parallel_writer_names_the_containers_that_have_one():
    able = [c.name for c in containers() if c.parallel_writer() is not None]
    assert able == ["zarr"]
