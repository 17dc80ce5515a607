"""The distributed build's first pass: every line tokenised, hashed and placed, without a model.

It fixes everything but the vectors: each sentence's offset and length, the dedupe decisions
(``new``: the sentences whose rows are encoded), the stored tokens, and the windows (the same cuts
as the local build, :class:`~elmo_cache.builder.encoding.WindowCutter`), each with its first line,
line count, first row and row count. The result (the *plan*) is a few raw files under
``<output>.partial/.build/plan/`` plus ``plan.json``, written last (atomically), so a plan without
``plan.json`` is unfinished and is redone. Workers read their windows' tokens back from it, so the
corpus is read once, by the driver. About 30 bytes per sentence plus its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.builder.dedupe import SeenSentences
from elmo_cache.builder.encoding import Window, WindowCutter, assign_window
from elmo_cache.errors import CacheFormatError
from elmo_cache.store.columns import HASHES, TEXT, TEXT_ENDS, Column
from elmo_cache.store.durable import RawColumn, atomic_write_json, fsync_path
from elmo_cache.store.staging import decode_tokens, encode_tokens
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.tokenize import sentence_hash

__all__ = [
    "FirstPass",
    "PLANNED_COLUMNS",
    "PLAN_DIR",
    "PLAN_FILE",
    "first_pass",
    "load_first_pass",
    "corpus_signature",
]

PLAN_DIR = "plan"
"""Folder of the staging's build folder holding the plan."""

PLAN_FILE = "plan.json"
"""Written last into :data:`PLAN_DIR`: the plan is finished when it exists (and the staging is the ray engine's)."""

# name -> (dtype, item shape) of the plan's raw files, one item per sentence (windows: per window).
_COLUMNS: dict[str, tuple[str, tuple[int, ...]]] = {
    "offsets": ("int64", ()),
    "lengths": ("int32", ()),
    "hashes": ("uint64", ()),
    "new": ("bool", ()),
    "text_ends": ("int64", ()),
    "text": ("uint8", ()),
    # first line, line count, first row, row count
    "windows": ("int64", (4,)),
}

PLANNED_COLUMNS = ("offsets", "lengths", HASHES, TEXT_ENDS, TEXT)
"""The declared per-sentence columns (:func:`elmo_cache.store.columns.sentence_columns`) the first pass writes,
as the local writer stages them; the parts write every other declared column."""


