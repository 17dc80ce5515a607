"""A Transformer model through everything downstream: build (layers, mix, fp16, int8, pools), verify re-encoding
with the model the cache records, the allennlp-layout HDF5 export with all L+1 layers, and the server encoding
misses live with the model it finds from the cache."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")

import elmo_cache
from elmo_cache import Encoder
from elmo_cache.builder import BuildOptions, build
from elmo_cache.encoder.names import BATCH_TOKENS, FORMAT_BATCH_TOKENS
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model import transformer
from elmo_cache.verify.checks import verify
from tests._build_fixtures import write_corpus

LINES = [
    "the cat sat on the mat .",
    "Hello , world !",
    "",
    "the committee met on tuesday to discuss the new budget and officials said the plan would be published later",
    "a quick brown fox",
    "the cat sat on the mat .",
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("tf_corpus") / "corpus.txt", LINES)


@pytest.fixture(scope="module")
def spec(tiny_transformers):
    return f"hf:{tiny_transformers['bert']},subword=mean"


@pytest.fixture(scope="module")
def encoder(spec):
    return Encoder.load(spec, device="cpu")


def _options(spec, output, **kwargs):
    return BuildOptions(output=output, model=spec, device="cpu", progress=False, **kwargs)


def test_build_stores_every_layer_exactly_and_verify_re_encodes(spec, encoder, corpus, tmp_path):
    output = tmp_path / "c.zarr"
    summary = build(corpus, _options(spec, output, dedupe=True, pool="mean"))
    assert summary.n_sentences == len(LINES)
    cache = elmo_cache.open(output)
    meta = cache.metadata
    assert meta["layers"] == [0, 1, 2, 3] and meta["dim"] == 16
    assert meta["model"] == json.loads(json.dumps(encoder.identity))
    for i, line in enumerate(LINES):
        tokens = cache.tokens(i)
        assert tokens == line.split()
        want = encoder.embed_sentence(tokens) if tokens else np.zeros((4, 0, 16), np.float32)
        # Equal to the sentence encoded alone up to float rounding: padding its batch changes the last bit or so.
        np.testing.assert_allclose(np.asarray(cache[i]), want, atol=1e-6, rtol=0)
    report = verify(output, sample=len(LINES), corpus=corpus)
    assert report.ok, report
    # Batched as a Transformer batches best on a CPU, not as ELMo does (and the encoder's own default agrees).
    cpu_batch = FORMAT_BATCH_TOKENS[transformer.FORMAT]["cpu"]
    assert cpu_batch < BATCH_TOKENS["cpu"] and encoder.default_batch_tokens == cpu_batch
    assert meta["windows"]["batch_tokens"] == cpu_batch


def test_layers_mix_fp16_int8_and_pool_only(spec, encoder, corpus, tmp_path):
    full = [encoder.embed_sentence(line.split()) for line in LINES]
    layers = elmo_cache.open(build(corpus, _options(spec, tmp_path / "l.zarr", layers="0,3", fp16=True)).path)
    assert layers.metadata["layers"] == [0, 3] and np.asarray(layers[0]).dtype == np.float16
    np.testing.assert_allclose(np.asarray(layers[0], np.float32), full[0][[0, 3]], atol=2e-3, rtol=1e-3)

    mix = elmo_cache.MixSpec.from_raw("0.1,0.2,0.3,0.4", n_layers=4)
    mixed = elmo_cache.open(build(corpus, _options(spec, tmp_path / "m.zarr", mix=mix)).path)
    want = np.tensordot(np.array([0.1, 0.2, 0.3, 0.4], np.float32), full[3], axes=1)
    np.testing.assert_allclose(np.asarray(mixed[3]), want, atol=1e-6)

    quantized = build(corpus, _options(spec, tmp_path / "q.zarr", quantize="int8"))
    assert verify(quantized.path, sample=3, corpus=corpus).ok

    pooled = elmo_cache.open(build(corpus, _options(spec, tmp_path / "p.zarr", pool="mean", pool_only=True)).path)
    np.testing.assert_allclose(pooled.sentence_vector(0), full[0].mean(axis=1), atol=1e-6)


def test_a_layer_beyond_the_model_and_a_mix_of_the_wrong_length_are_refused(spec, corpus, tmp_path):
    with pytest.raises(InvalidParameterError, match=r"layer 4 does not exist; choose from \[0, 1, 2, 3\]"):
        build(corpus, _options(spec, tmp_path / "x.zarr", layers="1,4"))
    three = elmo_cache.MixSpec.from_raw("0.2,0.3,0.5")
    with pytest.raises(InvalidParameterError, match=r"mix: expected 4 numbers \(one per layer of the model\), got 3"):
        build(corpus, _options(spec, tmp_path / "y.zarr", mix=three))
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "y.zarr").exists()


def test_cli_build_checks_layers_against_the_model(spec, corpus, tmp_path):
    from click.testing import CliRunner

    from elmo_cache.cli.main import cli

    out = tmp_path / "cli.zarr"
    runner = CliRunner()
    bad = runner.invoke(cli, ["build", str(corpus), "-o", str(out), "--model", spec, "--mix", "1,2,3", "--no-progress"])
    assert bad.exit_code == 1 and "expected 4 numbers" in bad.output
    ok = runner.invoke(
        cli,
        ["build", str(corpus), "-o", str(out), "--model", spec, "--mix", "0,0,1,1", "--device", "cpu", "--no-progress"],
    )
    assert ok.exit_code == 0, ok.output
    assert elmo_cache.open(out).metadata["mix"]["weights"] == [0.0, 0.0, 1.0, 1.0]


def test_hdf5_export_holds_all_layers_word_aligned(spec, encoder, corpus, tmp_path):
    import h5py

    from elmo_cache.compat.export import export

    cache = build(corpus, _options(spec, tmp_path / "e.zarr")).path
    stored = elmo_cache.open(cache)
    export(cache, tmp_path / "e.hdf5", corpus=corpus)
    with h5py.File(tmp_path / "e.hdf5", "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        for i, line in enumerate(LINES):
            if not line:
                continue
            data = f[index[line]][()]
            assert data.shape == (4, len(line.split()), 16)
            np.testing.assert_array_equal(data, np.asarray(stored[i]))
            np.testing.assert_allclose(data, encoder.embed_sentence(line.split()), atol=1e-6, rtol=0)


def test_server_encodes_misses_live_with_the_recorded_model(spec, encoder, corpus, tmp_path):
    pytest.importorskip("fastapi")
    from elmo_cache.server import Settings, create_app
    from tests.server_helpers import decode, run

    cache = build(corpus, _options(spec, tmp_path / "s.zarr", layers="1,3")).path
    app = create_app(Settings(cache_path=cache, device="cpu"))

    async def scenario(client):
        hit = await client.get("/embed", params={"sentence": LINES[0]})
        miss = await client.get("/embed", params={"sentence": "the dog sat on the cat", "layers": "0,2"})
        bad = await client.get("/embed", params={"sentence": "x", "layers": "4"})
        mix = await client.get("/embed", params={"sentence": "x", "mix": "1,1,1"})
        info = (await client.get("/info")).json()
        return hit, miss, bad, mix, info

    hit, miss, bad, mix, info = run(app, scenario)
    assert hit.json()["source"] == "cache" and miss.json()["source"] == "live", miss.text
    np.testing.assert_allclose(decode(hit), encoder.embed_sentence(LINES[0].split())[[1, 3]], atol=1e-6, rtol=0)
    np.testing.assert_allclose(
        decode(miss), encoder.embed_sentence(["the", "dog", "sat", "on", "the", "cat"])[[0, 2]], atol=1e-6
    )
    assert bad.status_code == 422 and "choose from [0, 1, 2, 3]" in bad.json()["error"]["message"]
    assert mix.status_code == 422 and "expected 4 numbers" in mix.json()["error"]["message"]

    # POST /v1/embeddings pools a mix of the model's L + 1 layers; a mix of ELMo's three is refused as serve starts.
    app = create_app(Settings(cache_path=cache, device="cpu", openai_mix="0,1,0,1"))

    async def embeddings(client):
        return await client.post("/v1/embeddings", json={"input": LINES[0]})

    response = run(app, embeddings)
    assert response.status_code == 200, response.text
    layers = encoder.embed_sentence(LINES[0].split())
    np.testing.assert_allclose(
        response.json()["data"][0]["embedding"], (layers[1] + layers[3]).mean(axis=0), atol=1e-5, rtol=0
    )
    from click.testing import CliRunner

    from elmo_cache.cli.main import cli

    result = CliRunner().invoke(cli, ["serve", str(cache), "--device", "cpu", "--openai-mix", "1,1,1"])
    assert result.exit_code == 1 and "openai_mix (ELMO_CACHE_OPENAI_MIX)" in result.output, result.output
    assert "expected 4 numbers" in result.output and "Traceback" not in result.output
    assert info["available_layers"] == [0, 1, 2, 3]


def test_a_scalar_mix_learned_on_a_transformer_cache_builds_as_a_mix_of_all_its_layers(spec, encoder, corpus, tmp_path):
    import torch

    from elmo_cache.reader.scalar_mix import ScalarMix

    cache = elmo_cache.open(build(corpus, _options(spec, tmp_path / "sm.zarr", layers="1,3")).path)
    mix = ScalarMix.for_cache(cache, initial=[0.5, -0.5], gamma=2.0)
    assert mix.n_layers == 4 and len(mix.raw_weights) == 4
    spec_ = mix.mix_spec()
    # Layers the cache lacks get weights that are 0 in float32, where the build mixes.
    assert np.float32(spec_.weights[0]) == 0.0 and np.float32(spec_.weights[2]) == 0.0
    stored = torch.from_numpy(np.array(cache[0], np.float32))
    mixed = elmo_cache.open(build(corpus, _options(spec, tmp_path / "smb.zarr", mix=spec_)).path)
    np.testing.assert_allclose(np.asarray(mixed[0]), mix(stored).detach().numpy(), atol=1e-5)
