"""Pooled sentence vectors (``build --pool``): the pool against a numpy reference, the build (local engine; the ray
engine in tests/builder/test_distributed.py), the identity, the CLI and the server."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.errors import CacheExistsError, InvalidParameterError
from elmo_cache.rows.pooling import POOLS, parse_pool, pool_rows
from elmo_cache.server import create_app
from elmo_cache.text.tokenize import tokenize
from elmo_cache.verify.checks import verify
from tests._build_fixtures import RawMix, corpus_lines, expected_rows, write_corpus
from tests.server_helpers import LINES, UNSEEN, build_cache, decode, decode_item, run, settings


def numpy_pool(rows: np.ndarray, method: str) -> np.ndarray:
    """The reference: numpy's own reductions over the token axis of float32 token-major rows."""
    rows = np.asarray(rows, dtype=np.float32)
    if len(rows) == 0:
        width = rows.shape[-1] * (2 if method == "first-last" else 1)
        return np.zeros((*rows.shape[1:-1], width), dtype=np.float32)
    if method == "mean":
        return np.mean(rows, axis=0, dtype=np.float32)
    if method == "max":
        return np.max(rows, axis=0)
    return np.concatenate([rows[0], rows[-1]], axis=-1)


# -- the pool itself ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", POOLS)
@pytest.mark.parametrize("shape", [(1, 3, 8), (2, 8), (37, 3, 16), (5000, 2, 8)])
def test_pool_rows_equals_numpy_bit_for_bit(method, shape):
    rows = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32) * 7
    np.testing.assert_array_equal(pool_rows(rows, method), numpy_pool(rows, method))
    # A transposed (non-contiguous) view, as a layered cache hands sentences out, pools the same.
    layered = np.ascontiguousarray(rows.transpose(1, 0, 2)) if rows.ndim == 3 else None
    if layered is not None:
        np.testing.assert_array_equal(pool_rows(layered.transpose(1, 0, 2), method), numpy_pool(rows, method))
    # float16 rows widen exactly to float32 first.
    half = rows.astype(np.float16)
    np.testing.assert_array_equal(pool_rows(half, method), numpy_pool(half.astype(np.float32), method))


def test_pool_semantics_of_short_sentences():
    one = np.array([[[1.0, -2.0], [3.0, 4.0]]], dtype=np.float32)  # 1 token, 2 layers, dim 2
    np.testing.assert_array_equal(pool_rows(one, "first-last"), [[1, -2, 1, -2], [3, 4, 3, 4]])  # per layer
    np.testing.assert_array_equal(pool_rows(one, "mean"), one[0])
    two = np.array([[1.0, 5.0], [3.0, -1.0]], dtype=np.float32)  # 2 tokens of a mix, dim 2
    np.testing.assert_array_equal(pool_rows(two, "max"), [3, 5])
    np.testing.assert_array_equal(pool_rows(two, "mean"), [2, 2])
    np.testing.assert_array_equal(pool_rows(two, "first-last"), [1, 5, 3, -1])
    for method in POOLS:
        empty = pool_rows(np.empty((0, 3, 4), np.float32), method)
        assert empty.dtype == np.float32 and not empty.any() and np.isfinite(empty).all()
        assert empty.shape == ((3, 8) if method == "first-last" else (3, 4))


def test_parse_pool_names_the_parameter_and_the_choices():
    assert parse_pool(None) is None and parse_pool("none") is None and parse_pool("first-last") == "first-last"
    with pytest.raises(InvalidParameterError, match=r"pool: 'avg' is not valid; choose from \['mean', 'max', 'first-"):
        parse_pool("avg")


# -- the build ---------------------------------------------------------------------------------------

LINES_30 = corpus_lines(30, seed=8)


