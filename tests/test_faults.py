"""Fault injection: a damaged cache answers correctly or raises a clear error, never a wrong vector, never hangs.

Each case copies a pristine cache (built once per module), damages one file (zarr) or one dataset / the
file (HDF5) -- delete, truncate, flip one bit, replace by a FIFO or by a link to a file outside the cache --
then reads every sentence through ``cache[i]``, ``cache.get``, the torch Dataset and the server, and
compares every answer with the pristine cache's vectors.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
from pathlib import Path

import h5py
import httpx
import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.errors import CacheCorruptError, CacheFormatError, ElmoCacheError
from elmo_cache.reader.dataset import CacheDataset, collate
from elmo_cache.server import Settings, create_app

# Distinct lines (no two sentences share vectors by accident), one empty, lengths 1..9.
LINES = [" ".join([f"s{i}", *["w"] * (i % 9)]) for i in range(36)]
LINES[7] = ""

ZARR_FILES = {
    "vectors": "vectors/c/1/0/0",  # a middle shard (rows 10..19)
    "vectors-array-json": "vectors/zarr.json",
    "offsets": "offsets/c/0",
    "lengths": "lengths/c/0",
    "tokens-bytes": "tokens/bytes/c/0",
    "tokens-offsets": "tokens/offsets/c/0",
    "index-hashes": "index/hashes/c/0",
    "index-rows": "index/rows/c/0",
    "metadata": "zarr.json",
    "blocksums-vectors": "blocksums/vectors/c/0",
    "blocksums-offsets": "blocksums/offsets/c/0",
    "checksums-json": "checksums.json",
}
FILE_FAULTS = ["delete", "truncate", "flip", "fifo", "link"]
HDF5_DATASETS = [
    "vectors",
    "offsets",
    "lengths",
    "tokens/bytes",
    "tokens/offsets",
    "index/hashes",
    "index/rows",
    "blocksums/vectors",
    "blocksums/offsets",
    "blocksums/index_hashes",
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, tiny_encoder):
    """{format: (path, true vectors per sentence)} built once for the module."""
    root = tmp_path_factory.mktemp("pristine")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    caches = {}
    for fmt, name in (("zarr", "c.zarr"), ("hdf5", "c.h5")):
        options = BuildOptions(
            output=root / name,
            chunk_rows=5 if fmt == "zarr" else None,  # chunks of 5 rows in files of 10: many files
            shard_rows=10 if fmt == "zarr" else None,
            progress=False,
        )
        path = build(corpus, options, encoder=tiny_encoder).path
        with elmo_cache.open(path) as cache:
            caches[fmt] = (path, [np.array(cache[i]) for i in range(len(cache))])
    return caches


def _flip(path: Path, position: int) -> None:
    """Flip the lowest bit of the byte at ``position`` (the low byte of a little-endian number: +-1)."""
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 1]))


def _damage_file(target: Path, fault: str, outside: Path) -> None:
    size = target.stat().st_size
    if fault == "delete":
        target.unlink()
    elif fault == "truncate":
        os.truncate(target, size // 2)
    elif fault == "flip":
        _flip(target, (size // 2) // 8 * 8)  # aligned: the low byte of an 8-, 4- or 2-byte number
    elif fault == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif fault == "link":  # a link out of the cache to a file of the right size holding zeros (a partial sync)
        outside.parent.mkdir(parents=True, exist_ok=True)
        outside.write_bytes(bytes(size))
        target.unlink()
        target.symlink_to(outside)
    else:
        raise AssertionError(fault)


def _damage_hdf5_dataset(path: Path, name: str) -> None:
    if name == "metadata":
        # Inside the value of "tokenization" ("whitespace"): only the metadata's CRC-32 can tell.
        data = path.read_bytes()
        key = b'"tokenization": "'
        positions = [i for i in range(len(data)) if data.startswith(key, i)]
        assert positions
        for i in positions:  # every copy HDF5 keeps of the attribute
            _flip(path, i + len(key) + 2)
        return
    with h5py.File(path, "r") as f:
        dataset = f[name]
        offset, nbytes = dataset.id.get_offset(), dataset.nbytes
    assert offset is not None and nbytes > 0
    _flip(path, offset + (nbytes // 2) // 8 * 8)


@contextlib.contextmanager
def no_hang(seconds: float = 30.0):
    """Fail (rather than hang the suite) when the case blocks, e.g. in an open() of a FIFO."""

    def alarm(signum, frame):
        raise TimeoutError(f"the read hung for {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _answer(call, expected: np.ndarray) -> str:
    """'ok' when ``call()`` returns ``expected`` exactly, 'error' when it raises a library error."""
    try:
        got = call()
    except ElmoCacheError:
        return "error"
    assert got is not None, "a cached sentence answered as absent"
    got = np.asarray(got)
    assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, expected.shape)
    assert np.array_equal(got, expected), "a wrong vector"
    return "ok"


def _check_library(path: Path, truth: list[np.ndarray]) -> list[str]:
    try:
        cache = elmo_cache.open(path)
    except ElmoCacheError:
        return ["error"]
    outcomes = []
    with cache:
        assert len(cache) == len(truth)
        for i, expected in enumerate(truth):
            outcomes.append(_answer(lambda i=i: cache[i], expected))
        for i, line in enumerate(LINES):
            if line:  # distinct non-empty lines: get(line) is sentence i
                outcomes.append(_answer(lambda line=line: cache.get(line), truth[i]))
    try:
        dataset = CacheDataset(path)
    except ElmoCacheError:
        return [*outcomes, "error"]
    for i, expected in enumerate(truth):
        outcomes.append(_answer(lambda i=i: dataset[i], expected))
    try:
        batch = collate([dataset[i] for i in range(4)])
    except ElmoCacheError:
        outcomes.append("error")
    else:
        for i in range(4):
            n = truth[i].shape[-2]
            assert np.array_equal(batch.vectors[i, ..., :n, :].numpy(), truth[i].astype(np.float32, copy=False))
    return outcomes


def _check_server(path: Path, truth: list[np.ndarray]) -> list[str]:
    """GET /embed for a few sentences spread over the files: 200 with the true vectors, or >= 400 with a
    JSON error body. No model: a miss could not be hidden by a live encoding."""
    try:
        cache = elmo_cache.open(path)
    except ElmoCacheError:
        return ["error"]
    app = create_app(Settings(max_wait_ms=2.0), cache=cache)
    picks = [0, 5, 12, 18, 25, 35]

    async def scenario() -> list[str]:
        outcomes = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://elmo.test", timeout=10) as client:
                for i in picks:
                    response = await asyncio.wait_for(
                        client.get("/embed", params={"sentence": LINES[i], "format": "npy"}), 10
                    )
                    if response.status_code == 200:
                        got = np.load(io.BytesIO(response.content), allow_pickle=False)
                        assert got.shape == truth[i].shape and np.array_equal(got, truth[i]), f"wrong vector {i}"
                        outcomes.append("ok")
                    else:
                        assert response.status_code >= 400, response.status_code
                        assert "error" in response.json(), response.text
                        outcomes.append("error")
        return outcomes

    try:
        return asyncio.run(scenario())
    finally:
        cache.close()


def _run_case(path: Path, truth: list[np.ndarray]) -> list[str]:
    with no_hang():
        return _check_library(path, truth) + _check_server(path, truth)


@pytest.mark.parametrize("fault", FILE_FAULTS)
@pytest.mark.parametrize("kind", list(ZARR_FILES))
def test_zarr_file_fault(pristine, tmp_path, kind, fault):
    source, truth = pristine["zarr"]
    path = tmp_path / "c.zarr"
    shutil.copytree(source, path, symlinks=True)
    _damage_file(path / ZARR_FILES[kind], fault, tmp_path / "outside" / "file")
    outcomes = _run_case(path, truth)
    # checksums.json is read by verify only; a flip elsewhere may land where no read looks (padding).
    if kind != "checksums-json" and (kind == "vectors" or fault != "flip"):
        assert "error" in outcomes, "the damage went unnoticed"


@pytest.mark.parametrize("name", [*HDF5_DATASETS, "metadata"])
def test_hdf5_bit_flip(pristine, tmp_path, name):
    source, truth = pristine["hdf5"]
    path = tmp_path / "c.h5"
    shutil.copy(source, path)
    _damage_hdf5_dataset(path, name)
    outcomes = _run_case(path, truth)
    assert "error" in outcomes, "the flipped bit went unnoticed"


@pytest.mark.parametrize("fault", ["delete", "truncate", "fifo", "link"])
def test_hdf5_file_fault(pristine, tmp_path, fault):
    source, truth = pristine["hdf5"]
    path = tmp_path / "c.h5"
    shutil.copy(source, path)
    _damage_file(path, fault, tmp_path / "outside" / "c.h5")
    assert _run_case(path, truth) == ["error", "error"]


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_flipped_offset_bit_is_caught_on_the_first_read(pristine, tmp_path, fmt):
    """The issue's case: offsets[i] + 1 would serve sentence i shifted by one token."""
    source, _ = pristine[fmt]
    path = tmp_path / source.name
    (shutil.copytree if fmt == "zarr" else shutil.copy)(source, path)
    if fmt == "zarr":
        _flip(path / "offsets" / "c" / "0", 8 * 20)  # the low byte of offsets[20]
    else:
        with h5py.File(path, "r") as f:
            where = f["offsets"].id.get_offset()
        _flip(path, where + 8 * 20)
    with elmo_cache.open(path) as cache:
        with pytest.raises(CacheCorruptError, match=r"rows 0\.\.36 \(block 0\) of array 'offsets' fail their CRC-32C"):
            cache[20]
        with pytest.raises(CacheCorruptError, match="elmo-cache verify"):
            cache[3]  # the same block


