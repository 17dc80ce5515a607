"""Every row codec against the shared contract (tests/codec_contract.py), and the seam itself: a codec defined and
registered here alone builds a cache, reads it, resumes an interrupted build of it and verifies it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
import torch

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.reader.dataset import CacheDataset, collate
from elmo_cache.rows.codecs import (
    CodecEntry,
    RowCodec,
    UndecodedSentence,
    codec_choices,
    codec_for_option,
    invalid_option,
    pad_floats,
    register_codec,
    unregister_codec,
)
from elmo_cache.rows.selection import MixSpec, Selection
from elmo_cache.store import load_progress, staging_path
from elmo_cache.verify.checks import verify
from tests._build_fixtures import assert_same_cache, corpus_lines, failing_on, write_corpus
from tests.contracts.codec import CodecContract

# -- a codec from outside: int16 fixed point, 1/256 a step ------------------------------------------

FIXED16 = "fixed16"
STEPS = 256


@dataclass(frozen=True)
class Fixed16Sentence(UndecodedSentence):
    codes: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape)

    def dequantize(self) -> np.ndarray:
        return np.divide(self.codes, STEPS, dtype=np.float32)


@dataclass(frozen=True)
class Fixed16:
    """Each value stored as round(x * 256) in int16 (values beyond +-128 saturate)."""

    dim: int = 0
    slots: int = 0

    name = FIXED16
    dtype = "int16"
    quantized = True
    read_dtype = np.dtype(np.float32)
    training_vectors = None
    exact_pool = False

    def rounding_step(self, scale: float) -> float | None:
        return 1.0 / STEPS

    def require(self) -> None:
        return None

    def with_training_vectors(self, vectors: int) -> Fixed16:
        raise InvalidParameterError("codebook_sample: fixed16 is not trained")

    def bind(self, dim: int, slots: int) -> Fixed16:
        return replace(self, dim=dim, slots=slots)

    def stored_shape(self, row_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(row_shape)

    def to_metadata(self) -> dict[str, Any]:
        return {"scheme": FIXED16, "steps": STEPS}

    def encode(self, x: torch.Tensor) -> np.ndarray:
        return torch.round(x.float() * STEPS).clamp_(-32767, 32767).to(torch.int16).cpu().numpy()

    def train(self, sample: np.ndarray) -> Fixed16:
        return self

    def parameters(self) -> np.ndarray:
        return np.empty(0, "<f4")

    parameter_shape = (0,)

    def with_parameters(self, values: Any, where: str) -> Fixed16:
        return self

    def final_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def for_reading(self, where: Any, meta: Mapping[str, Any], optional: Mapping[str, tuple[Any, Any]]) -> Fixed16:
        return self

    def with_arrays(self, arrays: Mapping[str, Any], where: Any) -> Fixed16:
        return self

    def nonfinite(self, x, stored):
        return None  # saturating int16 codes always read back finite

    def decode(self, rows: np.ndarray) -> np.ndarray:
        return np.divide(rows, STEPS, dtype=np.float32)

    def decoder(self, read: Callable[[int, int], np.ndarray]) -> Callable[[int, int], np.ndarray]:
        return lambda start, stop: self.decode(read(start, stop))

    def raw(self, rows: np.ndarray) -> Fixed16Sentence:
        return Fixed16Sentence(rows)

    def pad(self, items: Sequence[Any], max_tokens: int) -> torch.Tensor:
        return pad_floats([np.asarray(item) for item in items], max_tokens)

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        return self.decode(self.encode(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))))

    def live_as_cached(
        self, acts: np.ndarray, selection: Selection, stored: Selection, dtype: Any = None
    ) -> np.ndarray:
        if stored.layers is not None:  # every value rounded alone: round the layers, then select or mix
            return selection.apply_array(self.roundtrip(acts), dtype)
        out = selection.apply_array(acts, np.float32)
        return np.ascontiguousarray(self.roundtrip(out) if selection.same_as(stored) else out, dtype=dtype)

    def sample_problem(
        self, stored: np.ndarray, expected: np.ndarray, atol: float, rtol: float
    ) -> tuple[str | None, float]:
        error = np.abs(self.decode(stored) - expected)
        if (error > atol + rtol * np.abs(expected) + 0.5 / STEPS * (1 + 1e-4)).any():
            return f"fixed16 values off by up to {float(error.max()):.3g}", float(error.max())
        return None, float(error.max())


def _parse(value: str) -> Fixed16:
    if value != FIXED16:
        raise invalid_option(value)
    return Fixed16()


def _from_metadata(raw: Mapping[str, Any], dim: int, slots: int) -> Fixed16:
    if raw.get("steps") != STEPS:
        raise CacheFormatError(f"metadata quantization {raw!r}: fixed16 with {STEPS} steps expected")
    return Fixed16(dim, slots)


ENTRY = CodecEntry(
    schemes=(FIXED16,),
    parse=_parse,
    from_metadata=_from_metadata,
    choices=(FIXED16,),
    expected=f"'fixed16' with 'steps': {STEPS} and dtype 'int16'",
    valid_metadata=lambda raw, dtype: dtype == "int16" and raw.get("steps") == STEPS,
)


@pytest.fixture(scope="module", autouse=True)
def fixed16_registered():
    """fixed16 is registered for this module's tests only (other modules' error messages list the choices)."""
    register_codec(ENTRY)
    yield
    unregister_codec(FIXED16)


# -- the contract, one tiny class per codec ---------------------------------------------------------


class TestFloat32(CodecContract):
    option = None

    def assert_close(self, x, back):
        np.testing.assert_array_equal(back, x)


class TestFloat16(CodecContract):
    option = None
    fp16 = True

    def assert_close(self, x, back):
        assert (np.abs(back - x) <= np.abs(x) * 2.0**-11 + 2.0**-25).all()  # half a unit in the last place


class TestInt8(CodecContract):
    option = "int8"

    def assert_close(self, x, back):
        half_step = np.abs(x).max(-1, keepdims=True) / 127 * (0.5 + 1e-5)
        assert (np.abs(back - x) <= half_step + 1e-6 * np.abs(x) + 1e-7).all()


class ProductContract(CodecContract):
    """pq and opq: no bound per value (nearest centroids), but far better than the vectors' own spread."""

    def assert_close(self, x, back):
        error = ((back - x) ** 2).sum(-1).mean()
        spread = ((x - x.mean(0)) ** 2).sum(-1).mean()
        assert error < 0.5 * spread, (error, spread)


