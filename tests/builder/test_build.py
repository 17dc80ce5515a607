"""elmo_cache.builder: stored vectors equal Encoder.embed_batch for every layout, plus awkward input and reruns."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import sys
import zlib

import h5py
import numpy as np
import pytest

import elmo_cache
from elmo_cache.builder import BuildOptions, build, default_chunk_rows, default_output, default_shard_rows
from elmo_cache.compat.export import export
from elmo_cache.errors import CacheExistsError, CorpusError, InvalidParameterError
from elmo_cache.rows.selection import MixSpec
from elmo_cache.store import load_progress, staging_path
from elmo_cache.store.format import metadata_checksum
from elmo_cache.text.tokenize import tokenize
from elmo_cache.verify.checks import verify
from tests._build_fixtures import RawMix, corpus_lines, expected_rows, placed_offsets, raw_arrays, write_corpus

LINES = corpus_lines(30)
SELECTIONS = {
    "all": {},
    "top": {"layers": "2"},
    "0,2": {"layers": (0, 2)},
    "mix": {"mix": RawMix((0.2, 0.3, 0.5), gamma=1.5)},
    "softmax": {"mix": RawMix((1, -0.5, 2), gamma=0.7, softmax=True)},
}


def build_kwargs(selection: str) -> dict:
    """SELECTIONS[selection] as BuildOptions takes it (a mix as the MixSpec the user's numbers make)."""
    return {key: value.spec() if isinstance(value, RawMix) else value for key, value in SELECTIONS[selection].items()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", LINES)


@pytest.fixture(scope="module")
def reference(tiny_encoder):
    return tiny_encoder.embed_batch([tokenize(line) for line in LINES])


def check_cache(path, lines, reference, *, layers=None, mix=None, fp16=False, dedupe=False, cuts=()):
    """Every sentence as stored equals the reference encoding, and the arrays follow FORMAT.md."""
    meta, arrays = raw_arrays(path)
    assert meta["complete"] is True
    assert meta["dtype"] == ("float16" if fp16 else "float32")
    assert meta["kind"] == ("mix" if mix else "layers")
    assert meta["layers"] == (None if mix else sorted(layers if layers is not None else (0, 1, 2)))
    lengths = [len(tokenize(line)) for line in lines]
    assert arrays["lengths"].tolist() == lengths
    assert meta["n_sentences"] == len(lines) and meta["n_tokens"] == sum(lengths)
    first: dict[str, int] = {}
    for i, line in enumerate(lines):
        first.setdefault(" ".join(tokenize(line)), i)
    assert meta["n_unique"] == len(first)
    # The index: sorted distinct hashes, each pointing at its sentence's first line.
    assert np.all(np.diff(arrays["index/hashes"].astype(np.float64)) > 0) or len(first) < 2
    assert sorted(arrays["index/rows"].tolist()) == sorted(first.values())
    offsets = arrays["offsets"]
    if dedupe:
        unique_rows = sum(len(k.split()) for k in first)
        # zarr (version 5): the rows between windows belong to no sentence.
        assert meta["n_rows"] == unique_rows if meta["format_version"] != 5 else meta["n_rows"] >= unique_rows
        for i, line in enumerate(lines):
            j = first[" ".join(tokenize(line))]
            if lengths[i]:
                assert offsets[i] == offsets[j]
    else:
        want = placed_offsets([tokenize(line) for line in lines], meta, cuts)
        assert offsets.tolist() == want.tolist()
        assert meta["n_rows"] == (int(want[-1]) + lengths[-1] if len(want) else 0)
        if meta["format_version"] != 5:
            assert meta["n_rows"] == sum(lengths)
    vectors = arrays["vectors"]
    assert vectors.dtype == np.dtype(meta["dtype"])
    for i, ref in enumerate(reference):
        stored = vectors[offsets[i] : offsets[i] + lengths[i]].astype(np.float32)
        want = expected_rows(ref, layers=layers, mix=mix)
        assert stored.shape == want.shape
        if fp16:
            # float16 rounding of the float32 value: within half a unit in the last place, plus slack
            # for the float32 value itself differing in its last bits between batch compositions.
            np.testing.assert_allclose(stored, want, rtol=2.0**-11, atol=1e-6)
        else:
            np.testing.assert_allclose(stored, want, rtol=1e-6, atol=1e-6)
    with elmo_cache.open(path) as cache:
        for line in lines:
            assert cache.find(line) == first[" ".join(tokenize(line))]
    return meta


@pytest.mark.parametrize("selection", sorted(SELECTIONS))
@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
@pytest.mark.parametrize("dedupe", [False, True], ids=["plain", "dedupe"])
def test_stored_vectors_equal_the_encoder(tmp_path, corpus, reference, tiny_encoder, selection, fmt, dedupe):
    kwargs = SELECTIONS[selection]
    output = tmp_path / ("c.zarr" if fmt == "zarr" else "c.h5")
    # Small batches and chunks: many batches per window and sentences straddling chunks.
    summary = build(
        corpus,
        BuildOptions(
            output=output,
            dedupe=dedupe,
            batch_tokens=64,
            window_batches=2,
            chunk_rows=7 if fmt == "zarr" else None,
            progress=False,
            **build_kwargs(selection),
        ),
        encoder=tiny_encoder,
    )
    assert summary.path == output and summary.format == fmt
    layers = kwargs.get("layers")
    if isinstance(layers, str):
        layers = tuple(int(x) for x in layers.split(","))
    meta = check_cache(output, LINES, reference, layers=layers, mix=kwargs.get("mix"), dedupe=dedupe)
    assert meta["dedupe"] is dedupe
    assert summary.n_rows == meta["n_rows"]
    # A zarr cache's rows between windows belong to no sentence (check_cache checks where each one's are).
    if fmt == "hdf5":
        # The corpus repeats sentences: with dedupe, fewer rows than tokens.
        assert meta["n_rows"] < meta["n_tokens"] if dedupe else meta["n_rows"] == meta["n_tokens"]
    assert not staging_path(output).exists()
    if kwargs.get("mix"):
        mix = kwargs["mix"]
        assert meta["mix"]["gamma"] == mix.gamma and meta["mix"]["softmax"] is mix.softmax
        assert meta["mix"]["raw"] == (list(mix.weights) if mix.softmax else None)
        np.testing.assert_allclose(meta["mix"]["weights"], mix.effective_weights(), rtol=1e-12)


@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
@pytest.mark.parametrize("selection", ["all", "softmax"])
def test_fp16_is_the_rounded_float32_value(tmp_path, corpus, reference, tiny_encoder, fmt, selection):
    kwargs = SELECTIONS[selection]
    output = tmp_path / ("c.zarr" if fmt == "zarr" else "c.h5")
    build(
        corpus,
        BuildOptions(output=output, fp16=True, batch_tokens=128, progress=False, **build_kwargs(selection)),
        encoder=tiny_encoder,
    )
    check_cache(output, LINES, reference, mix=kwargs.get("mix"), fp16=True)


def test_metadata_follows_the_format(tmp_path, corpus, tiny_encoder):
    output = tmp_path / "c.zarr"
    build(corpus, BuildOptions(output=output, layers="1,2", progress=False), encoder=tiny_encoder)
    meta, arrays = raw_arrays(output)
    assert meta["format"] == "elmo-cache" and meta["format_version"] == 5  # zarr: windows start vectors files
    # Each line's tokens, joined by one space, as UTF-8; tokens/offsets has one entry per line plus one.
    starts, text = arrays["tokens/offsets"], arrays["tokens/bytes"].tobytes()
    assert starts.tolist()[0] == 0 and len(starts) == len(LINES) + 1 and starts[-1] == len(text)
    assert [text[a:b].decode() for a, b in itertools.pairwise(starts.tolist())] == [
        " ".join(line.split()) for line in LINES
    ]
    assert meta["checksums"]["algorithm"] == "crc32" and (output / meta["checksums"]["file"]).is_file()
    # The corpus (331 tokens) is smaller than a default chunk (8192 rows of 256 bytes): its chunk and its one
    # vectors file (a shard of one chunk) hold its tokens rounded up to 16 rows, not 8192 padded rows.
    n_tokens = meta["n_tokens"]
    assert n_tokens == 331 and meta["compression"] is None
    assert meta["chunk_rows"] == default_chunk_rows(2 * 32 * 4, n_tokens) == 336
    assert meta["shard_rows"] == default_shard_rows(336, 2 * 32 * 4, n_tokens) == 336
    vectors_meta = json.loads((output / "vectors" / "zarr.json").read_text())
    assert vectors_meta["chunk_grid"]["configuration"]["chunk_shape"] == [336, 2, 32]
    (sharding,) = vectors_meta["codecs"]
    assert sharding["name"] == "sharding_indexed" and sharding["configuration"]["chunk_shape"] == [336, 2, 32]
    assert [p.relative_to(output).as_posix() for p in (output / "vectors" / "c").rglob("*") if p.is_file()] == [
        "vectors/c/0/0/0"
    ]
    assert (output / "vectors/c/0/0/0").stat().st_size == 336 * 2 * 32 * 4 + 1 * 16 + 4  # rows, index, CRC
    assert meta["dim"] == tiny_encoder.output_dim == arrays["vectors"].shape[-1]
    assert meta["model"] == tiny_encoder.identity
    assert meta["tokenization"] == "whitespace" and meta["sentence_hash"] == "blake2b-64-le"
    assert meta["elmo_cache_version"] == elmo_cache.__version__
    build_info = meta["build"]
    assert build_info["input"]["path"] == str(corpus.resolve())
    assert build_info["args"]["layers"] == "1,2" and build_info["seconds"] > 0 and build_info["tokens_per_s"] > 0
    assert set(meta) >= {"kind", "layers", "mix", "dtype", "n_sentences", "n_tokens", "n_rows", "n_unique", "dedupe"}


def test_hdf5_datasets_are_contiguous_and_memory_mappable(tmp_path, corpus, tiny_encoder):
    output = tmp_path / "c.h5"
    build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    with h5py.File(output, "r") as f:
        for name in ("vectors", "offsets", "lengths", "index/hashes", "index/rows", "tokens/bytes", "tokens/offsets"):
            assert f[name].chunks is None and f[name].compression is None
        ds = f["vectors"]
        mapped = np.memmap(output, dtype=ds.dtype, mode="r", offset=ds.id.get_offset(), shape=ds.shape)
        np.testing.assert_array_equal(mapped, ds[...])


@pytest.mark.parametrize("compression", ["zstd", "blosc-lz4", "blosc-zstd"])
def test_compressed_zarr_holds_the_same_vectors(tmp_path, corpus, tiny_encoder, compression):
    plain, packed = tmp_path / "plain.zarr", tmp_path / "packed.zarr"
    build(corpus, BuildOptions(output=plain, progress=False), encoder=tiny_encoder)
    build(corpus, BuildOptions(output=packed, compression=compression, progress=False), encoder=tiny_encoder)
    (_, a), (meta, b) = raw_arrays(plain), raw_arrays(packed)
    assert meta["compression"] == compression
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    codecs = json.loads((packed / "vectors" / "zarr.json").read_text())["codecs"]
    (sharding,) = codecs
    inner = sharding["configuration"]["codecs"]
    assert sharding["name"] == "sharding_indexed" and len(inner) == 2 and inner[0]["name"] == "bytes"
    # Checksums cover the compressed chunk files as stored.
    assert verify(packed).ok
    chunk = packed / "vectors" / "c" / "0" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[-1] ^= 1
    chunk.write_bytes(bytes(data))
    report = verify(packed)
    assert not report.ok and report.problems[0].startswith("vectors/c/0/0/0 (array 'vectors'): CRC-32")


def test_awkward_lines_each_have_their_stored_result(tmp_path, tiny_encoder):
    long_line = " ".join(f"w{i % 50}" for i in range(20_000))
    huge_token = "t" * 1_000_000
    raw = [
        b"\xef\xbb\xbfbom at start",
        b"crlf line\r",
        b"nul\x00inside token",
        b"",
        huge_token.encode(),
        long_line.encode(),
        b"after",
    ]
    path = tmp_path / "awkward.txt"
    path.write_bytes(b"\n".join(raw) + b"\n")
    output = tmp_path / "awkward.zarr"
    build(path, BuildOptions(output=output, batch_tokens=2048, progress=False), encoder=tiny_encoder)
    expected_tokens = [
        ["bom", "at", "start"],
        ["crlf", "line"],
        ["nul\x00inside", "token"],
        [],
        [huge_token],
        long_line.split(),
        ["after"],
    ]
    reference = tiny_encoder.embed_batch(expected_tokens)
    with elmo_cache.open(output) as cache:
        assert cache.lengths.tolist() == [3, 2, 2, 0, 1, 20_000, 1]
        for i, ref in enumerate(reference):
            np.testing.assert_allclose(cache[i], ref, rtol=1e-6, atol=1e-6)
        assert cache.find("nul\x00inside token") == 2


def test_invalid_utf8_keeps_earlier_lines_and_resumes_after_the_fix(tmp_path, tiny_encoder):
    lines = corpus_lines(40, seed=3)
    path = tmp_path / "c.txt"
    data = "\n".join(lines).encode().split(b"\n")
    data[33] = b"bad \xff byte"
    path.write_bytes(b"\n".join(data) + b"\n")
    output = tmp_path / "c.zarr"
    options = BuildOptions(output=output, batch_tokens=32, window_batches=1, commit_seconds=0, progress=False)
    with pytest.raises(CorpusError, match=r"c\.txt, line 34: invalid UTF-8"):
        build(path, options, encoder=tiny_encoder)
    assert not output.exists()
    assert load_progress(output).lines == 33  # every line before the bad one is committed
    lines[33] = "now fixed"
    write_corpus(path, lines)
    summary = build(path, options, encoder=tiny_encoder)
    assert summary.resumed_from == 33 and summary.n_sentences == 40
    check_cache(output, lines, tiny_encoder.embed_batch([tokenize(x) for x in lines]), cuts=(33,))


def test_gzip_and_stdin_give_the_same_cache(tmp_path, corpus, tiny_encoder, monkeypatch):
    packed = tmp_path / "corpus.txt.gz"
    packed.write_bytes(gzip.compress(corpus.read_bytes()))
    build(corpus, BuildOptions(output=tmp_path / "a.zarr", progress=False), encoder=tiny_encoder)
    build(packed, BuildOptions(output=tmp_path / "b.zarr", progress=False), encoder=tiny_encoder)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(corpus.read_bytes()))))
    build("-", BuildOptions(output=tmp_path / "c.zarr", progress=False), encoder=tiny_encoder)
    _, a = raw_arrays(tmp_path / "a.zarr")
    for other in ("b.zarr", "c.zarr"):
        _, b = raw_arrays(tmp_path / other)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


