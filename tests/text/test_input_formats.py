"""Input: pre-tokenised corpora (issue 20, item 3: ``--input-format tsv|conllu``, tokens with spaces stored
exactly, lookups by token list in the reader and the server, verify and export reading the corpus the same way),
and awkward whitespace-split input (invalid UTF-8 replaced, empty corpora, stdin)."""

from __future__ import annotations

import hashlib
import json

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.cli.main import cli
from elmo_cache.compat.export import export
from elmo_cache.errors import CacheExistsError, CorpusError, InvalidParameterError
from elmo_cache.server import create_app
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.tokenize import has_plain_tokens, sentence_hash, sentence_key, split_key
from elmo_cache.verify.checks import verify
from tests.server_helpers import close, decode_item, run, settings

# Sentences as token lists: spaces inside tokens, the same words split otherwise, an empty sentence.
SENTENCES = [
    ["New York", "is", "big"],
    [],
    ["Xin chào", "các", "bạn"],
    ["New", "York", "is", "big"],
    ["a b", "c"],
    ["a", "b c"],
    ["New York", "is", "big"],
]

CONLLU = """# sent_id = 1
# text = New York is big
1\tNew York\tNew York\tPROPN\t_\t_\t3\tnsubj\t_\t_
2\tis\tbe\tAUX\t_\t_\t3\tcop\t_\t_
3\tbig\tbig\tADJ\t_\t_\t0\troot\t_\t_

# a block of comments alone is no sentence

# sent_id = 2
1-2\tdela\t_\t_\t_\t_\t_\t_\t_\t_
1\tde\tde\tADP\t_\t_\t2\tcase\t_\t_
2\tla\tla\tDET\t_\t_\t0\troot\t_\t_
2.1\tgap\t_\t_\t_\t_\t_\t_\t_\t_


1\tXin chào\t_\t_\t_\t_\t0\troot\t_\t_\r
"""


def _tsv(sentences: list[list[str]]) -> str:
    return "".join("\t".join(tokens) + "\n" for tokens in sentences)


@pytest.fixture
def tsv_corpus(tmp_path):
    path = tmp_path / "corpus.tsv"
    path.write_text(_tsv(SENTENCES), encoding="utf-8")
    return path


def _build(corpus, output, tiny_model, **options):
    options = BuildOptions(
        output=output,
        options_file=tiny_model[0],
        weight_file=tiny_model[1],
        device="cpu",
        progress=False,
        **options,
    )
    return build(corpus, options)


# -- keys --------------------------------------------------------------------------------------------------


def test_keys_of_plain_tokens_are_unchanged_and_token_lists_never_collide():
    plain = ["The", "cat", "sat", "."]
    assert sentence_key(plain) == "The cat sat ." == sentence_key("The  cat sat .")
    digest = hashlib.blake2b(b"The cat sat .", digest_size=8).digest()
    assert sentence_hash(plain) == int.from_bytes(digest, "little")  # caches built before still answer
    lists = [*SENTENCES, [""], ["", ""], ["x\u00a0y"], ["\ufeffa"], ["a", ""], [" "]]
    keys = {sentence_key(tokens) for tokens in lists}
    assert len(keys) == len({tuple(tokens) for tokens in lists})
    for tokens in lists:
        assert split_key(sentence_key(tokens)) == tokens
    assert has_plain_tokens(plain) and not has_plain_tokens(["New York"]) and not has_plain_tokens([""])


# -- reading the formats -------------------------------------------------------------------------------------


def test_tsv_keeps_tokens_exactly_and_lines_stay_sentences(tmp_path):
    path = tmp_path / "c.tsv"
    path.write_bytes("\ufeffNew York\tis \tbig\r\n\n  \nc\u00e1c\tb\u1ea1n".encode())
    corpus = Corpus(path, input_format="tsv")
    assert list(corpus.sentences()) == [(0, ["New York", "is ", "big"]), (1, []), (2, ["  "]), (3, ["các", "bạn"])]
    assert corpus.count_sentences() == 4
    assert list(corpus.sentences(start=3)) == [(3, ["các", "bạn"])]


