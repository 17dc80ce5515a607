"""``verify``: check a cache's bytes, structure and index, and optionally a sample of its vectors
against a fresh encoding.

Format 2 caches are checked on their own: the CRC-32 of every zarr file / HDF5 dataset and of
the metadata against those recorded at finalisation (bit flips, truncation, edits), then the
structure, then every sentence's stored tokens against its token count and the sentence index.
The structure checks read the arrays with zarr-python or h5py themselves (not through the
reader), so that they test the format as FORMAT.md states it, not the reader's interpretation.
With the corpus (``corpus=``; never the input path the metadata records, which is the cache's
own claim) every line is also checked against the cache. A format-1 cache has no checksums and
no text: without its corpus only its structure can be checked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import CacheFormatError, InvalidParameterError
from elmo_cache.progress import progress_bar
from elmo_cache.rows.codecs import codec_of_metadata, nonfinite_rows, stored_row_shape
from elmo_cache.store import open_cache_arrays, open_with_library, readable_path
from elmo_cache.store.blocksums import sums_digest
from elmo_cache.store.format import (
    FORMAT_VERSIONS,
    INDEX_DTYPES,
    TEXT_ENCODING,
    WINDOW_FILES_FORMAT_VERSION,
    arrays_of,
    decode_metadata,
    metadata_checksum,
)
from elmo_cache.store.registry import get_container
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.tokenize import key_hash, sentence_hash, sentence_key, split_key
from elmo_cache.verify.pooled import check_pooled
from elmo_cache.verify.report import VerifyReport
from elmo_cache.verify.sample import check_sample, choose, sampled_tokens, tolerance

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder

__all__ = ["verify", "tolerance"]


def verify(
    path: str | os.PathLike[str],
    *,
    sample: int = 0,
    corpus: str | os.PathLike[str] | None = None,
    encoder: Encoder | None = None,
    model: str | None = None,
    options_file: str | os.PathLike[str] | None = None,
    weight_file: str | os.PathLike[str] | None = None,
    device: str | None = None,
    seed: int = 0,
    progress: bool = False,
) -> VerifyReport:
    """Check the cache at ``path``; with ``sample`` > 0 re-encode that many random sentences.
    ``progress``: a bar per long phase on stderr (checksums, the vectors' scan, the corpus, the sample;
    :mod:`elmo_cache.progress`).

    Returns a :class:`VerifyReport` listing what passed and every problem found. Raises
    only when ``path`` is missing or unreadable, or when a sample is asked for without a
    corpus or a usable model.
    """
    report = VerifyReport(Path(path))
    # In the moment of an update's publish by renames, the cache is read where it is (elmo_cache.store.readable_path).
    path = readable_path(Path(path))
    if path != report.path:
        report.notes.append(f"{report.path} was being replaced by an update: checked the cache it replaces, at {path}")
    try:
        fmt, raw, arrays, close = open_with_library(path)
    except CacheFormatError as exc:
        report.problems.append(str(exc))
        return report
    meta = decode_metadata(raw)
    try:
        if meta is None:
            report.problems.append("no elmo-cache metadata (attribute 'elmo_cache'); not an elmo-cache store")
            return report
        version = meta.get("format_version")
        if version not in FORMAT_VERSIONS:
            report.problems.append(
                f"format_version {version!r}; this elmo-cache knows versions {list(FORMAT_VERSIONS)}"
            )
            return report
        if version >= 2:
            # One step: the container checks its files itself; the bar says what runs and how long it took.
            with progress_bar(desc="checking checksums", unit=" check", total=1, disable=not progress) as bar:
                _check_checksums(fmt, path, meta, arrays, report)
                bar.update(1)
        else:
            report.notes.append(
                "format 1: no checksums (bit flips not detectable) and no stored text (the index is checked "
                "only with the corpus); rebuild with this elmo-cache to get both"
            )
        if report.problems:
            return report
        try:
            _check_structure(fmt, meta, arrays, report)
        except Exception as exc:  # zarr and h5py raise many types for damaged data
            report.problems.append(f"cannot read the arrays ({type(exc).__name__}: {exc})")
        if report.problems:
            return report
        _check_finite(meta, arrays, report, progress)
        check_pooled(meta, arrays, report)
        if report.problems:
            return report
        stored: tuple[np.ndarray, list[bytes]] | None = None
        if version >= 2:
            stored = _check_tokens(meta, arrays, report)
            if report.problems:
                return report
        # Only a corpus named by the caller is read: the input path recorded in the metadata is the
        # cache's own claim, and a damaged or hostile cache could point it at any file on this machine.
        tokens: dict[int, list[str]] = {}
        if corpus is not None:
            report.corpus = str(corpus)
            tokens = _check_corpus(
                Corpus.as_built(corpus, meta),
                meta,
                arrays,
                report,
                sample,
                seed,
                None if stored is None else stored[0],
                progress,
            )
        elif stored is not None:
            tokens = sampled_tokens(stored[1], np.asarray(arrays["lengths"][:]), sample, seed)
        else:
            report.notes.append("no corpus: the sentence index was not checked; pass --corpus")
            if sample:
                raise InvalidParameterError(
                    "sample: re-encoding needs the sentence text; this format-1 cache stores none: pass --corpus"
                )
        if sample and tokens and not report.problems:
            check_sample(meta, arrays, tokens, report, encoder, model, options_file, weight_file, device, progress)
        _check_journal(path, meta, report)
        return report
    finally:
        close()


def _check_journal(path: Path, meta: dict[str, Any], report: VerifyReport) -> None:
    """The write-back journal beside the cache (``serve --write-back``), when there is one: its header is this
    cache's kind and every record passes its CRC-32C (records past the first that does not are a torn tail)."""
    from elmo_cache.reader.writeback import layout_of_metadata
    from elmo_cache.store.journal import Journal, encoding_identity, journal_path

    where = journal_path(path)
    if not where.is_file():
        return
    try:
        journal = Journal(where, encoding_identity(meta), layout_of_metadata(meta))
    except (CacheFormatError, InvalidParameterError) as exc:
        report.problems.append(str(exc))
        return
    with journal:
        report.checks.append(
            f"write-back journal {where.name}: {len(journal):,} sentences, {journal.size:,} bytes, every record's "
            "CRC-32C"
        )
        if journal.dropped_tail:
            report.notes.append(
                f"{where.name} ends with {journal.dropped_tail:,} bytes that are not whole records (a torn tail left "
                "by a kill, or damage): the next `serve --write-back` drops them"
            )


