"""``build --quantize pq:M`` on a random tiny model (32-d): our numpy decoder against faiss's, codes against the
nearest centroids, the measured error against the float build, codebooks identical across resume, stored and
checked (verify and the reader catch a flipped bit), Dataset/collate, export, the server, and clear errors."""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.errors import CacheCorruptError, CacheExistsError, InvalidParameterError
from elmo_cache.rows.codecs import codec_for_option
from elmo_cache.rows.pq import PQSentence, ProductQuantization, Training
from elmo_cache.store import load_progress, staging_path
from elmo_cache.store.format import CODEBOOKS
from elmo_cache.verify.checks import verify
from tests._build_fixtures import assert_same_cache, corpus_lines, failing_on, raw_arrays, write_corpus

faiss = pytest.importorskip("faiss")

DIM = 32


def random_codebooks(m: int, slots: int, seed: int = 0) -> ProductQuantization:
    q = ProductQuantization(DIM, m, slots)
    rng = np.random.default_rng(seed)
    return q.with_codebooks(rng.standard_normal(q.codebook_shape).astype(np.float32))


# -- the scheme alone -------------------------------------------------------------------------------


@pytest.mark.parametrize("m", [4, 8, 16])
def test_our_decoder_gives_faiss_decoded_vectors_for_the_same_codebooks(m):
    rng = np.random.default_rng(1)
    train = rng.standard_normal((3000, DIM)).astype(np.float32) * np.linspace(0.1, 3, DIM, dtype=np.float32)
    pq = faiss.ProductQuantizer(DIM, m, 8)
    pq.cp.seed = 0
    pq.train(train)
    ours = ProductQuantization(DIM, m, 1).with_codebooks(faiss.vector_to_array(pq.centroids))
    x = rng.standard_normal((500, DIM)).astype(np.float32)
    codes = pq.compute_codes(x)
    np.testing.assert_array_equal(ours.dequantize(codes), pq.decode(codes))  # same floats, bit for bit
    # Our code assignment (torch, on the build's device) picks faiss's centroid, up to a near-tie.
    mine = ours.quantize(torch.from_numpy(x))
    assert (mine == codes).mean() > 0.999
    mine_err = ((ours.dequantize(mine) - x) ** 2).sum(1)
    faiss_err = ((pq.decode(codes) - x) ** 2).sum(1)
    np.testing.assert_allclose(mine_err, faiss_err, rtol=1e-5)


def test_codes_are_the_nearest_centroids_per_slot_and_layout_is_kept():
    q = random_codebooks(8, 3)
    x = torch.randn(5, 7, 3, DIM)  # (batch, tokens, slots, dim)
    codes = q.quantize(x)  # stored dtype and shape: the codec contract (tests/test_codecs.py)
    table = q.codebooks
    sub = x.numpy().reshape(5, 7, 3, 8, 1, 4)
    dist = ((sub - table[None, None]) ** 2).sum(-1)  # slot s uses its own codebooks
    assert (codes == dist.argmin(-1)).mean() > 0.99  # up to a near-tie (|c|^2 - 2x.c rounds otherwise)
    chosen = np.take_along_axis(dist, codes[..., None].astype(np.intp), -1)[..., 0]
    np.testing.assert_allclose(chosen, dist.min(-1), rtol=1e-5, atol=1e-5)
    back = q.dequantize(codes)
    np.testing.assert_array_equal(back[1, 2, 0, 4:8], table[0, 1, codes[1, 2, 0, 1]])
    np.testing.assert_array_equal(back[1, 2, 2, 4:8], table[2, 1, codes[1, 2, 2, 1]])


def random_rotated(m: int, slots: int, seed: int = 0) -> ProductQuantization:
    """An opq quantisation with random centroids and random orthonormal rotations (no faiss training)."""
    q = ProductQuantization(DIM, m, slots, scheme="opq")
    rng = np.random.default_rng(seed)
    rotations = np.stack([np.linalg.qr(rng.standard_normal((DIM, DIM)))[0] for _ in range(slots)])
    return q.with_rotation(rng.standard_normal(q.codebook_shape).astype(np.float32), rotations.astype(np.float32))


