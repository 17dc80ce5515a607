"""Helpers shared by the build tests: a small awkward corpus and the expected stored rows."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import torch

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


def expected_rows(reference: np.ndarray, *, layers=None, mix: MixSpec | None = None) -> np.ndarray:
    """What a cache stores for one sentence, in float32: ``(n, L, D)`` or ``(n, D)``."""
    if mix is not None:
        return mix.apply(torch.from_numpy(reference), layer_dim=0).numpy()
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