def corpus_signature(source: Corpus) -> dict[str, Any]:
    """What identifies the corpus file cheaply: path, size and modification time."""
    assert source.path is not None
    stat = source.path.resolve().stat()
    return {"path": str(source.path.resolve()), "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}


@dataclass
class FirstPass:
    """The plan of a distributed build (memory-mapped arrays) and its description."""

    directory: Path
    info: dict[str, Any]
    offsets: np.ndarray
    lengths: np.ndarray
    hashes: np.ndarray
    new: np.ndarray
    text_ends: np.ndarray
    text: np.ndarray
    windows: np.ndarray

    @property
    def n_lines(self) -> int:
        return int(self.info["lines"])

    @property
    def n_rows(self) -> int:
        return int(self.info["rows"])

    @property
    def n_tokens(self) -> int:
        return int(self.info["tokens"])

    def window(self, w: int) -> tuple[Window, np.ndarray, np.ndarray, int]:
        """Window ``w`` with its tokens read back from the stored keys, its offsets, ``new`` and first row.

        Read from the plan's files, not through the maps of its arrays: a worker reading its windows
        through the maps kept every page it touched, its share of the corpus's text and per-line
        arrays by the end of its parts."""
        first, count, first_row, _ = (int(x) for x in self.windows[w])
        lo = max(0, first - 1)  # the end of the line before: where this window's text starts
        ends_from_lo = self._range("text_ends", lo, first + count)
        start = int(ends_from_lo[0]) if first else 0
        ends = ends_from_lo[first - lo :]
        base = start
        raw = self._range("text", start, int(ends[-1])).tobytes() if count else b""
        tokens: list[list[str]] = []
        for end in ends.tolist():
            tokens.append(decode_tokens(raw[start - base : end - base]))
            start = end
        window = Window(
            first, tokens, self._range("hashes", first, first + count), self._range("lengths", first, first + count)
        )
        return window, self._range("offsets", first, first + count), self._range("new", first, first + count), first_row

    def column(self, spec: Column) -> RawColumn:
        """The plan's file of the declared column ``spec``, one of :data:`PLANNED_COLUMNS`."""
        dtype, shape = _COLUMNS[spec.name]
        # The plan's files stand for the local writer's staged columns: a declaration that changed one's storage
        # would otherwise finish a cache of other bytes than the local engine's.
        assert spec.name in PLANNED_COLUMNS and (np.dtype(dtype), shape) == (np.dtype(spec.dtype), spec.row_shape), spec
        return RawColumn(self.directory / f"{spec.name}.bin", spec.dtype, spec.row_shape)

    def _range(self, name: str, start: int, stop: int) -> np.ndarray:
        dtype, shape = _COLUMNS[name]
        return RawColumn(self.directory / f"{name}.bin", dtype, shape).read_range(start, stop)


def _columns(directory: Path) -> dict[str, RawColumn]:
    return {name: RawColumn(directory / f"{name}.bin", dtype, shape) for name, (dtype, shape) in _COLUMNS.items()}


def first_pass(
    source: Corpus, directory: Path, window_tokens: int, dedupe: bool, info: dict[str, Any], align: int = 1
) -> FirstPass:
    """Read ``source`` once and write its plan into ``directory`` (``info`` is recorded in ``plan.json``); each
    window's rows start at a multiple of ``align`` (``Layout.window_rows``), as the local engine places them."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PLAN_FILE).unlink(missing_ok=True)
    columns = _columns(directory)
    seen = SeenSentences(directory / "seen") if dedupe else None
    rows = tokens = text_bytes = lines = 0
    n_windows = 0

    def put(window: Window) -> None:
        nonlocal rows, tokens, text_bytes, lines, n_windows
        offsets, new, first_row = assign_window(window, rows, seen, align)
        window_rows = int(window.lengths[new].sum(dtype=np.int64))
        text, sizes = encode_tokens(window.tokens)
        parts = {
            "offsets": offsets,
            "lengths": window.lengths,
            "hashes": window.hashes,
            "new": new,
            "text_ends": text_bytes + np.cumsum(sizes),
            "text": text,
            "windows": np.array([[window.first_line, len(window.tokens), first_row, window_rows]]),
        }
        for name, data in parts.items():
            columns[name].append(data)
        rows = first_row + window_rows
        tokens += int(window.lengths.sum(dtype=np.int64))
        text_bytes += len(text)
        lines += len(window.tokens)
        n_windows += 1

    try:
        for column in columns.values():
            column.open(0)
        cutter = WindowCutter(0, window_tokens)
        for _, sentence in source.sentences():
            window = cutter.add(sentence, sentence_hash(sentence))
            if window is not None:
                put(window)
        window = cutter.flush()
        if window is not None:
            put(window)
        for column in columns.values():
            column.sync()
    finally:
        for column in columns.values():
            column.close()
        if seen is not None:
            seen.close()
    fsync_path(directory, directory=True)
    counts = {"lines": lines, "rows": rows, "tokens": tokens, "text_bytes": text_bytes, "windows": n_windows}
    atomic_write_json(directory / PLAN_FILE, {**info, **counts})
    loaded = load_first_pass(directory)
    assert loaded is not None
    return loaded


def load_first_pass(directory: Path) -> FirstPass | None:
    """The finished plan in ``directory``, or None when there is none (or it was not finished)."""
    path = directory / PLAN_FILE
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheFormatError(f"{path}: unreadable build plan ({exc}); rerun with --overwrite") from None
    counts = {name: int(info["lines"]) for name in _COLUMNS}
    counts["text"] = int(info["text_bytes"])
    counts["windows"] = int(info["windows"])
    arrays: dict[str, np.ndarray] = {}
    for name, column in _columns(directory).items():
        want = counts[name] * column.item_bytes
        if not column.path.is_file() or column.path.stat().st_size != want:
            raise CacheFormatError(
                f"{column.path}: missing or not {want} bytes; the build plan is damaged, rerun with --overwrite"
            )
        arrays[name] = column.read(counts[name])
    return FirstPass(directory, info, **arrays)