def _rows_seen(monkeypatch, *names: str) -> list[int]:
    """The row counts torch's products ``names`` (mm, bmm, baddbmm) are called with from now on."""
    seen: list[int] = []

    def spy(name):
        product = getattr(torch, name)

        def spied(*args, **kwargs):
            left = args[1] if name == "baddbmm" else args[0]
            seen.append(int(left.shape[-2]))
            return product(*args, **kwargs)

        return spied

    for name in names:
        monkeypatch.setattr(torch, name, spy(name))
    return seen


def test_an_opq_row_decodes_to_the_same_bits_whatever_rows_are_read_with_it(monkeypatch):
    """A sentence read alone (``cache[i]``) and in a collated batch must be the same floats. The rotation back is a
    matrix product over all the rows read at once, and a BLAS may pick its kernel by the row count and give a
    row's last bits by its place: the product's rows are rounded up like the encoder's."""
    from elmo_cache.model.bilm import ROW_MULTIPLE

    q = random_rotated(4, 3)
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 256, (999, 3, 4), dtype=np.uint8)
    seen = _rows_seen(monkeypatch, "mm")
    whole = q.dequantize(codes)
    for n in (1, 2, 3, 5, 17, 100, 998):
        np.testing.assert_array_equal(q.dequantize(codes[:n]), whole[:n])
    order = rng.permutation(len(codes))
    np.testing.assert_array_equal(q.dequantize(codes[order]), whole[order])
    assert seen and all(rows % ROW_MULTIPLE == 0 for rows in seen), seen
    # The values: each slot's centroids rotated back by that slot's rotation.
    table = q.codebooks.reshape(3, 4 * 256, DIM // 4)
    y = np.stack([table[s][codes[:, s] + np.arange(4) * 256].reshape(-1, DIM) for s in range(3)], axis=1)
    np.testing.assert_allclose(whole, np.einsum("nsd,sde->nse", y, q.rotation), atol=1e-5, rtol=0)


@pytest.mark.parametrize("scheme", ["pq", "opq"])
def test_code_assignment_rounds_every_product_s_rows(monkeypatch, scheme):
    """A vector's codes must not follow the size of its batch (an update copies stored codes where a fresh build
    encodes the sentence in another batch): every product of the assignment gets a multiple of ROW_MULTIPLE
    rows, and sub-batches of any size give the whole batch's codes."""
    from elmo_cache.model.bilm import ROW_MULTIPLE

    q = random_rotated(4, 3) if scheme == "opq" else random_codebooks(4, 3)
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((203, 3, DIM)).astype(np.float32))
    seen = _rows_seen(monkeypatch, "baddbmm", "bmm")
    whole = q.quantize_rows(x)
    for n in (1, 3, 5, 77):
        assert torch.equal(q.quantize_rows(x[:n]), whole[:n])
    assert seen and all(rows % ROW_MULTIPLE == 0 for rows in seen), seen


def test_bad_pq_values_and_widths_are_named():
    assert codec_for_option("pq:8").name == "pq:8"
    for bad in ("pq:0", "pq:x", "pq:", "pq:-4", "pq8"):
        with pytest.raises(
            InvalidParameterError, match=r"choose from \['none', 'int8', 'pq:M', 'opq:M'\] \(pq:M, M sub-quant"
        ):
            codec_for_option(bad)
    with pytest.raises(
        InvalidParameterError, match=r"pq:5 does not divide the model's width 32.*M in \[1, 2, 4, 8, 16, 32\]"
    ):
        ProductQuantization(DIM, 5, 1)


# -- builds ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("pq") / "c.txt", corpus_lines(300, seed=7))