def _check_checksums(fmt: str, path: Path, meta: dict[str, Any], arrays: dict[str, Any], report: VerifyReport) -> None:
    """Compare the CRC-32 of the metadata and of every file / dataset of the container with those recorded."""
    problems = report.problems
    recorded = meta.get("checksums")
    if not isinstance(recorded, dict) or recorded.get("algorithm") != "crc32":
        problems.append("metadata 'checksums' is missing or not crc32; the cache was not finalised by elmo-cache")
        return
    if recorded.get("metadata") != metadata_checksum(meta):
        problems.append(
            f"metadata: CRC-32 {metadata_checksum(meta):#010x}, recorded {recorded.get('metadata')!r}: "
            "the metadata was edited after the build"
        )
    found, what = get_container(fmt).checksum_problems(path, meta, arrays)
    problems.extend(found[:20])
    if len(found) > 20:
        problems.append(f"... and {len(found) - 20} more damaged files or datasets")
    _check_sums_digests(path, meta, recorded, problems)
    if not problems:
        report.checks.append(f"CRC-32 of the metadata and of every {what} match those recorded at the build")


def _check_sums_digests(path: Path, meta: dict[str, Any], recorded: dict[str, Any], problems: list[str]) -> None:
    """The block sums are this cache's: each array's sums have the digest its metadata records (a sibling's
    metadata, or sums copied in with another build's rows, pass every file checksum of their own)."""
    blocks = recorded.get("blocks")
    digests = blocks.get("digests") if isinstance(blocks, dict) else None
    if not isinstance(digests, dict):
        if meta.get("checksums_required") is True:
            problems.append(
                "metadata 'checksums.blocks.digests' is missing, but 'checksums_required' says the build wrote it"
            )
        return
    try:
        _, _, _, sums = open_cache_arrays(path)
    except CacheFormatError as exc:
        problems.append(f"cannot read the block sums ({exc})")
        return
    for name, digest in digests.items():
        stored = sums.get(name)
        actual = None if stored is None else sums_digest(np.asarray(stored))
        if actual != digest:
            problems.append(
                f"block sums of {name!r}: digest {actual}, the metadata records {digest}: the metadata or the sums "
                "(with their rows) come from another cache"
            )


