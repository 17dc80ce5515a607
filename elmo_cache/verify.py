"""``verify``: check a cache's structure and, optionally, a sample of its vectors against a fresh encoding.

The structure checks read the arrays with zarr-python or h5py themselves (not through the reader),
so that they test the format as FORMAT.md states it, not the reader's interpretation.
With the corpus (``corpus=`` or the input path recorded in the metadata, when it still
exists) every line's token count and hash are checked, which proves the sentence index.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.identity import model_differences
from elmo_cache.selection import Selection
from elmo_cache.store import open_with_library
from elmo_cache.store.format import FORMAT_VERSION, INDEX_DTYPES, decode_metadata
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.tokenize import sentence_hash

__all__ = ["VerifyReport", "verify", "tolerance"]


@dataclass
class VerifyReport:
    """Outcome of :func:`verify`: ``ok`` when ``problems`` is empty."""

    path: Path
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    corpus: str | None = None
    sampled: int = 0
    max_abs_error: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        lines = [f"{self.path}: " + ("OK" if self.ok else f"{len(self.problems)} problem(s)")]
        lines += [f"  ok: {c}" for c in self.checks]
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        if self.corpus is None:
            lines.append("  (no corpus: sentence text, index and vectors not checked against it; pass --corpus)")
        return "\n".join(lines)


def tolerance(dtype: str, precision: str) -> tuple[float, float]:
    """``(atol, rtol)`` between stored vectors and a fresh fp32 encoding.

    fp32 storage of an fp32 encoder: 1e-5 absolute (batches of other sizes change the last
    bits). float16 storage adds its rounding: one unit in the last place is 2**-10 relative.
    A reduced-precision encoder (bf16/fp16 arithmetic) differs from batch to batch by its own
    rounding, which is far larger: 5e-2.
    """
    if precision != "fp32":
        return 5e-2, 5e-2
    return (1e-5, 2.0**-10) if dtype == "float16" else (1e-5, 0.0)


def _expected(reference: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """What the cache should hold for a fresh ``(3, n, D)`` float32 encoding, token-major, before the cast."""
    selected = Selection.from_metadata(meta).apply_array(reference)
    return selected if meta["kind"] == "mix" else selected.transpose(1, 0, 2)


def verify(
    path: str | os.PathLike[str],
    *,
    sample: int = 0,
    corpus: str | os.PathLike[str] | None = None,
    encoder: Any = None,
    model: str | None = None,
    options_file: str | os.PathLike[str] | None = None,
    weight_file: str | os.PathLike[str] | None = None,
    device: str | None = None,
    seed: int = 0,
) -> VerifyReport:
    """Check the cache at ``path``; with ``sample`` > 0 re-encode that many random sentences.

    Returns a :class:`VerifyReport` listing what passed and every problem found. Raises
    only when ``path`` is missing or unreadable, or when a sample is asked for without a
    corpus or a usable model.
    """
    path = Path(path)
    fmt, raw, arrays, close = open_with_library(path)
    meta = decode_metadata(raw)
    report = VerifyReport(path)
    try:
        if meta is None:
            report.problems.append("no elmo-cache metadata (attribute 'elmo_cache'); not an elmo-cache store")
            return report
        _check_structure(fmt, meta, arrays, report)
        if report.problems:
            return report
        corpus_path = corpus
        if corpus_path is None:
            recorded = ((meta.get("build") or {}).get("input") or {}).get("path")
            if recorded and recorded != "-" and Path(recorded).is_file():
                corpus_path = recorded
        if corpus_path is None:
            if sample:
                raise InvalidParameterError(
                    "sample: re-encoding needs the corpus text; pass --corpus (the cache stores no text)"
                )
            return report
        report.corpus = str(corpus_path)
        tokens = _check_corpus(
            Corpus(corpus_path, errors=((meta.get("build") or {}).get("args") or {}).get("errors", "strict")),
            meta,
            arrays,
            report,
            sample,
            seed,
        )
        if sample and tokens and not report.problems:
            _check_sample(meta, arrays, tokens, report, encoder, model, options_file, weight_file, device)
        return report
    finally:
        close()


def _check_structure(fmt: str, meta: dict[str, Any], arrays: dict[str, Any], report: VerifyReport) -> None:
    problems = report.problems
    if meta.get("format_version") != FORMAT_VERSION:
        problems.append(
            f"format_version {meta.get('format_version')!r}; this elmo-cache knows version {FORMAT_VERSION}"
        )
    if meta.get("complete") is not True:
        problems.append("complete is not true: the build was interrupted; rerun the same build command to finish it")
    missing = [name for name, a in arrays.items() if a is None]
    if missing:
        problems.append(f"missing arrays: {missing}")
        return
    vectors = arrays["vectors"]
    dim = meta.get("dim")
    row = (dim,) if meta.get("kind") == "mix" else (len(meta.get("layers") or []), dim)
    if tuple(vectors.shape[1:]) != row:
        problems.append(f"vectors has shape {tuple(vectors.shape)}, expected (n_rows, {', '.join(map(str, row))})")
    if str(vectors.dtype) != meta.get("dtype"):
        problems.append(f"vectors has dtype {vectors.dtype}, metadata says {meta.get('dtype')}")
    for name, dtype in INDEX_DTYPES.items():
        if str(arrays[name].dtype) != dtype or len(arrays[name].shape) != 1:
            problems.append(f"{name} is {arrays[name].dtype} {tuple(arrays[name].shape)}, expected 1-D {dtype}")
    if fmt == "hdf5":
        for name, ds in arrays.items():
            if ds.chunks is not None or ds.compression is not None:
                problems.append(f"HDF5 dataset {name} is chunked or compressed; FORMAT.md wants it contiguous (memmap)")
    else:
        chunks = tuple(vectors.chunks)
        if chunks[1:] != tuple(vectors.shape[1:]) or chunks[0] != meta.get("chunk_rows"):
            problems.append(f"vectors chunks {chunks} do not match chunk_rows {meta.get('chunk_rows')} along rows only")
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
    expected_offsets = np.concatenate([[0], np.cumsum(owned)[:-1]]) if n else np.zeros(0, np.int64)
    fresh = owner | (lengths == 0) if meta.get("dedupe") else np.ones(n, dtype=bool)
    if int(owned.sum()) != n_rows or (offsets[fresh] != expected_offsets[fresh]).any():
        misplaced = np.flatnonzero(fresh & (offsets != expected_offsets))
        where = (
            f"sentence {int(misplaced[0])} starts at row {offsets[misplaced[0]]}, "
            f"expected {expected_offsets[misplaced[0]]}"
            if len(misplaced)
            else f"sentences own {int(owned.sum())} rows but vectors has {n_rows}"
        )
        problems.append(f"offsets/lengths are not consecutive in input order: {where}")
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


def _check_corpus(
    source: Corpus, meta: dict[str, Any], arrays: dict[str, Any], report: VerifyReport, sample: int, seed: int
) -> dict[int, list[str]]:
    lengths = np.asarray(arrays["lengths"][:])
    offsets = np.asarray(arrays["offsets"][:])
    n = len(lengths)
    chosen: set[int] = set()
    if sample:
        candidates = np.flatnonzero(lengths > 0)
        rng = np.random.default_rng(seed)
        chosen = (
            set(rng.choice(candidates, size=min(sample, len(candidates)), replace=False).tolist())
            if len(candidates)
            else set()
        )
    tokens: dict[int, list[str]] = {}
    line_hashes = np.empty(n, dtype=np.uint64)
    count = 0
    for number, sentence in source.sentences():
        count = number + 1
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
    order = np.argsort(line_hashes, kind="stable")
    ordered = line_hashes[order]
    first = np.ones(n, dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    if not (
        np.array_equal(ordered[first], np.asarray(arrays["index/hashes"][:]))
        and np.array_equal(order[first], np.asarray(arrays["index/rows"][:]))
    ):
        report.problems.append("the sentence index does not match the corpus (hashes or first-occurrence rows differ)")
        return {}
    if meta.get("dedupe"):
        firsts = np.empty(n, dtype=np.int64)
        group_start = np.cumsum(first) - 1
        firsts[order] = order[first][group_start]
        nonempty = lengths > 0
        if (offsets[nonempty] != offsets[firsts[nonempty]]).any():
            bad = int(np.flatnonzero(nonempty & (offsets != offsets[firsts]))[0])
            report.problems.append(f"sentence {bad} repeats sentence {firsts[bad]} but does not share its rows")
            return {}
    report.checks.append("sentence index matches the corpus")
    return tokens


def _load_model(
    meta: dict[str, Any], model: str | None, options_file: Any, weight_file: Any, device: str | None
) -> Any:
    """The model asked for, else the one the cache records (found locally, else loaded by its recorded name)."""
    from elmo_cache.encoder import Encoder, load_encoder
    from elmo_cache.model import hub

    identity = meta.get("model") or {}
    kwargs = {
        "device": device,
        "precision": identity.get("precision", "fp32"),
        "initial_state": identity.get("initial_state", "zero"),
    }
    if options_file is not None or weight_file is not None or model is not None:
        return load_encoder(model, options_file, weight_file, **kwargs)
    files, _ = hub.locate(identity)
    if files is not None:
        return Encoder.from_model(files, **kwargs)
    name = identity.get("name")
    if not name:
        raise InvalidParameterError("the cache does not name its model; pass --model or --options-file/--weight-file")
    try:
        return Encoder.load(name, **kwargs)
    except Exception as exc:
        raise InvalidParameterError(
            f"cannot load the model {name!r} the cache names ({exc}); pass --model or --options-file/--weight-file"
        ) from None


def _check_sample(
    meta: dict[str, Any],
    arrays: dict[str, Any],
    tokens: dict[int, list[str]],
    report: VerifyReport,
    encoder: Any,
    model: str | None,
    options_file: Any,
    weight_file: Any,
    device: str | None,
) -> None:
    if encoder is None:
        encoder = _load_model(meta, model, options_file, weight_file, device)
    stored_model = meta.get("model") or {}
    differences = model_differences(stored_model, encoder.identity)
    if differences:
        report.problems.append(f"the model given differs from the one that built the cache ({differences[0]})")
        return
    lines = sorted(tokens)
    references = encoder.embed_batch([tokens[i] for i in lines])
    atol, rtol = tolerance(meta["dtype"], stored_model.get("precision", "fp32"))
    offsets = arrays["offsets"]
    lengths = arrays["lengths"]
    worst = 0.0
    for i, reference in zip(lines, references):
        start, length = int(offsets[i]), int(lengths[i])
        stored = np.asarray(arrays["vectors"][start : start + length]).astype(np.float32)
        expected = _expected(reference, meta)
        error = np.abs(stored - expected)
        worst = max(worst, float(error.max()))
        if (error > atol + rtol * np.abs(expected)).any():
            report.problems.append(
                f"sentence {i}: stored vectors differ from a fresh encoding by up to {float(error.max()):.3g} "
                f"(tolerance {atol:g} + {rtol:g} x |value|)"
            )
            return
    report.sampled = len(lines)
    report.max_abs_error = worst
    report.checks.append(f"{len(lines)} sampled sentences match a fresh encoding (max abs error {worst:.3g})")
