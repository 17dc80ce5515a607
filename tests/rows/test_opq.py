"""``build --quantize opq:M`` on a random tiny model (32-d): our decoder and code assignment against faiss's own
OPQ + PQ, the rotations trained deterministically, stored after the centroids and checked (verify and the reader
catch a flipped bit in them), resume reusing the staged rotations, verify's sample check of rotated codes,
Dataset/collate, export, the server's live path, unchanged pq metadata, and clear errors."""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import torch

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.errors import CacheCorruptError, CacheExistsError, InvalidParameterError
from elmo_cache.rows.codecs import codec_for_option
from elmo_cache.rows.pq import PQSentence, ProductQuantization, Training
from elmo_cache.store import load_progress, staging_path
from elmo_cache.store.format import CODEBOOKS
from elmo_cache.verify.checks import verify
from tests._build_fixtures import assert_same_cache, corpus_lines, failing_on, raw_arrays, write_corpus
from tests.rows.test_pq import _training_calls

faiss = pytest.importorskip("faiss")

DIM = 32


def correlated(rng: np.random.Generator, n: int, mix: np.ndarray) -> np.ndarray:
    """Vectors whose values are correlated across sub-vectors (what a rotation can improve on)."""
    return (rng.standard_normal((n, DIM)).astype(np.float32) * np.linspace(0.2, 3, DIM, dtype=np.float32)) @ mix


def faiss_opq(train: np.ndarray, m: int) -> tuple:
    opq = faiss.OPQMatrix(DIM, m)
    opq.niter = 5
    opq.train(train)
    pq = faiss.ProductQuantizer(DIM, m, 8)
    pq.cp.seed = 0
    pq.train(opq.apply(train))
    return opq, pq


