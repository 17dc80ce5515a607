"""elmo_cache.text.corpus: line = sentence, and a defined result for every awkward input."""

from __future__ import annotations

import gzip
import io
import sys

import pytest

from elmo_cache.errors import CorpusError, InvalidParameterError
from elmo_cache.text.corpus import Corpus


def sentences(path, **kwargs):
    return [tokens for _, tokens in Corpus(path, **kwargs).sentences()]


def test_one_sentence_per_line_and_empty_lines_are_kept(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"a b\n\n   \nc\n")
    assert sentences(path) == [["a", "b"], [], [], ["c"]]
    assert Corpus(path).count_lines() == 4


@pytest.mark.parametrize(
    ("data", "count"), [(b"", 0), (b"\n", 1), (b"a", 1), (b"a\nb", 2), (b"a\nb\n", 2), (b"a\nb\n\n", 3)]
)
def test_a_final_newline_adds_no_sentence(tmp_path, data, count):
    path = tmp_path / "c.txt"
    path.write_bytes(data)
    assert len(sentences(path)) == count
    assert Corpus(path).count_lines() == count


def test_crlf_bom_and_nul(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes("\ufeffbom first\r\nx\x00y z\r\n\ufeffnot-first\r\n".encode())
    assert sentences(path) == [["bom", "first"], ["x\x00y", "z"], ["not-first"]]


def test_invalid_utf8_strict_names_file_and_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\nalso fine\nbroken \xff\xfe here\n")
    with pytest.raises(CorpusError, match=r"bad\.txt, line 3: invalid UTF-8 at byte 7") as info:
        sentences(path)
    assert "--errors replace" in str(info.value)


def test_invalid_utf8_replace(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"broken \xff here\n")
    assert sentences(path, errors="replace") == [["broken", "\ufffd", "here"]]


def test_errors_choice_is_validated(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("a\n")
    with pytest.raises(InvalidParameterError, match=r"\['strict', 'replace'\]"):
        Corpus(path, errors="ignore")


def test_gzip_is_read_transparently(tmp_path):
    lines = [f"line {i} " + "w " * (i % 5) for i in range(50)]
    plain = tmp_path / "c.txt"
    plain.write_text("\n".join(lines) + "\n")
    packed = tmp_path / "c.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert sentences(packed) == sentences(plain)
    assert Corpus(packed).count_lines() == 50
    hidden = tmp_path / "gzip-without-suffix"
    hidden.write_bytes(packed.read_bytes())
    assert sentences(hidden) == sentences(plain)


def test_gz_suffix_on_plain_text_and_truncated_gzip(tmp_path):
    fake = tmp_path / "c.txt.gz"
    fake.write_text("not compressed\n")
    with pytest.raises(CorpusError, match="not gzip"):
        sentences(fake)
    truncated = tmp_path / "t.txt.gz"
    truncated.write_bytes(gzip.compress(("word " * 20 + "\n").encode() * 2000)[:-200])
    with pytest.raises(CorpusError, match=r"t\.txt\.gz, line \d+: corrupt or truncated"):
        sentences(truncated)


def test_missing_corpus_and_directory(tmp_path):
    with pytest.raises(CorpusError, match="corpus not found"):
        Corpus(tmp_path / "nope.txt")
    with pytest.raises(CorpusError, match="is a directory"):
        Corpus(tmp_path)


def test_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(b"a b\n\nc\n"))))
    corpus = Corpus("-")
    assert corpus.name == "<stdin>" and corpus.count_lines() is None
    assert [t for _, t in corpus.sentences()] == [["a", "b"], [], ["c"]]


def test_gzip_on_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(gzip.compress(b"x y\nz\n")))))
    assert [t for _, t in Corpus("-").sentences()] == [["x", "y"], ["z"]]


def test_long_lines_and_tokens_are_read_whole(tmp_path):
    path = tmp_path / "c.txt"
    token = "x" * 1_000_000
    path.write_text(" ".join(["w"] * 20_000) + "\n" + token + "\n")
    got = sentences(path)
    assert len(got[0]) == 20_000 and got[1] == [token]


def test_a_line_over_the_limit_is_refused_with_its_number(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"short\n" + b"y" * 101 + b"\nafter\n")
    assert len(sentences(path, max_line_bytes=101)) == 3  # exactly at the limit is fine
    with pytest.raises(CorpusError, match=r"line 2: longer than 100 bytes"):
        sentences(path, max_line_bytes=100)


def test_resume_start_skips_lines(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"a\nb \xff\nc\nd\n")
    # Line 2 is invalid UTF-8 but starting at line 3 never decodes it.
    assert list(Corpus(path).sentences(start=2)) == [(2, ["c"]), (3, ["d"])]
