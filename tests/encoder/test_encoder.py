"""The encoder against the original TensorFlow outputs and a plain reference."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch
from conftest import requires_cuda
from reference_elmo import ReferenceElmo

from elmo_cache import Encoder
from elmo_cache.errors import InvalidParameterError

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "a",
    "in",
    "is",
    "was",
    "that",
    "for",
    "it",
    "with",
    "as",
    "his",
    "on",
    "be",
    "at",
    "by",
    "I",
    "had",
    "not",
    "are",
    "but",
    "from",
    "or",
    "have",
    "an",
    "they",
    "which",
    "one",
    "you",
    "were",
    "her",
    "all",
    "she",
    "there",
    "would",
    "their",
    "we",
    "him",
    "been",
    "has",
    "when",
    "who",
    "will",
    "more",
    "no",
    "if",
    "out",
    "so",
    "said",
    "what",
    "up",
    "its",
    "about",
    "into",
    "than",
    "them",
    "can",
    "only",
    "other",
    "new",
    "some",
    "could",
    "time",
    "these",
    "two",
    "may",
    "then",
    "do",
    "first",
    "any",
    "my",
    "now",
    "such",
    "like",
    "Zürich",
    "naïve",
    "東京",
    "☃",
    "supercalifragilisticexpialidocious-and-then-some-more-characters-than-fifty",
]


def random_sentences(count: int, seed: int, max_len: int = 45) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len, size=count)
    return [list(rng.choice(WORDS, size=n)) for n in lengths]


@pytest.fixture(scope="module")
def golden_encoder(golden_dir):
    return Encoder.load((golden_dir / "options.json", golden_dir / "lm_weights.hdf5"), device="cpu")


@pytest.fixture(scope="module")
def golden_sentences(golden_dir):
    return json.loads((golden_dir / "sentences.json").read_text())


def golden_top_layer(golden_dir, k: int, batch: int) -> np.ndarray:
    with h5py.File(golden_dir / f"lm_embeddings_{k}.hdf5", "r") as f:
        both = f[str(batch)][()]
    return np.concatenate([both[0], both[1]], axis=-1)


# The README's promise for fp32 against the TensorFlow outputs (measured max 9.5e-7 on a Xeon with
# AVX-512; float32 round-off of values up to ~4, so another CPU's kernels may differ by an ulp or two).
GOLDEN_ATOL = 2e-6


def test_token_embeddings_match_tensorflow_for_whole_vocabulary(golden_encoder, golden_dir):
    vocab = [w for w in (golden_dir / "vocab_test.txt").read_text(encoding="utf-8").split("\n") if w]
    with h5py.File(golden_dir / "elmo_token_embeddings.hdf5", "r") as f:
        expected = f["embedding"][()]
    assert len(vocab) == expected.shape[0] == 458
    layer0 = np.stack([v[0, 0] for v in golden_encoder.embed_batch([[w] for w in vocab])])
    p = expected.shape[1]
    np.testing.assert_allclose(layer0[:, :p], expected, atol=GOLDEN_ATOL, rtol=0)
    np.testing.assert_array_equal(layer0[:, :p], layer0[:, p:])  # layer 0 is the token vector twice


def test_first_golden_batch_matches_tensorflow(golden_encoder, golden_dir, golden_sentences):
    batch = [golden_sentences[k][0].split() for k in range(3)]
    vectors = golden_encoder.embed_batch(batch)
    for k in range(3):
        expected = golden_top_layer(golden_dir, k, 0)
        assert vectors[k].shape == (3, len(batch[k]), 32)
        np.testing.assert_allclose(vectors[k][2], expected, atol=GOLDEN_ATOL, rtol=0)


def test_carry_mode_matches_all_ten_stateful_golden_batches(golden_dir, golden_sentences):
    encoder = Encoder.load(
        (golden_dir / "options.json", golden_dir / "lm_weights.hdf5"), device="cpu", initial_state="carry"
    )
    for i in range(10):
        batch = [golden_sentences[k][i].split() for k in range(3)]
        vectors = encoder.embed_batch(batch)
        for k in range(3):
            np.testing.assert_allclose(vectors[k][2], golden_top_layer(golden_dir, k, i), atol=GOLDEN_ATOL, rtol=0)


def test_carry_mode_differs_from_stateless_after_first_batch(golden_dir, golden_sentences, golden_encoder):
    carry = Encoder.load(
        (golden_dir / "options.json", golden_dir / "lm_weights.hdf5"), device="cpu", initial_state="carry"
    )
    batch = [golden_sentences[k][1].split() for k in range(3)]
    carry.embed_batch([golden_sentences[k][0].split() for k in range(3)])
    assert np.abs(carry.embed_batch(batch)[0] - golden_encoder.embed_batch(batch)[0]).max() > 1e-3
    carry.reset_state()
    np.testing.assert_allclose(carry.embed_batch(batch)[0], golden_encoder.embed_batch(batch)[0], atol=1e-6)


def test_matches_plain_reference_with_clipping_and_skip_connections(clipping_model):
    reference = ReferenceElmo(*clipping_model)
    encoder = Encoder.load(clipping_model, device="cpu")
    sentences = random_sentences(12, seed=3, max_len=60) + [["a"], WORDS[-4:]]
    fast = encoder.embed_batch(sentences)
    for tokens, got in zip(sentences, fast):
        np.testing.assert_allclose(got, reference.embed(tokens), atol=1e-5, rtol=0)
    # The comparison only means something if both clips actually fired, many times.
    assert reference.cell_clips > 1000
    assert reference.proj_clips > 1000
    assert max(np.abs(v[2]).max() for v in fast) > 0.3  # skip connection lifts layer 2 past proj_clip


def test_same_sentence_same_vectors_in_any_batch(tiny_encoder):
    sentences = random_sentences(64, seed=7)
    target = sentences[17]
    alone = tiny_encoder.embed_sentence(target)
    in_batch = tiny_encoder.embed_batch(sentences)[17]
    reversed_batch = tiny_encoder.embed_batch(sentences[::-1])[64 - 1 - 17]
    split = tiny_encoder.embed_batch(sentences, batch_tokens=100)[17]
    for other in (in_batch, reversed_batch, split):
        assert np.abs(other - alone).max() <= 1e-5


def test_shapes_empty_sentences_and_streaming(tiny_encoder):
    sentences = [[], ["one"], [], ["two", "words"], []]
    out = tiny_encoder.embed_batch(sentences)
    assert [o.shape for o in out] == [(3, 0, 32), (3, 1, 32), (3, 0, 32), (3, 2, 32), (3, 0, 32)]
    assert all(o.dtype == np.float32 for o in out)
    assert tiny_encoder.embed_batch([]) == []
    assert tiny_encoder.embed_batch([[]])[0].shape == (3, 0, 32)
    many = random_sentences(40, seed=11)
    streamed = list(tiny_encoder.embed_sentences(iter(many), batch_tokens=64, window=2))
    for a, b in zip(streamed, tiny_encoder.embed_batch(many)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_embed_batch_arrays_are_each_sentences_block_of_encode_flat(tiny_encoder):
    sentences = random_sentences(30, seed=9) + [[]]
    flat, offsets = tiny_encoder.encode_flat(sentences)
    flat = flat.numpy()
    out = tiny_encoder.embed_batch(sentences, batch_tokens=10_000)  # one sub-batch: the same batch as encode_flat
    for k, array in enumerate(out):
        assert array.flags.c_contiguous and array.dtype == np.float32
        np.testing.assert_array_equal(array, flat[:, offsets[k] : offsets[k + 1]])
    # One buffer per sub-batch, as embed_batch's docstring says: sentences of one sub-batch share it, and a
    # sentence written to leaves its neighbours as they were.
    assert _buffer(out[0]) is _buffer(out[1])
    before = out[1].copy()
    out[0][...] = 0
    np.testing.assert_array_equal(out[1], before)
    split = tiny_encoder.embed_batch(sentences, batch_tokens=40)
    assert _buffer(split[0]) is not _buffer(split[-2])


def _buffer(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def test_default_batch_tokens_follow_the_device(tiny_encoder):
    from elmo_cache.encoder.encoder import DEFAULT_BATCH_TOKENS

    assert tiny_encoder.default_batch_tokens == DEFAULT_BATCH_TOKENS


def test_encode_padded_matches_embed_batch(tiny_encoder):
    sentences = random_sentences(9, seed=5) + [[]]
    acts, lengths = tiny_encoder.encode_padded(sentences)
    assert acts.shape == (10, 3, int(lengths.max()), 32)
    for i, expected in enumerate(tiny_encoder.embed_batch(sentences)):
        n = int(lengths[i])
        np.testing.assert_allclose(acts[i, :, :n].numpy(), expected, atol=1e-6)
        assert not acts[i, :, n:].any()


def test_warm_state_is_deterministic_and_recorded(tiny_model):
    first = Encoder.load(tiny_model, device="cpu", initial_state="warm")
    second = Encoder.load(tiny_model, device="cpu", initial_state="warm")
    zero = Encoder.load(tiny_model, device="cpu")
    tokens = ["A", "warm", "start", "."]
    np.testing.assert_array_equal(first.embed_sentence(tokens), second.embed_sentence(tokens))
    assert np.abs(first.embed_sentence(tokens)[1] - zero.embed_sentence(tokens)[1]).max() > 1e-4
    np.testing.assert_allclose(first.embed_sentence(tokens)[0], zero.embed_sentence(tokens)[0], atol=1e-6)
    assert first.identity["initial_state"] == "warm" and len(first.identity["warmup_sha256"]) == 64
    # Stateless even when warm: batch composition does not matter.
    batch = random_sentences(20, seed=2) + [tokens]
    assert np.abs(first.embed_batch(batch)[-1] - first.embed_sentence(tokens)).max() <= 1e-5


# The README's precision table (benchmarks/precision_error.py on the bilm-tf test model), its
# figures rounded up in the last digit: max abs error, min cosine and mean cosine per token.
PRECISION_TABLE = {"bf16": (0.016, 0.9999, 0.99999), "fp16": (0.0025, 0.999995, 0.999999)}


@pytest.mark.parametrize("precision", sorted(PRECISION_TABLE))
def test_reduced_precision_error_is_what_the_readme_states(
    golden_encoder, golden_dir, golden_sentences, precision, native_bf16, monkeypatch
):
    import elmo_cache.encoder.hardware as module

    monkeypatch.setenv(module.ALLOW_SLOW_FP16_ENV, "1")  # the arithmetic is tested, not the speed
    max_abs, min_cos, mean_cos = PRECISION_TABLE[precision]
    sentences = [s.split() for batch in golden_sentences for s in batch]
    reduced = Encoder.load(
        (golden_dir / "options.json", golden_dir / "lm_weights.hdf5"), device="cpu", precision=precision
    )
    a = np.concatenate(reduced.embed_batch(sentences), axis=1)
    b = np.concatenate(golden_encoder.embed_batch(sentences), axis=1)
    assert a.shape[1] == 744 and np.abs(a - b).max() <= max_abs
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    assert cos.min() >= min_cos and cos.mean() >= mean_cos, (cos.min(), cos.mean())


@pytest.mark.parametrize("precision,tolerance", [("bf16", 0.1), ("fp16", 0.02)])
def test_reduced_precision_stays_close_to_fp32(
    tiny_model, tiny_encoder, precision, tolerance, native_bf16, monkeypatch
):
    import elmo_cache.encoder.hardware as module

    monkeypatch.setenv(module.ALLOW_SLOW_FP16_ENV, "1")  # the arithmetic is tested, not the speed
    reduced = Encoder.load(tiny_model, device="cpu", precision=precision)
    sentences = random_sentences(16, seed=9)
    for a, b in zip(reduced.embed_batch(sentences), tiny_encoder.embed_batch(sentences)):
        assert a.dtype == np.float32
        assert np.abs(a - b).max() < tolerance
        cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        assert cos.min() > 0.99


def test_bf16_on_a_cpu_without_native_bf16_is_refused(tiny_model, monkeypatch):
    import elmo_cache.encoder.hardware as module

    monkeypatch.delenv(module.ALLOW_SLOW_BF16_ENV, raising=False)
    monkeypatch.setattr(module, "cpu_bf16_problem", lambda *args: "this CPU has no native bf16 (test)")
    with pytest.raises(InvalidParameterError) as refused:
        Encoder.load(tiny_model, device="cpu", precision="bf16")
    message = str(refused.value)
    for part in ("'bf16'", "slower than fp32", "no native bf16 (test)", "'fp32'", "AVX512-BF16 or AMX"):
        assert part in message
    assert "ELMO_CACHE_ALLOW_SLOW_BF16=1" in message
    # fp32 is not concerned; the override runs bf16 anyway.
    assert Encoder.load(tiny_model, device="cpu", precision="fp32").precision == "fp32"
    monkeypatch.setenv(module.ALLOW_SLOW_BF16_ENV, "1")
    forced = Encoder.load(tiny_model, device="cpu", precision="bf16")
    assert forced.embed_sentence(["a", "b"]).shape == (3, 2, 32)
    monkeypatch.setenv(module.ALLOW_SLOW_BF16_ENV, "0")  # only "1" overrides
    with pytest.raises(InvalidParameterError, match="bf16"):
        Encoder.load(tiny_model, device="cpu", precision="bf16")


def test_fp16_on_a_cpu_is_refused_unless_asked_for(tiny_model, monkeypatch):
    import elmo_cache.encoder.hardware as module

    monkeypatch.delenv(module.ALLOW_SLOW_FP16_ENV, raising=False)
    with pytest.raises(InvalidParameterError) as refused:
        Encoder.load(tiny_model, device="cpu", precision="fp16")
    message = str(refused.value)
    for part in ("'fp16' on a CPU", "slower than fp32", "'fp32'", "CUDA", "ELMO_CACHE_ALLOW_SLOW_FP16=1"):
        assert part in message
    monkeypatch.setenv(module.ALLOW_SLOW_FP16_ENV, "1")
    forced = Encoder.load(tiny_model, device="cpu", precision="fp16")
    assert forced.precision == "fp16" and forced.embed_sentence(["a", "b"]).shape == (3, 2, 32)


def test_native_bf16_detection(tmp_path, monkeypatch):
    import elmo_cache.encoder.hardware as module

    def cpuinfo(text):
        path = tmp_path / f"cpuinfo{len(list(tmp_path.iterdir()))}"
        path.write_text(text)
        return path

    monkeypatch.setattr(module, "_torch_bf16_problem", lambda arch: None)  # torch's side: not capped
    zen4 = cpuinfo("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n")
    sapphire = cpuinfo("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n")
    haswell = cpuinfo("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    graviton3 = cpuinfo("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n")
    graviton2 = cpuinfo("processor\t: 0\nFeatures\t: fp asimd\n")
    assert module.cpu_bf16_problem(zen4) is None and module.cpu_bf16_problem(sapphire) is None
    assert module.cpu_bf16_problem(graviton3) is None
    assert "no avx512_bf16 or amx_bf16 flag" in module.cpu_bf16_problem(haswell)
    assert "no bf16 flag" in module.cpu_bf16_problem(graviton2)
    # No /proc/cpuinfo: torch's own cpuinfo queries decide; none at all: unknown, so not native.
    missing = tmp_path / "absent"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert module.cpu_bf16_problem(missing) is None
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert "neither AVX512-BF16 nor AMX" in module.cpu_bf16_problem(missing)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    assert "cannot tell" in module.cpu_bf16_problem(missing)


def test_capped_torch_is_not_native_bf16(monkeypatch):
    import elmo_cache.encoder.hardware as module

    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in module._torch_bf16_problem("x86")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")
    # Whatever this CPU is (the check must not depend on it): oneDNN able, kernels capped.
    monkeypatch.setattr(module, "_onednn_bf16", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert "dispatched to AVX2" in (module._torch_bf16_problem("x86") or "")
    monkeypatch.setattr(module, "_onednn_bf16", lambda: False)
    assert "oneDNN cannot run bf16" in (module._torch_bf16_problem("x86") or "")


def test_capped_cpu_kernels_keep_the_eager_cell(monkeypatch):
    from dataclasses import replace

    from elmo_cache.encoder.encoder import default_fuse_cell
    from elmo_cache.model.random_model import PRESETS

    big = replace(PRESETS["tiny"], lstm_dim=1024)
    cpu = torch.device("cpu")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert default_fuse_cell(big, cpu) and not default_fuse_cell(PRESETS["tiny"], cpu)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # the compiled cell gave NaN there
    assert not default_fuse_cell(big, cpu)


def test_bad_arguments_are_clear(tiny_model, tiny_encoder):
    with pytest.raises(InvalidParameterError, match="precision.*'fp8'.*fp32"):
        Encoder.load(tiny_model, precision="fp8")
    with pytest.raises(InvalidParameterError, match="initial_state"):
        Encoder.load(tiny_model, initial_state="hot")
    with pytest.raises(InvalidParameterError, match="device"):
        Encoder.load(tiny_model, device="tpu")
    with pytest.raises(InvalidParameterError, match="list of tokens"):
        tiny_encoder.embed_batch(["not tokenised"])
    with pytest.raises(InvalidParameterError, match="list of tokens"):
        tiny_encoder.embed_sentence("not tokenised")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidParameterError, match="CUDA is not available"):
            Encoder.load(tiny_model, device="cuda")


def test_identity_names_the_weights(tiny_model, tiny_encoder):
    import hashlib

    identity = tiny_encoder.identity
    assert identity["weights_sha256"] == hashlib.sha256(tiny_model[1].read_bytes()).hexdigest()
    assert identity["options"]["lstm"]["projection_dim"] == 16
    json.dumps(identity)


@requires_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_matches_cpu(tiny_model, tiny_encoder, precision):
    gpu = Encoder.load(tiny_model, device="cuda", precision=precision)
    sentences = random_sentences(32, seed=4)
    tolerance = 1e-4 if precision == "fp32" else 0.1
    for a, b in zip(gpu.embed_batch(sentences), tiny_encoder.embed_batch(sentences)):
        assert np.abs(a - b).max() < tolerance


def test_fused_cell_matches_eager_with_clipping(clipping_model):
    """The compiled cell (default for full-size models) against the eager one and the reference."""
    eager = Encoder.load(clipping_model, device="cpu", fuse_cell=False)
    fused = Encoder.load(clipping_model, device="cpu", fuse_cell=True)
    reference = ReferenceElmo(*clipping_model)
    sentences = random_sentences(10, seed=21, max_len=50)
    for tokens, a, b in zip(sentences, fused.embed_batch(sentences), eager.embed_batch(sentences)):
        assert np.abs(a - b).max() <= 1e-5
        np.testing.assert_allclose(a, reference.embed(tokens), atol=1e-5, rtol=0)
    alone = fused.embed_sentence(sentences[3])
    assert np.abs(alone - fused.embed_batch(sentences)[3]).max() <= 1e-5


def test_original_size_model_with_both_clips_firing_matches_reference(tmp_path):
    """Full Original dimensions (4096 cells, 2048 filters, 7 widths), a batch of mixed lengths."""
    from dataclasses import replace

    from elmo_cache.model.random_model import PRESETS, write_random_model

    # A random full-size model keeps its projections small, so the projection clip is lowered
    # until it fires; the cell clip fires at the published 3.0.
    options = replace(PRESETS["original"], cell_clip=3.0, proj_clip=0.05)
    files = write_random_model(tmp_path, options, seed=3)
    encoder = Encoder.load(files, device="cpu")
    reference = ReferenceElmo(*files)
    rng = np.random.default_rng(8)
    checked = [list(rng.choice(WORDS, size=n)) for n in (1, 9, 23, 41)]
    batch = random_sentences(30, seed=9) + checked
    for tokens, got in zip(checked, encoder.embed_batch(batch)[30:]):
        assert got.shape == (3, len(tokens), 1024)
        np.testing.assert_allclose(got, reference.embed(tokens), atol=1e-5, rtol=0)
    assert reference.cell_clips > 1000 and reference.proj_clips > 1000