def test_default_chunks_hold_at_most_3_mib():
    assert default_chunk_rows(3 * 1024 * 2) == 512  # Original layers, float16
    assert default_chunk_rows(3 * 1024 * 4) == 256
    assert default_chunk_rows(1024 * 2) == 1024  # Original mix, float16
    assert default_chunk_rows(10**8) == 16


def test_default_output_is_beside_the_corpus(tmp_path):
    assert default_output(tmp_path / "corpus.txt", "zarr") == tmp_path / "corpus.zarr"
    assert default_output(tmp_path / "corpus.en.txt.gz", "hdf5") == tmp_path / "corpus.en.h5"
    assert default_output(tmp_path / "corpus", "zarr") == tmp_path / "corpus.zarr"


def test_format_from_suffix_and_default_output(tmp_path, corpus, tiny_encoder):
    local = write_corpus(tmp_path / "local.txt", LINES[:5])
    summary = build(local, BuildOptions(progress=False), encoder=tiny_encoder)
    assert summary.path == tmp_path / "local.zarr" and summary.format == "zarr"
    summary = build(local, BuildOptions(output=tmp_path / "x.hdf5", progress=False), encoder=tiny_encoder)
    assert summary.format == "hdf5" and h5py.is_hdf5(summary.path)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"layers": "1", "mix": MixSpec.from_raw("1,1,1")}, "exclusive"),
        ({"layers": "3"}, r"choose from \[0, 1, 2\]"),
        ({"output": "x.h5", "compression": "zstd"}, "only zarr caches can be compressed"),
        ({"output": "x.h5", "chunk_rows": 64}, "only zarr caches are chunked"),
        ({"output": "x.zarr", "format": "hdf5"}, "contradicts the output suffix"),
        ({"compression": "lz77"}, r"choose from \['none', 'zstd', 'blosc-lz4', 'blosc-zstd'\]"),
        ({"format": "parquet"}, r"choose from \['zarr', 'hdf5'\]"),
        ({"chunk_rows": 0}, "positive"),
        ({"output": "s3://bucket/c.zarr"}, "'s3://bucket/c.zarr' is a URL"),
        ({"shard_rows": 0}, "positive"),
        ({"output": "x.h5", "shard_rows": 64}, "only zarr caches are sharded"),
        ({"chunk_rows": 4, "shard_rows": 10}, r"shard_rows: 10 is not a multiple of chunk_rows \(4\)"),
        ({"batch_tokens": 0}, "positive"),
    ],
)
def test_bad_options_are_named(tmp_path, corpus, tiny_encoder, options, message):
    if "output" in options and "://" not in options["output"]:
        options = {**options, "output": tmp_path / options["output"]}
    with pytest.raises(InvalidParameterError, match=message):
        build(corpus, BuildOptions(progress=False, **options), encoder=tiny_encoder)