class TestPQ(ProductContract):
    option = "pq:8"


class TestOPQ(ProductContract):
    option = "opq:8"


class TestFixed16(CodecContract):
    option = FIXED16

    def assert_close(self, x, back):
        assert (np.abs(back - x) <= 0.5 / STEPS + 1e-7).all()


def test_the_registry_lists_and_refuses_by_name():
    assert codec_choices() == ["none", "int8", "pq:M", "opq:M", FIXED16]
    with pytest.raises(InvalidParameterError, match=r"quantize: 'fixed8' is not valid; choose from \['none', 'int8'"):
        codec_for_option("fixed8")
    with pytest.raises(InvalidParameterError, match=r"register_codec: scheme\(s\) \['fixed16'\] are registered"):
        register_codec(ENTRY)
    with pytest.raises(InvalidParameterError, match=r"--fp16 .*does not apply"):
        codec_for_option(FIXED16, fp16=True)
    assert isinstance(codec_for_option(FIXED16), RowCodec)


# -- the seam: a cache of the outside codec, built, read, resumed and verified -----------------------


@pytest.mark.parametrize(
    ("suffix", "extra"), [(".zarr", {"chunk_rows": 16, "shard_rows": 48}), (".h5", {"dedupe": True})]
)
def test_a_registered_codec_builds_reads_resumes_and_verifies(tmp_path, tiny_encoder, suffix, extra):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False, quantize=FIXED16, **extra)
    reference = tmp_path / ("reference" + suffix)
    build(corpus, BuildOptions(output=reference, **options), encoder=tiny_encoder)
    floats = build(corpus, BuildOptions(output=tmp_path / ("f" + suffix), **{**options, "quantize": None}),
                   encoder=tiny_encoder)  # fmt: skip
    with elmo_cache.open(reference) as cache, elmo_cache.open(floats.path) as f:
        assert cache.metadata["quantization"] == {"scheme": FIXED16, "steps": STEPS}
        assert cache.metadata["dtype"] == "int16" and cache.stored_dtype == np.int16 and cache.dtype == np.float32
        for i in range(len(cache)):
            assert (np.abs(cache[i] - f[i]) <= 0.5 / STEPS + 1e-7).all(), i
            np.testing.assert_array_equal(np.asarray(cache.quantized(i)), cache[i])
        batch = collate([CacheDataset(reference)[i] for i in range(4)])
        np.testing.assert_array_equal(batch.vectors[1, :, : batch.lengths[1]].numpy(), cache[1])
    output = tmp_path / ("resumed" + suffix)
    for fail_at in (7, 3):
        with failing_on(tiny_encoder, fail_at), pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert 0 < load_progress(output).lines < 120 and staging_path(output).exists()
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and summary.n_sentences == 120
    assert assert_same_cache(output, reference)["vectors"].dtype == np.int16
    assert verify(output).ok
    report = verify(output, sample=5, encoder=tiny_encoder)
    assert report.ok and report.sampled == 5, str(report)


def test_a_registered_codec_serves_live_answers_as_its_hits(tmp_path, tiny_encoder):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(20, seed=3))
    mix = MixSpec.from_raw([0.2, 0.3, 0.5])
    out = build(corpus, BuildOptions(output=tmp_path / "m.zarr", quantize=FIXED16, mix=mix, progress=False),
                encoder=tiny_encoder)  # fmt: skip
    with elmo_cache.open(out.path) as cache:
        tokens = cache.tokens(2)
        acts = tiny_encoder.embed_batch([tokens])[0]
        stored = Selection.from_metadata(cache.metadata)
        np.testing.assert_array_equal(cache.codec.live_as_cached(acts, stored, stored, cache.dtype), cache[2])
