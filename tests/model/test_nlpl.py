"""NLPL / simple_elmo models (elmo_cache.model.nlpl, sources.NlplSource): a directory of options.json and
model.hdf5 and its zip, made from a tiny random model in the bilm-tf layout, load wherever a model is taken
and compute exactly the vectors of the options/weights pair they hold; unsafe archives are refused."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from elmo_cache import Encoder
from elmo_cache.builder import BuildOptions, build
from elmo_cache.errors import ModelDownloadError, ModelNotFoundError
from elmo_cache.model import efml_hub, nlpl, sources
from elmo_cache.model.random_model import write_random_model
from elmo_cache.reader.cache import open as open_cache
from tests.efml_fixtures import write_model as write_efml_model

SENTENCES = [["The", "cat", "sat", "."], ["Ölçü", "birimi"], ["x"]]


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "models"
    monkeypatch.setenv("ELMO_CACHE_MODELS", str(folder))
    return folder


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return write_random_model(tmp_path_factory.mktemp("pair"), "tiny", seed=11)


def nlpl_dir(pair: tuple[Path, Path], folder: Path) -> Path:
    """The pair laid out as the NLPL repository ships a model: options.json, model.hdf5, meta.json, vocab.txt."""
    folder.mkdir(parents=True)
    shutil.copy(pair[0], folder / "options.json")
    shutil.copy(pair[1], folder / "model.hdf5")
    (folder / "meta.json").write_text(json.dumps({"id": 999, "algorithm": {"name": "ELMo"}}), encoding="utf-8")
    (folder / "vocab.txt").write_text("<S>\n</S>\n<UNK>\nthe\n", encoding="utf-8")
    (folder / "README").write_text("a model", encoding="utf-8")
    return folder


def zip_of(directory: Path, archive: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(directory.iterdir()):
            zf.write(path, prefix + path.name)
    return archive


def vectors(model) -> list[np.ndarray]:
    return Encoder.load(model, device="cpu").embed_batch(SENTENCES)


def same(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_directory_computes_the_vectors_of_its_pair(tmp_path, pair):
    folder = nlpl_dir(pair, tmp_path / "209")
    files = sources.resolve(str(folder))
    assert (files.origin, files.options_file.name, files.weight_file.name) == ("nlpl", "options.json", "model.hdf5")
    encoder = Encoder.load(str(folder), device="cpu")
    assert encoder.identity["directory"] == str(folder.resolve())
    same(encoder.embed_batch(SENTENCES), vectors(pair))


@pytest.mark.parametrize("prefix", ["", "209/"], ids=["flat", "in-a-folder"])
def test_a_zip_is_unpacked_once_into_the_model_cache_and_loads_the_same(tmp_path, pair, models, prefix):
    (tmp_path / "dl").mkdir()
    archive = zip_of(nlpl_dir(pair, tmp_path / "209"), tmp_path / "dl" / "209.zip", prefix)
    files = sources.resolve(str(archive))
    assert files.origin == "nlpl" and files.name == "209" and models in files.directory.parents
    same(vectors(str(archive)), vectors(pair))
    unpacked = files.directory
    stamp = (unpacked / "model.hdf5").stat().st_mtime_ns
    assert sources.resolve(str(archive)).directory == unpacked  # found, not unpacked again
    assert (unpacked / "model.hdf5").stat().st_mtime_ns == stamp
    assert archive.is_file()  # the user's archive is left alone
    assert [p.name for p in (models / "nlpl").iterdir()] == [unpacked.relative_to(models / "nlpl").parts[0]]


def test_a_build_names_the_zip_and_serve_finds_the_unpacked_folder_again(tmp_path, pair, models):
    archive = zip_of(nlpl_dir(pair, tmp_path / "209"), tmp_path / "209.zip")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(" ".join(s) for s in SENTENCES) + "\n", encoding="utf-8")
    build(corpus, BuildOptions(output=tmp_path / "c.zarr", model=str(archive), device="cpu", progress=False))
    with open_cache(tmp_path / "c.zarr") as cache:
        for i, want in enumerate(vectors(pair)):  # batched otherwise than embed_batch: float round-off apart
            np.testing.assert_allclose(cache[i], want, rtol=1e-5, atol=1e-6)
        files, why = sources.locate(cache.metadata["model"])
    assert why == "" and files is not None and files.origin == "nlpl"


def test_a_zip_holding_an_elmoformanylangs_model_loads_as_one(tmp_path, models):
    model = write_efml_model(tmp_path / "src" / "zht.model", seed=3)
    archive = zip_of(model, tmp_path / "179.zip", "zht.model/")
    files = sources.resolve(str(archive))
    assert files.format == "elmoformanylangs"
    same(vectors(str(archive)), vectors(str(model)))


def test_the_only_hdf5_is_taken_and_a_choice_between_several_is_refused(tmp_path, pair):
    folder = nlpl_dir(pair, tmp_path / "m")
    (folder / "model.hdf5").rename(folder / "elmo_en.hdf5")
    same(vectors(str(folder)), vectors(pair))
    shutil.copy(folder / "elmo_en.hdf5", folder / "other.hdf5")
    with pytest.raises(ModelNotFoundError, match=r"no model.hdf5 and 2 other HDF5 files \(\['elmo_en.hdf5'"):
        nlpl.model_files(folder)


@pytest.mark.parametrize(
    ("member", "why"),
    [("../evil.txt", "'..' component"), ("/tmp/evil.txt", "absolute path")],
)
def test_an_unsafe_zip_is_refused_and_nothing_is_left(tmp_path, pair, models, member, why):
    archive = zip_of(nlpl_dir(pair, tmp_path / "209"), tmp_path / "209.zip")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr(member, "escaped")
    with pytest.raises(ModelDownloadError, match=why):
        Encoder.load(str(archive), device="cpu")
    assert not (tmp_path / "evil.txt").exists() and not (models / "evil.txt").exists()
    assert [p for p in (models / "nlpl").rglob("*")] == []


def test_a_zip_over_the_unpack_limit_or_without_a_model_is_refused(tmp_path, pair, models, monkeypatch):
    archive = zip_of(nlpl_dir(pair, tmp_path / "209"), tmp_path / "209.zip")
    monkeypatch.setenv(efml_hub.MAX_BYTES_ENV, "1000")
    with pytest.raises(ModelDownloadError, match=r"above the limit of 1000 bytes unpacked"):
        sources.resolve(str(archive))
    monkeypatch.delenv(efml_hub.MAX_BYTES_ENV)
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as zf:
        zf.writestr("README", "nothing")
    with pytest.raises(ModelDownloadError, match=r"holds no model at its top or in one folder.*README"):
        sources.resolve(str(empty))
    (tmp_path / "page.zip").write_text("<html>not found</html>", encoding="utf-8")
    with pytest.raises(ModelNotFoundError, match="not a zip archive"):
        sources.resolve(str(tmp_path / "page.zip"))
    assert [p for p in (models / "nlpl").rglob("*")] == []


def test_the_unknown_model_message_names_the_nlpl_forms():
    with pytest.raises(ModelNotFoundError, match=r"an NLPL / simple_elmo directory \(options.json \+ model.hdf5\)"):
        sources.resolve("no-such-model")