@pytest.mark.parametrize(
    ("fmt", "method", "extra"),
    [
        ("zarr", "mean", {"layers": "0,2", "dedupe": True}),
        ("hdf5", "max", {"fp16": True}),
        ("zarr", "first-last", {"mix": RawMix((0.2, 0.3, 0.5), gamma=0.7), "fp16": True}),
        ("hdf5", "mean", {"quantize": "int8", "dedupe": True}),
        pytest.param(  # pooled before the codes: float32, unquantised
            "zarr",
            "max",
            {"quantize": "pq:8", "layers": "1,2", "dedupe": True},
            marks=pytest.mark.skipif(importlib.util.find_spec("faiss") is None, reason="pq needs the pq extra"),
        ),
    ],
)
def test_built_pools_equal_a_numpy_reference_of_the_encoder_output(tmp_path, tiny_encoder, fmt, method, extra):
    corpus = write_corpus(tmp_path / "c.txt", LINES_30)
    output = tmp_path / ("c.zarr" if fmt == "zarr" else "c.h5")
    given = {key: value.spec() if isinstance(value, RawMix) else value for key, value in extra.items()}
    options = BuildOptions(output=output, pool=method, progress=False, batch_tokens=64, **given)
    build(corpus, options, encoder=tiny_encoder)
    cache = elmo_cache.open(output)
    float_dtype = "float16" if extra.get("fp16") else "float32"
    assert cache.pool is not None and cache.metadata["pool"] == {"method": method, "dtype": float_dtype}
    layers = None if "mix" in extra else tuple(int(x) for x in extra.get("layers", "0,1,2").split(","))
    atol = 2e-3 if extra.get("fp16") else 1e-5  # float16 storage rounds after pooling; fp32: batch round-off
    for i, line in enumerate(LINES_30):
        tokens = tokenize(line)
        got = cache.sentence_vector(i)
        assert got.dtype == np.dtype(float_dtype)
        if not tokens:
            assert not got.any()
            continue
        reference = tiny_encoder.embed_sentence(tokens)  # (3, n, D) float32, the sentence alone
        want = numpy_pool(expected_rows(reference, layers=layers, mix=extra.get("mix")), method)
        np.testing.assert_allclose(got.astype(np.float32), want, rtol=1e-3 if extra.get("fp16") else 1e-5, atol=atol)
        assert np.array_equal(got, cache.sentence_vector(line))  # by text: the first occurrence, same vector
    if extra.get("dedupe"):
        repeats = [i for i, line in enumerate(LINES_30) if line.split() and LINES_30.index(" ".join(line.split())) != i]
        assert any(cache.sentence_vector(i).any() for i in repeats)  # copies, not the zeros left while encoding
    assert verify(output).ok


def test_a_float32_cache_pools_its_own_rows_exactly(tmp_path, tiny_encoder):
    corpus = write_corpus(tmp_path / "c.txt", LINES_30)
    build(corpus, BuildOptions(output=tmp_path / "c.zarr", pool="mean", progress=False), encoder=tiny_encoder)
    cache = elmo_cache.open(tmp_path / "c.zarr")
    for i in range(len(cache)):
        # the stored rows are the float32 rows pooled at the build: numpy's mean of them, to the bit
        np.testing.assert_array_equal(cache.sentence_vector(i), numpy_pool(cache[i].transpose(1, 0, 2), "mean"))


def test_the_pool_is_part_of_the_identity(tmp_path, tiny_encoder):
    corpus = write_corpus(tmp_path / "c.txt", LINES_30[:6])
    output = tmp_path / "c.zarr"
    build(corpus, BuildOptions(output=output, pool="mean", progress=False), encoder=tiny_encoder)
    again = build(corpus, BuildOptions(output=output, pool="mean", progress=False), encoder=tiny_encoder)
    assert again.already_complete
    with pytest.raises(CacheExistsError, match=r"built with other options \(pool: \{'method': 'mean'.*'max'"):
        build(corpus, BuildOptions(output=output, pool="max", progress=False), encoder=tiny_encoder)
    with pytest.raises(CacheExistsError, match=r"pool: \{'method': 'mean', 'dtype': 'float32'\} there, None now"):
        build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    with pytest.raises(InvalidParameterError, match=r"pool: 'sum' is not valid; choose from"):
        build(corpus, BuildOptions(output=tmp_path / "x.zarr", pool="sum", progress=False), encoder=tiny_encoder)


def test_bytes_per_sentence(tmp_path, tiny_encoder):
    """What the pooled array costs: one row per sentence, against the token rows (recorded in FORMAT.md)."""
    corpus = write_corpus(tmp_path / "c.txt", LINES_30)
    build(corpus, BuildOptions(output=tmp_path / "c.h5", pool="mean", fp16=True, progress=False), encoder=tiny_encoder)
    cache = elmo_cache.open(tmp_path / "c.h5")
    n_tokens = int(cache.lengths.sum())
    assert cache.sentence_vector(0).nbytes == 3 * 32 * 2  # (layers, dim) float16 per sentence
    assert len(cache) * 3 * 32 * 2 < n_tokens * 3 * 32 * 2 / 5  # this corpus: ~13 tokens a line


# -- the CLI -----------------------------------------------------------------------------------------


def test_cli_pool(tmp_path, tiny_model):
    corpus = write_corpus(tmp_path / "c.txt", LINES_30[:8])
    model = ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--no-progress"]
    runner = CliRunner()
    bad = runner.invoke(cli, ["build", str(corpus), "--pool", "foo", *model])
    assert bad.exit_code == 2
    assert "Invalid value for '--pool': 'foo' is not one of 'none', 'mean', 'max', 'first-last'" in bad.output
    output = tmp_path / "c.zarr"
    done = runner.invoke(cli, ["build", str(corpus), "-o", str(output), "--pool", "first-last", *model])
    assert done.exit_code == 0, done.output
    info = runner.invoke(cli, ["info", str(output)])
    assert "pooled:       one first-last vector per sentence, float32" in info.output
    assert json.loads(runner.invoke(cli, ["info", str(output), "--json"]).output)["pool"]["method"] == "first-last"
    assert elmo_cache.open(output).sentence_vector(0).shape == (3, 64)


