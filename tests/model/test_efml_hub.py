"""Published ELMoForManyLangs models by name (``efml-<lang>``): a real HTTP server on the loopback
interface serves archives of tiny generated models; pooch downloads them as it would from NLPL."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re
import socket
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from elmo_cache import Encoder
from elmo_cache.errors import ModelDownloadError, ModelNotFoundError
from elmo_cache.model import efml, efml_hub, sources
from tests.efml_fixtures import write_model

SENTENCE = ["我们", "是", "中文", "。", "cat"]
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def server(file_server):
    """The loopback file server (tests/conftest.py): its root folder and base URL."""
    return file_server


@pytest.fixture
def models(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "models"
    monkeypatch.setenv("ELMO_CACHE_MODELS", str(folder))
    return folder


@pytest.fixture
def model_dir(tmp_path) -> Path:
    return write_model(tmp_path / "src" / "zht.model", seed=5)


def zip_dir(directory: Path, archive: Path, prefix: str = "") -> Path:
    archive.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(directory.iterdir()):
            zf.write(path, prefix + path.name)
    return archive


def publish(monkeypatch, name: str, url: str, sha256: str | None = None) -> efml_hub.PublishedEfml:
    """Point a catalogue entry at ``url`` (the test server, or nowhere)."""
    model = dataclasses.replace(efml_hub.EFML_MODELS[name], url=url, sha256=sha256)
    monkeypatch.setitem(efml_hub.EFML_MODELS, name, model)
    return model


def unused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/repository/11/179.zip"


def test_a_name_is_downloaded_once_unpacked_and_loaded_then_found_offline(server, models, model_dir, monkeypatch):
    root, base = server
    zip_dir(model_dir, root / "repository" / "11" / "179.zip")
    publish(monkeypatch, "efml-zht", f"{base}/repository/11/179.zip")
    files = sources.resolve("efml-zht")
    assert files.origin == "elmoformanylangs-published" and files.format == efml.FORMAT
    assert files.name == "efml-zht" and files.directory == models / "efml-zht"
    assert sorted(p.name for p in (models / "efml-zht").iterdir()) == sorted(p.name for p in model_dir.iterdir())
    encoder = Encoder.load("efml-zht", device="cpu")
    expected = Encoder.load(model_dir, device="cpu").embed_sentence(SENTENCE)
    np.testing.assert_array_equal(encoder.embed_sentence(SENTENCE), expected)
    assert encoder.identity["weights_sha256"] == efml.fingerprint(model_dir)[0]
    assert encoder.identity["name"] == "efml-zht"

    publish(monkeypatch, "efml-zht", unused_url())  # no server: found again without network
    assert sources.resolve("EFML-ZHT") == files


def test_a_tar_archive_with_a_model_folder_is_found_inside_it(server, models, model_dir, monkeypatch):
    root, base = server
    with tarfile.open(root / "zhs.model.tar.bz2", "w:bz2") as tf:
        tf.add(model_dir, arcname="zhs.model")
    publish(monkeypatch, "efml-zh", f"{base}/zhs.model.tar.bz2")
    files = sources.resolve("efml-zh")
    assert files.directory == models / "efml-zh" / "zhs.model"
    assert sorted(p.name for p in (models / "efml-zh").iterdir()) == ["zhs.model"]  # the archive is removed
    vectors = Encoder.load("efml-zh", device="cpu").embed_sentence(SENTENCE)
    np.testing.assert_array_equal(vectors, Encoder.load(model_dir, device="cpu").embed_sentence(SENTENCE))


def test_an_archive_put_in_the_folder_by_hand_is_unpacked_without_network(models, model_dir, monkeypatch):
    model = publish(monkeypatch, "efml-de", unused_url().replace("179", "142"))
    zip_dir(model_dir, models / "efml-de" / model.archive_name, prefix="de.model/")
    files = sources.resolve("efml-de")
    assert files.directory == models / "efml-de" / "de.model" and (files.directory / "encoder.pkl").is_file()


@pytest.mark.parametrize(
    ("member", "why"),
    [("../evil.txt", "'..' component"), ("ok/../../evil.txt", "'..' component"), ("/tmp/evil.txt", "absolute path")],
)
def test_an_archive_with_a_member_outside_its_folder_is_refused(server, models, model_dir, monkeypatch, member, why):
    root, base = server
    archive = zip_dir(model_dir, root / "179.zip")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr(member, "escaped")
    publish(monkeypatch, "efml-zht", f"{base}/179.zip")
    with pytest.raises(ModelDownloadError) as info:
        sources.resolve("efml-zht")
    message = str(info.value)
    assert repr(member) in message and why in message and "refused" in message and "removed" in message
    assert not (models / "evil.txt").exists() and not (models.parent / "evil.txt").exists()
    assert list((models / "efml-zht").iterdir()) == []  # neither files nor the archive stay


def test_a_tar_with_a_link_is_refused(server, models, model_dir, monkeypatch):
    root, base = server
    with tarfile.open(root / "zhs.model.tar.bz2", "w:bz2") as tf:
        tf.add(model_dir, arcname="zhs.model")
        link = tarfile.TarInfo("zhs.model/word.dic.link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    publish(monkeypatch, "efml-zh", f"{base}/zhs.model.tar.bz2")
    with pytest.raises(ModelDownloadError, match="not a plain file or folder"):
        sources.resolve("efml-zh")
    assert list((models / "efml-zh").iterdir()) == []


def test_an_archive_without_a_model_or_not_an_archive_is_refused(server, models, monkeypatch):
    root, base = server
    with zipfile.ZipFile(root / "179.zip", "w") as zf:
        zf.writestr("README", "nothing here")
    (root / "page.zip").write_text("<html>not found</html>")
    publish(monkeypatch, "efml-zht", f"{base}/179.zip")
    with pytest.raises(ModelDownloadError, match=r"does not hold an ELMoForManyLangs model.*README"):
        sources.resolve("efml-zht")
    publish(monkeypatch, "efml-zht", f"{base}/page.zip")
    with pytest.raises(ModelDownloadError, match="neither a zip nor a tar archive"):
        sources.resolve("efml-zht")
    assert list((models / "efml-zht").iterdir()) == []


def test_offline_the_error_names_the_url_and_the_folder(models, monkeypatch):
    url = unused_url()
    publish(monkeypatch, "efml-zht", url)
    with pytest.raises(ModelDownloadError) as info:
        Encoder.load("efml-zht", device="cpu")
    message = str(info.value)
    for part in (url, str(models / "efml-zht"), "ELMO_CACHE_MODELS", "--model DIR", "config.json", "encoder.pkl"):
        assert part in message, part


def test_unpinned_downloads_warn_and_pinned_ones_are_verified(server, models, model_dir, monkeypatch, caplog):
    root, base = server
    archive = zip_dir(model_dir, root / "179.zip")
    publish(monkeypatch, "efml-zht", f"{base}/179.zip", sha256="0" * 64)
    with pytest.raises(ModelDownloadError, match="does not have the SHA-256 elmo-cache pins"):
        sources.resolve("efml-zht")
    assert list((models / "efml-zht").iterdir()) == []
    publish(monkeypatch, "efml-zht", f"{base}/179.zip", sha256=hashlib.sha256(archive.read_bytes()).hexdigest())
    assert sources.resolve("efml-zht").directory == models / "efml-zht"
    publish(monkeypatch, "efml-zh", f"{base}/179.zip")
    with caplog.at_level("WARNING", logger="elmo_cache.model.efml_hub"):
        sources.resolve("efml-zh")
    assert "without a pinned SHA-256" in caplog.text


def test_locate_finds_a_downloaded_model_by_its_name(server, models, model_dir, monkeypatch, tmp_path):
    root, base = server
    zip_dir(model_dir, root / "179.zip")
    publish(monkeypatch, "efml-zht", f"{base}/179.zip")
    recorded = dict(Encoder.load("efml-zht", device="cpu").identity)
    recorded["directory"] = str(tmp_path / "another-machine" / "efml-zht")  # not here: found by name
    files, why = sources.locate(recorded)
    assert why == "" and files is not None and files.directory == models / "efml-zht"
    assert files.origin == "elmoformanylangs-published"

    monkeypatch.setenv("ELMO_CACHE_MODELS", str(tmp_path / "empty"))
    files, why = sources.locate(recorded)
    assert files is None and f"'efml-zht' is not downloaded into {tmp_path / 'empty' / 'efml-zht'}" in why


def test_the_catalogue_is_the_readme_table_of_theirs():
    names = list(efml_hub.EFML_MODELS)
    assert len(names) == 45 and all(name.startswith(efml_hub.PREFIX) for name in names)
    ids = [int(m.url.rsplit("/", 1)[1].removesuffix(".zip")) for m in efml_hub.EFML_MODELS.values() if "nlpl" in m.url]
    assert sorted(ids) == list(range(136, 180))
    for model in efml_hub.EFML_MODELS.values():
        assert model.sha256 is None or re.fullmatch("[0-9a-f]{64}", model.sha256), model.name
    readme = README.read_text(encoding="utf-8")
    for model in efml_hub.EFML_MODELS.values():
        assert f"`{model.name}`" in readme and model.url in readme, model.name


def test_unknown_names_list_the_languages():
    with pytest.raises(ModelNotFoundError) as info:
        sources.resolve("efml-xx")
    assert "'efml-LANG'" in str(info.value) and "zht" in str(info.value)


def test_unpack_refuses_before_writing(tmp_path):
    archive = tmp_path / "a.zip"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("config.json", "{}")
        zf.writestr("sub\\..\\..\\evil.txt", "x")  # Windows separators count too
    archive.write_bytes(buffer.getvalue())
    with pytest.raises(ModelDownloadError, match="'..' component"):
        efml_hub.unpack(archive, tmp_path / "out")
    assert not (tmp_path / "out" / "config.json").exists()


# ------------------------------------------------------------------ unpacking limits (issue 33, item 5)
def _zip_bomb(archive: Path, sizes: list[int]) -> Path:
    """A zip whose members are runs of zeros: a few KB compressed, ``sizes`` bytes unpacked."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for i, size in enumerate(sizes):
            zf.writestr(f"m/part{i}.bin", bytes(size))
    return archive