@pytest.mark.parametrize(
    ("suffix", "selection"), [(".zarr", {"layers": "0,2"}), (".h5", {}), (".zarr", {"mix": "0.2,0.3,0.5"})]
)
def test_a_pq_build_reads_back_near_the_float_build(tmp_path, tiny_encoder, corpus, suffix, selection):
    from elmo_cache.rows.selection import MixSpec

    if "mix" in selection:
        selection = {"mix": MixSpec.from_raw([0.2, 0.3, 0.5])}
    common = dict(device="cpu", progress=False, batch_tokens=256, **selection)
    floats = build(corpus, BuildOptions(output=tmp_path / ("f" + suffix), **common), encoder=tiny_encoder)
    quant = build(
        corpus, BuildOptions(output=tmp_path / ("q" + suffix), quantize="pq:8", **common), encoder=tiny_encoder
    )
    with elmo_cache.open(floats.path) as f, elmo_cache.open(quant.path) as q:
        meta = q.metadata
        assert meta["dtype"] == "uint8" and meta["quantization"]["scheme"] == "pq" and meta["quantization"]["m"] == 8
        assert q.dtype == np.float32 and q.stored_dtype == np.uint8
        slots = 1 if "mix" in selection else len(f.layers)
        assert q.quantization.codebooks.shape == (slots, 8, 256, 4)
        a = np.concatenate([f[i].reshape(-1, DIM) for i in range(len(f)) if f[i].size])
        b = np.concatenate([q[i].reshape(-1, DIM) for i in range(len(q)) if q[i].size])
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        # Measured on this model and corpus (3,400 tokens, every vector in the training sample): mean cosine
        # 0.9992, max abs error 0.076; the bounds leave room for other BLAS, not for a broken decoder
        # (decoding another slot's codebooks gives a mean cosine below 0.9).
        assert cos.mean() > 0.995 and np.abs(a - b).max() < 0.2, (cos.mean(), np.abs(a - b).max())
        # Every code is its vector's nearest centroid (what verify --sample checks against a fresh encoding).
        raw = q.quantized(3)
        assert isinstance(raw, PQSentence) and raw.codes.dtype == np.uint8
        np.testing.assert_array_equal(np.asarray(raw), q[3])
        tokens = q.tokens(5)
        np.testing.assert_array_equal(q.get(tokens), q[5])
    report = verify(quant.path, sample=5, encoder=tiny_encoder)
    assert report.ok and report.sampled == 5, str(report)
    # M bytes a vector: 8 against float16's 64 (8x smaller), measured on the stored rows.
    _, arrays = raw_arrays(quant.path)
    n_vectors = arrays["vectors"].size // 8
    assert arrays["vectors"].dtype == np.uint8 and arrays["vectors"].nbytes == n_vectors * 8
    assert arrays[CODEBOOKS].dtype == np.float32 and arrays[CODEBOOKS].size == slots * 8 * 256 * 4


# (scheme, layers, encoder batches that train the codebooks); opq's check rotates the fresh vectors first.
@pytest.mark.parametrize("scheme,layers,training_batches", [("pq:8", None, 40), ("opq:4", "2", 30)])
def test_verify_sample_finds_codes_that_are_not_the_nearest(
    tmp_path, tiny_encoder, corpus, monkeypatch, scheme, layers, training_batches
):
    output = tmp_path / "q.h5"
    real = tiny_encoder.encode_flat
    calls = {"n": 0}

    def shifted_after_training(sentences):  # a faulty encoder: right while the codebooks train, then off
        flat, offsets = real(sentences)
        calls["n"] += 1
        return (flat if calls["n"] <= training_batches else flat * 1.5 + 0.3), offsets

    monkeypatch.setattr(tiny_encoder, "encode_flat", shifted_after_training)
    build(corpus, BuildOptions(output=output, quantize=scheme, progress=False, batch_tokens=64, layers=layers),
          encoder=tiny_encoder)  # fmt: skip
    monkeypatch.undo()  # verify re-encodes with the right encoder
    assert verify(output).ok  # the bytes are as written
    report = verify(output, sample=20, encoder=tiny_encoder)
    assert not report.ok and "not the code of a fresh encoding" in report.problems[0], str(report)


