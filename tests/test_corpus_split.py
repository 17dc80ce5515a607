"""scripts/bundled_model/build_corpus.py: the held-out split (every source has some, none of it seen)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bundled_model" / "build_corpus.py"


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
