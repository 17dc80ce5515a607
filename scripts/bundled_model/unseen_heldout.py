#!/usr/bin/env python3
"""A corpus folder whose held-out text holds only sentences its training text does not.

Reads CORPUS/{train.txt, heldout.txt, manifest.json} as ``build_corpus.py`` writes them (the
held-out sentences in source order, as many per source as the manifest says), drops every held-out
sentence whose normalised form (``build_corpus.normalise``: lower case, punctuation ignored) occurs
in the training text, and writes OUT/heldout.txt, OUT/manifest.json (per-source counts after the
drop, ``heldout_dropped_as_seen`` per source and in total) and OUT/train.txt (a link to CORPUS's).

    python scripts/bundled_model/unseen_heldout.py --corpus /work/data/corpus-old --out /work/data/corpus-eval

Needed for corpora written before build_corpus.py dropped seen sentences itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _normalise():
    spec = importlib.util.spec_from_file_location("build_corpus", _HERE / "build_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.normalise


def drop_seen(corpus: Path, out: Path) -> dict:
    """Write the unseen held-out text and its manifest under ``out``; returns the new manifest."""
    normalise = _normalise()
    manifest = json.loads((corpus / "manifest.json").read_text(encoding="utf-8"))
    heldout = (corpus / "heldout.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    expected = sum(s["heldout"]["sentences"] for s in manifest["sources"])
    if expected != len(heldout):
        raise SystemExit(f"{corpus}/heldout.txt has {len(heldout)} lines but its manifest counts {expected}")
    with open(corpus / "train.txt", encoding="utf-8") as f:
        seen = {normalise(line) for line in f}
    kept: list[str] = []
    start = 0
    dropped_total = {"sentences": 0, "tokens": 0}
    for source in manifest["sources"]:
        part = heldout[start : start + source["heldout"]["sentences"]]
        start += len(part)
        keep = [line for line in part if normalise(line) not in seen]
        gone = [line for line in part if normalise(line) in seen]
        dropped = {"sentences": len(gone), "tokens": sum(len(line.split()) for line in gone)}
        source["heldout_dropped_as_seen"] = dropped
        source["heldout"] = {
            "documents": source["heldout"]["documents"],
            "sentences": len(keep),
            "tokens": sum(len(line.split()) for line in keep),
        }
        for key in dropped_total:
            dropped_total[key] += dropped[key]
        kept += keep
    totals = manifest["totals"]
    totals["heldout"] = {
        "documents": totals["heldout"]["documents"],
        "sentences": len(kept),
        "tokens": sum(len(line.split()) for line in kept),
    }
    totals["heldout_dropped_as_seen"] = dropped_total
    manifest["heldout_rule"] = (
        manifest.get("heldout_rule", "by build_corpus.py")
        + "; then every held-out sentence whose normalised form occurs in train.txt is dropped (unseen_heldout.py)"
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "heldout.txt").write_text("".join(kept), encoding="utf-8")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    link = out / "train.txt"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink((corpus / "train.txt").resolve(), link)
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, type=Path, help="folder with train.txt, heldout.txt, manifest.json")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args(argv)
    manifest = drop_seen(args.corpus, args.out)
    dropped = manifest["totals"]["heldout_dropped_as_seen"]
    kept = manifest["totals"]["heldout"]
    print(
        f"{args.out}: {kept['sentences']:,} held-out sentences kept ({kept['tokens']:,} tokens), "
        f"{dropped['sentences']:,} dropped as seen in train.txt"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