def test_zarr_metadata_flip_outside_the_structure_is_caught(pristine, tmp_path):
    source, _ = pristine["zarr"]
    path = tmp_path / "c.zarr"
    shutil.copytree(source, path)
    group = json.loads((path / "zarr.json").read_text())
    group["attributes"]["elmo_cache"]["tokenization"] = "whitespacf"
    (path / "zarr.json").write_text(json.dumps(group))
    with pytest.raises(CacheFormatError, match="the metadata fails its CRC-32"):
        elmo_cache.open(path)


def test_every_damaged_block_is_named(pristine, tmp_path):
    """A flipped vector bit: only the sentences of the damaged block raise, naming array, block and rows."""
    source, truth = pristine["zarr"]
    path = tmp_path / "c.zarr"
    shutil.copytree(source, path)
    _flip(path / "vectors" / "c" / "1" / "0" / "0", 0)  # row 10, block 2 (rows 10..15)
    with elmo_cache.open(path) as cache:
        offsets, lengths = np.array(cache._offsets), np.array(cache.lengths)
        for i, expected in enumerate(truth):
            start, stop = int(offsets[i]), int(offsets[i] + lengths[i])
            if start < 15 and stop > 10:
                with pytest.raises(CacheCorruptError, match=r"rows 10\.\.15 \(block 2\) of array 'vectors'"):
                    cache[i]
            else:
                np.testing.assert_array_equal(cache[i], expected)