class _NoEncoding:
    """Looks like the tiny encoder but fails if asked to encode anything."""

    def __init__(self, real):
        self.identity, self.output_dim, self.device, self.initial_state = (
            real.identity,
            real.output_dim,
            real.device,
            "zero",
        )

    def encode_flat(self, batch):
        raise AssertionError("encoded although the cache was complete")


def test_rerun_on_a_complete_cache_does_nothing(tmp_path, corpus, tiny_encoder):
    output = tmp_path / "c.zarr"
    first = build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    again = build(corpus, BuildOptions(output=output, progress=False), encoder=_NoEncoding(tiny_encoder))
    assert again.already_complete and "already complete" in str(again)
    assert (again.n_sentences, again.n_tokens) == (first.n_sentences, first.n_tokens)


def test_other_options_on_an_existing_cache_need_overwrite(tmp_path, corpus, tiny_encoder, reference):
    output = tmp_path / "c.h5"
    build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    with pytest.raises(CacheExistsError, match=r"dtype: 'float32' there, 'float16' now.*--overwrite"):
        build(corpus, BuildOptions(output=output, fp16=True, progress=False), encoder=tiny_encoder)
    build(corpus, BuildOptions(output=output, fp16=True, overwrite=True, progress=False), encoder=tiny_encoder)
    check_cache(output, LINES, reference, fp16=True)