def _window_rows(meta: dict[str, Any]) -> int:
    """Where a window's rows may start (a multiple of it; ``Layout.window_rows``): a zarr cache's vectors file
    rows (format version 5, and a --pool-only cache's offsets, which address the rows such a cache would have),
    else 1 (HDF5, and zarr caches written before windows started files: their rows are consecutive)."""
    files = meta.get("format_version") == WINDOW_FILES_FORMAT_VERSION or (meta.get("pool") or {}).get("only")
    if not meta.get("shard_rows") or not files:
        return 1
    return int(meta["shard_rows"])


def _placement_problem(
    offsets: np.ndarray, owned: np.ndarray, fresh: np.ndarray, n_rows: int, window_rows: int
) -> str | None:
    """Whether the sentences that own rows (and the empty ones) sit one after the other in input order, a
    sentence starting a window possibly at the next multiple of ``window_rows`` (FORMAT.md, "Windows"), and the
    last one ends at ``n_rows``: None, or where they do not."""
    idx = np.flatnonzero(fresh)
    starts, sizes = offsets[idx].astype(np.int64), owned[idx].astype(np.int64)
    # Where the sentence would start right after the rows before it: the end of the last one owning rows.
    ends = starts + sizes
    running = np.maximum.accumulate(np.where(sizes > 0, ends, 0)) if len(idx) else ends
    before = np.concatenate([[0], running[:-1]]) if len(idx) else running
    aligned = -(-before // window_rows) * window_rows
    ok = (starts == before) | (starts == aligned)
    if not ok.all():
        bad = int(np.flatnonzero(~ok)[0])
        also = f" or {int(aligned[bad])}" if aligned[bad] != before[bad] else ""
        return f"sentence {int(idx[bad])} starts at row {int(starts[bad])}, expected {int(before[bad])}{also}"
    end = int(running[-1]) if len(idx) else 0
    if end != n_rows:
        return f"sentences own rows up to {end} but vectors has {n_rows}"
    return None


def _check_structure(fmt: str, meta: dict[str, Any], arrays: dict[str, Any], report: VerifyReport) -> None:
    problems = report.problems
    if meta.get("complete") is not True:
        problems.append("complete is not true: the build was interrupted; rerun the same build command to finish it")
    names = arrays_of(meta["format_version"])
    arrays = {name: arrays[name] for name in names}
    missing = [name for name, a in arrays.items() if a is None]
    if missing:
        problems.append(f"missing arrays: {missing}")
        return
    vectors = arrays["vectors"]
    row = stored_row_shape(meta)  # a quantised row ends in its scale's bytes
    if tuple(vectors.shape[1:]) != row:
        problems.append(f"vectors has shape {tuple(vectors.shape)}, expected (n_rows, {', '.join(map(str, row))})")
    if str(vectors.dtype) != meta.get("dtype"):
        problems.append(f"vectors has dtype {vectors.dtype}, metadata says {meta.get('dtype')}")
    for name, dtype in INDEX_DTYPES.items():
        if name not in arrays:
            continue
        if str(arrays[name].dtype) != dtype or len(arrays[name].shape) != 1:
            problems.append(f"{name} is {arrays[name].dtype} {tuple(arrays[name].shape)}, expected 1-D {dtype}")
    problems.extend(get_container(fmt).structure_problems(meta, arrays))
    if problems:
        return
    report.checks.append("metadata and array shapes/dtypes")

    offsets = np.asarray(arrays["offsets"][:])
    lengths = np.asarray(arrays["lengths"][:]).astype(np.int64)
    hashes = np.asarray(arrays["index/hashes"][:])
    rows = np.asarray(arrays["index/rows"][:])
    n, n_rows = len(offsets), int(vectors.shape[0])
    counts = {"n_sentences": n, "n_tokens": int(lengths.sum()), "n_rows": n_rows, "n_unique": len(hashes)}
    wrong = [f"{k} = {meta.get(k)} but the arrays say {v}" for k, v in counts.items() if meta.get(k) != v]
    if len(lengths) != n:
        wrong.append(f"offsets has {n} entries, lengths {len(lengths)}")
    if len(rows) != len(hashes):
        wrong.append(f"index/hashes has {len(hashes)} entries, index/rows {len(rows)}")
    if wrong:
        problems.extend(wrong)
        return
    report.checks.append(
        f"counts ({n:,} sentences, {counts['n_tokens']:,} tokens, {n_rows:,} rows, {len(hashes):,} distinct)"
    )
    if (meta.get("pool") or {}).get("only"):
        if n_rows:
            problems.append(f"vectors has {n_rows:,} rows in a --pool-only cache (pool.only), which stores none")
            return
        # No rows, but the offsets are still where the rows would be (they record the deduplicated repeats):
        # they are checked against the rows they imply.
        n_rows = int((offsets + lengths).max()) if n else 0

    if (lengths < 0).any() or (offsets < 0).any() or (offsets + lengths > n_rows).any():
        bad = int(np.flatnonzero((lengths < 0) | (offsets < 0) | (offsets + lengths > n_rows))[0])
        problems.append(
            f"sentence {bad}: rows {offsets[bad]}..{offsets[bad] + lengths[bad]} outside vectors (n_rows {n_rows})"
        )
        return
    if meta.get("dedupe"):
        nonempty = np.flatnonzero(lengths > 0)
        _, first = np.unique(offsets[nonempty], return_index=True)
        owner = np.zeros(n, dtype=bool)
        owner[nonempty[first]] = True
        owned = np.where(owner, lengths, 0)
    else:
        owned = lengths
    fresh = owner | (lengths == 0) if meta.get("dedupe") else np.ones(n, dtype=bool)
    placed = _placement_problem(offsets, owned, fresh, n_rows, _window_rows(meta))
    if placed is not None:
        problems.append(f"offsets/lengths are not consecutive in input order: {placed}")
        return
    if meta.get("dedupe"):
        dup = (~owner) & (lengths > 0)
        if dup.any():
            first_of = dict(zip(offsets[owner].tolist(), np.flatnonzero(owner).tolist()))
            for i in np.flatnonzero(dup)[:100000].tolist():
                j = first_of.get(int(offsets[i]))
                if j is None or j > i or lengths[j] != lengths[i]:
                    problems.append(
                        f"sentence {i} shares rows at {offsets[i]} but no earlier sentence of its length owns them"
                    )
                    return
    report.checks.append("offsets and lengths consistent" + (" (deduplicated)" if meta.get("dedupe") else ""))

    if len(hashes) and ((np.diff(hashes) <= 0).any() if len(hashes) > 1 else False):
        problems.append("index/hashes is not sorted strictly ascending")
    elif len(rows) and (rows.min() < 0 or rows.max() >= n or len(np.unique(rows)) != len(rows)):
        problems.append("index/rows holds sentence numbers out of range or repeated")
    else:
        report.checks.append("index sorted, rows in range")


_FINITE_BLOCK_ROWS = 1 << 16


def _check_finite(meta: dict[str, Any], arrays: dict[str, Any], report: VerifyReport, progress: bool = False) -> None:
    """The first sentence whose stored vectors read back with a value that is not finite (a float16 overflow, an
    int8 scale of inf: builds before the build refused them wrote such caches, and a reader returns them)."""
    vectors = arrays["vectors"]
    n_rows = int(vectors.shape[0])
    if not n_rows:
        return
    codec = codec_of_metadata(meta).with_arrays(arrays, "verify")
    bar = progress_bar(desc="scanning vectors", unit=" row", total=n_rows, disable=not progress)
    for start in range(0, n_rows, _FINITE_BLOCK_ROWS):
        bad = nonfinite_rows(codec.decode(np.asarray(vectors[start : start + _FINITE_BLOCK_ROWS])))
        bar.update(min(_FINITE_BLOCK_ROWS, n_rows - start))
        if bad is None:
            continue
        bar.close()
        row = start + int(np.flatnonzero(bad)[0])
        offsets = np.asarray(arrays["offsets"][:], dtype=np.int64)
        lengths = np.asarray(arrays["lengths"][:], dtype=np.int64)
        owners = np.flatnonzero((offsets <= row) & (row < offsets + lengths))
        where = f"sentence {int(owners[0])} (line {int(owners[0]) + 1})" if len(owners) else f"row {row}"
        report.problems.append(
            f"vectors: {where} reads back with values that are not finite (row {row}); rebuild the cache (this "
            "elmo-cache refuses such values and names the option that overflowed)"
        )
        return
    bar.close()


def _check_tokens(
    meta: dict[str, Any], arrays: dict[str, Any], report: VerifyReport
) -> tuple[np.ndarray, list[bytes]] | None:
    """Check the stored tokens against the lengths and the index; return each sentence's hash and text."""
    problems = report.problems
    lengths = np.asarray(arrays["lengths"][:])
    offsets = np.asarray(arrays["offsets"][:])
    starts = np.asarray(arrays["tokens/offsets"][:])
    text = np.asarray(arrays["tokens/bytes"][:]).tobytes()
    n = len(lengths)
    if starts.shape != (n + 1,) or starts[0] != 0 or starts[-1] != len(text) or (np.diff(starts) < 0).any():
        problems.append(
            f"tokens/offsets ({len(starts)} entries, {starts[:1].tolist()}..{starts[-1:].tolist()}) is not an "
            f"ascending run from 0 to the {len(text)} bytes of tokens/bytes with one entry per sentence plus one"
        )
        return None
    bounds = starts.tolist()
    texts = [text[bounds[i] : bounds[i + 1]] for i in range(n)]
    hashes = np.empty(n, dtype=np.uint64)
    for i, key in enumerate(texts):
        try:
            sentence = key.decode(*TEXT_ENCODING)
        except UnicodeDecodeError as exc:
            problems.append(f"tokens/bytes: sentence {i} is not valid UTF-8 ({exc.reason})")
            return None
        tokens = split_key(sentence)
        if len(tokens) != lengths[i] or sentence_key(tokens) != sentence:
            problems.append(
                f"tokens/bytes: sentence {i} holds {len(tokens)} tokens {sentence[:80]!r}, "
                f"array lengths says {lengths[i]}"
            )
            return None
        hashes[i] = key_hash(key)  # the stored bytes are the canonical key: checked just above
    if meta.get("dedupe"):
        # Sentences sharing rows must be the same sentence (the build dedupes by hash).
        nonempty = np.flatnonzero(lengths > 0)
        _, first, inverse = np.unique(offsets[nonempty], return_index=True, return_inverse=True)
        owners = nonempty[first][inverse]
        for i, j in zip(nonempty.tolist(), owners.tolist()):
            if i != j and texts[i] != texts[j]:
                problems.append(f"sentences {j} and {i} share rows of vectors but hold different tokens")
                return None
    report.checks.append(f"stored tokens of all {n:,} sentences match their lengths")
    if not _check_index(hashes, meta, arrays, report, "the stored tokens", texts):
        return None
    return hashes, texts


def _check_index(
    line_hashes: np.ndarray,
    meta: dict[str, Any],
    arrays: dict[str, Any],
    report: VerifyReport,
    source: str,
    texts: list[bytes] | None = None,
) -> bool:
    """Whether the sentence index (and, with dedupe, the shared rows) matches the sentences' hashes.

    With dedupe a sentence must share the rows of the first one of its hash, unless ``texts``
    (the stored keys) show that the two differ: a hash collision, stored anew by the build.
    """
    n = len(line_hashes)
    lengths = np.asarray(arrays["lengths"][:])
    offsets = np.asarray(arrays["offsets"][:])
    order = np.argsort(line_hashes, kind="stable")
    ordered = line_hashes[order]
    first = np.ones(n, dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    if not (
        np.array_equal(ordered[first], np.asarray(arrays["index/hashes"][:]))
        and np.array_equal(order[first], np.asarray(arrays["index/rows"][:]))
    ):
        report.problems.append(f"the sentence index does not match {source} (hashes or first-occurrence rows differ)")
        return False
    if meta.get("dedupe"):
        firsts = np.empty(n, dtype=np.int64)
        group_start = np.cumsum(first) - 1
        firsts[order] = order[first][group_start]
        nonempty = lengths > 0
        if texts is not None:
            for i in np.flatnonzero(nonempty & (firsts != np.arange(n))).tolist():
                if texts[i] != texts[firsts[i]]:
                    nonempty[i] = False
        if (offsets[nonempty] != offsets[firsts[nonempty]]).any():
            bad = int(np.flatnonzero(nonempty & (offsets != offsets[firsts]))[0])
            report.problems.append(f"sentence {bad} repeats sentence {firsts[bad]} but does not share its rows")
            return False
    report.checks.append(f"sentence index matches {source}")
    return True


def _check_corpus(
    source: Corpus,
    meta: dict[str, Any],
    arrays: dict[str, Any],
    report: VerifyReport,
    sample: int,
    seed: int,
    stored: np.ndarray | None,
    progress: bool = False,
) -> dict[int, list[str]]:
    lengths = np.asarray(arrays["lengths"][:])
    n = len(lengths)
    with progress_bar(desc="reading the corpus", unit=" line", total=n, disable=not progress) as bar:
        return _corpus_lines(source, meta, arrays, report, lengths, choose(lengths, sample, seed), stored, bar)


def _corpus_lines(
    source: Corpus,
    meta: dict[str, Any],
    arrays: dict[str, Any],
    report: VerifyReport,
    lengths: np.ndarray,
    chosen: set[int],
    stored: np.ndarray | None,
    bar: Any,
) -> dict[int, list[str]]:
    n = len(lengths)
    tokens: dict[int, list[str]] = {}
    line_hashes = np.empty(n, dtype=np.uint64)
    count = 0
    for number, sentence in source.sentences():
        count = number + 1
        bar.update(1)
        if number >= n:
            continue
        if len(sentence) != lengths[number]:
            report.problems.append(
                f"{source.name}, line {number + 1}: {len(sentence)} tokens, the cache stores {lengths[number]}"
            )
            return {}
        line_hashes[number] = sentence_hash(sentence)
        if number in chosen:
            tokens[number] = sentence
    if count != n:
        report.problems.append(f"{source.name} has {count} lines, the cache {n} sentences")
        return {}
    report.checks.append(f"token counts of all {n:,} lines match {source.name}")
    if stored is not None:
        differ = np.flatnonzero(stored != line_hashes)
        if len(differ):
            report.problems.append(
                f"{source.name}, line {int(differ[0]) + 1}: other tokens than the cache stores for it"
            )
            return {}
        report.checks.append(f"the stored tokens are those of {source.name}")
        return tokens
    if not _check_index(line_hashes, meta, arrays, report, source.name):
        return {}
    return tokens
