"""A trained codec's values (a product-quantised build's codebooks) staged in its staging folder
(``.build/codebooks.f32``, the values, and ``.build/codebooks.json``, what they are, written last so a
half-written pair is never taken): every encoder of the build reads them from there, the local one and
each Ray worker."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.rows.codecs import RowCodec
from elmo_cache.store.durable import atomic_write_json, fsync_path
from elmo_cache.store.format import BUILD_DIR, checksum

__all__ = ["CODEBOOKS_FILE", "staged_codebooks", "stage_codebooks"]


CODEBOOKS_FILE = "codebooks"
"""Base name of the staged codebooks in the staging's build folder (``.f32``: the values, ``.json``: what they are)."""


def _paths(staging: Path) -> tuple[Path, Path]:
    build = staging / BUILD_DIR
    return build / f"{CODEBOOKS_FILE}.f32", build / f"{CODEBOOKS_FILE}.json"


def staged_codebooks(staging: Path, quantization: RowCodec) -> RowCodec | None:
    """``quantization`` (a codec that is trained) with the values staged in ``staging`` (None when none are
    staged); an error when they belong to another codec or fail their CRC-32."""
    values, info_path = _paths(staging)
    if not info_path.is_file():
        return None
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
        data = np.fromfile(values, dtype="<f4")
    except (OSError, ValueError) as exc:
        raise CacheFormatError(f"{info_path}: unreadable staged codebooks ({exc}); rerun with --overwrite") from None
    if info.get("quantization") != quantization.to_metadata() or info.get("shape") != list(
        quantization.parameter_shape
    ):
        raise CacheFormatError(
            f"{info_path}: staged codebooks of another quantisation ({info.get('quantization')!r}); "
            "rerun with --overwrite"
        )
    if checksum(np.ascontiguousarray(data)) != info.get("crc32"):
        raise CacheFormatError(f"{values}: the staged codebooks fail their CRC-32 (damaged); rerun with --overwrite")
    return quantization.with_parameters(data, str(values))


def stage_codebooks(staging: Path, trained: RowCodec) -> None:
    """Stage ``trained``'s values (its codebooks) in ``staging`` (values first, the JSON that describes them last)."""
    values, info_path = _paths(staging)
    data = trained.parameters()
    tmp = values.with_suffix(".tmp")
    data.tofile(tmp)
    fsync_path(tmp)
    os.replace(tmp, values)
    info = {"quantization": trained.to_metadata(), "shape": list(trained.parameter_shape), "crc32": checksum(data)}
    atomic_write_json(info_path, info)  # last: its presence means the values are whole