# -- the server --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pooled_cache(tmp_path_factory, tiny_encoder):
    from elmo_cache.builder import build as build_fn

    path = tmp_path_factory.mktemp("pooled") / "c.zarr"
    corpus = path.with_suffix(".txt")
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    build_fn(corpus, BuildOptions(output=path, pool="mean", fp16=True, progress=False), encoder=tiny_encoder)
    return elmo_cache.open(path)


def test_server_pool_from_the_stored_array_and_computed(tmp_path, tiny_encoder, pooled_cache):
    app = create_app(settings(), encoder=tiny_encoder, cache=pooled_cache)

    async def scenario(client):
        for line in LINES:
            index = pooled_cache.find(line)
            stored = pooled_cache.sentence_vector(index)
            for fmt in ("json", "npy", "base64"):
                response = await client.get("/embed", params={"sentence": line, "pool": "mean", "format": fmt})
                assert response.status_code == 200, response.text
                got = decode(response)
                assert got.dtype == np.float16 and got.shape == (3, 32)
                np.testing.assert_array_equal(got, stored)  # the stored pooled row, not recomputed
            body = (await client.get("/embed", params={"sentence": line, "pool": "mean", "layers": "2"})).json()
            assert body["source"] == "cache" and body["pool"] == "mean" and body["shape"] == [1, 32]
            np.testing.assert_array_equal(decode_item(body), stored[2:3])
            # Another pool than the stored one: computed in float32 from the cached token vectors, then cast.
            body = (await client.get("/embed", params={"sentence": line, "pool": "max"})).json()
            want = pool_rows(pooled_cache[index].transpose(1, 0, 2), "max").astype(np.float16)
            np.testing.assert_array_equal(decode_item(body), want)
        # Live: the encoder's float32 output pooled, then cast (float16, the cache's dtype).
        response = await client.post("/embed", json={"sentences": [UNSEEN[0], "", LINES[0]], "pool": "first-last"})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["source"] for r in results] == ["live", "cache", "cache"]  # LINES holds the empty sentence
        live = numpy_pool(tiny_encoder.embed_sentence(tokenize(UNSEEN[0])).transpose(1, 0, 2), "first-last")
        # float16: within half a unit in the last place (2**-11 relative) of a float32 value that may itself differ
        # from this one by batch round-off (README, "Determinism": <= 1e-5).
        np.testing.assert_allclose(decode_item(results[0]).astype(np.float32), live, rtol=2**-11, atol=1e-5)
        empty = decode_item(results[1])
        assert empty.shape == (3, 64) and not empty.any()
        mixed = await client.get("/embed", params={"sentence": LINES[1], "mix": "0.2,0.3,0.5", "pool": "mean"})
        rows = pooled_cache[pooled_cache.find(LINES[1])].astype(np.float32)
        want = np.tensordot(np.float32([0.2, 0.3, 0.5]), rows, axes=1)
        np.testing.assert_allclose(decode(mixed).astype(np.float32), numpy_pool(want, "mean"), rtol=2**-11, atol=1e-6)
        bad = await client.get("/embed", params={"sentence": LINES[0], "pool": "median"})
        assert bad.status_code == 422 and "mean" in bad.text and "first-last" in bad.text
        bad = await client.post("/embed", json={"sentences": [LINES[0]], "pool": None})
        assert bad.status_code == 422
        return (await client.get("/openapi.json")).json()

    schema = run(app, scenario)
    get_params = {p["name"]: p for p in schema["paths"]["/embed"]["get"]["parameters"]}
    text = json.dumps(get_params["pool"]) + json.dumps(schema["components"]["schemas"])
    assert all(f'"{method}"' in text for method in POOLS)


def test_server_pool_of_a_cache_built_without_one(tmp_path, tiny_encoder):
    cache = build_cache(tmp_path / "plain.h5", tiny_encoder, LINES, layers=(1, 2))
    app = create_app(settings(), cache=cache)  # the cache alone: hits only

    async def scenario(client):
        for line in LINES:
            response = await client.get("/embed", params={"sentence": line, "pool": "mean", "format": "npy"})
            assert response.status_code == 200 and response.headers["x-elmo-pool"] == "mean"
            want = pool_rows(cache[cache.find(line)].transpose(1, 0, 2), "mean")
            np.testing.assert_array_equal(decode(response), want)
        missing = await client.get("/embed", params={"sentence": UNSEEN[0], "pool": "mean"})
        assert missing.status_code == 404

    run(app, scenario)
