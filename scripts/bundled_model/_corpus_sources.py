"""The corpus sources' readers: each yields (doc_id, [paragraph text, ...]) from an unpacked Debian package
(see build_corpus.py)."""

from __future__ import annotations

import gzip
import html
import os
import re
import struct
import zlib
from pathlib import Path

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