def _tar_bomb(archive: Path, sizes: list[int]) -> Path:
    with tarfile.open(archive, "w:bz2") as tf:
        for i, size in enumerate(sizes):
            info = tarfile.TarInfo(f"m/part{i}.bin")
            info.size = size
            tf.addfile(info, io.BytesIO(bytes(size)))
    return archive


def _left(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*")) if folder.exists() else []


@pytest.mark.parametrize("make", [_zip_bomb, _tar_bomb], ids=["zip", "tar"])
def test_an_archive_unpacking_past_the_byte_limit_is_refused_before_writing(tmp_path, make):
    archive = make(tmp_path / ("bomb.zip" if make is _zip_bomb else "bomb.tar.bz2"), [600_000])
    assert archive.stat().st_size < 10_000  # small on disk, 600 kB unpacked
    with pytest.raises(ModelDownloadError) as info:
        efml_hub.unpack(archive, tmp_path / "out", efml_hub.UnpackLimits(max_bytes=100_000))
    message = str(info.value)
    assert str(archive) in message and "100000 bytes" in message and efml_hub.MAX_BYTES_ENV in message
    assert _left(tmp_path / "out") == []


@pytest.mark.parametrize("make", [_zip_bomb, _tar_bomb], ids=["zip", "tar"])
def test_members_each_small_but_over_the_total_are_refused(tmp_path, make):
    archive = make(tmp_path / ("many.zip" if make is _zip_bomb else "many.tar.bz2"), [40_000] * 5)
    with pytest.raises(ModelDownloadError, match=r"declare 200000 bytes, above the limit of 100000 bytes"):
        efml_hub.unpack(archive, tmp_path / "out", efml_hub.UnpackLimits(max_bytes=100_000))
    assert _left(tmp_path / "out") == []


@pytest.mark.parametrize("make", [_zip_bomb, _tar_bomb], ids=["zip", "tar"])
def test_an_archive_of_too_many_members_is_refused(tmp_path, make, monkeypatch):
    archive = make(tmp_path / ("many.zip" if make is _zip_bomb else "many.tar.bz2"), [1] * 12)
    monkeypatch.setenv(efml_hub.MAX_MEMBERS_ENV, "10")
    with pytest.raises(ModelDownloadError) as info:
        efml_hub.unpack(archive, tmp_path / "out")
    message = str(info.value)
    assert str(archive) in message and "12 members, above the limit of 10" in message
    assert efml_hub.MAX_MEMBERS_ENV in message and _left(tmp_path / "out") == []
    monkeypatch.setenv(efml_hub.MAX_MEMBERS_ENV, "12")  # raised: the same archive unpacks
    efml_hub.unpack(archive, tmp_path / "out")
    assert len(list((tmp_path / "out" / "m").iterdir())) == 12


def test_the_byte_limit_is_raised_by_its_environment_variable(tmp_path, monkeypatch):
    archive = _zip_bomb(tmp_path / "a.zip", [5000])
    monkeypatch.setenv(efml_hub.MAX_BYTES_ENV, "4999")
    with pytest.raises(ModelDownloadError, match="limit of 4999 bytes"):
        efml_hub.unpack(archive, tmp_path / "out")
    monkeypatch.setenv(efml_hub.MAX_BYTES_ENV, "5000")
    efml_hub.unpack(archive, tmp_path / "out")
    assert (tmp_path / "out" / "m" / "part0.bin").stat().st_size == 5000
    assert efml_hub.UnpackLimits() == efml_hub.UnpackLimits(max_bytes=4 << 30, max_members=10_000)


def _forge_sizes(archive: Path, declared: int) -> None:
    """Rewrite every size a zip declares (local headers and central directory) to ``declared``."""
    data = bytearray(archive.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        start = 0
        while (start := data.find(signature, start)) != -1:
            data[start + offset : start + offset + 4] = declared.to_bytes(4, "little")
            start += 4
    archive.write_bytes(bytes(data))


def test_a_zip_whose_members_decompress_past_their_declared_size_is_refused(tmp_path):
    archive = _zip_bomb(tmp_path / "liar.zip", [600_000])
    _forge_sizes(archive, 10)  # declares 10 bytes: within any limit before writing
    with pytest.raises(ModelDownloadError) as info:
        efml_hub.unpack(archive, tmp_path / "out", efml_hub.UnpackLimits(max_bytes=100_000))
    assert str(archive) in str(info.value) and "not the 10 bytes it declares" in str(info.value)
    assert _left(tmp_path / "out") == []


def test_bytes_written_are_counted_whatever_the_member_declares(tmp_path):
    """A reader that hands over more than the member declared (zipfile and tarfile stop at the
    declared size; this guards any that would not): refused before the excess is written."""
    member = ("m/big.bin", False, 10, lambda: io.BytesIO(bytes(600_000)))
    with pytest.raises(ModelDownloadError, match="'m/big.bin' is larger than the 10 bytes it declares"):
        efml_hub._write_members(tmp_path / "liar.zip", tmp_path, [member], efml_hub.UnpackLimits())
    assert (tmp_path / "m" / "big.bin").stat().st_size == 0
