"""Whether two caches hold the same bytes but for the build's record: what a benchmark's ``--check`` asks of a
cache it built two ways (an update against a fresh build, the ray engine against the local one).

Benchmarks do not import the test suite; tests/builder/test_update.py asserts the same with its own helper.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.store import open_with_library


def _read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    _, raw, arrays, close = open_with_library(path)
    try:
        meta = json.loads(raw) if isinstance(raw, (str, bytes)) else json.loads(json.dumps(raw))
        return meta, {name: np.asarray(array[...]) for name, array in arrays.items()}
    finally:
        close()


def _comparable(meta: dict[str, Any]) -> dict[str, Any]:
    """Metadata but for the build's record (arguments, engine, times) and the metadata's own CRC, which covers it."""
    meta = dict(meta)
    meta.pop("build", None)
    meta["checksums"] = {k: v for k, v in (meta.get("checksums") or {}).items() if k != "metadata"}
    return meta


def cache_difference(a: Path, b: Path) -> str | None:
    """What first differs between caches ``a`` and ``b`` (each a zarr folder or an HDF5 file), or None when every
    stored byte is the same but the build's record: the metadata, each array's dtype, shape and bytes, and for a
    zarr folder every file but the root ``zarr.json`` (which holds the build's record)."""
    meta_a, arrays_a = _read(a)
    meta_b, arrays_b = _read(b)
    if _comparable(meta_a) != _comparable(meta_b):
        return "the metadata (the build's record aside)"
    if sorted(arrays_a) != sorted(arrays_b):
        return f"the arrays: {sorted(arrays_a)} against {sorted(arrays_b)}"
    for name, want in arrays_b.items():
        got = arrays_a[name]
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            return f"array {name}"
    if a.is_dir() != b.is_dir():
        return "the container (a folder against a file)"
    if a.is_dir():
        files_a = {p.relative_to(a): p for p in a.rglob("*") if p.is_file()}
        files_b = {p.relative_to(b): p for p in b.rglob("*") if p.is_file()}
        if sorted(files_a) != sorted(files_b):
            return f"the files: {sorted(map(str, set(files_a) ^ set(files_b)))}"
        for name in sorted(files_b):
            if name != Path("zarr.json") and files_a[name].read_bytes() != files_b[name].read_bytes():
                return f"file {name}"
    return None
