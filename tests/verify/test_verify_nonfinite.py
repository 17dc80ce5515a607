"""verify finds stored vectors that read back non-finite (caches built before the build refused them)."""

from __future__ import annotations

import pytest

from elmo_cache.builder import BuildOptions, build
from elmo_cache.rows.codecs import FloatCodec
from elmo_cache.rows.quantize import Quantization
from elmo_cache.rows.selection import MixSpec
from elmo_cache.verify.checks import verify
from tests._build_fixtures import corpus_lines, write_corpus


@pytest.mark.parametrize(
    ("fmt", "codec", "gamma", "extra"),
    [("zarr", FloatCodec, 1e6, {"fp16": True}), ("hdf5", Quantization, 1e39, {"quantize": "int8"})],
)
def test_verify_reports_the_first_non_finite_sentence(tmp_path, tiny_encoder, monkeypatch, fmt, codec, gamma, extra):
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(10, seed=3))
    output = tmp_path / ("c.zarr" if fmt == "zarr" else "c.h5")
    # A cache as builds before the check wrote it: the build's refusal switched off.
    monkeypatch.setattr(codec, "nonfinite", lambda self, x, stored: None)
    build(
        corpus,
        BuildOptions(output=output, mix=MixSpec.from_raw([1, 1, 1], gamma=gamma), progress=False, **extra),
        encoder=tiny_encoder,
    )
    monkeypatch.undo()
    report = verify(output)
    assert not report.ok
    assert any("vectors: sentence" in p and "not finite" in p for p in report.problems), report.problems