def random_rotations(slots: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([np.linalg.qr(rng.standard_normal((DIM, DIM)))[0] for _ in range(slots)]).astype(np.float32)


# -- the scheme alone -------------------------------------------------------------------------------


def test_our_decoder_and_codes_are_faiss_opq_for_the_same_rotation_and_codebooks():
    rng = np.random.default_rng(2)
    mix = rng.standard_normal((DIM, DIM)).astype(np.float32)
    opq, pq = faiss_opq(correlated(rng, 3000, mix), 8)
    rotation = faiss.vector_to_array(opq.A).reshape(DIM, DIM)
    ours = ProductQuantization(DIM, 8, 1, scheme="opq").with_rotation(faiss.vector_to_array(pq.centroids), rotation)
    x = correlated(rng, 500, mix)
    codes = pq.compute_codes(opq.apply(x))
    theirs = opq.reverse_transform(pq.decode(codes))
    np.testing.assert_allclose(ours.dequantize(codes), theirs, rtol=1e-5, atol=1e-5)
    # The cache's flat array (centroids, then rotations) decodes the same.
    np.testing.assert_array_equal(
        ProductQuantization(DIM, 8, 1, scheme="opq").with_codebooks(ours.parameters()).dequantize(codes),
        ours.dequantize(codes),
    )
    # Without the rotation the same codes are other vectors: the test above can fail.
    plain = ProductQuantization(DIM, 8, 1).with_codebooks(faiss.vector_to_array(pq.centroids))
    assert np.abs(plain.dequantize(codes) - theirs).max() > 0.5
    # Our assignment (rotate with torch, then nearest centroids) picks faiss's codes, up to a near-tie.
    mine = ours.quantize(torch.from_numpy(x))
    assert (mine == codes).mean() > 0.999
    np.testing.assert_allclose(
        ((ours.dequantize(mine) - x) ** 2).sum(1), ((theirs - x) ** 2).sum(1), rtol=1e-4, atol=1e-5
    )


def test_each_slot_decodes_through_its_own_rotation_and_codes_do_not_depend_on_threads():
    q = ProductQuantization(DIM, 4, 3, scheme="opq")
    table = np.random.default_rng(3).standard_normal(q.codebook_shape).astype(np.float32)
    q = q.with_rotation(table, random_rotations(3, seed=4))
    x = torch.randn(9, 3, DIM)  # (tokens, slots, dim)
    torch.set_num_threads(2)
    codes = q.quantize(x)
    torch.set_num_threads(1)
    assert np.array_equal(codes, q.quantize(x)) and np.array_equal(codes[:4], q.quantize(x[:4]))
    back = q.dequantize(codes)
    for slot in range(3):
        gathered = np.concatenate([table[slot, j, codes[:, slot, j]] for j in range(4)], axis=1)  # y's centroids
        np.testing.assert_allclose(back[:, slot], gathered @ q.rotation[slot], rtol=1e-5, atol=1e-6)
        # The code of each rotated sub-vector is its nearest centroid.
        y = (x[:, slot].numpy() @ q.rotation[slot].T).reshape(9, 4, 1, 8)
        assert (((y - table[slot][None]) ** 2).sum(-1).argmin(-1) == codes[:, slot]).mean() > 0.97


def test_training_is_deterministic_seeded_and_orthonormal():
    from elmo_cache.rows.pq_training import train_codebooks

    rng = np.random.default_rng(5)
    mix = rng.standard_normal((DIM, DIM)).astype(np.float32)
    sample = np.stack([correlated(rng, 1200, mix), correlated(rng, 1200, mix.T)], axis=1)  # (n, 2 slots, dim)
    q = ProductQuantization(DIM, 4, 2, Training(rotation_iterations=3), scheme="opq")
    threads = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(2)
        a = train_codebooks(sample, q)
        faiss.omp_set_num_threads(1)
        b = train_codebooks(sample, q)
    finally:
        faiss.omp_set_num_threads(threads)
    assert np.array_equal(a.parameters(), b.parameters())
    for slot in range(2):
        np.testing.assert_allclose(a.rotation[slot] @ a.rotation[slot].T, np.eye(DIM), atol=1e-5)
    assert not np.array_equal(a.rotation[0], a.rotation[1])  # one rotation per slot
    other = train_codebooks(sample, dataclasses.replace(q, training=Training(seed=1, rotation_iterations=3)))
    assert not np.array_equal(other.parameters(), a.parameters())  # the seed matters
    # On these correlated vectors the rotation beats plain pq of the same bytes (what opq is for; measured: 0.80
    # of pq's squared error).
    plain = train_codebooks(sample, ProductQuantization(DIM, 4, 2))
    x = torch.from_numpy(sample)
    err = [float(((t.dequantize(t.quantize(x)) - sample) ** 2).sum()) for t in (a, plain)]
    assert err[0] < 0.9 * err[1], err


_TRAIN_IN_A_PROCESS = """
import hashlib, sys
import numpy as np
from elmo_cache.rows.pq import ProductQuantization, Training
from elmo_cache.rows.pq_training import train_codebooks
rng = np.random.default_rng(7)  # no product here: the sample itself must not depend on the threads
sample = (rng.standard_normal((3000, 2, 32)) * np.linspace(0.2, 3, 32)).astype(np.float32)
q = ProductQuantization(32, 4, 2, Training(rotation_iterations=2), scheme="opq")
sys.stdout.write(hashlib.sha256(train_codebooks(sample, q).parameters().tobytes()).hexdigest())
"""


@pytest.mark.parametrize("variable", ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"])
def test_training_gives_the_same_bytes_whatever_the_process_threads(variable):
    """A Ray worker runs with one thread, a local build with the machine's: the codebooks and rotations must be
    the same bytes. numpy's BLAS splits a product by its thread count and the last bits followed it on a 2-core
    Zen 5 (the rotated sample, 2 threads against 1), so the rotated sample is faiss's own product on training's one
    OpenMP thread. (On a CPU where numpy's products do not depend on the threads this passes either way.)"""
    import os
    import subprocess
    import sys

    digests = set()
    for threads in ("1", "2"):
        env = {**os.environ, variable: threads}
        run = subprocess.run(
            [sys.executable, "-c", _TRAIN_IN_A_PROCESS], env=env, capture_output=True, text=True, check=False
        )
        assert run.returncode == 0, run.stderr[-2000:]
        digests.add(run.stdout)
    assert len(digests) == 1


def test_pq_metadata_and_old_caches_are_unchanged():
    q = ProductQuantization(DIM, 8, 3)
    assert q.to_metadata() == {
        "scheme": "pq", "m": 8, "centroids": 256, "codebooks": CODEBOOKS,
        "training": {"sample": "first-rows", "vectors": 65536, "seed": 0, "iterations": 25,
                     "algorithm": "faiss-kmeans"},
    }  # fmt: skip
    assert q.parameter_count == 3 * 8 * 256 * 4 and not q.rotated
    opq = ProductQuantization(DIM, 8, 3, scheme="opq")
    assert opq.to_metadata()["rotation"] == "after-centroids"
    assert opq.to_metadata()["training"]["rotation_iterations"] == 10
    assert opq.parameter_count == q.parameter_count + 3 * DIM * DIM


def test_bad_opq_values_and_widths_are_named():
    assert codec_for_option("opq:8").name == "opq:8"
    for bad in ("opq:0", "opq:", "opq8", "oqp:8"):
        with pytest.raises(InvalidParameterError, match=r"choose from \['none', 'int8', 'pq:M', 'opq:M'\].*opq:M, "):
            codec_for_option(bad)
    with pytest.raises(InvalidParameterError, match=r"opq:5 does not divide the model's width 32.*M in \[1, 2, 4"):
        ProductQuantization(DIM, 5, 1, scheme="opq")


# -- builds ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("opq") / "c.txt", corpus_lines(200, seed=8))


@pytest.mark.parametrize(("suffix", "selection"), [(".zarr", {"layers": "0,2"}), (".h5", {"mix": "0.2,0.3,0.5"})])
def test_an_opq_build_reads_back_near_the_float_build_and_as_faiss_decodes_it(
    tmp_path, tiny_encoder, corpus, suffix, selection
):
    from elmo_cache.rows.selection import MixSpec

    if "mix" in selection:
        selection = {"mix": MixSpec.from_raw([0.2, 0.3, 0.5])}
    common = dict(device="cpu", progress=False, batch_tokens=256, **selection)
    floats = build(corpus, BuildOptions(output=tmp_path / ("f" + suffix), **common), encoder=tiny_encoder)
    quant = build(
        corpus, BuildOptions(output=tmp_path / ("q" + suffix), quantize="opq:8", **common), encoder=tiny_encoder
    )
    slots = 1 if "mix" in selection else 2
    with elmo_cache.open(floats.path) as f, elmo_cache.open(quant.path) as q:
        meta = q.metadata["quantization"]
        assert q.metadata["dtype"] == "uint8" and meta["scheme"] == "opq" and meta["rotation"] == "after-centroids"
        quantization = q.quantization
        assert quantization.rotation.shape == (slots, DIM, DIM) and quantization.codebooks.shape == (slots, 8, 256, 4)
        for slot in range(slots):
            np.testing.assert_allclose(
                quantization.rotation[slot] @ quantization.rotation[slot].T, np.eye(DIM), atol=1e-5
            )
        a = np.concatenate([f[i].reshape(-1, DIM) for i in range(len(f)) if f[i].size])
        b = np.concatenate([q[i].reshape(-1, DIM) for i in range(len(q)) if q[i].size])
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        # Measured (2,300 tokens, all in the training sample): mean cosine 0.9996 (layers), 0.9993 (mix); a
        # decoder without the rotation gives about 0.1.
        assert cos.mean() > 0.995, cos.mean()
        # faiss, given the cache's rotation and centroids, decodes the stored codes to the floats we read.
        rotation = faiss.OPQMatrix(DIM, 8)
        faiss.copy_array_to_vector(quantization.rotation[-1].reshape(-1), rotation.A)
        rotation.is_trained = True
        rotation.set_is_orthonormal()  # faiss's own check of the stored matrix (it decodes only orthonormal ones)
        assert rotation.is_orthonormal
        pq = faiss.ProductQuantizer(DIM, 8, 8)
        faiss.copy_array_to_vector(quantization.codebooks[-1].reshape(-1), pq.centroids)
        raw = q.quantized(3)
        assert isinstance(raw, PQSentence) and raw.codes.dtype == np.uint8
        np.testing.assert_array_equal(np.asarray(raw), q[3])
        codes = raw.codes[-1] if slots > 1 else raw.codes
        np.testing.assert_allclose(
            rotation.reverse_transform(pq.decode(np.ascontiguousarray(codes))), q[3][-1] if slots > 1 else q[3],
            rtol=1e-5, atol=1e-5,
        )  # fmt: skip
    report = verify(quant.path, sample=5, encoder=tiny_encoder)
    assert report.ok and report.sampled == 5, str(report)
    # M bytes a vector, as pq; the array holds the centroids, then the rotations.
    _, arrays = raw_arrays(quant.path)
    assert arrays["vectors"].dtype == np.uint8 and arrays["vectors"].shape[1:] == ((slots, 8) if slots > 1 else (8,))
    n_centroids = slots * 8 * 256 * 4
    assert arrays[CODEBOOKS].dtype == np.float32 and arrays[CODEBOOKS].size == n_centroids + slots * DIM * DIM
    np.testing.assert_array_equal(arrays[CODEBOOKS][n_centroids:], quantization.rotation.reshape(-1))


def test_resume_reuses_the_staged_rotation_and_equals_an_uninterrupted_build(tmp_path, tiny_encoder, monkeypatch):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False, quantize="opq:4",
                   chunk_rows=16, shard_rows=48, layers="1,2")  # fmt: skip
    reference = tmp_path / "reference.zarr"
    build(corpus, BuildOptions(output=reference, **options), encoder=tiny_encoder)
    output = tmp_path / "resumed.zarr"
    # The sample's encoding is the same for pq and opq (the same windows): count it with the cheaper pq.
    training_calls = _training_calls(tiny_encoder, corpus, {**options, "quantize": "pq:4"})
    for fail_at in (training_calls + 5, 9):  # a crash once the rotations are staged, then another
        with failing_on(tiny_encoder, fail_at), pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert 0 < load_progress(output).lines < 120
    staged = staging_path(output) / ".build" / "codebooks.f32"
    before = staged.read_bytes()
    # pq of the same M, or other OPQ iterations (recorded in the metadata), are refused; the staging is kept.
    from elmo_cache.builder import plan

    make = plan.codec_for_option
    monkeypatch.setattr(
        plan, "codec_for_option",
        lambda *a, **k: dataclasses.replace(make(*a, **k), training=Training(rotation_iterations=3)),
    )  # fmt: skip
    with pytest.raises(CacheExistsError, match="quantization"):
        build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    monkeypatch.undo()
    with pytest.raises(CacheExistsError, match="quantization"):
        build(corpus, BuildOptions(output=output, **{**options, "quantize": "pq:4"}), encoder=tiny_encoder)
    assert staged.read_bytes() == before
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and summary.n_sentences == 120
    arrays_out = assert_same_cache(output, reference)
    assert CODEBOOKS in arrays_out
    np.testing.assert_array_equal(arrays_out[CODEBOOKS], np.frombuffer(before, "<f4"))  # the staged ones, kept
    assert verify(output).ok


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_flipped_bit_in_a_rotation_is_caught_by_verify_and_at_open(tmp_path, tiny_encoder, corpus, suffix):
    from elmo_cache.rows.selection import MixSpec

    output = tmp_path / ("q" + suffix)
    build(corpus, BuildOptions(output=output, quantize="opq:4", progress=False, mix=MixSpec.from_raw([0.2, 0.3, 0.5])),
          encoder=tiny_encoder)  # fmt: skip
    assert verify(output).ok
    at = (4 * 256 * 8 + 100) * 4  # a byte of the rotation, after the 4 x 256 x 8 centroids
    if suffix == ".zarr":
        (chunk,) = [
            p for p in (output / "quantization" / "codebooks").rglob("*") if p.is_file() and p.name != "zarr.json"
        ]
        data = bytearray(chunk.read_bytes())
        assert len(data) == (4 * 256 * 8 + DIM * DIM) * 4  # one raw chunk: the offset is the value's
        data[at] ^= 0x10
        chunk.write_bytes(bytes(data))
    else:
        with h5py.File(output, "r") as f:
            offset = f[CODEBOOKS].id.get_offset()
        with open(output, "r+b") as f:
            f.seek(offset + at)
            byte = f.read(1)
            f.seek(offset + at)
            f.write(bytes([byte[0] ^ 0x10]))
    report = verify(output)
    assert not report.ok and "codebooks" in report.problems[0], str(report)
    with pytest.raises(CacheCorruptError, match="quantization/codebooks.*block sums"):
        elmo_cache.open(output)


def test_the_servers_live_answers_are_rotated_centroids(tmp_path, tiny_encoder, corpus):
    # Dataset, collate and export of opq caches: tests/rows/test_pq.py, parametrised over both schemes.
    build(corpus, BuildOptions(output=tmp_path / "q.zarr", quantize="opq:4", progress=False, layers="1,2"),
          encoder=tiny_encoder)  # fmt: skip
    _live_answers_are_rotated_centroids(elmo_cache.open(tmp_path / "q.zarr"), tiny_encoder)


def _live_answers_are_rotated_centroids(cache, encoder):
    from elmo_cache.server import create_app
    from tests.server_helpers import UNSEEN, decode, run, settings

    app = create_app(settings(), encoder=encoder, cache=cache)
    q = cache.quantization
    first = cache.tokens(0)

    async def scenario(client):
        hit = await client.get("/embed", params={"sentence": " ".join(first), "format": "npy"})
        assert hit.headers["x-elmo-source"] == "cache"
        np.testing.assert_array_equal(decode(hit), cache[0])
        live = await client.get("/embed", params={"sentence": UNSEEN[0], "format": "npy"})
        assert live.headers["x-elmo-source"] == "live"
        got = decode(live)  # (2, n, 32): layers 1 and 2; rotated back, every sub-vector one of its slot's centroids
        for slot in range(2):
            sub = (got[slot] @ q.rotation[slot].T).reshape(-1, 4, 8)
            gap = np.abs(sub[:, :, None, :] - q.codebooks[slot][None]).max(-1).min(-1)
            assert gap.max() < 1e-4, gap.max()
        raw = encoder.embed_batch([UNSEEN[0].split()])[0][1:]
        assert not np.array_equal(got, raw) and np.abs(got - raw).max() < 0.5

    run(app, scenario)


def test_building_without_faiss_is_refused_before_anything_is_written(tmp_path, tiny_encoder, corpus, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "faiss", None)  # as if faiss were not installed
    with pytest.raises(InvalidParameterError, match=r'trained with faiss: pip install "elmo-cache\[pq\]"'):
        build(corpus, BuildOptions(output=tmp_path / "new.zarr", quantize="opq:4"), encoder=tiny_encoder)
    assert not (tmp_path / "new.zarr").exists() and not staging_path(tmp_path / "new.zarr").exists()
