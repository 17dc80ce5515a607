"""The CUDA paths against the TensorFlow golden data, the reference and the CPU (skipped without a CUDA device).

CI has no GPU: these run where one is lent (benchmarks/RESULTS.md, "On a GPU", says when and on which card;
benchmarks/gpu_check.sh runs them with the GPU benchmarks).
The promises checked are the CPU's: fp32 matches the original implementation to float precision, a sentence
gets the same vectors in any batch, and a build, a server and the reduced precisions on the GPU give what the
CPU gives within the errors the README states.
"""

from __future__ import annotations

import json
from dataclasses import replace

import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from conftest import requires_cuda
from reference_elmo import ReferenceElmo
from test_encoder import GOLDEN_ATOL, WORDS, golden_top_layer, random_sentences

import elmo_cache
from elmo_cache import Encoder
from elmo_cache.cli.main import cli
from elmo_cache.model.random_model import PRESETS, write_random_model
from elmo_cache.server import create_app
from elmo_cache.text.tokenize import tokenize
from tests._build_fixtures import assert_same_cache, corpus_lines, write_corpus
from tests.server_helpers import UNSEEN, close, decode, run, settings

pytestmark = [requires_cuda, pytest.mark.gpu]

# The README's CUDA rows of the precision table (H200, torch 2.11), rounded up in the last digit: max abs
# error, min cosine and mean cosine per token. bf16's max error is larger than on the CPU (2.1e-2 vs 1.5e-2).
GPU_PRECISION_TABLE = {"bf16": (0.022, 0.9999, 0.99999), "fp16": (0.0025, 0.999995, 0.999999)}


def golden_files(golden_dir):
    return golden_dir / "options.json", golden_dir / "lm_weights.hdf5"


@pytest.mark.parametrize("fuse_cell", [False, True])
def test_fp32_matches_tensorflow_on_the_golden_data(golden_dir, fuse_cell):
    encoder = Encoder.load(golden_files(golden_dir), device="cuda", fuse_cell=fuse_cell)
    sentences = json.loads((golden_dir / "sentences.json").read_text())
    vectors = encoder.embed_batch([sentences[k][0].split() for k in range(3)])
    for k in range(3):
        np.testing.assert_allclose(vectors[k][2], golden_top_layer(golden_dir, k, 0), atol=GOLDEN_ATOL, rtol=0)
    vocab = [w for w in (golden_dir / "vocab_test.txt").read_text(encoding="utf-8").split("\n") if w]
    with h5py.File(golden_dir / "elmo_token_embeddings.hdf5", "r") as f:
        expected = f["embedding"][()]
    layer0 = np.stack([v[0, 0] for v in encoder.embed_batch([[w] for w in vocab])])
    np.testing.assert_allclose(layer0[:, : expected.shape[1]], expected, atol=GOLDEN_ATOL, rtol=0)


def test_carry_mode_matches_the_stateful_golden_batches(golden_dir):
    encoder = Encoder.load(golden_files(golden_dir), device="cuda", initial_state="carry")
    sentences = json.loads((golden_dir / "sentences.json").read_text())
    for i in range(len(sentences[0])):
        vectors = encoder.embed_batch([sentences[k][i].split() for k in range(3)])
        for k in range(3):
            np.testing.assert_allclose(vectors[k][2], golden_top_layer(golden_dir, k, i), atol=GOLDEN_ATOL, rtol=0)


@pytest.fixture(scope="module")
def original_files(tmp_path_factory):
    """A random model of the Original's dimensions whose cell and projection clips both fire."""
    options = replace(PRESETS["original"], cell_clip=3.0, proj_clip=0.05)
    return write_random_model(tmp_path_factory.mktemp("original"), options, seed=3)


@pytest.mark.parametrize("fuse_cell", [False, True])
def test_original_size_matches_the_reference_in_any_batch(original_files, fuse_cell):
    encoder = Encoder.load(original_files, device="cuda", fuse_cell=fuse_cell)
    reference = ReferenceElmo(*original_files)
    rng = np.random.default_rng(8)
    checked = [list(rng.choice(WORDS, size=n)) for n in (1, 9, 23, 41)]
    batch = random_sentences(60, seed=9) + checked
    in_batch = encoder.embed_batch(batch)[60:]
    for tokens, got in zip(checked, in_batch):
        np.testing.assert_allclose(got, reference.embed(tokens), atol=1e-5, rtol=0)
    assert reference.cell_clips > 1000 and reference.proj_clips > 1000
    # The same batch twice: the same bits (no atomics or autotuning changing the sums between runs).
    for a, b in zip(encoder.embed_batch(batch)[60:], in_batch):
        np.testing.assert_array_equal(a, b)
    # Other batch sizes pick other GEMM kernels; each sentence stays within float rounding of itself.
    for tokens, got in zip(checked, in_batch):
        assert np.abs(encoder.embed_sentence(tokens) - got).max() <= 1e-5
    reordered = encoder.embed_batch(checked[::-1] + random_sentences(7, seed=10))[:4][::-1]
    for a, b in zip(reordered, in_batch):
        assert np.abs(a - b).max() <= 1e-5


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_reduced_precision_error_is_within_the_readme_table(golden_dir, precision):
    sentences = [s.split() for batch in json.loads((golden_dir / "sentences.json").read_text()) for s in batch]
    exact = Encoder.load(golden_files(golden_dir), device="cpu")
    reduced = Encoder.load(golden_files(golden_dir), device="cuda", precision=precision)
    a = np.concatenate(reduced.embed_batch(sentences), axis=1)
    b = np.concatenate(exact.embed_batch(sentences), axis=1)
    max_abs, min_cos, mean_cos = GPU_PRECISION_TABLE[precision]
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    assert np.abs(a - b).max() <= max_abs
    assert cos.min() >= min_cos and cos.mean() >= mean_cos


