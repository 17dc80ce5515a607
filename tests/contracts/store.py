"""One contract for every container (zarr-python's StoreTests is the model).

A container (:class:`elmo_cache.store.container.Container`) must write a cache through its
writer that its own reader (``open_arrays``), ``read_metadata``, ``open_with_library`` and
:class:`elmo_cache.reader.cache.Cache` all read back the same, crash-safely and atomically, and whose
damage ``open`` and ``verify`` name. Each container runs these tests through one subclass of
:class:`StoreContract` in ``tests/store/test_store_<name>.py`` that implements the hooks (how to damage
or edit a cache in its layout); this module holds no test of its own.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import elmo_cache
from elmo_cache import store
from elmo_cache.errors import CacheFormatError
from elmo_cache.rows.quantize import Quantization
from elmo_cache.store import Layout, OutputKind, OutputState, Progress
from elmo_cache.store.columns import HASHES, TEXT, TEXT_ENDS
from elmo_cache.store.container import PartFiles
from elmo_cache.store.format import (
    ARRAYS,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_DTYPES,
    decode_metadata,
    staging_path,
)
from elmo_cache.store.staging import SentenceColumns, staged_column
from elmo_cache.text.tokenize import sentence_hash
from elmo_cache.verify.checks import verify

DIM = 4
WORDS = ["the", "cat", "Zürich", "naïve", "—", "a\x00b", "42", ".", "日本語", "🙂"]


def _metadata(
    progress: Progress, *, complete: bool, n_unique: int, row_shape: tuple[int, ...], quantized: bool = False
) -> dict:
    extra = {"dtype": "int8", "quantization": Quantization("int8", DIM).to_metadata()} if quantized else {}
    return extra | {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "complete": complete,
        "kind": "layers" if len(row_shape) == 2 else "mix",
        "layers": [1, 2] if len(row_shape) == 2 else None,
        "mix": None
        if len(row_shape) == 2
        else {"weights": [0.2, 0.3, 0.5], "gamma": 1.0, "raw": None, "softmax": False},
        "dim": DIM,
        "dtype": extra.get("dtype", "float32"),
        "n_sentences": progress.lines,
        "n_tokens": progress.tokens,
        "n_rows": progress.rows,
        "n_unique": n_unique,
        "dedupe": False,
        "chunk_rows": 3 if progress.identity.get("fmt") == "zarr" else None,
    }


def _sentences(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((int(rng.integers(0, 6)), 2, DIM)).astype(np.float32) for _ in range(n)]


def _tokens(sentences: list[np.ndarray], first: int = 0) -> list[list[str]]:
    """Distinct token lists of the sentences' lengths (sentence k's first token names k)."""
    return [
        [f"s{first + k}", *(WORDS[(first + k + j) % len(WORDS)] for j in range(len(s) - 1))][: len(s)]
        for k, s in enumerate(sentences)
    ]


def _append(writer, sentences: list[np.ndarray], rows: int, first: int, row_shape) -> int:
    lengths = np.array([len(s) for s in sentences], dtype=np.int32)
    offsets = rows + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    tokens = _tokens(sentences, first)
    hashes = np.array([sentence_hash(t) for t in tokens], dtype=np.uint64)
    vectors = np.concatenate(sentences) if sentences else np.empty((0, *row_shape), np.float32)
    writer.append(vectors, offsets, lengths, hashes, tokens)
    return rows + int(lengths.sum())


def _store_files(path: Path) -> dict[str, bytes]:
    """Every file of a store (a directory's files by relative path, or the one file) and its bytes."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


class StoreContract:
    """The tests every container passes. A subclass names the container in ``fmt`` and implements
    the hooks below, which damage or edit a cache in that container's own layout."""

    fmt: str
    # Whether several workers may write one cache of this container (Container.parallel_writer is not None).
    parallel: bool

    # -- hooks: what a new container's test subclass implements ---------------------------------------

    def data_of(self, output: Path, name: str) -> tuple[Path, int]:
        """The file holding the start of array ``name``'s data, and the byte offset there."""
        raise NotImplementedError

    def where(self, name: str) -> str:
        """How ``verify`` names the unit holding the start of array ``name`` in a problem."""
        raise NotImplementedError

    def truncate_vectors(self, output: Path) -> tuple[str, str]:
        """Cut the end off the vectors' data; returns how ``open`` and ``verify`` name the damage."""
        raise NotImplementedError

    def delete_array(self, output: Path, name: str) -> None:
        raise NotImplementedError

    def set_metadata(self, path: Path, raw: str | None = None, **changes) -> None:
        """Edit the metadata attribute in place (``raw``: replace it with that text)."""
        raise NotImplementedError

    def replace_array(self, path: Path, name: str, data: np.ndarray) -> None:
        raise NotImplementedError

    def write_format_1(self, path: Path) -> None:
        """Turn a cache into the format-1 layout: no token arrays, no checksums, format_version 1."""
        raise NotImplementedError

    # -- helpers ---------------------------------------------------------------------------------------

    @pytest.fixture
    def output(self, tmp_path) -> Path:
        return tmp_path / ("c" + store.get_container(self.fmt).suffixes[0])

    def layout(self, row_shape=(2, DIM), dtype="float32") -> Layout:
        chunked = store.get_container(self.fmt).chunked
        return Layout(self.fmt, row_shape, dtype, 3 if chunked else None, None, 6 if chunked else None)

    def write(
        self,
        output: Path,
        sentences: list[np.ndarray],
        *,
        commit_every: int = 2,
        finalize: bool = True,
        quantized: bool = False,
    ):
        """Write ``sentences`` (float32 rows, or with ``quantized`` int8 rows of codes and scale) as a cache."""
        layout = self.layout(sentences[0].shape[1:] if sentences else (2, DIM), "int8" if quantized else "float32")
        progress = Progress(identity={"fmt": self.fmt})
        metadata = _metadata(progress, complete=False, n_unique=0, row_shape=layout.row_shape, quantized=quantized)
        writer = store.writer_class(self.fmt).create(output, layout, progress, metadata)
        rows = 0
        for k in range(0, len(sentences), commit_every):
            rows = _append(writer, sentences[k : k + commit_every], rows, k, layout.row_shape)
            writer.commit(done=k + commit_every >= len(sentences))
        if not finalize:
            writer.close()
            return writer
        hashes, _ = writer.index()
        p = writer.progress
        return writer.finalize(
            _metadata(p, complete=True, n_unique=len(hashes), row_shape=layout.row_shape, quantized=quantized)
        )

    # -- the contract ---------------------------------------------------------------------------------

    def test_written_arrays_read_back_through_every_reader(self, output):
        sentences = _sentences(11, seed=1)
        assert self.write(output, sentences) == output
        assert store.detect(output) == self.fmt
        fmt, raw, arrays = store.open_arrays(output, ARRAYS)
        assert fmt == self.fmt and decode_metadata(raw)["complete"] is True
        _, raw_lib, library, close = store.open_with_library(output)
        try:
            for name in ARRAYS:
                np.testing.assert_array_equal(np.asarray(arrays[name][:]), np.asarray(library[name][...]))
                if name in INDEX_DTYPES:
                    assert np.dtype(arrays[name].dtype) == np.dtype(INDEX_DTYPES[name])
            assert decode_metadata(raw_lib) == decode_metadata(raw)
        finally:
            close()
        with elmo_cache.open(output) as cache:
            assert cache.format == self.fmt and len(cache) == 11
            for i, expected in enumerate(sentences):
                np.testing.assert_array_equal(cache[i], expected.transpose(1, 0, 2))

    def test_read_metadata_and_is_store(self, output, tmp_path):
        self.write(output, _sentences(3, seed=2))
        container = store.get_container(self.fmt)
        assert container.owns(output)
        assert container.read_metadata(output)["n_sentences"] == 3
        assert store.read_metadata(output) == container.read_metadata(output)
        other = tmp_path / "other"
        other.mkdir()
        (tmp_path / "text.txt").write_text("not a store")
        for foreign in (other, tmp_path / "text.txt", tmp_path / "absent"):
            assert not container.owns(foreign)
            assert container.read_metadata(foreign) is None

    def test_inspect_says_what_a_build_finds_at_the_output(self, output, tmp_path):
        container = store.get_container(self.fmt)
        fresh = container.inspect(output)
        assert fresh == OutputState(OutputKind.FRESH, self.fmt)
        self.write(output, _sentences(5, seed=15), finalize=False)
        resumable = container.inspect(output)
        assert resumable.kind is OutputKind.RESUMABLE and resumable.meta is None
        assert resumable.progress.lines == 5 and resumable.progress.done
        assert store.inspect_output(output, self.fmt) == resumable
        shutil.rmtree(staging_path(output))
        self.write(output, _sentences(4, seed=16))
        complete = container.inspect(output)
        assert complete.kind is OutputKind.COMPLETE and complete.container == self.fmt and complete.progress is None
        assert complete.meta == store.read_metadata(output) and complete.meta["n_sentences"] == 4
        # Whatever format the build asks for, the container whose store is there answers.
        other = next(name for name in store.container_names() if name != self.fmt)
        assert store.inspect_output(output, other) == complete
        assert store.get_container(other).inspect(output) is None
        # A cache of ours that is not finished is in the way, and says so with its metadata.
        self.set_metadata(output, complete=False)
        occupied = container.inspect(output)
        assert occupied.kind is OutputKind.OCCUPIED and occupied.meta["complete"] is False
        # Something not ours: no container claims it, and the store calls it occupied, without metadata.
        for foreign in (tmp_path / "notes.txt", tmp_path / "folder"):
            foreign.mkdir() if foreign.suffix == "" else foreign.write_text("precious")
            assert container.inspect(foreign) is None
            assert store.inspect_output(foreign, self.fmt) == OutputState(
                OutputKind.OCCUPIED, next(c.name for c in store.containers() if c.is_directory == foreign.is_dir())
            )

    def test_output_appears_only_when_finished(self, output):
        writer = self.write(output, _sentences(5, seed=3), finalize=False)
        assert not output.exists() and staging_path(output).is_dir()
        assert writer.progress.lines == 5 and writer.progress.done
        with pytest.raises(elmo_cache.IncompleteCacheError):
            store.detect(output)

    def test_resume_drops_what_was_not_committed(self, output):
        sentences = _sentences(6, seed=4)
        writer = self.write(output, sentences[:4], finalize=False)
        committed = writer.progress
        resumed = store.writer_class(self.fmt).resume(output, self.layout(), committed)
        # Appended but never committed: a crash loses it, and a resume must not see it.
        resumed.append(
            np.ones((3, 2, DIM), np.float32),
            np.array([99], np.int64),
            np.array([3], np.int32),
            np.array([5], np.uint64),
            [["never", "committed", "tokens"]],
        )
        resumed.close()
        again = store.writer_class(self.fmt).resume(output, self.layout(), committed)
        _append(again, sentences[4:], committed.rows, 4, (2, DIM))
        again.commit(done=True)
        hashes, _ = again.index()
        again.finalize(_metadata(again.progress, complete=True, n_unique=len(hashes), row_shape=(2, DIM)))
        with elmo_cache.open(output) as cache:
            assert len(cache) == 6
            for i, expected in enumerate(sentences):
                np.testing.assert_array_equal(cache[i], expected.transpose(1, 0, 2))
            assert [cache.tokens(i) for i in range(6)] == _tokens(sentences)
        assert verify(output).ok

    def test_a_parallel_writer_writes_the_single_writers_cache_or_is_declared_absent(self, output, tmp_path):
        """Parts written out of order, cut inside row-files, then stitched and finished: the same bytes."""
        writer = store.get_container(self.fmt).parallel_writer()
        assert (writer is not None) == self.parallel
        if writer is None:
            return
        sentences = _sentences(17, seed=7)
        self.write(output, sentences)
        _, _, arrays = store.open_arrays(output, ARRAYS)
        vectors = np.concatenate(sentences)
        n_rows, n_lines = len(vectors), len(sentences)
        layout = self.layout()
        meta = store.read_metadata(output)
        assert meta is not None
        meta.pop("checksums")
        tokens = _tokens(sentences)
        hashes = np.array([sentence_hash(t) for t in tokens], dtype=np.uint64)
        # The declared columns' values as a distributed build's driver stages them, in files of their own.
        values = {
            "offsets": arrays["offsets"],
            "lengths": arrays["lengths"],
            HASHES: hashes,
            TEXT_ENDS: np.asarray(arrays["tokens/offsets"])[1:],
            TEXT: arrays["tokens/bytes"],
        }
        work = tmp_path / "work"
        work.mkdir()
        files = {}
        for spec in layout.sentence_columns:
            files[spec.name] = column = staged_column(work, spec)
            column.open(0)
            column.append(np.asarray(values[spec.name]))
            column.sync()
            column.close()

        other = tmp_path / "parallel" / output.name
        other.parent.mkdir()
        staging = staging_path(other)
        writer.create(staging, layout, n_rows, {**meta, "complete": False})
        file_rows = writer.file_rows(layout)
        assert 1 <= file_rows < n_rows
        cuts = [0, 4, file_rows + 1, n_rows]  # a part inside one file, one across a boundary, the rest
        written = {}
        for first, end in reversed(list(itertools.pairwise(cuts))):
            with writer.part(staging, layout, n_rows, first, end) as sink:
                for piece in np.array_split(vectors[first:end], 3):
                    sink.add(piece)
                written[first] = sink.finish()
        # What a worker reports survives its marker's JSON (a resumed build reads it back).
        parts = [PartFiles.from_json(json.loads(json.dumps(written[c].to_json()))) for c in cuts[:-1]]
        assert parts == [written[c] for c in cuts[:-1]]
        sums = writer.stitch(staging, layout, n_rows, parts)
        assert sorted(sums) == list(range(-(-n_rows // file_rows)))
        small = SentenceColumns(layout.sentence_columns, files, n_lines, work)
        assert writer.finish(staging, other, small, meta, sums) == other
        assert not staging.exists()
        assert _store_files(other) == _store_files(output)
        assert verify(other).ok

    def test_a_parallel_writer_refuses_parts_that_miss_rows(self, output, tmp_path):
        writer = store.get_container(self.fmt).parallel_writer()
        if writer is None:
            return
        layout = self.layout()
        staging = staging_path(output)
        meta = _metadata(Progress(identity={}), complete=False, n_unique=0, row_shape=(2, DIM))
        writer.create(staging, layout, 20, meta)
        with writer.part(staging, layout, 20, 0, 5) as sink:
            sink.add(np.zeros((3, 2, DIM), np.float32))
            with pytest.raises(elmo_cache.ElmoCacheError, match="ended at row 3, not 5"):
                sink.finish()
        with writer.part(staging, layout, 20, 0, 5) as sink:
            sink.add(np.zeros((5, 2, DIM), np.float32))
            part = sink.finish()
        with pytest.raises(CacheFormatError, match="rerun with --overwrite"):
            writer.stitch(staging, layout, 20, [part])

    def test_an_empty_cache(self, output):
        self.write(output, [])
        with elmo_cache.open(output) as cache:
            assert len(cache) == 0 and cache.n_tokens == 0 and cache.find("anything") is None
        assert verify(output).ok

    def test_mixed_rows(self, output):
        rng = np.random.default_rng(5)
        sentences = [rng.standard_normal((n, DIM)).astype(np.float32) for n in (2, 0, 4)]
        self.write(output, sentences)
        with elmo_cache.open(output) as cache:
            assert cache.kind == "mix" and cache.layers is None
            for i, expected in enumerate(sentences):
                np.testing.assert_array_equal(cache[i], expected)

    # -- stored tokens -------------------------------------------------------------------------------

    def test_tokens_are_stored_and_confirm_lookups(self, output):
        sentences = _sentences(9, seed=6)
        tokens = _tokens(sentences)
        self.write(output, sentences)
        with elmo_cache.open(output) as cache:
            assert cache.stores_tokens and cache.format_version == FORMAT_VERSION
            assert [cache.tokens(i) for i in range(len(cache))] == tokens
            assert cache.tokens(-1) == tokens[-1]
            for i, t in enumerate(tokens):
                if t:
                    assert cache.find(t) == i and cache.find(" ".join(t)) == i
                    np.testing.assert_array_equal(cache.get(t), cache[i])
        report = verify(output)  # the cache alone: no corpus anywhere
        assert report.ok, str(report)
        assert any("stored tokens" in c for c in report.checks) and any("CRC-32" in c for c in report.checks)

    def test_a_hash_collision_never_answers_for_another_sentence(self, output, monkeypatch):
        sentences = _sentences(4, seed=7)
        sentences[1] = np.ones((3, 2, DIM), np.float32)
        sentences[2] = np.full((3, 2, DIM), 2.0, np.float32)
        a, b = ["the", "cat", "sat"], ["a", "dog", "ran"]  # same length, made to collide below
        token_lists = [["x"] * len(sentences[0]), a, b, ["y"] * len(sentences[3])]
        collide = sentence_hash(a)
        hashes = [sentence_hash(token_lists[0]), collide, collide, sentence_hash(token_lists[3])]
        layout = self.layout()
        progress = Progress(identity={"fmt": self.fmt})
        writer = store.writer_class(self.fmt).create(
            output, layout, progress, _metadata(progress, complete=False, n_unique=0, row_shape=layout.row_shape)
        )
        lengths = np.array([len(s) for s in sentences], dtype=np.int32)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        writer.append(np.concatenate(sentences), offsets, lengths, np.array(hashes, np.uint64), token_lists)
        writer.commit(done=True)
        unique, _ = writer.index()
        writer.finalize(_metadata(writer.progress, complete=True, n_unique=len(unique), row_shape=layout.row_shape))
        with elmo_cache.open(output) as cache:
            # The index holds one entry for the colliding hash: sentence 1, the first occurrence.
            assert cache.find(a) == 1 and float(cache.get(a).max()) == 1.0
            # Sentence 2 hashes to sentence 1's entry, has its length, but not its tokens: no answer.
            assert cache.find(b) is None and cache.get(b) is None and b not in cache
            assert cache.tokens(2) == b
            # The same through the hash the lookup computes: every query now hashes like sentence 1.
            monkeypatch.setattr("elmo_cache.reader.cache.key_hash", lambda key: collide)
            assert cache.get(["one", "two", "six"]) is None
            assert cache.get("the cat sat") is not None

    def test_format_1_caches_still_open_and_say_what_they_cannot_do(self, output, tmp_path):
        sentences = _sentences(7, seed=8)
        tokens = _tokens(sentences)
        self.write(output, sentences)
        self.write_format_1(output)
        with elmo_cache.open(output) as cache:
            assert cache.format_version == 1 and not cache.stores_tokens
            for i, expected in enumerate(sentences):
                np.testing.assert_array_equal(cache[i], expected.transpose(1, 0, 2))
            i = next(k for k, t in enumerate(tokens) if t)
            assert cache.find(tokens[i]) == i  # found by hash and length, as format 1 always was
            with pytest.raises(CacheFormatError, match="format-1 cache stores no tokens"):
                cache.tokens(i)
        report = verify(output)
        assert report.ok, str(report)
        assert "no checksums" in str(report) and "--corpus" in str(report)
        with pytest.raises(elmo_cache.InvalidParameterError, match="stores none: pass --corpus"):
            verify(output, sample=2)
        from elmo_cache.compat.export import export

        summary = export(output, tmp_path / "allennlp.h5")
        assert not summary.from_tokens and summary.corpus is None and "format-1" in str(summary)
        with h5py.File(tmp_path / "allennlp.h5", "r") as f:
            assert "sentence_to_index" not in f and len(f) == len(sentences)

    def test_export_needs_no_corpus(self, output, tmp_path):
        from elmo_cache.compat.export import export

        sentences = _sentences(5, seed=9)
        self.write(output, sentences)
        summary = export(output, tmp_path / "allennlp.h5")
        assert summary.from_tokens and "tokens stored in the cache" in str(summary)
        with h5py.File(tmp_path / "allennlp.h5", "r") as f:
            mapping = json.loads(f["sentence_to_index"][0])
        tokens = _tokens(sentences)
        assert mapping == {" ".join(t): str(i) for i, t in enumerate(tokens)}  # a repeat maps to its last line

    # -- corruption ----------------------------------------------------------------------------------

    @pytest.mark.parametrize("name", ARRAYS)
    def test_a_flipped_bit_in_any_array_is_found_by_verify(self, output, name):
        self.write(output, _sentences(8, seed=10))
        assert verify(output).ok
        file, offset = self.data_of(output, name)
        data = bytearray(file.read_bytes())
        data[offset] ^= 0x10
        file.write_bytes(bytes(data))
        report = verify(output)
        assert not report.ok
        assert (
            self.where(name) in report.problems[0]
            and "CRC-32" in report.problems[0]
            and "bit flip" in report.problems[0]
        )

    def test_a_truncated_file_is_found_by_open_and_verify(self, output):
        self.write(output, _sentences(8, seed=11))
        opened, verified = self.truncate_vectors(output)
        with pytest.raises(CacheFormatError, match="truncated|bytes") as info:
            elmo_cache.open(output)
        assert opened in str(info.value)
        report = verify(output)
        assert not report.ok and verified in report.problems[0], str(report)

    @pytest.mark.parametrize("name", ["lengths", "tokens/bytes", "index/rows"])
    def test_a_missing_array_is_found_by_open_and_verify(self, output, name):
        self.write(output, _sentences(6, seed=12))
        self.delete_array(output, name)
        with pytest.raises(CacheFormatError, match=f"array {name!r} is missing"):
            elmo_cache.open(output)
        report = verify(output)
        assert not report.ok and name in report.problems[0] and "missing" in report.problems[0], str(report)

    @pytest.mark.parametrize("name", ["lengths", "index/rows"])
    def test_a_missing_array_of_a_cache_without_checksums_is_found_by_verify(self, output, name):
        """Without checksums (format 1) nothing reports a deleted array before the structure check does."""
        self.write(output, _sentences(6, seed=12))
        self.write_format_1(output)
        assert verify(output).ok
        self.delete_array(output, name)
        report = verify(output)
        assert not report.ok, str(report)
        assert report.problems[0] == f"missing arrays: [{name!r}]", str(report)

    def test_offsets_out_of_input_order_are_found_by_verify_without_checksums(self, output):
        """Two sentences of one length whose offsets were swapped (a writer's bug): in range, right lengths,
        nothing but the order of the rows is wrong, and no checksum reports it first."""
        sentences = _sentences(12, seed=15)
        self.write(output, sentences)
        self.write_format_1(output)
        lengths = [len(s) for s in sentences]
        i, j = next((i, j) for i, j in itertools.combinations(range(12), 2) if lengths[i] == lengths[j] > 0)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        offsets[[i, j]] = offsets[[j, i]]
        self.replace_array(output, "offsets", offsets)
        report = verify(output)
        assert not report.ok, str(report)
        assert report.problems[0] == (
            f"offsets/lengths are not consecutive in input order: sentence {i} starts at row {offsets[i]}, "
            f"expected {offsets[j]}"
        ), str(report)

    def test_edited_metadata_is_found(self, output):
        self.write(output, _sentences(6, seed=13))
        # Disagreeing with the arrays: open refuses.
        self.set_metadata(output, n_sentences=5)
        with pytest.raises(CacheFormatError, match="metadata says n_sentences = 5 but array 'offsets' has 6"):
            elmo_cache.open(output)
        report = verify(output)
        assert not report.ok and "metadata was edited" in report.problems[0]
        # Agreeing with the arrays: open checks the metadata's CRC-32 too (a mix edited after the build
        # would describe the stored vectors wrongly), and so does verify.
        self.set_metadata(
            output, n_sentences=6, mix={"weights": [1, 0, 0], "gamma": 1.0, "raw": None, "softmax": False}
        )
        with pytest.raises(CacheFormatError, match="the metadata fails its CRC-32"):
            elmo_cache.open(output)
        report = verify(output)
        assert not report.ok and "metadata: CRC-32" in report.problems[0] and "edited" in report.problems[0]
        # Not JSON at all.
        self.set_metadata(output, raw="{not json")
        with pytest.raises(CacheFormatError, match="not valid JSON|cannot read the zarr metadata"):
            elmo_cache.open(output)
        assert not verify(output).ok

    def test_token_offsets_disagreeing_with_the_text_are_found_by_open(self, output):
        self.write(output, _sentences(6, seed=14))
        self.replace_array(output, "tokens/offsets", np.zeros(3, np.int64))
        with pytest.raises(CacheFormatError, match=r"'tokens/offsets' has shape \(3,\), expected \(7,\)"):
            elmo_cache.open(output)
        self.replace_array(output, "tokens/offsets", np.array([0, 1, 2, 3, 4, 5, 10**6], np.int64))
        with pytest.raises(CacheFormatError, match="'tokens/offsets' runs from 0 to 1000000 but 'tokens/bytes'"):
            elmo_cache.open(output)
