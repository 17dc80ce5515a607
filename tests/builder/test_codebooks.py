"""A product-quantised build of a corpus too small for its codebooks warns, once, naming its size and int8's
(issue 35, item 9: "pq:16/opq:16 caches of 200 lines are larger than the int8 one with no word")."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from elmo_cache import Encoder
from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.codebooks import compare_with_int8, larger_than_int8
from elmo_cache.builder.plan import make_plan
from elmo_cache.store.format import CODEBOOKS
from elmo_cache.text.corpus import Corpus
from tests._build_fixtures import corpus_lines, failing_on, raw_arrays, write_corpus
from tests.rows.test_pq import _training_calls

pytest.importorskip("faiss")

_WARNING = re.compile(
    r"--quantize (\S+): this corpus's ([\d,]+) token rows take ([\d,]+) bytes as .* codes and codebooks "
    r"\(([\d,]+) bytes of codebooks, stored once\), more than --quantize int8 would take \(([\d,]+) bytes"
)


def _warnings(caplog) -> list[tuple[str, int, int, int, int]]:
    found = []
    for record in caplog.records:
        if record.name == "elmo_cache.builder" and record.levelno == logging.WARNING:
            name, *numbers = _WARNING.search(record.getMessage()).groups()
            found.append((name, *(int(n.replace(",", "")) for n in numbers)))
    caplog.clear()
    return found


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.fixture(scope="module")
def bundled_encoder(bundled_model):
    return Encoder.load(bundled_model, device="cpu")


def test_a_small_pq_build_warns_once_with_the_sizes_its_cache_and_int8_s_have(
    tmp_path, bundled_encoder, caplog
):  # fmt: skip
    caplog.set_level(logging.WARNING, logger="elmo_cache.builder")
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(40, seed=2))
    pq = build(corpus, BuildOptions(output=tmp_path / "pq.zarr", quantize="pq:16", progress=False),
               encoder=bundled_encoder)  # fmt: skip
    ((name, rows, own, codebooks, int8),) = _warnings(caplog)
    assert name == "pq:16" and rows == pq.n_tokens == pq.n_rows
    int8_cache = build(corpus, BuildOptions(output=tmp_path / "int8.zarr", quantize="int8", progress=False),
                       encoder=bundled_encoder)  # fmt: skip
    assert _warnings(caplog) == []  # int8 trains nothing: nothing to warn about
    # The figures are the caches' own: pq's codes and codebooks arrays, int8's codes-and-scales array.
    _, pq_arrays = raw_arrays(pq.path)
    _, int8_arrays = raw_arrays(int8_cache.path)
    assert codebooks == pq_arrays[CODEBOOKS].nbytes == 3 * 16 * 256 * 16 * 4
    assert own == pq_arrays["vectors"].nbytes + codebooks
    assert int8 == int8_arrays["vectors"].nbytes and own > int8
    assert _disk_bytes(pq.path) > _disk_bytes(int8_cache.path)  # and on disk, as the warning says
    # Once per build: the complete cache found again is no new build.
    build(corpus, BuildOptions(output=pq.path, quantize="pq:16", progress=False), encoder=bundled_encoder)
    assert _warnings(caplog) == []


def test_a_resumed_build_is_not_warned_again(tmp_path, tiny_encoder, caplog):
    caplog.set_level(logging.WARNING, logger="elmo_cache.builder")
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(120, seed=5))
    options = dict(batch_tokens=40, window_batches=2, commit_seconds=0, progress=False)
    training_calls = _training_calls(tiny_encoder, corpus, options)
    caplog.clear()
    options["quantize"] = "pq:16"  # the tiny model's 98,304 bytes of codebooks outweigh 1,342 rows' savings
    output = tmp_path / "pq.zarr"
    with failing_on(tiny_encoder, training_calls + 7), pytest.raises(RuntimeError, match="simulated crash"):
        build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert [w[:2] for w in _warnings(caplog)] == [("pq:16", 1342)]
    summary = build(corpus, BuildOptions(output=output, **options), encoder=tiny_encoder)
    assert summary.resumed_from > 0 and _warnings(caplog) == []


@pytest.mark.parametrize("scheme", ["pq:16", "opq:16"])
def test_the_comparison_turns_at_the_break_even_and_a_corpus_past_it_is_not_warned(tmp_path, scheme):
    corpus_path = write_corpus(tmp_path / "c.txt", ["a b c"])
    plan = make_plan(Corpus(corpus_path), BuildOptions(output=tmp_path / "x.zarr", quantize=scheme)).with_model(256)
    zero = compare_with_int8(plan, 0)
    # The bundled model's three layers: 3 x 16 sub-quantisers of 256 centroids of 16 floats, and opq's three
    # 256 x 256 rotations; a row is 48 code bytes against int8's 3 x (256 + 4).
    rotations = 3 * 256 * 256 * 4 if scheme == "opq:16" else 0
    assert zero.parameter_bytes == 3 * 16 * 256 * 16 * 4 + rotations
    assert zero.break_even_rows == -(-zero.parameter_bytes // (3 * 260 - 48)) == (1075 if rotations == 0 else 2149)
    below, at = compare_with_int8(plan, zero.break_even_rows - 1), compare_with_int8(plan, zero.break_even_rows)
    assert below.own_bytes > below.int8_bytes and at.own_bytes <= at.int8_bytes
    assert larger_than_int8(plan, Corpus(corpus_path)).rows == 3
    # A corpus of exactly the break-even's tokens is not warned; one token fewer is.
    big = write_corpus(tmp_path / "big.txt", ["w x"] * (zero.break_even_rows // 2) + ["w"] * (zero.break_even_rows % 2))
    assert Corpus(big).count_tokens(10**6) == zero.break_even_rows
    assert larger_than_int8(plan, Corpus(big)) is None
    small = write_corpus(tmp_path / "small.txt", ["w"] * (zero.break_even_rows - 1))
    assert larger_than_int8(plan, Corpus(small)).rows == zero.break_even_rows - 1
    # Codecs that train nothing never warn, whatever the corpus.
    floats = make_plan(Corpus(corpus_path), BuildOptions(output=tmp_path / "f.zarr", quantize="int8")).with_model(256)
    assert larger_than_int8(floats, Corpus(corpus_path)) is None
