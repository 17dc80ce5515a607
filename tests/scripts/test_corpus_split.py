"""scripts/bundled_model/build_corpus.py: the held-out split (every source has some, none of it seen)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bundled_model" / "build_corpus.py"


def _load():
    spec = importlib.util.spec_from_file_location("build_corpus", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


bc = _load()


def _docs(n: int, tokens: int) -> list[tuple[str, list[str], int]]:
    return [(f"d{i}", [f"sentence {i} ."], tokens) for i in range(n)]


@pytest.mark.parametrize("n_docs", [2, 3, 26, 500])
def test_every_source_gets_held_out_text_but_never_all_of_it(n_docs):
    docs = _docs(n_docs, 1000)
    train, heldout = bc.split_documents("src", docs)
    assert heldout and train  # even a source of two documents (the old 1%-of-documents rule gave none)
    assert sorted(train + heldout) == sorted(docs)
    held = sum(d[2] for d in heldout)
    assert held * 100 >= bc.HELDOUT_PERCENT * n_docs * 1000
    assert (held - 1000) * 100 < bc.HELDOUT_PERCENT * n_docs * 1000  # no more documents than needed
    # Source order is kept within each split, and the choice is a pure function of the ids.
    assert [d[0] for d in train] == [d[0] for d in docs if d in train]
    assert bc.split_documents("src", list(docs)) == (train, heldout)


def test_the_choice_depends_on_the_source_name():
    docs = _docs(300, 10)
    assert bc.split_documents("a", docs)[1] != bc.split_documents("b", docs)[1]


def test_normalised_sentences_ignore_case_spacing_and_punctuation():
    assert bc.normalise("See Section 9.1 .") == bc.normalise("see  section 9 1")
    assert bc.normalise("It ' s done !") == bc.normalise("it s done")
    assert bc.normalise("the cat") != bc.normalise("the cats")


def test_seen_held_out_sentences_are_dropped_and_counted(tmp_path, monkeypatch):
    texts = {
        "s1": [(f"doc{i}", [f"text {i} {k} here ." for k in range(20)] + ["A shared line !"]) for i in range(60)],
        "s2": [("only", ["alone in its source ."]), ("other", ["The shared line", "fresh words ."])],
    }
    monkeypatch.setattr(bc, "SOURCES", [(name, f"pkg-{name}", "test licence") for name in texts])
    monkeypatch.setattr(bc, "READERS", {name: (lambda root, n=name: iter(texts[n])) for name in texts})
    monkeypatch.setattr(bc, "fetch_and_extract", lambda pkg, work, refresh: (work, {"package": pkg, "version": "1"}))
    monkeypatch.setattr(bc, "paragraph_sentences", lambda line: [line.split()])
    out = tmp_path / "out"
    bc.main(["--out", str(out), "--work", str(tmp_path / "work")])
    train = (out / "train.txt").read_text().splitlines()
    heldout = (out / "heldout.txt").read_text().splitlines()
    manifest = json.loads((out / "manifest.json").read_text())
    seen = {bc.normalise(line) for line in train}
    assert heldout and not any(bc.normalise(line) in seen for line in heldout)
    by_source = {entry["source"]: entry for entry in manifest["sources"]}
    assert all(entry["heldout"]["tokens"] > 0 for entry in by_source.values())
    dropped = sum(entry["heldout_dropped_as_seen"]["sentences"] for entry in by_source.values())
    assert dropped >= 1 and dropped == manifest["totals"]["heldout_dropped_as_seen"]["sentences"]
    assert len(train) == manifest["totals"]["train"]["sentences"]
    assert len(heldout) == manifest["totals"]["heldout"]["sentences"]
    assert (out / "DONE").exists()


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPT.with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unseen_heldout_drops_sentences_seen_in_training_per_source(tmp_path):
    corpus, out = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "train.txt").write_text("The cat sat .\nA dog ran\n", encoding="utf-8")
    # Source a: one seen (other case and punctuation), one new; source b: one new, one seen.
    heldout = ["the CAT sat\n", "a bird sang .\n", "fish swim here\n", "A dog ran !\n"]
    (corpus / "heldout.txt").write_text("".join(heldout), encoding="utf-8")
    sources = [
        {"source": name, "heldout": {"documents": 1, "sentences": 2, "tokens": 6}, "train": {"tokens": 3}}
        for name in ("a", "b")
    ]
    manifest = {"sources": sources, "totals": {"heldout": {"documents": 2, "sentences": 4, "tokens": 13}}}
    (corpus / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")

    written = _load_script("unseen_heldout").drop_seen(corpus, out)

    assert (out / "heldout.txt").read_text(encoding="utf-8") == "a bird sang .\nfish swim here\n"
    assert (out / "train.txt").read_text(encoding="utf-8") == (corpus / "train.txt").read_text(encoding="utf-8")
    a, b = written["sources"]
    assert a["heldout"] == {"documents": 1, "sentences": 1, "tokens": 4}
    assert a["heldout_dropped_as_seen"] == {"sentences": 1, "tokens": 3}
    assert b["heldout"]["sentences"] == 1 and b["heldout_dropped_as_seen"]["tokens"] == 4
    assert written["totals"]["heldout_dropped_as_seen"] == {"sentences": 2, "tokens": 7}
    assert json.loads((out / "manifest.json").read_text(encoding="utf-8")) == written
    with pytest.raises(SystemExit, match="has 4 lines but its manifest counts 3"):
        sources[0]["heldout"]["sentences"] = 1
        (corpus / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        _load_script("unseen_heldout").drop_seen(corpus, tmp_path / "again")
