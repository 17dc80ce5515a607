#!/usr/bin/env python3
"""Build the English training corpus for the bundled ELMo model from Debian packages.

Every source is a Debian package fetched with ``apt-get download`` and unpacked with
``dpkg-deb -x`` (no other network access, no NLTK data).  Text is cleaned, split into
sentences with a small rule-based splitter, tokenised PTB-style (punctuation, quotes and
contractions split; case kept) and written one sentence per line.

About 1% of every source's text goes to ``heldout.txt``, in whole documents chosen by a
hash of the document id (at least one document per source); the rest goes to ``train.txt``.
Held-out sentences that also occur in the training text (compared lower-cased, punctuation
ignored) are dropped, so the held-out figures measure modelling, not memory.  Nothing is
shuffled: documents keep their source order and the sentences of a document stay together.
Given the same .deb files the output is byte-for-byte identical.

Usage:
    python3 scripts/bundled_model/build_corpus.py --out /work/data/corpus --work /work/scratch/corpus

``--work`` holds ``debs/`` (downloaded packages; reused when present, so a rebuild from
the same .deb files is exact) and ``extract/`` (unpacked packages, recreated every run).
Pass ``--refresh`` to download the packages again (versions drift; the manifest records
name, version and sha256 of every .deb used).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HELDOUT_PERCENT = 1  # at least 1% of each source's tokens


# --------------------------------------------------------------------------------------
# Sources.  Licence strings come from each package's /usr/share/doc/PKG/copyright
# (checked by hand; only the upstream text is used, never the GPL'd debian/ packaging).
# --------------------------------------------------------------------------------------
SOURCES = [
    # name, package, licence
    (
        "web_bible",
        "sword-text-web",
        "Public domain (World English Bible; 'World English Bible' is a trademark of eBible.org)",
    ),
    ("austen", "r-cran-janeaustenr", "Novels public domain (Jane Austen); R package MIT (Julia Silge)"),
    ("wordnet", "wordnet-base", "WordNet 3.0 licence (permissive, BSD-like; Princeton University)"),
    ("python_doc", "python3.11-doc", "PSF License Agreement (Python documentation)"),
    ("postgresql_doc", "postgresql-doc-15", "PostgreSQL Licence (permissive, BSD/MIT-like)"),
    ("fortunes", "fortunes", "BSD (fortune-mod, Regents of the University of California) per debian/copyright"),
    ("fortunes_min", "fortunes-min", "BSD (fortune-mod, Regents of the University of California) per debian/copyright"),
    ("jargon", "jargon-text", "Public domain (The Jargon File 4.4.7, Eric S. Raymond)"),
    ("devil", "dict-devil", "Public domain (Ambrose Bierce, The Devil's Dictionary, copyright expired)"),
]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Packages
# --------------------------------------------------------------------------------------
def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_and_extract(pkg, work, refresh):
    debdir = os.path.join(work, "debs")
    os.makedirs(debdir, exist_ok=True)
    existing = sorted(glob.glob(os.path.join(debdir, glob.escape(pkg) + "_*.deb")))
    if refresh or not existing:
        for p in existing:
            os.remove(p)
        subprocess.run(["apt-get", "download", pkg], cwd=debdir, check=True, stdout=subprocess.DEVNULL)
        existing = sorted(glob.glob(os.path.join(debdir, glob.escape(pkg) + "_*.deb")))
    if len(existing) != 1:
        raise RuntimeError(f"expected one .deb for {pkg} in {debdir}, found {existing}")
    deb = existing[0]
    version = subprocess.run(
        ["dpkg-deb", "-f", deb, "Version"], check=True, capture_output=True, text=True
    ).stdout.strip()
    root = os.path.join(work, "extract", pkg)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
    info = {"package": pkg, "version": version, "deb": os.path.basename(deb), "deb_sha256": sha256_file(deb)}
    cp = os.path.join(root, "usr/share/doc", pkg, "copyright")
    if os.path.exists(cp):
        info["copyright_file_sha256"] = sha256_file(cp)
    return root, info


# The text rules and the readers live beside this script; run as a script, its folder is on sys.path already.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _corpus_sources import READERS  # noqa: E402
from _ptb_text import MAX_TOKENS, MIN_TOKENS, paragraph_sentences  # noqa: E402


def doc_rank(full_id):
    """A document's place in its source's held-out order: the first 8 bytes of sha256(id)."""
    return int.from_bytes(hashlib.sha256(full_id.encode("utf-8")).digest()[:8], "big")


def normalise(line):
    """The form two sentences are compared in: case, spacing and punctuation do not count, so
    "See Section 9.1 ." and "see section 9.1" are the same sentence."""
    return " ".join(_NON_WORD.sub(" ", line.lower()).split())


_NON_WORD = re.compile(r"[^\w]+")


def split_documents(name, docs):
    """Choose a source's held-out documents: the lowest-ranked documents until they hold at least
    HELDOUT_PERCENT of the source's tokens (at least one document, never all of them), so every
    source has held-out text however few documents it has. Returns (train_docs, heldout_docs),
    each a list of (doc_id, lines, tokens) in source order."""
    total = sum(ntok for _, _, ntok in docs)
    ranked = sorted(range(len(docs)), key=lambda i: doc_rank(f"{name}:{docs[i][0]}"))
    chosen, held_tokens = set(), 0
    for i in ranked[: max(len(docs) - 1, 0)]:
        if chosen and held_tokens * 100 >= total * HELDOUT_PERCENT:
            break
        chosen.add(i)
        held_tokens += docs[i][2]
    train = [d for i, d in enumerate(docs) if i not in chosen]
    heldout = [d for i, d in enumerate(docs) if i in chosen]
    return train, heldout


def source_documents(name, root):
    """(doc_id, sentence lines, tokens) of every non-empty document of a source, in source order."""
    docs = []
    for doc_id, paras in READERS[name](root):
        lines, ntok = [], 0
        for para in paras:
            for toks in paragraph_sentences(para):
                lines.append(" ".join(toks))
                ntok += len(toks)
        if lines:
            docs.append((doc_id, lines, ntok))
    return docs


def empty_stats():
    return {"documents": 0, "sentences": 0, "tokens": 0}


def add_stats(stats, lines):
    stats["documents"] += 1
    stats["sentences"] += len(lines)
    stats["tokens"] += sum(len(line.split()) for line in lines)


# --------------------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (train.txt, heldout.txt, ...)")
    ap.add_argument("--work", required=True, help="scratch folder for .deb files and extraction")
    ap.add_argument("--refresh", action="store_true", help="download the .deb files again")
    ap.add_argument("--only", nargs="*", help="restrict to these source names (debugging)")
    args = ap.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.work, exist_ok=True)
    done = os.path.join(args.out, "DONE")
    if os.path.exists(done):
        os.remove(done)

    manifest = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "heldout_rule": (
            "per source, documents in order of sha256(source + ':' + doc_id) (first 8 bytes, big-endian) "
            f"until they hold >= {HELDOUT_PERCENT}% of the source's tokens (at least one document); "
            "then every held-out sentence whose normalised form (lower case, runs of non-word "
            "characters as one space) occurs in train.txt is dropped from heldout.txt"
        ),
        "sentence_tokens": [MIN_TOKENS, MAX_TOKENS],
        "sources": [],
    }
    t0 = time.time()
    split_docs = {}
    for name, pkg, licence in SOURCES:
        if args.only and name not in args.only:
            continue
        log(f"[{name}] fetching {pkg}")
        root, info = fetch_and_extract(pkg, args.work, args.refresh)
        train, heldout = split_documents(name, source_documents(name, root))
        split_docs[name] = (train, heldout)
        manifest["sources"].append({"source": name, **info, "licence": licence})

    # A held-out sentence the model has read in training measures memory, not modelling.
    seen = {normalise(line) for train, _ in split_docs.values() for _, lines, _ in train for line in lines}
    tot = {"train": empty_stats(), "heldout": empty_stats(), "heldout_dropped_as_seen": empty_stats()}
    tmp_train = os.path.join(args.out, "train.txt.tmp")
    tmp_held = os.path.join(args.out, "heldout.txt.tmp")
    with (
        open(tmp_train, "w", encoding="utf-8", newline="\n") as ftr,
        open(tmp_held, "w", encoding="utf-8", newline="\n") as fho,
    ):
        for entry in manifest["sources"]:
            train, heldout = split_docs[entry["source"]]
            stats = {key: empty_stats() for key in tot}
            for _, lines, _ in train:
                ftr.write("\n".join(lines) + "\n")
                add_stats(stats["train"], lines)
            for _, lines, _ in heldout:
                kept = [line for line in lines if normalise(line) not in seen]
                dropped = [line for line in lines if normalise(line) in seen]
                if kept:
                    fho.write("\n".join(kept) + "\n")
                    add_stats(stats["heldout"], kept)
                if dropped:
                    add_stats(stats["heldout_dropped_as_seen"], dropped)
            for key in tot:
                for k, v in stats[key].items():
                    tot[key][k] += v
            entry.update(stats)
            log(
                f"[{entry['source']}] train {stats['train']} heldout {stats['heldout']} "
                f"dropped {stats['heldout_dropped_as_seen']['sentences']} seen sentences"
            )
            if not stats["heldout"]["tokens"]:
                raise RuntimeError(f"{entry['source']}: no held-out text left after dropping seen sentences")
    manifest["totals"] = tot
    manifest["excluded"] = EXCLUDED
    os.replace(tmp_train, os.path.join(args.out, "train.txt"))
    os.replace(tmp_held, os.path.join(args.out, "heldout.txt"))
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    open(done, "w").close()
    log(f"done: train {tot['train']} heldout {tot['heldout']} ({time.time() - t0:.0f}s)")


# What was deliberately left out, recorded in the manifest.
EXCLUDED = {
    "debian/* packaging files of every package": "GPL (not used; only upstream text is read)",
    "python3.11-doc license.html, copyright.html, about/bugs/download, indexes": (
        "licence/legal boilerplate and navigation, not prose"
    ),
    "python3.11-doc _sources/*.rst.txt, whatsnew/changelog.html.gz": "duplicates of the HTML",
    "postgresql-doc-15 legalnotice.html, bookindex.html, man pages": (
        "licence boilerplate / index; man pages duplicate the HTML"
    ),
    "wordnet-base licence header lines, index.*, sents.vrb": "not gloss text",
    "fortunes ascii-art, art": "mostly ASCII pictures",
    "jargon-text box-drawing/table paragraphs": "not prose",
}


if __name__ == "__main__":
    main()
