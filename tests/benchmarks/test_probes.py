"""The quality probes (benchmarks/probe_quality.py, benchmarks/_wordnet.py, benchmarks/bench_cache_vs_live.py).

The WordNet files here are a hand-written miniature in the database format
(tests/data/wordnet_mini), so the suite never needs the wordnet-base package.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MINI = Path(__file__).resolve().parents[1] / "data" / "wordnet_mini"
sys.path.insert(0, str(BENCHMARKS))

import _wordnet as wn  # noqa: E402 - the benchmarks folder is not a package: it goes on the path first
import probe_quality as pq  # noqa: E402


# ------------------------------------------------------------------ parsing
def test_parse_data_line_reads_words_and_examples():
    line = (
        "00000200 14 n 03 depository_financial_institution 0 bank 0 banking_concern 0 001 @ 00000900 n 0000 "
        '| a financial institution; "he cashed a check at the bank"; "that bank holds the mortgage"  \n'
    )
    synset = wn.parse_data_line(line)
    assert synset == wn.Synset(
        200,
        "n",
        ("depository_financial_institution", "bank", "banking_concern"),
        ("he cashed a check at the bank", "that bank holds the mortgage"),
    )
    assert wn.parse_data_line("  1 licence header with a | bar  \n") is None


def test_parse_data_line_word_count_is_hex_and_markers_go():
    words = " ".join(f"w{k} 0" for k in range(10))
    synset = wn.parse_data_line(f"00001234 00 a 0a {words} 000 | x  \n")
    assert len(synset.words) == 10  # "0a": ten words, not zero
    assert wn.parse_data_line("00000001 00 s 01 big(a) 0 000 | large").words == ("big",)
    with pytest.raises(ValueError, match="not a WordNet data line"):
        wn.parse_data_line("garbage | gloss")


def test_read_index_keeps_wordnet_sense_order_and_exceptions_map_base_to_forms():
    index = wn.read_index(MINI, "n")
    assert index["bank"] == [200, 100, 300]  # the file's order: most frequent sense first
    assert index["stop"] == [700, 800]
    assert wn.read_exceptions(MINI, "n") == {"mouse": {"mice"}}
    assert wn.read_exceptions(MINI, "v")["run"] == {"ran", "run"}
    synsets = wn.read_data(MINI, "v")
    assert synsets[100].words == ("deposit", "bank")
    assert synsets[100].examples == ("she banked the check", "deposit your paycheck every month")


def test_missing_wordnet_directory_names_it_and_how_to_get_it(tmp_path):
    with pytest.raises(wn.WordNetMissingError, match="apt-get download wordnet-base") as info:
        wn.check_wordnet_dir(tmp_path / "nowhere")
    assert "nowhere" in str(info.value)
    (tmp_path / "data.noun").write_text("")
    with pytest.raises(wn.WordNetMissingError, match="index.noun is missing"):
        wn.check_wordnet_dir(tmp_path)


# ------------------------------------------------------------------ locating the target word
@pytest.mark.parametrize(
    ("lemma", "pos", "form"),
    [
        ("city", "n", "cities"),
        ("bank", "n", "banks"),
        ("box", "n", "boxes"),
        ("stop", "v", "stopped"),
        ("stop", "v", "stopping"),
        ("carry", "v", "carried"),
        ("carry", "v", "carries"),
        ("bake", "v", "baked"),
        ("bake", "v", "baking"),
        ("bank", "v", "banked"),
    ],
)
def test_word_forms_cover_regular_inflections(lemma, pos, form):
    assert form in wn.word_forms(lemma, pos)


def test_word_forms_take_irregulars_and_no_verb_forms_for_nouns():
    assert "ran" in wn.word_forms("run", "v", {"run": {"ran"}})
    assert "banked" not in wn.word_forms("bank", "n")
    assert "played" in wn.word_forms("play", "v") and "plaies" not in wn.word_forms("play", "v")


def test_locate_is_case_insensitive_and_takes_the_first():
    assert wn.locate(["Stop", "!"], {"stop"}) == 0
    assert wn.locate(["the", "bank", "and", "banks"], {"bank", "banks"}) == 1
    assert wn.locate(["nothing", "here"], {"bank"}) is None


def test_examples_are_tokenised_like_the_training_text():
    assert wn.tokenize_example("he cashed the bank's check, then left.") == [
        "he",
        "cashed",
        "the",
        "bank",
        "'s",
        "check",
        ",",
        "then",
        "left",
        ".",
    ]


def test_collect_examples_on_the_fixture():
    examples, counts = wn.collect_examples(MINI)
    # Worked out by hand from tests/data/wordnet_mini (see the files).
    assert counts == {"short_lemmas": 1, "examples": 26, "not_found": 5, "duplicates": 1}
    assert len(examples) == 20
    found = {(e.lemma, e.pos, " ".join(e.tokens)): (e.offset, e.rank, e.index) for e in examples}
    assert found[("bank", "n", "he cashed a check at the bank")] == (200, 0, 6)
    assert found[("bank", "n", "the Red Cross keeps banks of blood for emergencies")] == (300, 2, 4)
    assert found[("mouse", "n", "the mice ran away when the cat came")] == (400, 0, 1)
    assert found[("run", "v", "the children are running in the park")] == (300, 0, 3)
    assert found[("stop", "v", "Stop !")] == (400, 0, 0)
    assert found[("bank", "v", "she banked the check")] == (100, 1, 1)
    # The synonym's example without the lemma is skipped for "deposit" and kept for "bank".
    assert ("deposit", "v", "she banked the check") not in found
    assert not any(e.lemma in ("a", "depository_financial_institution") for e in examples)


def test_short_lemmas_would_match_function_words():
    examples, _ = wn.collect_examples(MINI, min_length=1)
    wrong = [e for e in examples if e.lemma == "a"]
    assert [(" ".join(e.tokens), e.index) for e in wrong] == [("a typical household circuit carries 15 to 50 amps", 0)]


def test_split_is_seeded_deterministic_and_near_its_share():
    keys = [f"example {k}" for k in range(20000)]
    first = [wn.split_of(k, 0.3, seed=0) for k in keys]
    assert first == [wn.split_of(k, 0.3, seed=0) for k in keys]
    assert abs(first.count("test") / len(keys) - 0.3) < 0.02
    assert first != [wn.split_of(k, 0.3, seed=1) for k in keys]
    assert all(wn.split_of(k, 0.0) == "train" for k in keys[:100])


# ------------------------------------------------------------------ classifiers on data whose answer is known
def _clusters(n_per: int, n_classes: int, dim: int, spread: float, seed: int):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((n_classes, dim)) * 5
    y = np.repeat(np.arange(n_classes), n_per)
    return centres[y] + spread * rng.standard_normal((len(y), dim)), y


def test_nearest_sense_separates_separable_senses_per_word():
    x, y = _clusters(40, 3, 16, 0.1, seed=0)
    words = ["w1" if k % 2 else "w2" for k in range(len(y))]
    senses = [int(label) + (10 if w == "w1" else 20) for label, w in zip(y, words)]  # each word has its own senses
    train, test = np.arange(len(y)) % 4 != 0, np.arange(len(y)) % 4 == 0
    pick = lambda seq, mask: [v for v, m in zip(seq, mask) if m]  # noqa: E731
    predicted = pq.nearest_sense(x[train], pick(words, train), pick(senses, train), x[test], pick(words, test))
    assert np.array_equal(predicted, np.array(pick(senses, test)))
    # A test row may only get a sense of its own word.
    assert all(p // 10 == (1 if w == "w1" else 2) for p, w in zip(predicted, pick(words, test)))


def test_nearest_sense_on_shuffled_labels_is_near_chance():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3000, 32))
    senses = rng.integers(0, 2, size=3000).tolist()
    predicted = pq.nearest_sense(x[:2000], ["w"] * 2000, senses[:2000], x[2000:], ["w"] * 1000)
    assert 0.44 < np.mean(predicted == np.array(senses[2000:])) < 0.56


def test_logistic_regression_separable_and_shuffled():
    x, y = _clusters(300, 2, 32, 1.0, seed=2)
    order = np.random.default_rng(3).permutation(len(y))
    x, y = x[order], y[order]
    predict = pq.fit_logreg(x[:400], y[:400])
    assert np.mean(predict(x[400:]) == y[400:]) == 1.0
    noise = np.random.default_rng(4).standard_normal((4000, 32))
    labels = np.random.default_rng(5).integers(0, 2, size=4000)
    predict = pq.fit_logreg(noise[:2000], labels[:2000])
    assert 0.45 < np.mean(predict(noise[2000:]) == labels[2000:]) < 0.55


def test_most_frequent_sense_breaks_ties_by_wordnet_order():
    predicted = pq.most_frequent_sense(["w", "w", "v", "v", "v"], [5, 6, 7, 8, 8], [1, 0, 0, 1, 1], ["w", "v"])
    assert predicted.tolist() == [6, 8]


def _example(lemma: str, pos: str, offset: int, k: int) -> wn.Example:
    return wn.Example(lemma, pos, offset, offset, (lemma, "number", str(k)), 0)


def test_select_wsd_keeps_lemmas_it_can_score_and_drops_unseen_test_senses():
    examples = [_example("two", "n", s, k) for s in (0, 1) for k in range(30)]
    examples += [_example("one", "n", 0, k) for k in range(30)]  # one sense: nothing to disambiguate
    examples += [_example("two", "n", 2, 999)]  # a third sense with one example
    train, test, counts = pq.select_wsd(examples, 0.3, seed=0, max_examples=10_000)
    assert {e.lemma for e in train + test} == {"two"}
    assert {e.offset for e in test} <= {e.offset for e in train}
    assert counts["lemmas"] == 1 and counts["train"] + counts["test"] + counts["test_unseen_sense"] <= 61


def test_select_pos_needs_both_parts_of_speech():
    examples, _ = wn.collect_examples(MINI)
    chosen, counts = pq.select_pos(examples, seed=0, max_examples=1000)
    assert {e.lemma for e in chosen} == {"bank", "run", "stop"}
    assert counts == {"lemmas": 3, "examples": len(chosen)}


# ------------------------------------------------------------------ the scripts end to end, on a tiny random model
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from elmo_cache.model.random_model import write_random_model

    folder = tmp_path_factory.mktemp("tiny_model")
    write_random_model(folder, "tiny")
    return folder


def test_probe_quality_runs_on_the_fixture(tiny_model, tmp_path, capsys):
    argv = [
        "--model",
        str(tiny_model),
        "--wordnet",
        str(MINI),
        "--test-share",
        "0.5",
        "--json",
        str(tmp_path / "r.json"),
    ]
    report = pq.main(argv)
    out = capsys.readouterr().out
    assert "(b) noun vs verb" in out and "(c) held-out perplexity" in out
    assert report["ppl"] == "skipped: no --heldout file given"
    for split in ("by_example", "by_lemma"):
        assert set(report["pos"][split]["model"]) == {0, 1, 2} and set(report["pos"][split]["random"]) == {0, 1, 2}
    assert (tmp_path / "r.json").is_file()


def test_probe_quality_without_wordnet_says_how_to_get_it(tmp_path):
    with pytest.raises(SystemExit, match="wordnet-base"):
        pq.main(["--wordnet", str(tmp_path / "absent"), "--probes", "pos"])


def test_perplexity_of_a_model_without_softmax_is_skipped(tiny_model, tmp_path):
    text = tmp_path / "heldout.txt"
    text.write_text("a b c .\n")
    assert pq.run_perplexity(str(tiny_model), text, None).startswith("skipped:")


def test_cache_and_live_training_agree(tmp_path, capsys):
    import bench_cache_vs_live as bench

    argv = ["--random-size", "tiny", "--wordnet", str(MINI), "--test-share", "0.5", "--epochs", "2"]
    result = bench.main([*argv, "--workdir", str(tmp_path)])
    assert result["max_vector_diff"] <= bench.VECTOR_ATOL
    assert result["disagreements"] == 0
    assert result["cache"]["accuracy"] == result["live"]["accuracy"]
    assert result["cache"]["mix"] == pytest.approx(result["live"]["mix"], abs=1e-3)
    assert "speed-up per epoch" in capsys.readouterr().out