@pytest.mark.parametrize("line", ["a\t\tb", "\ta", "a\t"])
def test_tsv_refuses_an_empty_token_naming_the_line(tmp_path, line):
    path = tmp_path / "c.tsv"
    path.write_text(f"ok\tfine\n{line}\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=r"c\.tsv, line 2: token \d of \d is empty"):
        list(Corpus(path, input_format="tsv").sentences())


def test_conllu_gives_the_forms_of_the_words_of_each_block(tmp_path):
    path = tmp_path / "c.conllu"
    path.write_text(CONLLU, encoding="utf-8")
    corpus = Corpus(path, input_format="conllu")
    expected = [(0, ["New York", "is", "big"]), (1, ["de", "la"]), (2, ["Xin chào"])]
    assert list(corpus.sentences()) == expected
    assert corpus.count_sentences() == 3
    assert list(corpus.sentences(start=1)) == expected[1:]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1\tonly\tthree", r"line 2: a CoNLL-U word line has 10 tab-separated fields, this one has 3"),
        ("x\tw\t_\t_\t_\t_\t_\t_\t_\t_", r"line 2: ID 'x' is not a CoNLL-U word ID"),
    ],
)
def test_conllu_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "c.conllu"
    path.write_text(f"# c\n{line}\n\n", encoding="utf-8")
    with pytest.raises(CorpusError, match=message):
        list(Corpus(path, input_format="conllu").sentences())


def test_an_unknown_input_format_lists_the_valid_ones(tmp_path, tsv_corpus):
    with pytest.raises(InvalidParameterError, match=r"input_format: 'csv' is not valid; choose from \['lines', 'tsv'"):
        Corpus(tsv_corpus, input_format="csv")
    with pytest.raises(InvalidParameterError, match="input_format: the options say 'tsv'"):
        build(Corpus(tsv_corpus), BuildOptions(output=tmp_path / "x.zarr", input_format="tsv"))


# -- awkward lines input -----------------------------------------------------------------------------------


def test_errors_replace_stores_the_replacement_character(tmp_path, tiny_encoder):
    path = tmp_path / "c.txt"
    path.write_bytes(b"ok line\nbad \xff byte\n")
    output = tmp_path / "c.h5"
    build(path, BuildOptions(output=output, errors="replace", progress=False), encoder=tiny_encoder)
    with elmo_cache.open(output) as cache:
        np.testing.assert_allclose(
            cache[1], tiny_encoder.embed_sentence(["bad", "\ufffd", "byte"]), rtol=1e-6, atol=1e-6
        )


def test_empty_corpus(tmp_path, tiny_encoder):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    for output in (tmp_path / "e.zarr", tmp_path / "e.h5"):
        summary = build(path, BuildOptions(output=output, progress=False), encoder=tiny_encoder)
        assert (summary.n_sentences, summary.n_tokens) == (0, 0)
        with elmo_cache.open(output) as cache:
            assert len(cache) == 0


def test_stdin_needs_an_output(tiny_encoder):
    with pytest.raises(InvalidParameterError, match="stdin needs -o/--output"):
        build("-", BuildOptions(progress=False), encoder=tiny_encoder)


# -- build, read, verify, export -------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".zarr", ".h5"])
def test_a_tsv_build_stores_the_tokens_given_and_answers_by_token_list(
    tmp_path, tsv_corpus, tiny_model, tiny_encoder, suffix
):
    output = tmp_path / f"c{suffix}"
    _build(tsv_corpus, output, tiny_model, input_format="tsv", dedupe=True)
    with elmo_cache.open(output) as cache:
        # Token-list keys: version 3, or 5 for zarr (its windows start vectors files), which holds version 3's keys.
        want = 5 if suffix == ".zarr" else 3
        assert cache.metadata["format_version"] == want and cache.metadata["tokenization"] == "tsv"
        assert [cache.tokens(i) for i in range(len(cache))] == SENTENCES
        for i, tokens in enumerate(SENTENCES):
            assert cache.find(tokens) == SENTENCES.index(tokens)
            if tokens:
                close(cache[i], tiny_encoder.embed_sentence(tokens))
        # "New York" as one token and as two are different sentences with different vectors.
        assert not np.allclose(cache.get(["New York", "is", "big"])[:, 1:], cache.get("New York is big")[:, 2:])
        assert cache.find("New York is big") == 3  # a text is split on whitespace
        assert cache.find(["a", "b", "c"]) is None and cache.find(["New\nYork", "is", "big"]) is None
    report = verify(output, corpus=tsv_corpus, sample=2, options_file=tiny_model[0], weight_file=tiny_model[1])
    assert report.ok and report.sampled == 2, report.problems