def test_a_foreign_file_is_not_overwritten_silently(tmp_path, corpus, tiny_encoder):
    output = tmp_path / "notes.h5"
    output.write_text("precious")
    with pytest.raises(CacheExistsError, match="not an elmo-cache cache"):
        build(corpus, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
    assert output.read_text() == "precious"
    folder = tmp_path / "home.zarr"
    folder.mkdir()
    (folder / "thesis.tex").write_text("precious")
    with pytest.raises(CacheExistsError, match="refusing to delete"):
        build(corpus, BuildOptions(output=folder, overwrite=True, progress=False), encoder=tiny_encoder)
    assert (folder / "thesis.tex").read_text() == "precious"


def test_verify_passes_on_a_build_and_catches_damage(tmp_path, corpus, tiny_encoder):
    output = tmp_path / "c.h5"
    build(corpus, BuildOptions(output=output, dedupe=True, fp16=True, progress=False), encoder=tiny_encoder)
    report = verify(output, sample=5, corpus=corpus, encoder=tiny_encoder)
    assert report.ok, str(report)
    assert report.sampled == 5 and report.corpus == str(corpus)
    with h5py.File(output, "r+") as f:
        f["vectors"][3] = f["vectors"][3] + 1  # damage one row's values
    damaged = verify(output, sample=len(LINES), encoder=tiny_encoder)
    assert not damaged.ok and damaged.problems[0].startswith("dataset 'vectors': CRC-32")
    # Wrong vectors with matching checksums (as a faulty encoder would write) fail the re-encoding.
    with h5py.File(output, "r+") as f:
        meta = json.loads(f.attrs["elmo_cache"])
        meta["checksums"]["datasets"]["vectors"] = zlib.crc32(f["vectors"][...].tobytes())
        meta["checksums"]["metadata"] = metadata_checksum(meta)
        f.attrs["elmo_cache"] = json.dumps(meta)
    damaged = verify(output, sample=len(LINES), encoder=tiny_encoder)
    assert not damaged.ok and "differ from a fresh encoding" in damaged.problems[0]
    with h5py.File(output, "r+") as f:
        f["lengths"][2] = f["lengths"][2] + 1
    broken = verify(output)
    assert not broken.ok and broken.problems[0].startswith("dataset 'lengths': CRC-32")


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_verify_and_export_without_the_corpus(tmp_path, tiny_encoder, reference, suffix):
    corpus = write_corpus(tmp_path / "gone.txt", LINES)
    output = tmp_path / ("c" + suffix)
    build(corpus, BuildOptions(output=output, dedupe=True, progress=False), encoder=tiny_encoder)
    corpus.unlink()
    report = verify(output, sample=6, encoder=tiny_encoder)
    assert report.ok and report.corpus is None and report.sampled == 6, str(report)
    assert "sentence index matches the stored tokens" in report.checks
    summary = export(output, tmp_path / "allennlp.hdf5")
    assert summary.from_tokens and summary.corpus is None
    with h5py.File(tmp_path / "allennlp.hdf5", "r") as f:
        mapping = json.loads(f["sentence_to_index"][0])
        np.testing.assert_allclose(f["0"][...], reference[0], rtol=1e-6, atol=1e-6)
    assert mapping == {" ".join(line.split()): str(i) for i, line in enumerate(LINES)}


def test_export_writes_the_allennlp_layout(tmp_path, corpus, tiny_encoder, reference):
    cache = tmp_path / "c.zarr"
    build(corpus, BuildOptions(output=cache, dedupe=True, progress=False), encoder=tiny_encoder)
    out = tmp_path / "allennlp.hdf5"
    summary = export(cache, out, corpus=corpus)
    assert summary.n_sentences == len(LINES)
    with h5py.File(out, "r") as f:
        assert set(f) == {str(i) for i in range(len(LINES))} | {"sentence_to_index"}
        for i, ref in enumerate(reference):
            assert f[str(i)].dtype == np.float32 and f[str(i)].shape == ref.shape
            np.testing.assert_allclose(f[str(i)][...], ref, rtol=1e-6, atol=1e-6)
        mapping = json.loads(f["sentence_to_index"][0])
    expected = {}
    for i, line in enumerate(LINES):
        expected[line.strip()] = str(i)
    assert mapping == expected
    with pytest.raises(CacheExistsError):
        export(cache, out)


def test_export_of_a_mixed_cache_has_one_vector_per_token(tmp_path, corpus, tiny_encoder, reference):
    cache = tmp_path / "m.h5"
    mix = SELECTIONS["mix"]["mix"]
    build(corpus, BuildOptions(output=cache, mix=mix.spec(), progress=False), encoder=tiny_encoder)
    out = tmp_path / "allennlp.hdf5"
    export(cache, out, corpus=corpus)
    with h5py.File(out, "r") as f:
        np.testing.assert_allclose(f["0"][...], expected_rows(reference[0], mix=mix), rtol=1e-6, atol=1e-6)