def test_codebook_sample_sets_the_rows_the_codebooks_are_trained_on(tmp_path, tiny_encoder, corpus, monkeypatch):
    real, calls = tiny_encoder.encode_flat, [0]

    def counting(sentences):
        calls[0] += 1
        return real(sentences)

    monkeypatch.setattr(tiny_encoder, "encode_flat", counting)
    spent = {}
    for sample in (None, 300):  # None: 65,536 rows, more than the corpus has: the whole corpus encoded twice
        calls[0] = 0
        output = tmp_path / f"{sample}.zarr"
        options = BuildOptions(output=output, quantize="pq:4", codebook_sample=sample, progress=False, batch_tokens=64)
        build(corpus, options, encoder=tiny_encoder)
        spent[sample] = calls[0]
    assert spent[300] < spent[None]  # the same rows are written: the difference is the training sample's
    with elmo_cache.open(output) as cache:
        assert cache.metadata["quantization"]["training"]["vectors"] == 300
        assert cache.metadata["build"]["args"]["codebook_sample"] == 300
    # Another sample is another cache: refused at the same output, without --overwrite.
    with pytest.raises(CacheExistsError, match="'vectors': 300.*'vectors': 200"):
        build(corpus, dataclasses.replace(options, codebook_sample=200), encoder=tiny_encoder)
    for bad in ({"quantize": "int8", "codebook_sample": 300}, {"quantize": "opq:4", "codebook_sample": 0}):
        with pytest.raises(InvalidParameterError, match="codebook_sample.*pq:M or opq:M"):
            build(corpus, BuildOptions(output=tmp_path / "bad.zarr", **bad), encoder=tiny_encoder)
        assert not (tmp_path / "bad.zarr").exists()


def test_a_width_not_divisible_by_m_is_refused_before_anything_is_written(tmp_path, tiny_encoder, tiny_model, corpus):
    with pytest.raises(InvalidParameterError, match=r"pq:5 does not divide the model's width 32"):
        build(corpus, BuildOptions(output=tmp_path / "x.zarr", quantize="pq:5"), encoder=tiny_encoder)
    assert not (tmp_path / "x.zarr").exists() and not staging_path(tmp_path / "x.zarr").exists()
    result = CliRunner().invoke(
        cli, ["build", str(corpus), "-o", str(tmp_path / "y.zarr"), "--quantize", "pq:x", "--options-file",
              str(tiny_model[0]), "--weight-file", str(tiny_model[1])],
    )  # fmt: skip
    assert (
        result.exit_code != 0
        and "quantize: 'pq:x' is not valid; choose from ['none', 'int8', 'pq:M', 'opq:M']" in result.output
    )


