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
import gzip
import hashlib
import html
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

HELDOUT_PERCENT = 1  # at least 1% of each source's tokens
MIN_TOKENS, MAX_TOKENS = 1, 200

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


# --------------------------------------------------------------------------------------
# Text processing
# --------------------------------------------------------------------------------------
_QUOTE_MAP = str.maketrans(
    {
        "\u2018": "'",
        "\u2019": "'",
        "\u201a": "'",
        "\u201b": "'",
        "\u2032": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u201e": '"',
        "\u201f": '"',
        "\u2033": '"',
        "\u00a0": " ",
        "\u2009": " ",
        "\u200a": " ",
        "\u2002": " ",
        "\u2003": " ",
        "\u200b": "",
        "\u00ad": "",
        "\ufeff": "",
        "\u2026": "...",
    }
)
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_WS = re.compile(r"\s+")


def clean(text):
    text = text.translate(_QUOTE_MAP)
    text = _CTRL.sub(" ", text)
    text = text.replace("``", '"').replace("''", '"')
    return _WS.sub(" ", text).strip()


ABBREV = {
    "mr",
    "mrs",
    "ms",
    "dr",
    "st",
    "jr",
    "sr",
    "prof",
    "rev",
    "gen",
    "col",
    "capt",
    "lt",
    "sgt",
    "hon",
    "messrs",
    "mme",
    "mlle",
    "esq",
    "gov",
    "sen",
    "rep",
    "co",
    "corp",
    "inc",
    "ltd",
    "bros",
    "vs",
    "etc",
    "e.g",
    "i.e",
    "cf",
    "al",
    "approx",
    "no",
    "nos",
    "vol",
    "vols",
    "fig",
    "figs",
    "eq",
    "sec",
    "secs",
    "ch",
    "chap",
    "p",
    "pp",
    "ed",
    "eds",
    "jan",
    "feb",
    "mar",
    "apr",
    "jun",
    "jul",
    "aug",
    "sep",
    "sept",
    "oct",
    "nov",
    "dec",
    "mt",
    "ft",
    "u.s",
    "u.k",
    "a.m",
    "p.m",
    "viz",
    "ca",
    "dept",
    "univ",
    "assn",
    "ave",
    "blvd",
    "op",
    "esp",
    "incl",
    "max",
    "min",
    "ref",
    "resp",
    "b.c",
    "a.d",
}
# candidate sentence end: [.?!] (+ closing quotes/brackets), whitespace, then something
# that can start a sentence
_SENT_END = re.compile(r"""([.?!]+)(["')\]]*)\s+(?=["'(\[]*[A-Z0-9])""")
_LAST_WORD = re.compile(r"(\S+)$")


