"""The ray engine (elmo_cache.builder.ray.engine) on a local 2-CPU Ray cluster: the cache equals build()'s byte for
byte, a failed part is redone alone, empty lines keep their rows, the CLI, and clear errors."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

import elmo_cache  # noqa: E402
from elmo_cache.builder import BuildOptions, build  # noqa: E402
from elmo_cache.builder.ray.engine import FAIL_PART_ENV, build_distributed  # noqa: E402
from elmo_cache.builder.ray.parts import cut_parts  # noqa: E402
from elmo_cache.errors import CacheExistsError, ElmoCacheError, InvalidParameterError  # noqa: E402
from elmo_cache.store.format import BUILD_DIR, ZARR_JSON, staging_path  # noqa: E402
from elmo_cache.verify.checks import verify  # noqa: E402
from tests._build_fixtures import corpus_lines, write_corpus  # noqa: E402

LINES = corpus_lines(3000, seed=3)
# Small windows, files and parts, so that a few thousand lines make ~18 windows, ~30 vectors files
# (shards of 4 chunks of 256 rows, the last one partial) and 4 parts whose cuts split files into fragments.
SMALL = {
    "batch_tokens": 1024,
    "window_batches": 2,
    "chunk_rows": 256,
    "shard_rows": 1024,
    "device": "cpu",
    "progress": False,
}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    """One local Ray cluster for the module (2 CPUs; actors take half a CPU each)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", LINES)


def options(tiny_model, output, **kwargs) -> BuildOptions:
    return BuildOptions(output=output, options_file=tiny_model[0], weight_file=tiny_model[1], **{**SMALL, **kwargs})