@pytest.mark.parametrize(
    ("suffix", "extra"), [(".zarr", {"chunk_rows": 16, "shard_rows": 48}), (".h5", {"dedupe": True})]
)
def test_resume_reuses_the_staged_codebooks_and_equals_an_uninterrupted_build(tmp_path, tiny_encoder, suffix, extra):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False, quantize="pq:4", **extra)
    reference = tmp_path / ("reference" + suffix)
    build(corpus, BuildOptions(output=reference, **options), encoder=tiny_encoder)
    output = tmp_path / ("resumed" + suffix)
    # A crash while training (nothing staged: the next run trains again), then three while writing rows.
    training_calls = _training_calls(tiny_encoder, corpus, options)
    for fail_at in (training_calls // 2, training_calls + 7, 3, 11):
        with failing_on(tiny_encoder, fail_at), pytest.raises(RuntimeError, match="simulated crash"):
            build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
        if fail_at == training_calls // 2:
            assert not (staging_path(output) / ".build" / "codebooks.json").exists()
    assert 0 < load_progress(output).lines < 120
    staged = staging_path(output) / ".build" / "codebooks.f32"
    before = staged.read_bytes()
    # Another M, or the floats, are refused and named; the interrupted build (and its codebooks) is kept.
    for other in ({"quantize": "pq:8"}, {"quantize": None}):
        with pytest.raises(CacheExistsError, match="quantization|dtype"):
            build(corpus, BuildOptions(output=output, **{**options, **other}), encoder=tiny_encoder)
    assert staged.read_bytes() == before
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and summary.n_sentences == 120
    arrays_out = assert_same_cache(output, reference)
    assert CODEBOOKS in arrays_out
    np.testing.assert_array_equal(arrays_out[CODEBOOKS], np.frombuffer(before, "<f4"))  # the staged ones, kept
    assert verify(output).ok


def _training_calls(encoder, corpus, options) -> int:
    """Encoder batches spent training the codebooks: a pq build's, less a float build's of the same rows."""
    calls = []
    for quantize in ("pq:4", None):
        real, count = encoder.encode_flat, [0]

        def counting(sentences, real=real, count=count):
            count[0] += 1
            return real(sentences)

        encoder.encode_flat = counting
        try:
            output = corpus.with_name(f"count-{quantize}.zarr".replace(":", ""))
            build(corpus, BuildOptions(output=output, **{**options, "quantize": quantize}), encoder=encoder)
        finally:
            del encoder.encode_flat
        calls.append(count[0])
    assert calls[0] > calls[1] > 0
    return calls[0] - calls[1]


def test_the_codebooks_are_a_function_of_the_sample_alone_whatever_the_thread_count(tiny_encoder, corpus):
    from elmo_cache.builder.codebooks import corpus_windows, training_sample
    from elmo_cache.builder.plan import make_plan
    from elmo_cache.rows.pq_training import train_codebooks
    from elmo_cache.text.corpus import Corpus

    source = Corpus(corpus)
    plan = make_plan(source, BuildOptions(output=corpus.with_suffix(".zarr"), quantize="pq:8"))
    sample = training_sample(corpus_windows(source, 512), tiny_encoder, plan, 256, 10**6)
    assert sample.shape == (3400, 3, DIM) or sample.shape[1:] == (3, DIM)
    q = plan.bound_codec(DIM)
    threads = faiss.omp_get_max_threads()
    try:
        faiss.omp_set_num_threads(2)
        a = train_codebooks(sample, q).codebooks
        faiss.omp_set_num_threads(1)
        b = train_codebooks(sample, q).codebooks
    finally:
        faiss.omp_set_num_threads(threads)
    np.testing.assert_array_equal(a, b)
    assert faiss.omp_get_max_threads() == threads  # training leaves faiss's threads as they were
    other = train_codebooks(sample, ProductQuantization(DIM, 8, 3, Training(seed=1)))
    assert not np.array_equal(other.codebooks, a)  # the seed matters: the test above can fail


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_flipped_bit_in_the_codebooks_is_caught_by_verify_and_at_open(tmp_path, tiny_encoder, corpus, suffix):
    output = tmp_path / ("q" + suffix)
    build(corpus, BuildOptions(output=output, quantize="pq:8", progress=False), encoder=tiny_encoder)
    assert verify(output).ok
    if suffix == ".zarr":
        chunk = next(
            p for p in (output / "quantization" / "codebooks").rglob("*") if p.is_file() and p.name != "zarr.json"
        )
        data = bytearray(chunk.read_bytes())
        data[1000] ^= 0x10
        chunk.write_bytes(bytes(data))
    else:
        with h5py.File(output, "r") as f:
            offset = f[CODEBOOKS].id.get_offset()
        with open(output, "r+b") as f:
            f.seek(offset + 1000)
            byte = f.read(1)
            f.seek(offset + 1000)
            f.write(bytes([byte[0] ^ 0x10]))
    report = verify(output)
    assert not report.ok and "codebooks" in report.problems[0], str(report)
    with pytest.raises(CacheCorruptError, match="quantization/codebooks.*block sums"):
        elmo_cache.open(output)


@pytest.mark.parametrize("scheme", ["pq:16", "opq:4"])
def test_dataset_collate_export_and_cli(tmp_path, tiny_model, corpus, scheme):
    output = tmp_path / "q.zarr"
    result = CliRunner().invoke(
        cli, ["build", str(corpus), "-o", str(output), "--quantize", scheme, "--layers", "1,2", "--no-progress",
              "--codebook-sample", "2000",
              "--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    cache = elmo_cache.open(output)
    assert cache.metadata["quantization"]["training"]["vectors"] == 2000
    dataset = elmo_cache.CacheDataset(output, list(range(len(cache))))
    picks = (0, 3, 4, 7)
    items = [dataset[i] for i in picks]
    assert all(isinstance(item[0], PQSentence) for item in items)
    batch = elmo_cache.collate(items)  # zero padding (not centroid 0): the codec contract (tests/test_codecs.py)
    assert batch.vectors.shape[1] == 2
    for b, i in enumerate(picks):
        n = int(batch.lengths[b])
        np.testing.assert_array_equal(batch.vectors[b, :, :n].numpy(), cache[i])
    from elmo_cache.compat.export import export

    export(output, tmp_path / "allennlp.h5")
    with h5py.File(tmp_path / "allennlp.h5", "r") as f:
        for i in range(len(cache)):
            assert f[str(i)].dtype == np.float32
            np.testing.assert_array_equal(f[str(i)][...], cache[i])


def test_the_servers_live_answers_go_through_the_codebooks_as_its_hits(tmp_path, tiny_encoder):
    from elmo_cache.server import create_app
    from tests.server_helpers import LINES, UNSEEN, decode, run, settings

    corpus = write_corpus(tmp_path / "lines.txt", LINES)
    build(corpus, BuildOptions(output=tmp_path / "q.zarr", quantize="pq:8", progress=False, layers="1,2"),
          encoder=tiny_encoder)  # fmt: skip
    cache = elmo_cache.open(tmp_path / "q.zarr")
    app = create_app(settings(), encoder=tiny_encoder, cache=cache)
    table = cache.quantization.codebooks

    async def scenario(client):
        hit = await client.get("/embed", params={"sentence": LINES[0], "format": "npy"})
        assert hit.headers["x-elmo-source"] == "cache" and hit.headers["x-elmo-dtype"] == "float32"
        np.testing.assert_array_equal(decode(hit), cache[0])
        live = await client.get("/embed", params={"sentence": UNSEEN[0], "format": "npy"})
        assert live.headers["x-elmo-source"] == "live"
        got = decode(live)  # (2, n, 32): layers 1 and 2, every sub-vector one of its slot's centroids
        for slot in range(2):
            sub = got[slot].reshape(-1, 8, 4)
            on_grid = (np.abs(sub[:, :, None, :] - table[slot][None]).sum(-1) == 0).any(-1)
            assert on_grid.all()
        raw = tiny_encoder.embed_batch([UNSEEN[0].split()])[0][1:]
        assert not np.array_equal(got, raw) and np.abs(got - raw).max() < 0.3

    run(app, scenario)


def test_reading_needs_no_faiss_and_building_without_it_says_what_to_install(
    tmp_path, tiny_encoder, corpus, monkeypatch
):
    import sys

    output = tmp_path / "q.zarr"
    build(corpus, BuildOptions(output=output, quantize="pq:8", progress=False), encoder=tiny_encoder)
    with elmo_cache.open(output) as cache:
        want = [cache[i] for i in range(5)]
    monkeypatch.setitem(sys.modules, "faiss", None)  # as if faiss were not installed
    with elmo_cache.open(output) as cache:
        for i in range(5):
            np.testing.assert_array_equal(cache[i], want[i])
        batch = elmo_cache.collate([cache.quantized(i) for i in range(5)])
        np.testing.assert_array_equal(batch.vectors[2, :, : want[2].shape[1]].numpy(), want[2])
    assert verify(output, sample=3, encoder=tiny_encoder).ok
    with pytest.raises(InvalidParameterError, match=r'trained with faiss: pip install "elmo-cache\[pq\]"'):
        build(corpus, BuildOptions(output=tmp_path / "new.zarr", quantize="pq:8", progress=False), encoder=tiny_encoder)
    assert not (tmp_path / "new.zarr").exists() and not staging_path(tmp_path / "new.zarr").exists()  # refused first
