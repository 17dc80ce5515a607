"""The bundled model is the default everywhere, offline; ``serve CACHE`` finds the model the cache records."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache import Encoder
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.model import hub, sources
from elmo_cache.model.random_model import write_random_model
from elmo_cache.server import Settings, create_app, load_resources
from elmo_cache.text.tokenize import tokenize

LINES = ["The cat sat on the mat .", "hello world", "", "Colourless green ideas sleep furiously ."]
UNSEEN = "a sentence the cache lacks"


def _corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def _get(app, sentence: str, **params) -> httpx.Response:
    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://elmo.test") as client:
                return await client.get("/embed", params={"sentence": sentence, "format": "npy", **params})

    return asyncio.run(main())


def _vectors(response: httpx.Response) -> np.ndarray:
    import io

    return np.load(io.BytesIO(response.content), allow_pickle=False)


def test_encoder_load_without_a_name_is_the_bundled_model(bundled_model, offline):
    encoder = Encoder.load(device="cpu")
    assert encoder.name == "bundled" and encoder.output_dim == 256
    assert encoder.identity["weights_sha256"] == hub.file_sha256(bundled_model.weight_file)
    assert encoder.embed_sentence(["Hello", "!"]).shape == (3, 2, 256)
    assert Encoder.load("bundled", device="cpu").identity == encoder.identity


def _readme_python_blocks() -> list[str]:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    return [block.split("```", 1)[0] for block in readme.split("```python\n")[1:]]


def test_the_readme_python_examples_run_unchanged_offline(tmp_path, bundled_model, offline, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _corpus(tmp_path)
    result = CliRunner().invoke(cli, ["build", "corpus.txt", "--layers", "1,2", "--fp16", "--no-progress"])
    assert result.exit_code == 0, result.output
    blocks = _readme_python_blocks()
    assert len(blocks) >= 2 and "elmo_cache.open" in blocks[0] and "Encoder.load()" in blocks[1]
    namespaces: list[dict] = []
    for block in blocks:
        namespaces.append({})
        exec(compile(block, "README.md", "exec"), namespaces[-1])
    assert namespaces[1]["ds"][0] is not None and namespaces[1]["enc"].name == "bundled"


def test_the_readme_main_job_works_offline(tmp_path, bundled_model, offline):
    corpus = _corpus(tmp_path)
    runner = CliRunner()
    result = runner.invoke(cli, ["build", str(corpus), "--layers", "1,2", "--fp16", "--no-progress", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    output = tmp_path / "corpus.zarr"
    with elmo_cache.open(output) as cache:
        assert cache.metadata["model"]["name"] == "bundled" and cache.layers == (1, 2)
    verified = runner.invoke(cli, ["verify", str(output), "--sample", "2", "--device", "cpu"])
    assert verified.exit_code == 0 and "2 sampled sentences match" in verified.output, verified.output

    # serve CACHE without --model: the cache records the bundled model, which is always here.
    settings = Settings(cache_path=output, device="cpu", max_wait_ms=1.0)
    encoder, cache = load_resources(settings)
    assert encoder is not None and encoder.name == "bundled" and encoder.identity["precision"] == "fp32"
    app = create_app(settings, encoder=encoder, cache=cache)
    hit = _get(app, LINES[0])
    assert hit.headers["x-elmo-source"] == "cache"
    live_of_a_cached_sentence = encoder.embed_batch([tokenize(LINES[0])])[0][[1, 2]].astype(np.float16)
    np.testing.assert_allclose(
        _vectors(hit).astype(np.float32), live_of_a_cached_sentence.astype(np.float32), rtol=2.0**-10, atol=1e-5
    )
    miss = _get(app, UNSEEN)
    assert miss.headers["x-elmo-source"] == "live" and miss.headers["x-elmo-dtype"] == "float16"
    cache.close()


def test_a_recorded_precision_this_cpu_refuses_serves_the_cache_alone(tmp_path, caplog, monkeypatch):
    import elmo_cache.encoder.encoder

    folder = tmp_path / "model"
    write_random_model(folder, "tiny", seed=6)
    monkeypatch.setenv(elmo_cache.encoder.hardware.ALLOW_SLOW_FP16_ENV, "1")  # built where fp16 was allowed
    build(
        _corpus(tmp_path), BuildOptions(output=tmp_path / "c.zarr", model=str(folder), precision="fp16", progress=False)
    )
    monkeypatch.delenv(elmo_cache.encoder.hardware.ALLOW_SLOW_FP16_ENV)  # served on a CPU that refuses it
    cache = elmo_cache.open(tmp_path / "c.zarr")
    with caplog.at_level(logging.WARNING, logger="elmo_cache.server"):
        encoder, _ = load_resources(Settings(device="cpu"), cache=cache)
    assert encoder is None
    assert "cache only" in caplog.text and "'fp16' on a CPU" in caplog.text and "--precision" in caplog.text
    app = create_app(Settings(max_wait_ms=1.0, device="cpu"), cache=cache)
    assert _get(app, LINES[1]).headers["x-elmo-source"] == "cache"
    assert _get(app, UNSEEN).status_code == 404
    cache.close()


def test_a_published_model_is_used_only_when_already_downloaded(tmp_path, offline, caplog, monkeypatch):
    folder = tmp_path / "model-cache" / "small"
    write_random_model(folder, "tiny", seed=5, name=hub.PUBLISHED_MODELS["small"].stem)  # stands in for the download
    corpus = _corpus(tmp_path)
    build(corpus, BuildOptions(output=tmp_path / "c.h5", model="small", device="cpu", progress=False))
    cache = elmo_cache.open(tmp_path / "c.h5")
    assert cache.metadata["model"]["name"] == "small"

    encoder, _ = load_resources(Settings(device="cpu"), cache=cache)
    assert encoder is not None and encoder.name == "small"

    for path in folder.iterdir():
        path.unlink()
    with caplog.at_level(logging.WARNING, logger="elmo_cache.server"):
        encoder, _ = load_resources(Settings(device="cpu"), cache=cache)
    assert encoder is None
    assert "cache only" in caplog.text and "'small' is not downloaded" in caplog.text
    app = create_app(Settings(max_wait_ms=1.0, device="cpu"), cache=cache)
    assert _get(app, LINES[1]).headers["x-elmo-source"] == "cache"
    missing = _get(app, UNSEEN)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_in_cache"
    cache.close()


def test_a_local_directory_is_used_while_it_holds_the_same_weights(tmp_path, offline, caplog):
    directory = tmp_path / "my-model"
    write_random_model(directory, "tiny", seed=6)
    corpus = _corpus(tmp_path)
    build(corpus, BuildOptions(output=tmp_path / "c.zarr", model=str(directory), device="cpu", progress=False))
    cache = elmo_cache.open(tmp_path / "c.zarr")
    assert cache.metadata["model"]["directory"] == str(directory.resolve())

    encoder, _ = load_resources(Settings(device="cpu"), cache=cache)
    assert encoder is not None and encoder.directory == directory.resolve()
    np.testing.assert_array_equal(
        encoder.embed_batch([tokenize(LINES[3])])[0],
        Encoder.load(directory, device="cpu").embed_sentence(tokenize(LINES[3])),
    )

    write_random_model(directory, "tiny", seed=7)  # same names, other weights
    with caplog.at_level(logging.WARNING, logger="elmo_cache.server"):
        encoder, _ = load_resources(Settings(device="cpu"), cache=cache)
    assert encoder is None and "now holds other weights" in caplog.text
    cache.close()


def test_a_cache_built_from_explicit_files_is_served_alone(tmp_path, tiny_encoder, offline, caplog):
    corpus = _corpus(tmp_path)
    build(corpus, BuildOptions(output=tmp_path / "c.zarr", progress=False), encoder=tiny_encoder)
    with caplog.at_level(logging.WARNING, logger="elmo_cache.server"):
        encoder, cache = load_resources(Settings(cache_path=tmp_path / "c.zarr"))
    assert encoder is None and cache is not None and "not available locally" in caplog.text
    cache.close()


@pytest.mark.parametrize("name", ["bundled", "BUNDLED"])
def test_the_bundled_model_is_a_model_name(bundled_model, name):
    files = sources.resolve(name)
    assert files.origin == "bundled" and files.options_file.name == "options.json"
    assert files.weight_file == bundled_model.weight_file


def test_a_missing_bundled_model_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "BUNDLED_DIR", tmp_path)
    with pytest.raises(elmo_cache.ModelNotFoundError, match=r"bundled model is incomplete.*weights.hdf5.*--model"):
        Encoder.load()
