"""``build --quantize int8`` on a random tiny model: the scheme's bound against the float build, both containers,
layers and mixes, resume, the identity, Dataset/collate, export, the server, and clear errors."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.rows.codecs import codec_for_option
from elmo_cache.rows.quantize import Quantization, QuantizedSentence
from elmo_cache.rows.selection import MixSpec
from elmo_cache.store import load_progress, staging_path
from elmo_cache.verify.checks import verify
from tests._build_fixtures import assert_same_cache, corpus_lines, failing_on, raw_arrays, write_corpus

MIX = MixSpec.from_raw([0.2, 0.3, 0.5], gamma=1.5)


def within_half_a_step(got: np.ndarray, want: np.ndarray, scales: np.ndarray) -> bool:
    """|x - x^| <= scale / 2 per value (plus float32 round-off of the division and the product)."""
    return bool((np.abs(got - want) <= scales[..., None] * (0.5 + 1e-5) + 1e-6 * np.abs(want) + 1e-7).all())


# -- the scheme alone -------------------------------------------------------------------------------


def test_codes_and_scales_of_awkward_vectors():
    q = Quantization("int8", 6)
    x = torch.tensor(
        [
            [1.0, -2.0, 0.5, 0.0, 127.0, -127.0],  # absmax 127: scale 1, codes are the values rounded
            [0.0] * 6,  # all zeros: scale 0, codes 0, reads back as zeros
            [1e-30, -3e-30, 0.0, 2e-30, 0.0, 1e-30],  # tiny (denormal-adjacent) values keep their scale
            [1e4, 1.0, -1.0, 0.0, 0.0, 5e3],  # an outlier: small values fall to 0 within half a step
            [127.0, 0.9, -0.9, 2.6, -2.6, 1.4],  # scale 1: each code is the nearest integer, not the truncated one
        ]
    )
    stored = q.quantize(x)  # stored dtype and shape: the codec contract (tests/test_codecs.py)
    codes, scales = q.split(stored)
    np.testing.assert_array_equal(codes[0], [1, -2, 0, 0, 127, -127])  # 0.5 rounds half to even
    np.testing.assert_array_equal(codes[4], [127, 1, -1, 3, -3, 1])
    np.testing.assert_allclose(scales, x.abs().amax(-1).numpy() / 127, rtol=1e-7)
    assert scales[1] == 0 and not codes[1].any()
    assert np.abs(codes).max() == 127 and codes.min() >= -127
    back = q.dequantize(stored)
    assert within_half_a_step(back, x.numpy(), scales)
    np.testing.assert_array_equal(back[1], 0)
    assert back[2, 1] < 0 and abs(back[2, 1] + 3e-30) < 1e-31


@pytest.mark.filterwarnings("ignore:invalid value encountered in multiply:RuntimeWarning")
def test_a_non_finite_vector_reads_back_non_finite():
    q = Quantization("int8", 3)
    back = q.dequantize(q.quantize(torch.tensor([[1.0, float("nan"), 2.0], [float("inf"), 1.0, 0.0], [1, 2, 3.0]])))
    assert not np.isfinite(back[0]).all() and not np.isfinite(back[1]).all() and np.isfinite(back[2]).all()


def test_bad_choices_are_named():
    assert codec_for_option(None).to_metadata() is None and codec_for_option("none").to_metadata() is None
    assert codec_for_option("int8") == Quantization("int8")
    with pytest.raises(
        InvalidParameterError, match=r"quantize: 'foo' is not valid; choose from \['none', 'int8', 'pq:M', 'opq:M'\]"
    ):
        codec_for_option("foo")


# -- builds ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("q") / "c.txt", corpus_lines(40, seed=7))


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
@pytest.mark.parametrize("selection", [{"layers": "0,2"}, {"mix": MIX}, {}])
def test_a_quantized_build_reads_back_within_half_a_step_of_the_float_build(
    tmp_path, tiny_encoder, corpus, suffix, selection
):
    common = dict(device="cpu", progress=False, batch_tokens=64, **selection)
    floats = build(corpus, BuildOptions(output=tmp_path / ("f" + suffix), **common), encoder=tiny_encoder)
    quant = build(
        corpus, BuildOptions(output=tmp_path / ("q" + suffix), quantize="int8", **common), encoder=tiny_encoder
    )
    layered = "mix" not in selection
    with elmo_cache.open(floats.path) as f, elmo_cache.open(quant.path) as q:
        meta = q.metadata
        assert meta["dtype"] == "int8" and meta["quantization"] == {"scheme": "int8", "scale": "float32"}
        assert "quantization" not in f.metadata  # float caches' metadata is as it always was
        assert q.dtype == np.float32 and q.quantization == Quantization("int8", tiny_encoder.output_dim)
        checked = 0
        for i in range(len(f)):
            want, got, raw = f[i], q[i], q.quantized(i)
            assert got.shape == want.shape and got.dtype == np.float32 and isinstance(raw, QuantizedSentence)
            assert raw.codes.shape == want.shape and raw.scales.shape == want.shape[:-1]
            assert within_half_a_step(got, want, raw.scales), i
            if want.size:
                # The scale is each vector's absmax / 127: the largest value of every vector is stored exactly.
                np.testing.assert_allclose(raw.scales, np.abs(want).max(axis=-1) / 127, rtol=1e-6)
                assert (np.abs(raw.codes).max(axis=-1) == 127).all()
                checked += 1
            tokens = q.tokens(i)
            np.testing.assert_array_equal(q.get(tokens), q[q.find(tokens)])
        assert checked > 20
        assert (q[0].ndim == 3) == layered
    assert verify(quant.path).ok
    report = verify(quant.path, sample=5, encoder=tiny_encoder)
    assert report.ok and report.sampled == 5, str(report)
    # Half the bytes of float16 (dim 32 here: 36 bytes a vector against 64), measured on the stored rows.
    _, arrays = raw_arrays(quant.path)
    _, float_arrays = raw_arrays(floats.path)
    assert arrays["vectors"].nbytes * 4 == float_arrays["vectors"].nbytes * (32 + 4) // 32


def test_verify_sample_finds_vectors_off_by_more_than_half_a_step(tmp_path, tiny_encoder, corpus, monkeypatch):
    output = tmp_path / "q.h5"
    real = tiny_encoder.encode_flat

    def one_percent_off(sentences):  # a faulty encoder: each vector's largest value moves 1.27 steps
        flat, offsets = real(sentences)
        return flat * 1.01, offsets

    monkeypatch.setattr(tiny_encoder, "encode_flat", one_percent_off)
    build(corpus, BuildOptions(output=output, quantize="int8", device="cpu", progress=False), encoder=tiny_encoder)
    monkeypatch.undo()  # verify re-encodes with the right encoder
    assert verify(output).ok  # the bytes are as written
    report = verify(output, sample=5, encoder=tiny_encoder)
    assert not report.ok and "half the vector's quantisation step" in report.problems[0], str(report)


def test_quantize_with_fp16_and_bad_names_are_refused(tmp_path, tiny_encoder, corpus, tiny_model):
    with pytest.raises(InvalidParameterError, match=r"--fp16 .*does not apply"):
        build(corpus, BuildOptions(output=tmp_path / "x.zarr", quantize="int8", fp16=True), encoder=tiny_encoder)
    with pytest.raises(InvalidParameterError, match=r"choose from \['none', 'int8', 'pq:M', 'opq:M'\]"):
        build(corpus, BuildOptions(output=tmp_path / "x.zarr", quantize="int4"), encoder=tiny_encoder)
    result = CliRunner().invoke(
        cli, ["build", str(corpus), "-o", str(tmp_path / "y.zarr"), "--quantize", "foo", "--options-file",
              str(tiny_model[0]), "--weight-file", str(tiny_model[1])],
    )  # fmt: skip
    assert (
        result.exit_code != 0
        and "quantize: 'foo' is not valid; choose from ['none', 'int8', 'pq:M', 'opq:M']" in result.output
    )
    assert not (tmp_path / "y.zarr").exists()


@pytest.mark.parametrize(
    ("suffix", "extra"), [(".zarr", {"chunk_rows": 16, "shard_rows": 48}), (".h5", {"dedupe": True, "mix": MIX})]
)
def test_resume_after_crashes_equals_an_uninterrupted_quantized_build(tmp_path, tiny_encoder, suffix, extra):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False, quantize="int8", **extra)
    reference = tmp_path / ("reference" + suffix)
    build(corpus, BuildOptions(output=reference, **options), encoder=tiny_encoder)
    output = tmp_path / ("resumed" + suffix)
    for fail_at in (7, 3, 11):
        with failing_on(tiny_encoder, fail_at), pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert 0 < load_progress(output).lines < 120
    # A resume with other storage is refused and names the difference; the interrupted build is kept.
    for other in ({"quantize": None}, {"quantize": None, "fp16": True}):
        with pytest.raises(CacheExistsError, match="dtype: 'int8' there"):
            build(corpus, BuildOptions(output=output, **{**options, **other}), encoder=tiny_encoder)
    assert staging_path(output).exists()
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and summary.n_sentences == 120
    arrays_out = assert_same_cache(output, reference)
    assert arrays_out["vectors"].dtype == np.int8 and verify(output).ok
    # A finished quantised cache is not rebuilt as floats without --overwrite either.
    with pytest.raises(CacheExistsError, match="quantization"):
        build(corpus, BuildOptions(output=output, **{**options, "quantize": None}), encoder=tiny_encoder)


def test_dataset_collate_export_and_cli(tmp_path, tiny_encoder, tiny_model, corpus):
    output = tmp_path / "q.zarr"
    result = CliRunner().invoke(
        cli, ["build", str(corpus), "-o", str(output), "--quantize", "int8", "--layers", "1,2", "--no-progress",
              "--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cache = elmo_cache.open(output)
    labels = list(range(len(cache)))
    dataset = elmo_cache.CacheDataset(output, labels)
    items = [dataset[i] for i in (0, 3, 4, 7)]
    assert all(isinstance(item[0], QuantizedSentence) for item in items)
    batch = elmo_cache.collate(items)  # padding and decoding of a batch: the codec contract (tests/test_codecs.py)
    assert batch.fields[0].tolist() == [0, 3, 4, 7]
    for b, i in enumerate((0, 3, 4, 7)):
        n = int(batch.lengths[b])
        np.testing.assert_array_equal(batch.vectors[b, :, :n].numpy(), cache[i])
    exported = tmp_path / "allennlp.h5"
    from elmo_cache.compat.export import export

    export(output, exported)
    with h5py.File(exported, "r") as f:
        for i in range(len(cache)):
            assert f[str(i)].dtype == np.float32
            np.testing.assert_array_equal(f[str(i)][...], cache[i])
    info = CliRunner().invoke(cli, ["info", str(output)])
    assert info.exit_code == 0 and "int8 (int8 codes, float32 scale per vector)" in info.output


def test_the_server_answers_floats_and_its_live_answers_are_rounded_as_its_hits(tmp_path, tiny_encoder):
    from elmo_cache.server import create_app
    from tests.server_helpers import LINES, UNSEEN, decode, run, settings

    corpus = write_corpus(tmp_path / "lines.txt", LINES)
    build(corpus, BuildOptions(output=tmp_path / "q.zarr", quantize="int8", progress=False), encoder=tiny_encoder)
    # The same sentences as a second cache's lines, to compare a live answer with what a cache holds for it.
    write_corpus(tmp_path / "unseen.txt", UNSEEN)
    build(tmp_path / "unseen.txt", BuildOptions(output=tmp_path / "u.zarr", quantize="int8", progress=False),
          encoder=tiny_encoder)  # fmt: skip
    cache, unseen = elmo_cache.open(tmp_path / "q.zarr"), elmo_cache.open(tmp_path / "u.zarr")
    app = create_app(settings(), encoder=tiny_encoder, cache=cache)

    async def scenario(client):
        hit = await client.get("/embed", params={"sentence": LINES[0], "format": "npy"})
        assert hit.headers["x-elmo-source"] == "cache" and hit.headers["x-elmo-dtype"] == "float32"
        np.testing.assert_array_equal(decode(hit), cache[0])
        for k, line in enumerate(UNSEEN):
            live = await client.get("/embed", params={"sentence": line, "format": "npy"})
            assert live.headers["x-elmo-source"] == "live"
            got, held = decode(live), unseen[k]
            # Rounded as a cache rounds: within half a step of the cache of this line (the float encodings agree
            # to ~1e-6, which can move a value across a rounding boundary), and not the raw float32.
            assert within_half_a_step(got, held, 2 * unseen.quantized(k).scales)
            raw = tiny_encoder.embed_batch([line.split()])[0]
            for values, on_grid in ((got, True), (held, True), (raw, False)):
                steps = values / (np.abs(values).max(axis=-1, keepdims=True) / 127)
                assert (np.abs(steps - np.round(steps)).max() < 1e-3) == on_grid  # code x its vector's scale
        mixed = await client.get("/embed", params={"sentence": LINES[0], "mix": "0,0.25,0.75", "format": "npy"})
        assert mixed.headers["x-elmo-source"] == "cache"
        np.testing.assert_allclose(decode(mixed), 0.25 * cache[0][1] + 0.75 * cache[0][2], rtol=1e-6, atol=1e-7)

    run(app, scenario)
