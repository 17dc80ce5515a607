"""Helpers shared by the build tests: a small awkward corpus and the expected stored rows."""

from __future__ import annotations

import contextlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elmo_cache.rows.selection import MixSpec
from elmo_cache.store import open_with_library


def corpus_lines(n: int = 30, seed: int = 0) -> list[str]:
    """``n`` lines with empty lines, repeats (also with other spacing), and lengths 1..25."""
    rng = random.Random(seed)
    words = [
        "the",
        "cat",
        "sat",
        "on",
        "a",
        "mat",
        ".",
        "dogs",
        "bark",
        "loudly",
        "Zürich",
        "naïve",
        "—",
        "42",
        ",",
        "!",
    ]
    lines: list[str] = []
    for i in range(n):
        if i % 9 == 4:
            lines.append("")
        elif i % 7 == 5 and lines:
            lines.append("  ".join(lines[rng.randrange(len(lines))].split()))  # a repeat, spaced differently
        else:
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 25))))
    return lines


def write_corpus(path: Path, lines: list[str], *, newline: str = "\n", encoding: str = "utf-8") -> Path:
    path.write_bytes(newline.join(lines).encode(encoding) + newline.encode())
    return path


@dataclass(frozen=True)
class RawMix:
    """A fixed mix as a user gives it: the raw numbers, gamma, and whether the numbers are softmax parameters.

    The tests build with :meth:`spec` and compute the expected rows with :meth:`rows` (numpy, float64,
    from the raw numbers): a bug in :class:`MixSpec` (normalisation, gamma) cannot hide in both."""

    weights: tuple[float, ...]
    gamma: float = 1.0
    softmax: bool = False

    def spec(self) -> MixSpec:
        return MixSpec.from_raw(list(self.weights), gamma=self.gamma, softmax=self.softmax)

    def effective_weights(self) -> np.ndarray:
        raw = np.asarray(self.weights, dtype=np.float64)
        if not self.softmax:
            return raw
        exps = np.exp(raw - raw.max())
        return exps / exps.sum()

    def rows(self, layers: np.ndarray) -> np.ndarray:
        """gamma * sum_j s_j * layer_j of ``layers`` (layers first: ``(3, n, D)``), as float32 ``(n, D)``."""
        mixed = np.tensordot(self.effective_weights(), np.asarray(layers, dtype=np.float64), axes=(0, 0))
        return (self.gamma * mixed).astype(np.float32)


def expected_rows(reference: np.ndarray, *, layers=None, mix: RawMix | None = None) -> np.ndarray:
    """What a cache stores for one sentence, in float32: ``(n, L, D)`` or ``(n, D)``."""
    if mix is not None:
        return mix.rows(reference)
    return reference[list(layers if layers is not None else (0, 1, 2))].transpose(1, 0, 2)


def raw_arrays(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Metadata and every array of a cache, read whole with zarr/h5py."""
    _, raw, arrays, close = open_with_library(Path(path))
    try:
        meta = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
        return meta, {name: np.asarray(array[...]) for name, array in arrays.items()}
    finally:
        close()


def without_timings(meta: dict) -> dict:
    """Metadata minus what legitimately differs between two runs of the same build."""
    meta = dict(meta)
    build = dict(meta.pop("build"))
    for key in ("started", "finished", "seconds", "tokens_per_s"):
        build.pop(key, None)
    meta["build"] = build
    return meta


def assert_same_cache(output: Path, reference: Path) -> dict[str, np.ndarray]:
    """``output`` holds ``reference``'s metadata (but for the output path and timings) and every one of its arrays,
    dtype and bytes; returns ``output``'s arrays for further checks."""
    meta_ref, arrays_ref = raw_arrays(reference)
    meta_out, arrays_out = raw_arrays(output)
    for meta in (meta_ref, meta_out):
        meta["build"]["args"].pop("output", None)  # the only intended difference
    assert without_timings(meta_out) == without_timings(meta_ref)
    assert sorted(arrays_out) == sorted(arrays_ref)
    for name, want in arrays_ref.items():
        assert arrays_out[name].dtype == want.dtype, name
        np.testing.assert_array_equal(arrays_out[name], want, err_msg=name)
    return arrays_out


def placed_offsets(token_lists: list[list[str]], meta: dict, cuts: tuple[int, ...] = ()) -> np.ndarray:
    """The offsets FORMAT.md gives the sentences of a cache built without dedupe: one after the other in input
    order, but in a version-5 zarr cache each window's first stored row at the next multiple of ``shard_rows``
    (windows cut as the metadata's ``windows`` records, by the build's own cutter, and before each line of
    ``cuts``: where a build stopped on a bad line committed the window it had, and its resume began one)."""
    from elmo_cache.builder.encoding import WindowCutter
    from elmo_cache.text.tokenize import sentence_hash

    align = int(meta["shard_rows"]) if meta.get("format_version") == 5 else 1
    cutter, windows = WindowCutter(0, int(meta["windows"]["window_tokens"])), []
    for i, tokens in enumerate(token_lists):
        if i in cuts:
            window = cutter.flush()
            if window is not None:
                windows.append(window.lengths)
        window = cutter.add(tokens, sentence_hash(tokens))
        if window is not None:
            windows.append(window.lengths)
    last = cutter.flush()
    if last is not None:
        windows.append(last.lengths)
    offsets, row = [], 0
    for lengths in windows:
        aligned = False
        for n in lengths.tolist():
            if n and not aligned:  # the window's first row (an empty line before it keeps the row before)
                row, aligned = -(-row // align) * align, True
            offsets.append(row)
            row += n
    return np.array(offsets, dtype=np.int64)


@contextlib.contextmanager
def failing_on(encoder, batch: int | None = None, *, holding: list[str] | None = None):
    """The encoder raises on its ``batch``-th batch, or on the first batch that holds the sentence ``holding`` (a
    crash in the middle of a build, at a place that does not depend on how many batches a window takes)."""
    real, calls = encoder.encode_flat, [0]

    def encode_flat(sentences):
        calls[0] += 1
        if calls[0] == batch or (holding is not None and any(list(s) == holding for s in sentences)):
            raise RuntimeError("simulated crash")
        return real(sentences)

    encoder.encode_flat = encode_flat
    try:
        yield
    finally:
        del encoder.encode_flat
