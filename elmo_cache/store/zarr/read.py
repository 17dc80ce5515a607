"""Opening a zarr v3 cache for reading: detection, metadata and each array's view (see :mod:`elmo_cache.store.zarr`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError, CacheReplacedError
from elmo_cache.store.chunked import ChunkedArray
from elmo_cache.store.columns import cache_arrays, optional_arrays
from elmo_cache.store.format import META_KEY, ZARR_JSON, decode_metadata
from elmo_cache.store.zarr.maps import DecodedChunks, RawChunks, RawShards, folder_identity

__all__ = ["is_store", "read_metadata", "read_json", "open_arrays", "open_with_library"]


def is_store(path: Path) -> bool:
    """Whether ``path`` is a directory holding a zarr v3 root (``zarr.json``)."""
    return path.is_dir() and (path / ZARR_JSON).is_file()


def read_metadata(path: Path) -> dict[str, Any] | None:
    """The elmo-cache metadata of the zarr group at ``path``, or None if it is not one of ours."""
    try:
        group = json.loads((path / ZARR_JSON).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return decode_metadata((group.get("attributes") or {}).get(META_KEY)) if isinstance(group, dict) else None


def _chunk_key(encoding: dict[str, Any], where: Path) -> Callable[[int, int], str]:
    name = encoding.get("name", "default")
    configured: str | None = (encoding.get("configuration") or {}).get("separator")
    if name == "default":
        separator = configured or "/"

        def key(c: int, ndim: int) -> str:
            return separator.join(["c", str(c), *("0" * (ndim - 1))])

    elif name == "v2":
        separator = configured or "."

        def key(c: int, ndim: int) -> str:
            return separator.join([str(c), *("0" * (ndim - 1))])

    else:
        raise CacheFormatError(f"{where}: unsupported chunk key encoding {name!r}; expected 'default' or 'v2'")
    return key


def _fill_value(raw: Any, dtype: np.dtype) -> Any:
    if isinstance(raw, str):
        special = {"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}
        if raw in special:
            return special[raw]
        if raw.startswith("0x"):  # the bit pattern of a float, big-endian hex per the zarr v3 spec
            return np.frombuffer(bytes.fromhex(raw[2:]), dtype=dtype.newbyteorder(">"))[0]
    return 0 if raw is None else raw


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (``what`` names it in the error when it is unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CacheFormatError(f"{path}: cannot read the zarr metadata of {what}: {exc}") from None
    if not isinstance(data, dict):
        raise CacheFormatError(f"{path}: the zarr metadata of {what} is not a JSON object")
    return data


def _open_array(root: Path, name: str) -> ChunkedArray | None:
    directory = root / name
    meta_path = directory / ZARR_JSON
    if not meta_path.is_file():
        return None
    meta = read_json(meta_path, f"array {name!r}")
    where = f"{root}: array {name!r}"
    if meta.get("node_type") != "array" or meta.get("zarr_format") != 3:
        raise CacheFormatError(f"{where} is not a zarr v3 array ({meta_path})")
    try:
        shape = tuple(int(s) for s in meta["shape"])
        data_type = meta["data_type"]
        if isinstance(data_type, dict):
            data_type = data_type.get("name")
        grid = meta["chunk_grid"]
        chunk_shape = tuple(int(s) for s in grid["configuration"]["chunk_shape"])
        codecs = list(meta.get("codecs") or [])
        dtype = np.dtype(data_type)
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheFormatError(f"{where}: malformed zarr.json ({exc})") from None
    if grid.get("name") != "regular" or len(chunk_shape) != len(shape) or not shape:
        raise CacheFormatError(f"{where}: expected a regular chunk grid matching shape {list(shape)}")
    plain = not meta.get("storage_transformers") and chunk_shape[1:] == shape[1:]
    if plain and _raw_bytes(codecs):
        dtype = dtype.newbyteorder(_raw_bytes(codecs))
        key = _chunk_key(meta.get("chunk_key_encoding") or {}, root / name)
        return RawChunks(name, shape, dtype, chunk_shape[0], directory, key, _fill_value(meta.get("fill_value"), dtype))
    sharded = len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed"
    sharding = (codecs[0].get("configuration") or {}) if sharded else {}
    inner = [int(s) for s in sharding.get("chunk_shape") or []]
    index_codecs = [c.get("name") for c in sharding.get("index_codecs") or []]
    if (
        plain
        and sharded
        and _raw_bytes(sharding.get("codecs") or []) == "<"
        and sharding.get("index_location", "end") == "end"
        and index_codecs in (["bytes"], ["bytes", "crc32c"])
        and _raw_bytes((sharding.get("index_codecs") or [])[:1]) == "<"
        and len(inner) == len(shape)
        and inner[1:] == list(shape[1:])
        and chunk_shape[0] % inner[0] == 0
    ):
        dtype = dtype.newbyteorder(_raw_bytes(sharding["codecs"]))
        key = _chunk_key(meta.get("chunk_key_encoding") or {}, root / name)
        fill = _fill_value(meta.get("fill_value"), dtype)
        return RawShards(
            name, shape, dtype, chunk_shape[0], inner[0], directory, key, fill, index_codecs[-1] == "crc32c"
        )
    import zarr  # only compressed caches pay for importing zarr

    try:
        array = zarr.open_array(store=str(root), path=name, mode="r")
    except Exception as exc:  # zarr raises many types for unreadable metadata
        raise CacheFormatError(f"{where}: zarr cannot open it ({exc})") from None
    # Sharded arrays are decoded one inner chunk at a time (zarr reads only that part of a shard).
    rows = int(inner[0]) if sharded and inner else chunk_shape[0]
    key = _chunk_key(meta.get("chunk_key_encoding") or {}, root / name)
    per_file = chunk_shape[0] // rows if chunk_shape[1:] == shape[1:] else 0

    def file_of(c: int) -> tuple[int, str]:
        k = c // per_file
        return k, os.path.join(directory, key(k, len(shape)))

    return DecodedChunks(name, shape, array.dtype, rows, array, file_of if per_file else None, directory)


def _raw_bytes(codecs: list[dict[str, Any]]) -> str | None:
    """The byte order ("<" or ">") when a codec chain is just the ``bytes`` codec, else None."""
    if len(codecs) != 1 or codecs[0].get("name") != "bytes":
        return None
    return "<" if (codecs[0].get("configuration") or {}).get("endian", "little") == "little" else ">"


# Tries of an open that a publish interrupted (each such open is a few milliseconds; updates are minutes apart).
_OPEN_TRIES = 5


def open_arrays(root: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, ChunkedArray | None]]:
    """Raw metadata attribute and the arrays ``names`` (None where missing) of a zarr cache.

    The metadata and each array's ``zarr.json`` are read by path, one after another: an update published meanwhile
    (its folder swapped in under ``root``) would pair the old cache's metadata with the new cache's arrays. So the
    folder at ``root`` must be the same one before and after; an open that saw it change is done again (the cache
    published is whole), and one that never sees it settle is a :class:`CacheReplacedError`."""
    for _ in range(_OPEN_TRIES):
        before = folder_identity(root)
        group = read_json(root / ZARR_JSON, "the root group")
        if group.get("node_type") != "group":
            raise CacheFormatError(
                f"{root}: zarr.json describes a {group.get('node_type')!r}, not a group; not an elmo-cache store"
            )
        attributes = group.get("attributes") or {}
        arrays = {name: _open_array(root, name) for name in names}
        if before is not None and folder_identity(root) == before:
            return attributes.get(META_KEY), arrays
    raise CacheReplacedError(
        f"{root}: the cache was replaced {_OPEN_TRIES} times while it was being opened (build --update publishing "
        "again and again?); open it once that settles"
    )


def open_with_library(path: Path) -> tuple[Any, dict[str, Any], Callable[[], None]]:
    """Metadata attribute, arrays (None where missing) and a ``close``, read by zarr-python itself.

    ``verify`` checks the format through this rather than through :func:`open_arrays`, so that it
    tests FORMAT.md, not this module's reading of it.
    """
    import zarr

    try:
        group = zarr.open_group(str(path), mode="r")
    except Exception as exc:  # zarr raises many types for foreign directories
        raise CacheFormatError(f"{path}: not a zarr v3 group ({exc})") from None
    raw = group.attrs.get(META_KEY)
    meta = decode_metadata(raw)
    optional = optional_arrays(meta)
    arrays: dict[str, Any] = {}
    for name in cache_arrays(meta):
        try:
            arrays[name] = group[name]
        except KeyError:
            if name not in optional:  # an optional array a cache does not hold is not named at all
                arrays[name] = None
    return raw, arrays, lambda: None


# -- writing ----------------------------------------------------------------------------------------