def test_the_inline_checks_stop_only_once_every_block_passed(pristine, tmp_path):
    """Warm reads pay nothing for the checks, but only after every block was checked: a damaged block
    that no read has reached yet is still caught when one does. (zarr: blocks of 5 rows here.)"""
    source, truth = pristine["zarr"]
    path = tmp_path / source.name
    shutil.copytree(source, path)
    with elmo_cache.open(source) as cache:
        offsets, lengths = np.array(cache._offsets), np.array(cache.lengths)
        n_rows = int(cache._n_rows)
        last_block = (n_rows - 1) // 5 * 5  # first row of the last vectors block
        in_last = [i for i in range(len(cache)) if lengths[i] and offsets[i] + lengths[i] > last_block]
        for i in range(len(cache)):
            if i not in in_last:
                cache[i]
        assert cache._vector_ok is not None  # the last block is still unread: its test stays inline
        for i in in_last:
            cache[i]
        assert cache._vector_ok is None and cache._pair_ok is None  # every block passed
    _flip(path / "vectors" / "c" / str(n_rows // 10 if n_rows % 10 else n_rows // 10 - 1) / "0" / "0", 0)
    with elmo_cache.open(path) as cache:
        for i in range(len(cache)):
            if i not in in_last:
                np.testing.assert_array_equal(cache[i], truth[i])
        assert cache._vector_ok is not None
    # The flip sits in the last file's first row; whichever block that is, reading it raises.
    with elmo_cache.open(path) as cache, pytest.raises(CacheCorruptError, match="of array 'vectors' fail their CRC"):
        for i in range(len(cache)):
            cache[i]


# -- forgeries: the cache's identity is bound to its data (issue 32, item 6) ---------------------------


@pytest.fixture(scope="module")
def siblings(tmp_path_factory, tiny_encoder):
    """{format: (A, B)}: two caches of the same corpus and shapes (two layers each) but other layers, so
    every array but 'vectors' (and its sums) is the same and any metadata of one fits the other's arrays."""
    root = tmp_path_factory.mktemp("siblings")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    made = {}
    for fmt, suffix in (("zarr", ".zarr"), ("hdf5", ".h5")):
        pair = []
        for name, layers in (("a", "0,1"), ("b", "1,2")):
            options = BuildOptions(
                output=root / f"{name}{suffix}",
                layers=layers,
                chunk_rows=5 if fmt == "zarr" else None,
                shard_rows=10 if fmt == "zarr" else None,
                progress=False,
            )
            pair.append(build(corpus, options, encoder=tiny_encoder).path)
        made[fmt] = tuple(pair)
    return made


def _copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copyfile(source, target)
    return target


def _metadata(path: Path) -> dict:
    if path.is_dir():
        return json.loads((path / "zarr.json").read_text())["attributes"]["elmo_cache"]
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["elmo_cache"])


def _set_metadata(path: Path, meta: dict) -> None:
    if path.is_dir():
        group = json.loads((path / "zarr.json").read_text())
        group["attributes"]["elmo_cache"] = meta
        (path / "zarr.json").write_text(json.dumps(group))
    else:
        with h5py.File(path, "r+") as f:
            f.attrs["elmo_cache"] = json.dumps(meta)


def _refused_everywhere(path: Path, error=CacheCorruptError) -> None:
    """No read of ``path`` answers: the library raises ``error`` at open or on the first read, verify fails
    and the server answers 5xx, never 200."""
    from elmo_cache.verify.checks import verify

    with pytest.raises(error), elmo_cache.open(path) as cache:
        cache[0]
    assert not verify(path).ok
    assert set(_check_server(path, [np.zeros(0)] * len(LINES))) == {"error"}


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_a_siblings_metadata_is_caught(siblings, tmp_path, fmt):
    """Cache A under B's metadata claimed B's layers: the server answered layers=[1, 2] with A's layers 0 and 1,
    200, source cache, and verify passed. The digests of B's block sums do not match A's sums."""
    a, b = siblings[fmt]
    forged = _copy(a, tmp_path)
    _set_metadata(forged, _metadata(b))
    _refused_everywhere(forged)


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_removed_checksums_are_caught(siblings, tmp_path, fmt):
    """Without 'checksums' every block check was off; a cache whose metadata says it was written with them
    is refused without them."""
    forged = _copy(siblings[fmt][0], tmp_path)
    meta = _metadata(forged)
    del meta["checksums"]
    _set_metadata(forged, meta)
    _refused_everywhere(forged, CacheFormatError)


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_vectors_with_their_sums_from_another_build_are_caught(siblings, tmp_path, fmt):
    """B's vectors with B's block sums inside A: each block matches its (B's) sum, but those sums are not the
    ones A's metadata records. Before, every sentence read B's vectors as A's."""
    a, b = siblings[fmt]
    forged = _copy(a, tmp_path)
    if fmt == "zarr":
        for part in ("vectors", "blocksums/vectors"):
            shutil.rmtree(forged / part)
            shutil.copytree(b / part, forged / part)
    else:
        with h5py.File(b, "r") as source, h5py.File(forged, "r+") as target:
            for name in ("vectors", "blocksums/vectors"):
                target[name][...] = source[name][...]
    _refused_everywhere(forged)


def test_half_of_the_shards_from_another_build_are_caught(siblings, tmp_path):
    """Half of A's shards replaced by B's: their blocks fail A's sums, the others still read A's vectors (never
    a wrong one); with B's sums copied in too, the sums are not A's and nothing reads."""
    a, b = siblings["zarr"]
    with elmo_cache.open(a) as cache:
        truth = [np.array(cache[i]) for i in range(len(cache))]
    for with_sums in (False, True):
        forged = _copy(a, tmp_path / str(with_sums))
        shards = sorted((b / "vectors" / "c").iterdir(), key=lambda p: int(p.name))
        for shard in shards[: len(shards) // 2]:
            shutil.copyfile(shard / "0" / "0", forged / "vectors" / "c" / shard.name / "0" / "0")
        if with_sums:
            shutil.rmtree(forged / "blocksums" / "vectors")
            shutil.copytree(b / "blocksums" / "vectors", forged / "blocksums" / "vectors")
            _refused_everywhere(forged)
        else:
            outcomes = _run_case(forged, truth)  # asserts that every answer is A's own vector or an error
            assert "error" in outcomes and "ok" in outcomes