def split_sentences(text):
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        punct = m.group(1)
        if punct == ".":
            w = _LAST_WORD.search(text, start, m.start())
            word = w.group(1) if w else ""
            bare = word.lstrip("\"'([").lower()
            if bare in ABBREV:
                continue
            if len(bare) == 1 and bare.isalpha():  # initials: "J. Smith"
                continue
            if re.fullmatch(r"(?:[a-z]\.)+[a-z]", bare):  # "e.g", "U.S.A"
                continue
        end = m.end(2)
        out.append(text[start:end].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return out


_TOK_RULES = [
    (re.compile(r'"'), ' " '),
    (re.compile(r"\.\.\.+"), " ... "),
    (re.compile(r"([;@#$%&?!\[\](){}<>*|~^\u2014\u2013])"), r" \1 "),
    (re.compile(r"--+"), " -- "),
    (re.compile(r"(?<!\d),|,(?!\d)"), " , "),
    (re.compile(r"(?<!\d):|:(?!\d)"), " : "),
    (re.compile(r"/(?=\s)|(?<=\s)/"), " / "),
    # final period (plus trailing quotes/brackets already split off)
    (re.compile(r"([^.])\.(\s*(?:[\])}>\"']\s*)*)$"), r"\1 . \2"),
    # opening single quote (not a contraction like 'tis, 'em)
    (re.compile(r"(^|\s)'(?!(?:tis|twas|twere|twill|em|s|re|ve|ll|d|m|t)\b)(?=\S)", re.I), r"\1' "),
    # closing single quote
    (re.compile(r"([^'\s])'(?=\s|$)"), r"\1 ' "),
    (re.compile(r"([^'\s])('[sSmMdD])(?=\s|$)"), r"\1 \2"),
    (re.compile(r"([^'\s])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T)(?=\s|$)"), r"\1 \2"),
    (re.compile(r"\b(can)(not)\b", re.I), r"\1 \2"),
]


def tokenize(sent):
    s = " " + sent + " "
    for rx, rep in _TOK_RULES:
        s = rx.sub(rep, s)
    return s.split()


# leading list enumerators ("1. ", "(2) ", "iv. ") are dropped
_ENUM = re.compile(r"^(?:\(?\d{1,3}[.)]|\([a-z]\)|[ivx]{1,4}\.)\s+(?=\S)")


def paragraph_sentences(text):
    """Clean a paragraph, split it into sentences, tokenise; yield token lists."""
    text = _ENUM.sub("", clean(text))
    if not text:
        return
    for sent in split_sentences(text):
        toks = tokenize(sent)
        if MIN_TOKENS <= len(toks) <= MAX_TOKENS:
            yield toks


# --------------------------------------------------------------------------------------
# Source readers: each yields (doc_id, [paragraph text, ...])
# --------------------------------------------------------------------------------------
_TAG = re.compile(r"<[^>]+>")


def read_web_bible(root):
    d = os.path.join(root, "usr/share/sword/modules/texts/ztext/engWEB2015eb")
    note = re.compile(r"<note\b[^>]*>.*?</note>", re.S)
    title = re.compile(r"<title\b[^>]*>.*?</title>", re.S)
    chap = re.compile(r'<chapter\b[^>]*\bsID="([^"]+)"[^>]*/>')
    # paragraph breaks only at OSIS paragraph milestones; poetry lines (<l>, <lg>) are
    # joined so that sentences spanning several lines stay whole
    para = re.compile(r'<div\b[^>]*type="x-p"[^>]*/>')
    for testament in ("ot", "nt"):
        bzs = Path(os.path.join(d, testament + ".bzs")).read_bytes()
        bzz = Path(os.path.join(d, testament + ".bzz")).read_bytes()
        bzv = Path(os.path.join(d, testament + ".bzv")).read_bytes()
        blocks = []
        for i in range(len(bzs) // 12):
            off, size, _usize = struct.unpack_from("<III", bzs, i * 12)
            blocks.append(zlib.decompress(bzz[off : off + size]) if size else b"")
        # verse index: (block, offset, size); join verses with spaces so that verse
        # boundaries never glue words together
        verses = []
        for i in range(len(bzv) // 10):
            b, off, size = struct.unpack_from("<IIH", bzv, i * 10)
            if size and b < len(blocks):
                verses.append(blocks[b][off : off + size].decode("utf-8", "replace"))
        text = " ".join(verses)
        text = note.sub(" ", text)
        text = title.sub(" \n\n ", text)
        text = para.sub(" \n\n ", text)
        pieces = chap.split(text)
        # pieces: [preamble, id1, text1, id2, text2, ...]
        for k in range(1, len(pieces), 2):
            doc_id = pieces[k]
            body = _TAG.sub(" ", pieces[k + 1])
            body = html.unescape(body)
            paras = [p for p in re.split(r"\n\s*\n", body) if p.strip()]
            yield doc_id, paras


def _r_strings(buf):
    """Parse an R XDR-serialised character vector (STRSXP) -> list of str/None."""
    if buf[:2] != b"X\n":
        raise ValueError("not an XDR R serialisation")
    version = struct.unpack_from(">i", buf, 2)[0]
    i = 14
    if version == 3:
        n = struct.unpack_from(">i", buf, i)[0]
        i += 4 + n
    flags, length = struct.unpack_from(">ii", buf, i)
    i += 8
    if flags & 0xFF != 16:
        raise ValueError("not a character vector")
    out = []
    for _ in range(length):
        _f, n = struct.unpack_from(">ii", buf, i)
        i += 8
        if n < 0:
            out.append(None)
            continue
        out.append(buf[i : i + n].decode("utf-8", "replace"))
        i += n
    return out


def read_austen(root):
    d = os.path.join(root, "usr/lib/R/site-library/janeaustenr/data")
    rdx = gzip.decompress(Path(os.path.join(d, "Rdata.rdx")).read_bytes())
    # object names, in the order of the chunks (emma, mansfieldpark, ...)
    names = re.findall(rb"\x00\x04\x00\x09\x00\x00\x00.([a-z]+)", rdx.split(b"names", 1)[1])
    rdb = Path(os.path.join(d, "Rdata.rdb")).read_bytes()
    chapter_re = re.compile(r"^\s*(CHAPTER|Chapter)\s+([0-9IVXLC]+)\b")
    pos, k = 0, 0
    while pos < len(rdb):
        dec = zlib.decompressobj()
        raw = dec.decompress(rdb[pos + 4 :])
        used = len(rdb) - pos - 4 - len(dec.unused_data)
        pos += 4 + used
        name = names[k].decode() if k < len(names) else f"book{k}"
        k += 1
        try:
            lines = _r_strings(raw)
        except ValueError:
            # fallback: long printable UTF-8 runs
            lines = re.findall(r"[^\x00-\x08\x0b-\x1f]{20,}", raw.decode("utf-8", "replace"))
        chap_no, paras, cur = 0, [], []
        docs = []
        for line in lines:
            line = line or ""
            if chapter_re.match(line):
                if cur:
                    paras.append(" ".join(cur))
                    cur = []
                if paras:
                    docs.append((f"{name}/ch{chap_no:03d}", paras))
                chap_no += 1
                paras = []
                continue
            if line.strip():
                cur.append(line.strip())
            elif cur:
                paras.append(" ".join(cur))
                cur = []
        if cur:
            paras.append(" ".join(cur))
        if paras:
            docs.append((f"{name}/ch{chap_no:03d}", paras))
        for doc_id, ps in docs:
            # drop Gutenberg-style emphasis underscores
            yield doc_id, [p.replace("_", "") for p in ps]


def read_wordnet(root, block=50):
    d = os.path.join(root, "usr/share/wordnet")
    quoted = re.compile(r'"([^"]*)"')
    for pos in ("noun", "verb", "adj", "adv"):
        synsets = []
        with open(os.path.join(d, "data." + pos), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  "):  # licence header
                    continue
                if "|" not in line:
                    continue
                gloss = line.split("|", 1)[1].strip()
                paras = []
                examples = quoted.findall(gloss)
                definition = quoted.sub(" ", gloss)
                definition = re.sub(r"\s*;(\s*;)*", ";", definition).strip(" ;")
                if definition:
                    definition = definition[0].upper() + definition[1:]
                    if definition[-1] not in ".?!":
                        definition += "."
                    paras.append(definition)
                for ex in examples:
                    ex = ex.strip()
                    if ex:
                        paras.append(ex)
                synsets.append(paras)
        for b in range(0, len(synsets), block):
            paras = [p for s in synsets[b : b + block] for p in s]
            yield f"{pos}/{b // block:05d}", paras


_P = re.compile(r"<p\b([^>]*)>(.*?)</p>", re.S | re.I)
_SCRIPT = re.compile(r"<(script|style)\b.*?</\1>", re.S | re.I)
_TABLE = re.compile(r"<table\b.*?</table>", re.S | re.I)


def _html_paragraphs(path, skip_class=()):
    raw = Path(path).read_text(encoding="utf-8", errors="replace")
    raw = _SCRIPT.sub(" ", raw)
    raw = _TABLE.sub(" ", raw)  # table cells are mostly identifiers, not prose
    out = []
    for m in _P.finditer(raw):
        attrs = m.group(1)
        if any(c in attrs for c in skip_class):
            continue
        text = html.unescape(_TAG.sub("", m.group(2)))
        text = text.replace("\u00b6", " ")
        if text.strip():
            out.append(text)
    return out


def read_python_doc(root):
    base = os.path.join(root, "usr/share/doc/python3.11/html")
    skip = {
        "license.html",
        "copyright.html",
        "genindex.html",
        "search.html",
        "py-modindex.html",
        "bugs.html",
        "about.html",
        "download.html",
    }
    paths = []
    for dp, dns, fns in os.walk(base):
        dns.sort()
        for fn in fns:
            if fn.endswith(".html"):
                paths.append(os.path.join(dp, fn))
    for p in sorted(paths):
        rel = os.path.relpath(p, base)
        if rel in skip or rel.startswith(("genindex", "_")):
            continue
        paras = _html_paragraphs(p, skip_class=('class="topless"',))
        if paras:
            yield rel, paras


def read_postgresql_doc(root):
    base = os.path.join(root, "usr/share/doc/postgresql-doc-15/html")
    skip = {"legalnotice.html", "bookindex.html"}
    for fn in sorted(os.listdir(base)):
        if not fn.endswith(".html") or fn in skip:
            continue
        paras = _html_paragraphs(os.path.join(base, fn))
        if paras:
            yield fn, paras


def _read_fortune_dir(root, block=50, skip=("ascii-art", "art")):
    d = os.path.join(root, "usr/share/games/fortunes")
    for fn in sorted(os.listdir(d)):
        p = os.path.join(d, fn)
        if fn.endswith(".dat") or os.path.islink(p) or not os.path.isfile(p) or fn in skip:
            continue
        raw = Path(p).read_text(encoding="utf-8", errors="replace")
        fortunes = [f for f in re.split(r"^%\s*$", raw, flags=re.M) if f.strip()]
        for b in range(0, len(fortunes), block):
            paras = []
            for f in fortunes[b : b + block]:
                # attribution lines ("-- Author") as their own paragraph
                for part in re.split(r"\n\s*(?=--\s)|\n\s*\n", f):
                    if part.strip():
                        paras.append(part)
            yield f"{fn}/{b // block:04d}", paras


def read_fortunes(root):
    # "art" is ASCII-art-heavy too (both skipped)
    return _read_fortune_dir(root)


def read_fortunes_min(root):
    return _read_fortune_dir(root)


def _blank_line_paragraphs(text):
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def read_jargon(root, block=40):
    raw = gzip.decompress(Path(os.path.join(root, "usr/share/doc/jargon-text/jargon.txt.gz")).read_bytes()).decode(
        "utf-8", "replace"
    )
    paras = []
    for p in _blank_line_paragraphs(raw):
        s = p.strip()
        # drop box-drawing rules, ascii art, tables of contents and indented code
        if re.search(r"[\u2500-\u257f]|[|+]-{3,}|_{4,}|={4,}", s):
            continue
        if len(s.split()) < 4:
            continue
        if re.match(r":[^:\n]+:", s):  # ":headword: /pronunciation/, n." lines
            s = re.sub(r"^:[^:\n]+:[^\n]*\n?", "", s)
            if not s.strip():
                continue
        paras.append(s.replace("{", "").replace("}", ""))
    for b in range(0, len(paras), block):
        yield f"block{b // block:05d}", paras[b : b + block]


def read_devil(root):
    raw = gzip.decompress(Path(os.path.join(root, "usr/share/dictd/devil.dict.dz")).read_bytes()).decode(
        "utf-8", "replace"
    )
    # skip the dictfmt header entries (00-database-*); the text starts at the preface
    i = raw.find("PREFACE")
    raw = raw[i:] if i >= 0 else raw
    raw = raw.replace("_", "")
    docs, cur_letter, cur = [], "preface", []
    for p in _blank_line_paragraphs(raw):
        s = p.strip()
        m = re.match(r"([A-Z])[A-Z'\- ]*[,.]", s)
        letter = m.group(1) if m else None
        if letter and letter != cur_letter and re.match(r"[A-Z][A-Z'\- ]+,\s+[a-z]", s):
            if cur:
                docs.append((cur_letter, cur))
            cur_letter, cur = letter, []
        cur.append(s)
    if cur:
        docs.append((cur_letter, cur))
    for letter, ps in docs:
        yield letter, ps


READERS = {
    "web_bible": read_web_bible,
    "austen": read_austen,
    "wordnet": read_wordnet,
    "python_doc": read_python_doc,
    "postgresql_doc": read_postgresql_doc,
    "fortunes": read_fortunes,
    "fortunes_min": read_fortunes_min,
    "jargon": read_jargon,
    "devil": read_devil,
}


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