def test_build_on_the_gpu_stores_what_the_cpu_build_stores(tmp_path, tiny_model):
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(40, seed=3))
    model = ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--no-progress"]
    outputs = {}
    for device in ("cuda", "cpu"):
        outputs[device] = tmp_path / f"{device}.zarr"
        result = CliRunner().invoke(
            cli, ["build", str(corpus), "-o", str(outputs[device]), "--device", device, *model], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
    verified = CliRunner().invoke(
        cli, ["verify", str(outputs["cuda"]), "--sample", "10", "--device", "cuda", *model[:4]], catch_exceptions=False
    )
    assert verified.exit_code == 0, verified.output
    with elmo_cache.open(outputs["cuda"]) as gpu, elmo_cache.open(outputs["cpu"]) as cpu:
        assert len(gpu) == len(cpu) == 40
        for i in range(len(cpu)):
            np.testing.assert_allclose(np.asarray(gpu[i]), np.asarray(cpu[i]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("storage", [{"layers": (1, 2), "fp16": True}, {"quantize": "int8"}], ids=["fp16", "int8"])
def test_a_window_put_together_on_the_gpu_stores_what_the_host_path_stores(tmp_path, tiny_model, monkeypatch, storage):
    """Windows that fit on the device are put together there and cross in one copy; the bytes are those of the
    path where each batch crosses and the host places its rows (tests/builder/test_encoding.py forces both on a
    CPU)."""
    from elmo_cache.builder import BuildOptions, build
    from elmo_cache.builder.encoding import WindowEncoder

    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(80, seed=5))
    encoder = Encoder.load(tiny_model, device="cuda")
    real = WindowEncoder._window_on_device
    chosen: list[bool] = []

    def recorded(self, nbytes):
        chosen.append(real(self, nbytes))
        return chosen[-1]

    def run_build(name):
        options = BuildOptions(output=tmp_path / name, batch_tokens=64, window_batches=2, progress=False, **storage)
        build(corpus, options, encoder=encoder)
        return options.output

    monkeypatch.setattr(WindowEncoder, "_window_on_device", recorded)
    on_device = run_build("device.zarr")
    assert chosen and all(chosen)
    monkeypatch.setattr(WindowEncoder, "_window_on_device", lambda self, nbytes: False)
    on_host = run_build("host.zarr")
    assert_same_cache(on_device, on_host)


def test_a_transformer_on_the_gpu_gives_what_the_cpu_gives(tiny_transformers):
    """Every family's word-aligned layers on CUDA (fp32) against the CPU's, a sentence longer than the model's
    positions included (several windows)."""
    lines = [
        "the cat sat on the mat .",
        "Hello , world !",
        "the committee met on tuesday to discuss the new budget and officials said the plan would be published "
        "later this year , said the quick brown fox over the lazy dog",
    ]
    sentences = [tokenize(line) for line in lines]
    for family, directory in sorted(tiny_transformers.items()):
        on_gpu = Encoder.load(f"hf:{directory},subword=mean", device="cuda")
        on_cpu = Encoder.load(f"hf:{directory},subword=mean", device="cpu")
        assert on_gpu.identity["options"] == on_cpu.identity["options"], family
        for a, b in zip(on_gpu.embed_batch(sentences), on_cpu.embed_batch(sentences), strict=True):
            assert a.shape == b.shape == (on_cpu.n_layers, b.shape[1], on_cpu.output_dim), family
            np.testing.assert_allclose(a, b, atol=1e-4, rtol=0, err_msg=family)


def test_server_encodes_unseen_sentences_on_the_gpu(tiny_model):
    on_gpu = Encoder.load(tiny_model, device="cuda")
    on_cpu = Encoder.load(tiny_model, device="cpu")
    assert on_gpu.device.type == "cuda"
    app = create_app(settings(), encoder=on_gpu)

    async def scenario(client):
        for line in UNSEEN:
            response = await client.get("/embed", params={"sentence": line, "format": "npy"})
            assert response.status_code == 200, response.text
            close(decode(response), on_cpu.embed_sentence(tokenize(line)))

    run(app, scenario)


@pytest.mark.parametrize(
    "storage", [{"layers": (1, 2), "fp16": True}, {"quantize": "int8", "pool": "mean"}], ids=["fp16", "int8-pool"]
)
def test_a_sentence_written_back_on_the_gpu_holds_what_a_gpu_build_of_it_holds(tmp_path, tiny_model, storage):
    """serve --write-back on a GPU: a miss encoded alone (AloneEncoder) keeps the bytes a one-line build on the
    same GPU stores (the device's own rounding, as the CPU's test checks on the CPU)."""
    from elmo_cache.builder import BuildOptions, build
    from elmo_cache.builder.writeback import AloneEncoder

    device = "cuda"
    encoder = Encoder.load(tiny_model, device=device)
    line = "the committee met on tuesday to discuss the new budget ."
    corpus = write_corpus(tmp_path / "one.txt", [line])
    build(corpus, BuildOptions(output=tmp_path / "one.zarr", device=device, progress=False, **storage), encoder=encoder)
    with elmo_cache.open(tmp_path / "one.zarr") as cache:
        alone = AloneEncoder.for_cache(encoder, cache).encode(tokenize(line))
        raw = cache._sentence(0, stored=True)
        rows = np.asarray(raw.transpose(1, 0, 2) if cache.kind == "layers" else raw)
        assert alone.finite and alone.rows.dtype == rows.dtype and alone.rows.tobytes() == rows.tobytes()
        if cache.pool is not None:
            assert alone.pooled is not None
            assert alone.pooled.tobytes() == np.asarray(cache.sentence_vector(0)).tobytes()