def files_of(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def assert_same_cache(ours: Path, reference: Path) -> None:
    """Every file byte-equal; the root metadata equal but for the ``build`` log."""
    a, b = files_of(ours), files_of(reference)
    assert sorted(a) == sorted(b)
    for name in a:
        if name == ZARR_JSON:
            meta_a = json.loads(a[name])["attributes"]["elmo_cache"]
            meta_b = json.loads(b[name])["attributes"]["elmo_cache"]
            meta_a.pop("build"), meta_b.pop("build")
            assert meta_a == meta_b
        else:
            assert a[name] == b[name], name


@pytest.fixture(scope="module")
def reference(tiny_model, corpus, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("reference") / "ref.zarr"
    build(corpus, options(tiny_model, output, dedupe=True, pool="mean"))
    return output


def run(corpus, opts, **kwargs):
    return build_distributed(corpus, opts, workers=2, parts=4, cpus_per_worker=0.5, **kwargs)


def test_cut_parts_fall_on_windows_near_file_boundaries():
    # windows: (first line, lines, first row, rows); 10 windows of 100 rows, files of 250 rows
    windows = np.array([[i * 10, 10, i * 100, 100] for i in range(10)])
    parts = cut_parts(windows, 250, 4)
    # targets 250, 500, 750 (multiples of the file size); a tie goes to the later window
    assert [(p.first_window, p.end_window) for p in parts] == [(0, 3), (3, 5), (5, 8), (8, 10)]
    assert [(p.first_row, p.end_row) for p in parts] == [(0, 300), (300, 500), (500, 800), (800, 1000)]
    assert len(cut_parts(windows, 250, 50)) == 10  # never more parts than windows
    empty = np.array([[i, 1, 0, 0] for i in range(6)])  # a corpus of empty lines has no rows
    assert [(p.first_window, p.end_window) for p in cut_parts(empty, 250, 3)] == [(0, 2), (2, 4), (4, 6)]


def test_byte_equal_to_build_and_readable(tiny_model, corpus, reference, tmp_path):
    output = tmp_path / "ray.zarr"
    summary = run(corpus, options(tiny_model, output, dedupe=True, pool="mean"))
    assert summary.engine == "ray" and summary.parts == 4 and summary.parts_run == 4
    assert 1 <= len(summary.workers) <= 2 and "ray: 4 parts on" in str(summary)
    assert (summary.n_sentences, summary.n_rows) == (
        len(LINES),
        json.loads((reference / ZARR_JSON).read_text())["attributes"]["elmo_cache"]["n_rows"],
    )
    assert len(list((output / "vectors" / "c").iterdir())) > 8  # several vectors files, some stitched
    assert_same_cache(output, reference)
    cache = elmo_cache.open(output)
    assert len(cache) == len(LINES)
    report = verify(output, corpus=corpus)
    assert report.ok, report
    # The parts' pooled rows joined in line order, and every repeat holds its first occurrence's pooled vector.
    assert (output / "pooled" / "zarr.json").is_file()
    for i in range(0, len(LINES), 97):
        assert np.array_equal(cache.sentence_vector(i), cache.sentence_vector(LINES[i]))
    # Rerunning on the complete cache does nothing.
    again = run(corpus, options(tiny_model, output, dedupe=True, pool="mean"))
    assert again.already_complete


def test_quantized_byte_equal_to_build(tiny_model, corpus, tmp_path):
    # int8 codes and scales are computed per window on each worker, so the ray cache is the local one's, byte for byte.
    reference = tmp_path / "ref.zarr"
    build(corpus, options(tiny_model, reference, quantize="int8", pool="first-last"))
    output = tmp_path / "ray.zarr"
    summary = run(corpus, options(tiny_model, output, quantize="int8", pool="first-last"))
    assert summary.parts == 4 and summary.parts_run == 4
    assert_same_cache(output, reference)
    cache = elmo_cache.open(output)
    assert cache.stored_dtype == np.int8 and cache.quantized(0).codes.dtype == np.int8
    assert cache.sentence_vector(0).dtype == np.float32  # pooled from the float32 rows, stored unquantised
    assert verify(output).ok


@pytest.mark.parametrize(("quantize", "extra"), [("pq:8", {}), ("opq:4", {"layers": "2"})])
def test_pq_codebooks_trained_once_on_the_cluster_and_byte_equal_to_build(
    tiny_model, corpus, tmp_path, monkeypatch, quantize, extra
):
    """pq and opq: a Ray task trains the codebooks (and rotations) from the first pass's windows (the driver loads
    no model), every worker reads them from the staging, a resume reuses them, and the cache is the local one's
    byte for byte (opq: one layer, to keep its training short)."""
    pytest.importorskip("faiss")
    from elmo_cache import Encoder

    reference = tmp_path / "ref.zarr"
    build(corpus, options(tiny_model, reference, quantize=quantize, dedupe=True, **extra))
    output = tmp_path / "ray.zarr"
    opts = options(tiny_model, output, quantize=quantize, dedupe=True, **extra)
    monkeypatch.setenv(FAIL_PART_ENV, "1")

    def no_loading(*args, **kwargs):
        raise AssertionError("the driver loaded an encoder")

    monkeypatch.setattr(Encoder, "load", no_loading)  # in this process only
    with pytest.raises(ElmoCacheError, match=r"1 of 4 parts"):
        run(corpus, opts)
    staged = staging_path(output) / BUILD_DIR / "codebooks.f32"
    first = staged.read_bytes()
    monkeypatch.delenv(FAIL_PART_ENV)
    summary = run(corpus, opts)
    assert (summary.parts, summary.parts_run) == (4, 1)
    assert_same_cache(output, reference)
    monkeypatch.undo()
    cache = elmo_cache.open(output)
    assert cache.stored_dtype == np.uint8 and cache.quantization.parameters().tobytes() == first
    assert verify(output, corpus=corpus).ok


def test_failed_part_is_redone_alone(tiny_model, corpus, reference, tmp_path, monkeypatch):
    output = tmp_path / "ray.zarr"
    opts = options(tiny_model, output, dedupe=True, pool="mean")
    monkeypatch.setenv(FAIL_PART_ENV, "2")
    with pytest.raises(ElmoCacheError, match=r"1 of 4 parts .* failed \(part 2 on .*failed on purpose.*rerun the same"):
        run(corpus, opts)
    staging = staging_path(output)
    done = sorted(p.name for p in (staging / BUILD_DIR / "parts").iterdir())
    assert done == ["0.done", "1.done", "3.done"]
    # Files of the parts that finished must not be written again.
    kept, fragments = {}, 0
    for name in ("0.done", "1.done", "3.done"):
        marker = json.loads((staging / BUILD_DIR / "parts" / name).read_text())
        fragments += len(marker["fragments"])
        for k in marker["files"]:
            path = staging / "vectors" / "c" / k / "0" / "0"
            kept[k] = path.stat().st_mtime_ns
    # Whole files only: parts are cut at windows, and each window's rows start a file of their own (none shared,
    # so nothing to stitch; tests/store/test_streamed_rows.py stitches shared files).
    assert kept and not fragments
    pooled = staging / BUILD_DIR / "columns" / "pooled"
    # Each part's pooled rows are published before its marker (the failing hook runs after, as a death there would).
    assert sorted(p.name for p in pooled.glob("*.bin")) == ["0.bin", "1.bin", "2.bin", "3.bin"]
    monkeypatch.delenv(FAIL_PART_ENV)
    with pytest.raises(CacheExistsError, match="interrupted build of the ray engine; rerun it with --engine ray"):
        build(corpus, opts)  # the local engine does not silently discard the parts done
    # A corpus touched since the plan was made is refused before any work (the plan would not fit it).
    stat = corpus.stat()
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(CacheExistsError, match="another corpus or window size .*mtime_ns.*--overwrite"):
        run(corpus, opts)
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    summary = run(corpus, opts)
    assert (summary.parts, summary.parts_run) == (4, 1) and "1 of 4 parts" in str(summary)
    for k, mtime in kept.items():
        assert (output / "vectors" / "c" / k / "0" / "0").stat().st_mtime_ns == mtime
    assert_same_cache(output, reference)


def test_killed_driver_resumes(tiny_model, corpus, reference, tmp_path):
    """kill -9 of the driver mid-run: the same call again redoes only the parts without a marker."""
    import subprocess
    import time

    output = tmp_path / "killed.zarr"
    address = ray.get_runtime_context().gcs_address
    script = (
        "import sys; from elmo_cache.builder import BuildOptions; "
        "from elmo_cache.builder.ray.engine import build_distributed; "
        f"build_distributed({str(corpus)!r}, BuildOptions(output={str(output)!r}, options_file={str(tiny_model[0])!r}, "
        f"weight_file={str(tiny_model[1])!r}, dedupe=True, pool='mean', **{SMALL!r}), address={address!r}, workers=2, "
        "parts=4, cpus_per_worker=0.5)"
    )
    driver = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
    parts = staging_path(output) / BUILD_DIR / "parts"
    deadline = time.monotonic() + 120
    while not (parts.is_dir() and any(parts.glob("*.done"))) and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    driver.kill()
    assert driver.wait() == -9, "the driver ended before it could be killed"
    # A worker of the killed driver may still finish its part until Ray reaps it: the markers are counted once
    # none has appeared for two seconds (not a marker's .tmp, which a worker may be writing at the kill).
    done, stable_since, deadline = -1, time.monotonic(), time.monotonic() + 60
    while time.monotonic() - stable_since < 2 and time.monotonic() < deadline:
        now = len(list(parts.glob("*.done")))
        if now != done:
            done, stable_since = now, time.monotonic()
        time.sleep(0.05)
    assert 1 <= done <= 4
    summary = run(corpus, options(tiny_model, output, dedupe=True, pool="mean"))
    assert summary.parts_run == 4 - done
    assert_same_cache(output, reference)


@pytest.mark.parametrize("lines", [["", "", "a b c", "", "d", "", "", "e f"] * 50 + ["", ""], [""] * 300])
def test_empty_lines_keep_their_rows(tiny_model, tmp_path, lines):
    corpus = write_corpus(tmp_path / "empty.txt", lines)
    output = tmp_path / "empty.zarr"
    summary = run(corpus, options(tiny_model, output, batch_tokens=64))
    assert summary.n_sentences == len(lines)
    cache = elmo_cache.open(output)
    assert [len(cache.tokens(i)) for i in range(len(lines))] == [len(line.split()) for line in lines]
    reference = tmp_path / "empty-ref.zarr"
    build(corpus, options(tiny_model, reference, batch_tokens=64))
    assert_same_cache(output, reference)


def test_pre_tokenised_input_gives_the_local_cache(tiny_model, tmp_path):
    # CoNLL-U with tokens holding spaces: the driver reads it, the parts store the tokens as given.
    blocks = [
        f"# sent_id = {i}\n"
        + "".join(
            f"{k + 1}\t{word}\t_\t_\t_\t_\t_\t_\t_\t_\n" for k, word in enumerate(line.split()[:6] + ["New York"])
        )
        for i, line in enumerate(corpus_lines(300, seed=5))
    ]
    corpus = tmp_path / "ud.conllu"
    corpus.write_text("\n".join(blocks) + "\n", encoding="utf-8")
    output, reference = tmp_path / "ud.zarr", tmp_path / "ud-ref.zarr"
    summary = run(corpus, options(tiny_model, output, input_format="conllu", batch_tokens=256))
    assert summary.n_sentences == 300
    build(corpus, options(tiny_model, reference, input_format="conllu", batch_tokens=256))
    assert_same_cache(output, reference)
    with elmo_cache.open(output) as cache:
        assert cache.tokens(7)[-1] == "New York" and cache.metadata["tokenization"] == "conllu"


def test_cli_engine_ray(tiny_model, corpus, tmp_path):
    """Another layout through the CLI: layers 1,2 in float16, no dedupe, the default parts (4 per worker)."""
    from click.testing import CliRunner

    from elmo_cache.cli.main import cli

    output = tmp_path / "cli.zarr"
    args = ["build", str(corpus), "-o", str(output), "--engine", "ray", "--workers", "2", "--layers", "1,2", "--fp16"]
    args += ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"]
    args += ["--batch-tokens", "1024", "--window-batches", "2", "--chunk-rows", "256", "--shard-rows", "1024"]
    args += ["--no-progress"]
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "ray: 8 parts on" in result.output
    reference = tmp_path / "local.zarr"
    build(corpus, options(tiny_model, reference, layers="1,2", fp16=True))
    assert_same_cache(output, reference)


def test_clear_errors(tiny_model, corpus, tmp_path, monkeypatch):
    with pytest.raises(
        InvalidParameterError, match=r"an? hdf5 cache has a single writer; build zarr \(or use --engine local\)"
    ):
        build(corpus, options(tiny_model, tmp_path / "x.h5", chunk_rows=None, shard_rows=None), engine="ray")
    with pytest.raises(InvalidParameterError, match=r"engine: 'spark' is not valid; choose from \['local', 'ray'\]"):
        build(corpus, options(tiny_model, tmp_path / "x.zarr"), engine="spark")
    with pytest.raises(InvalidParameterError, match="workers: must be at least 1, got 0"):
        build(corpus, options(tiny_model, tmp_path / "x.zarr"), engine="ray", workers=0)
    with pytest.raises(InvalidParameterError, match="3 workers of 1 CPUs need 3 CPUs; the Ray cluster has 2"):
        build_distributed(corpus, options(tiny_model, tmp_path / "x.zarr"), workers=3, cpus_per_worker=1)
    with pytest.raises(InvalidParameterError, match="only the ray engine"):
        build(corpus, options(tiny_model, tmp_path / "x.zarr"), workers=2)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(InvalidParameterError, match=r'pip install "elmo-cache\[ray\]"'):
        build(corpus, options(tiny_model, tmp_path / "x.zarr"), engine="ray")


def test_the_driver_loads_no_encoder(tiny_model, tmp_path, monkeypatch):
    """The driver plans from the model's files (its identity and width); only the workers load it."""
    from elmo_cache import Encoder

    def no_loading(*args, **kwargs):
        raise AssertionError("the driver loaded an encoder")

    monkeypatch.setattr(Encoder, "load", no_loading)  # in this process only: the actors are other processes
    lines = corpus_lines(200, seed=5)
    corpus = write_corpus(tmp_path / "small.txt", lines)
    summary = run(corpus, options(tiny_model, tmp_path / "small.zarr"))
    assert summary.n_sentences == len(lines) and summary.parts_run >= 1
    monkeypatch.undo()
    reference = tmp_path / "small-ref.zarr"
    build(corpus, options(tiny_model, reference))
    assert_same_cache(tmp_path / "small.zarr", reference)


def test_pool_only_byte_equal_to_build(tiny_model, corpus, tmp_path):
    """--pool-only on the ray engine: a layout without token rows, whose parts write the pooled vectors alone; the
    cache is the local pool-only build's, byte for byte, and no full cache is ever written beside it."""
    reference = tmp_path / "ref.zarr"
    build(corpus, options(tiny_model, reference, dedupe=True, pool="mean", pool_only=True))
    output = tmp_path / "ray.zarr"
    summary = run(corpus, options(tiny_model, output, dedupe=True, pool="mean", pool_only=True))
    assert summary.engine == "ray" and summary.parts == 4 and summary.n_rows == 0
    assert_same_cache(output, reference)
    assert not list(tmp_path.glob(".ray.zarr*"))  # the strip's hidden full build is gone
    assert not (output / "vectors" / "c").exists()
    assert elmo_cache.open(output).metadata["pool"] == {"method": "mean", "dtype": "float32", "only": True}
    assert verify(output).ok


def test_pool_only_failed_part_is_redone_alone(tiny_model, corpus, tmp_path, monkeypatch):
    """An interrupted --pool-only ray build writes no vectors file and keeps its finished parts' pooled rows; the
    rerun redoes the failed part alone and ends with the uninterrupted build's cache (the local one's, which
    test_pool_only_byte_equal_to_build shows is the ray engine's)."""
    reference = tmp_path / "ref.zarr"
    build(corpus, options(tiny_model, reference, dedupe=True, pool="mean", pool_only=True))
    output = tmp_path / "ray.zarr"
    opts = options(tiny_model, output, dedupe=True, pool="mean", pool_only=True)
    monkeypatch.setenv(FAIL_PART_ENV, "1")
    with pytest.raises(ElmoCacheError, match=r"1 of 4 parts .* failed \(part 1 on "):
        run(corpus, opts)
    staging = staging_path(output)
    assert sorted(p.name for p in (staging / BUILD_DIR / "parts").iterdir()) == ["0.done", "2.done", "3.done"]
    pooled = staging / BUILD_DIR / "columns" / "pooled"
    assert sorted(p.name for p in pooled.glob("*.bin")) == ["0.bin", "1.bin", "2.bin", "3.bin"]
    assert not (staging / "vectors" / "c").exists() and not any((staging / BUILD_DIR / "fragments").iterdir())
    monkeypatch.delenv(FAIL_PART_ENV)
    summary = run(corpus, opts)
    assert (summary.parts, summary.parts_run) == (4, 1) and summary.n_rows == 0
    assert_same_cache(output, reference)
    assert verify(output).ok