def test_lines_builds_keep_format_2_and_a_resume_in_another_format_is_refused(tmp_path, tsv_corpus, tiny_model):
    _build(tsv_corpus, tmp_path / "c.h5", tiny_model)
    with elmo_cache.open(tmp_path / "c.h5") as cache:  # zarr caches are version 5: windows start vectors files
        assert cache.metadata["format_version"] == 2 and cache.metadata["tokenization"] == "whitespace"
    output = tmp_path / "c.zarr"
    _build(tsv_corpus, output, tiny_model)
    with elmo_cache.open(output) as cache:
        assert cache.metadata["format_version"] == 5 and cache.metadata["tokenization"] == "whitespace"
        assert cache.tokens(0) == ["New", "York", "is", "big"]
    with pytest.raises(CacheExistsError, match=r"tokenization: 'whitespace' there, 'tsv' now"):
        _build(tsv_corpus, output, tiny_model, input_format="tsv")


def test_verify_reads_the_corpus_in_the_recorded_format_and_finds_other_tokens(tmp_path, tsv_corpus, tiny_model):
    output = tmp_path / "c.zarr"
    _build(tsv_corpus, output, tiny_model, input_format="tsv")
    changed = tmp_path / "changed.tsv"
    changed.write_text(_tsv([*SENTENCES[:4], ["a b", "C"], *SENTENCES[5:]]), encoding="utf-8")
    report = verify(output, corpus=changed)
    assert not report.ok and any("line 5: other tokens than the cache stores" in p for p in report.problems)


def test_export_maps_sentences_of_a_tsv_corpus(tmp_path, tsv_corpus, tiny_model):
    output = tmp_path / "c.zarr"
    _build(tsv_corpus, output, tiny_model, input_format="tsv")
    export(output, tmp_path / "out.h5", corpus=tsv_corpus)
    with h5py.File(tmp_path / "out.h5", "r") as f:
        mapping = json.loads(f["sentence_to_index"][0])
        assert mapping["Xin chào các bạn"] == "2" and f["2"].shape[1] == 3


def test_conllu_builds_through_the_cli_and_a_bad_format_exits_1(tmp_path, tiny_model):
    corpus = tmp_path / "ud.conllu"
    corpus.write_text(CONLLU, encoding="utf-8")
    model = ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"]
    runner = CliRunner()
    result = runner.invoke(cli, ["build", str(corpus), "--input-format", "conllu", "--no-progress", *model])
    assert result.exit_code == 0, result.output
    with elmo_cache.open(tmp_path / "ud.zarr") as cache:
        assert [cache.tokens(i) for i in range(len(cache))] == [["New York", "is", "big"], ["de", "la"], ["Xin chào"]]
    result = runner.invoke(cli, ["build", str(corpus), "--input-format", "xml", "--no-progress", *model])
    assert result.exit_code == 1 and "choose from ['lines', 'tsv', 'conllu']" in result.output
    assert "Traceback" not in result.output


# -- the server ---------------------------------------------------------------------------------------------


def test_the_server_answers_token_lists_from_the_cache(tmp_path, tsv_corpus, tiny_model, tiny_encoder):
    output = tmp_path / "c.zarr"
    _build(tsv_corpus, output, tiny_model, input_format="tsv")
    cache = elmo_cache.open(output)
    app = create_app(settings(), encoder=tiny_encoder, cache=cache)

    async def scenario(client):
        body = {"sentences": [["Xin chào", "các", "bạn"], "New York is big", ["Hà Nội", "đẹp"]]}
        ok = await client.post("/embed", json=body)
        bad = await client.post("/embed", json={"sentences": [["two\nlines"]]})
        empty = await client.post("/embed", json={"sentences": [["a", ""]]})
        return ok, bad, empty

    ok, bad, empty = run(app, scenario)
    assert ok.status_code == 200, ok.text
    results = ok.json()["results"]
    assert [r["source"] for r in results] == ["cache", "cache", "live"]
    assert [r["tokens"] for r in results] == [
        ["Xin chào", "các", "bạn"],
        ["New", "York", "is", "big"],
        ["Hà Nội", "đẹp"],
    ]
    close(decode_item(results[0]), cache.get(["Xin chào", "các", "bạn"]))
    close(decode_item(results[2]), tiny_encoder.embed_sentence(["Hà Nội", "đẹp"]))
    assert bad.status_code == 422 and empty.status_code == 422
    cache.close()
