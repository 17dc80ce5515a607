"""Writing a zarr v3 cache's files: the group, vectors files, the small arrays and the finish.

See :mod:`elmo_cache.store.zarr` for the design.

These functions are shared by :class:`~elmo_cache.store.zarr.writer.ZarrWriter` (one process) and the
distributed build, whose workers fill vectors files in any order.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheFormatError
from elmo_cache.store.blocksums import BlockSummer, block_sums, read_sums_file, sums_listing, write_sums_file
from elmo_cache.store.columns import Column
from elmo_cache.store.durable import fsync_path, publish_directory
from elmo_cache.store.format import (
    BLOCK_SUMS,
    BUILD_DIR,
    CHECKSUM_ALGORITHM,
    CHECKSUMS_FILE,
    META_KEY,
    OPTIONAL_ARRAYS,
    POOLED_ARRAY,
    POOLED_CHUNK_BLOCKS,
    SMALL_BLOCK_ROWS,
    ZARR_JSON,
    block_sums_name,
    checksum,
    metadata_checksum,
)
from elmo_cache.store.pooled import pooled_block_rows, pooled_chunk_rows
from elmo_cache.store.staging import Layout, SentenceColumns, array_blocks
from elmo_cache.store.zarr.maps import ABSENT_CHUNK
from elmo_cache.store.zarr.read import read_json

__all__ = [
    "COMPRESSIONS",
    "SMALL_CHUNK",
    "TEXT_CHUNK",
    "file_checksum",
    "create_group",
    "finish_group",
    "finish_sentences",
    "vectors_file_path",
    "vectors_file_rows",
    "write_vectors_file",
    "CRC_BYTES",
    "file_geometry",
    "shard_index",
    "write_file_body",
    "sums_path",
    "publish_file",
]

COMPRESSIONS = ("none", "zstd", "blosc-lz4", "blosc-zstd")
"""Valid ``compression`` names for zarr caches ("none" is stored as null)."""

# Entries per chunk of the 1-D arrays (offsets, lengths, index): 8 MiB of int64. Readers map
# them chunk by chunk (lazily) or load them whole; this size keeps a 100M-line cache at ~100
# files per array while a binary search of the index still touches only a few of them.
SMALL_CHUNK = 1 << 20

# Bytes per chunk of ``tokens/bytes`` (about 60 bytes a sentence: ~1.1M sentences a chunk).
TEXT_CHUNK = 1 << 26

# Bytes read at a time when a file's CRC-32 is computed.
CRC_BYTES = 16 * 2**20


def file_checksum(path: Path) -> tuple[int, int]:
    """``(size, CRC-32)`` of the file at ``path``, read in pieces."""
    crc = size = 0
    with open(path, "rb") as f:
        while piece := f.read(CRC_BYTES):
            crc = checksum(piece, crc)
            size += len(piece)
    return size, crc


def _compressor(name: str | None, itemsize: int) -> Any:
    import zarr.codecs

    if name is None:
        return None
    if name == "zstd":
        # Level 1: higher levels cost much more time and gain almost nothing on float vectors.
        return zarr.codecs.ZstdCodec(level=1)
    if name == "blosc-lz4":
        return zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle", typesize=itemsize)
    if name == "blosc-zstd":
        return zarr.codecs.BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle", typesize=itemsize)
    raise AssertionError(name)


# Bytes of a 1-D array written at a time when a cache is finished.
_BLOCK_BYTES = 64 * 2**20


def vectors_file_rows(layout: Layout) -> int:
    """Rows per ``vectors`` file of a zarr layout (one shard): row ``r`` lives in file ``r // vectors_file_rows``."""
    if layout.shard_rows is None or layout.chunk_rows is None:
        raise ValueError("a zarr layout needs chunk_rows and shard_rows")
    return int(layout.shard_rows)


def vectors_file_path(root: Path, layout: Layout, k: int) -> Path:
    """Where ``vectors`` file ``k`` lives in the zarr group at ``root`` (the default chunk key encoding)."""
    return root.joinpath("vectors", "c", str(k), *("0" * len(layout.row_shape)))


def _vectors_array_spec(layout: Layout, n_rows: int) -> dict[str, Any]:
    row = layout.row_shape
    return {
        "shape": (n_rows, *row),
        "chunks": (int(layout.chunk_rows or 0), *row),
        "shards": (vectors_file_rows(layout), *row),
        "dtype": layout.dtype,
        "compressors": _compressor(layout.compression, np.dtype(layout.dtype).itemsize),
        "fill_value": 0,
        "dimension_names": ("row", "layer", "dim") if len(row) == 2 else ("row", "dim"),
    }


def create_group(staging: Path, layout: Layout, n_rows: int, metadata: dict[str, Any]) -> None:
    """Create the zarr group at ``staging`` (root attribute ``metadata``) with an empty ``vectors`` array of
    ``n_rows`` rows laid out per ``layout``; no vectors file is written. Nothing happens when the group is
    already there with that shape (a resumed build)."""
    import zarr

    vectors_meta = staging / "vectors" / ZARR_JSON
    if vectors_meta.is_file():
        shape = read_json(vectors_meta, "array 'vectors'").get("shape")
        if shape == [n_rows, *layout.row_shape]:
            return
        raise CacheFormatError(
            f"{staging}: the vectors being built have shape {shape}, expected {[n_rows, *layout.row_shape]}; "
            "rerun with --overwrite"
        )
    group = zarr.create_group(store=str(staging), attributes={META_KEY: metadata})
    group.create_array("vectors", **_vectors_array_spec(layout, n_rows))


def file_geometry(layout: Layout, n_rows: int, k: int) -> tuple[int, int]:
    """``(rows, inner chunks present)`` of vectors file ``k`` in an array of ``n_rows`` rows."""
    shard, chunk = vectors_file_rows(layout), int(layout.chunk_rows or 0)
    rows = max(0, min(shard, n_rows - k * shard))
    return rows, -(-rows // chunk)


def shard_index(layout: Layout, present: int) -> bytes:
    """The index zarr's sharding codec ends an uncompressed shard with: (offset, size) per inner chunk, then
    its CRC-32C (the ``crc32c`` index codec)."""
    import google_crc32c

    chunk_bytes = int(layout.chunk_rows or 0) * layout.row_bytes
    index = np.full((vectors_file_rows(layout) // int(layout.chunk_rows or 1), 2), ABSENT_CHUNK, dtype="<u8")
    index[:present, 0] = np.arange(present, dtype=np.uint64) * np.uint64(chunk_bytes)
    index[:present, 1] = chunk_bytes
    raw = index.tobytes()
    return raw + int(google_crc32c.value(raw)).to_bytes(4, "little")


def _encode_with_zarr(layout: Layout, n_rows: int, k: int, rows: np.ndarray) -> bytes:
    """Vectors file ``k`` as zarr itself encodes it (compressed layouts), in memory."""
    import zarr
    from zarr.storage import MemoryStore

    # Public API only: MemoryStore keeps its values in the mapping it is given (zarr Buffers, which
    # have to_bytes()); zarr's store getters would need its private event-loop helpers.
    # write_empty_chunks as the array's config: zarr 3.1 ignores the global "array.write_empty_chunks" key.
    files: dict[str, Any] = {}
    array = zarr.create_array(
        MemoryStore(files), **_vectors_array_spec(layout, n_rows), config={"write_empty_chunks": True}
    )
    start = k * vectors_file_rows(layout)
    array[start : start + len(rows)] = rows
    key = "/".join(["c", str(k), *("0" * len(layout.row_shape))])
    encoded = files.get(key)
    assert encoded is not None, key
    return encoded.to_bytes()


def write_file_body(handle: Any, layout: Layout, n_rows: int, k: int, rows: np.ndarray) -> int:
    """Write vectors file ``k`` (whose rows are ``rows``) to ``handle``; returns its CRC-32."""
    if layout.compression is not None:
        data = _encode_with_zarr(layout, n_rows, k, rows)
        handle.write(data)
        return checksum(data)
    _, present = file_geometry(layout, n_rows, k)
    body = np.ascontiguousarray(rows, dtype=layout.dtype).data.cast("B")
    padding = bytes(present * int(layout.chunk_rows or 0) * layout.row_bytes - len(body))
    index = shard_index(layout, present)
    for piece in (body, padding, index):
        handle.write(piece)
    return checksum(index, checksum(padding, checksum(body)))


def write_vectors_file(
    staging: Path, layout: Layout, n_rows: int, k: int, rows: np.ndarray, *, end: int | None = None
) -> tuple[int, int]:
    """Write ``vectors`` file ``k`` of an array of ``n_rows`` rows: its rows ``[k*F, min((k+1)*F, n_rows))``
    (``F = vectors_file_rows(layout)``) are ``rows``, exactly that many; or, ``end`` given, a file whose rows end
    there, short of the file (a window's last: the next window's rows start the next file), ``[k*F, end)``.

    The file goes to a temporary name in the build folder, is synced, then renamed into place, so a
    file at its final name is always whole. Returns its ``(size, CRC-32)`` for ``checksums.json``.
    """
    if end is not None:
        n_rows = end
    want, _ = file_geometry(layout, n_rows, k)
    if len(rows) != want or tuple(rows.shape[1:]) != tuple(layout.row_shape):
        raise ValueError(
            f"vectors file {k} holds {want} rows of shape {layout.row_shape}, got an array of shape {rows.shape}"
        )
    (staging / BUILD_DIR).mkdir(parents=True, exist_ok=True)
    # A name of its own: two writers of the same file (a part redone while a stale worker still
    # runs) must never write into one temporary file; the last rename wins, whole either way.
    # (Not mkstemp: its files are private, 0600; a cache is read by other users and services.)
    name = staging / BUILD_DIR / f"vectors-{k}.{uuid.uuid4().hex}.tmp"
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            crc = write_file_body(handle, layout, n_rows, k, rows)
            handle.flush()
            os.fsync(handle.fileno())
            size = handle.tell()
        # The block sums first: a vectors file at its final name always has them beside it.
        write_sums_file(sums_path(staging, k), file_block_sums(rows, layout, short=end is not None))
        publish_file(Path(name), vectors_file_path(staging, layout, k))
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return size, crc


def file_block_sums(rows: np.ndarray, layout: Layout, *, short: bool) -> np.ndarray:
    """The block sums of a vectors file's ``rows``; of a file that ends ``short`` (before the array's last) the
    last block is a whole chunk, its padding summed as the zeros it reads as."""
    summer = BlockSummer(int(layout.chunk_rows or 0) * layout.row_bytes)
    summer.update(np.ascontiguousarray(rows, dtype=layout.dtype))
    if short:
        summer.pad_block()
    return summer.finish()


def sums_path(staging: Path, k: int) -> Path:
    """Where a build keeps the block sums of vectors file ``k`` until :func:`finish_group` gathers them."""
    return staging / BUILD_DIR / f"blocksums-{k}.bin"


def _vector_block_sums(staging: Path, vectors: Any) -> np.ndarray:
    """``blocksums/vectors``: the sums the writers left beside each vectors file, or for a file without
    them (a build resumed from an older elmo-cache) its rows read back through zarr."""
    rows, chunk = int(vectors.shape[0]), int(vectors.chunks[0])
    file_rows = int((vectors.shards or vectors.chunks)[0])
    parts = []
    absent: np.ndarray | None = None
    for k in range(-(-rows // file_rows)):
        start, stop = k * file_rows, min(rows, (k + 1) * file_rows)
        blocks = -(-(stop - start) // chunk)
        sums = read_sums_file(sums_path(staging, k), blocks)
        if sums is None:
            # A file that ends short (a window's last: the next window starts the next file): its chunks that
            # are not stored read as zeros, and are summed so.
            stored = read_sums_file(sums_path(staging, k), None)
            if stored is not None and len(stored) < blocks:
                if absent is None:
                    absent = block_sums(np.zeros((chunk, *vectors.shape[1:]), dtype=vectors.dtype), chunk)
                sums = np.concatenate([stored, np.repeat(absent, blocks - len(stored))])
        parts.append(sums if sums is not None else block_sums(np.asarray(vectors[start:stop]), chunk))
    joined = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
    if rows % chunk:
        # The array's last block is summed over its rows alone: a file an update took whole from a window that
        # was not its cache's last carries the sum of the block padded (as a file that ends short sums it).
        last = rows - rows % chunk
        joined[-1] = block_sums(np.asarray(vectors[last:rows]), chunk)[0]
    return joined


def publish_file(source: Path, final: Path) -> None:
    """Move a finished file of the group into place, durably (the rename and its folder synced)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(source, final)
    fsync_path(final.parent, directory=True)


def _write_checksums(staging: Path, known: dict[str, tuple[int, int]]) -> None:
    """``checksums.json``: size and CRC-32 of every file of the group but the root ``zarr.json``; ``known``
    holds the sums already computed (relative paths), the other files are read now."""
    files: dict[str, list[int]] = {}
    for directory, subdirectories, names in os.walk(staging):
        relative = Path(directory).relative_to(staging)
        if relative.parts[:1] == (BUILD_DIR,):
            subdirectories.clear()
            continue
        for name in names:
            key = (relative / name).as_posix()
            if key in (ZARR_JSON, CHECKSUMS_FILE):
                continue
            files[key] = list(known.get(key) or file_checksum(Path(directory) / name))
    path = staging / CHECKSUMS_FILE
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"algorithm": CHECKSUM_ALGORITHM, "files": files}, f, sort_keys=True, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())


def _create_small_array(group: Any, name: str, data: Any, column: Column | None) -> Any:
    """The zarr array ``name`` for ``data`` (1-D, or a declared column's rows), its chunks not written."""
    if column is not None and column.chunk_rows is not None:
        chunk_rows = max(1, min(len(data), column.chunk_rows))
    elif name == POOLED_ARRAY:
        chunk_rows = pooled_chunk_rows(len(data), _row_bytes(data))
    else:
        chunk_rows = max(1, min(len(data), TEXT_CHUNK if name == "tokens/bytes" else SMALL_CHUNK))
    return group.create_array(
        name,
        shape=data.shape,
        dtype=data.dtype,
        chunks=(chunk_rows, *data.shape[1:]),
        compressors=None,
        fill_value=0,
        overwrite=True,
        # Every chunk written, zeros too, so that an absent file always means damage (a reader refuses
        # it). As the array's config: zarr 3.1 ignores the global "array.write_empty_chunks" key.
        config={"write_empty_chunks": True},
    )


def _write_small_array(group: Any, name: str, data: np.ndarray, column: Column | None = None) -> np.ndarray:
    """Write ``data`` (1-D, or ``pooled``'s rows) as array ``name`` of ``group`` a block at a time; returns its
    block sums."""
    block_rows = _block_rows(name, data, column)
    array = _create_small_array(group, name, data, column)
    # Whole chunks and whole sum blocks per step, so each chunk is written once and each sum is of one block.
    unit = math.lcm(array.chunks[0], block_rows)
    step = unit * max(1, _BLOCK_BYTES // (unit * _row_bytes(data)))
    sums = []
    for start, block in array_blocks(data, step):
        array[start : start + len(block)] = block
        sums.append(block_sums(block, block_rows))
    return np.concatenate(sums) if sums else np.empty(0, np.uint32)


def staged_chunk_path(root: Path, name: str, k: int, ndim: int) -> Path:
    """Where chunk ``k`` of the unsharded array ``name`` (of ``ndim`` axes) lives in the group at ``root``."""
    return root.joinpath(*name.split("/"), "c", str(k), *("0" * (ndim - 1)))


def _publish_staged_array(
    group: Any, staging: Path, name: str, data: Any, column: Column, files: list[tuple[Path, int]]
) -> np.ndarray:
    """Array ``name`` from its staged files, one per chunk (a :class:`~elmo_cache.store.durable.ChunkedColumn`),
    moved into the group rather than copied: an uncompressed chunk is its rows' raw bytes, the last one padded
    with zeros to the chunk's rows when the array has several. Returns its block sums (read before the move).
    A finish interrupted after some moves takes them back on resume (ZarrWriter._recover_columns)."""
    block_rows = _block_rows(name, data, column)
    sums = [block_sums(block, block_rows) for _, block in array_blocks(data, block_rows * POOLED_CHUNK_BLOCKS)]
    array = _create_small_array(group, name, data, column)
    chunk_rows, row_bytes = int(array.chunks[0]), _row_bytes(data)
    for k, (path, rows) in enumerate(files):
        want = chunk_rows * row_bytes
        if path.stat().st_size != want:  # the last chunk of several: zero-padded; a lone chunk is its rows
            os.truncate(path, want if len(files) > 1 else rows * row_bytes)
        fsync_path(path)
        publish_file(path, staged_chunk_path(staging, name, k, len(data.shape)))
    return np.concatenate(sums) if sums else np.empty(0, np.uint32)


def _row_bytes(data: Any) -> int:
    return max(1, data.itemsize * int(np.prod(data.shape[1:], dtype=np.int64)))


def _block_rows(name: str, data: Any, column: Column | None = None) -> int:
    """Rows per checked block of array ``name`` (FORMAT.md, "Block checksums"): its declared column's, else
    the format's rule (the ray engine's finish names no columns)."""
    if column is not None:
        return column.block_rows
    return pooled_block_rows(_row_bytes(data)) if name == POOLED_ARRAY else SMALL_BLOCK_ROWS


def finish_group(
    staging: Path,
    output: Path,
    small_arrays: dict[str, np.ndarray],
    metadata: dict[str, Any],
    vector_sums: dict[int, tuple[int, int]] | None = None,
    columns: dict[str, Column] | None = None,
    staged: dict[str, list[tuple[Path, int]]] | None = None,
) -> Path:
    """Finish the zarr cache built in ``staging`` and publish it at ``output``.

    Every ``vectors`` file must already be written. Sets ``vectors`` to ``metadata["n_rows"]`` rows,
    writes the 1-D arrays (``offsets``, ``lengths``, ``index/hashes``, ``index/rows``, ``tokens/bytes``,
    ``tokens/offsets``), ``checksums.json`` (``vector_sums[k]`` is vectors file ``k``'s ``(size, CRC-32)``
    when already known), then the metadata with ``complete: true`` and its checksum, last; syncs,
    renames the folder to ``output`` and removes the build folder. ``columns``: the declared column of each
    array written as it is (its block rows, chunks, whether optional; store.columns); ``staged``: the arrays
    whose rows are staged as one file per chunk (``(path, rows)`` each), moved into the group instead of copied.
    """
    import zarr

    group = zarr.open_group(store=str(staging), mode="r+")
    vectors: Any = group["vectors"]
    rows = int(metadata["n_rows"])
    if vectors.shape[0] != rows:
        # Public Array.resize (the private async_array is gone in some zarr 3 releases): it rewrites
        # the shape in zarr.json and deletes only vectors files wholly past the new end, which hold no row.
        vectors.resize((rows, *vectors.shape[1:]))
    # Block sums (FORMAT.md, "Block checksums"): the vectors' from the files' writers, the others' as their
    # blocks are copied in (a block at a time: a whole copy would stay resident, bytes per line of corpus).
    sums = {BLOCK_SUMS["vectors"]: _vector_block_sums(staging, vectors)}
    columns, staged = columns or {}, staged or {}
    for name, data in small_arrays.items():
        column = columns.get(name)
        if column is not None and name in staged:
            sums[block_sums_name(name)] = _publish_staged_array(group, staging, name, data, column, staged[name])
        else:
            sums[block_sums_name(name)] = _write_small_array(group, name, data, column)
    for name, data in sums.items():
        _write_small_array(group, name, data)
    for directory, _, files in os.walk(staging):
        parts = Path(directory).relative_to(staging).parts
        if parts[:1] == (BUILD_DIR,) or parts[:2] == ("vectors", "c"):
            continue  # vectors files were synced when they were written
        for file in files:
            fsync_path(Path(directory) / file)
    ndim = len(vectors.shape)
    known = {
        "/".join(["vectors", "c", str(k), *("0" * (ndim - 1))]): (int(size), int(crc))
        for k, (size, crc) in (vector_sums or {}).items()
    }
    _write_checksums(staging, known)
    # complete=true is the last write into the group; the rename then publishes it whole.
    final = {**metadata}
    final["checksums"] = {
        "algorithm": CHECKSUM_ALGORITHM,
        "file": CHECKSUMS_FILE,
        "metadata": metadata_checksum(final),
        "blocks": sums_listing(
            int(vectors.chunks[0]),
            {
                name: _block_rows(name, data, columns.get(name))
                for name, data in small_arrays.items()
                if name in OPTIONAL_ARRAYS or getattr(columns.get(name), "optional", False)
            },
            {name: sums[block_sums_name(name)] for name in ("vectors", *small_arrays)},
        ),
    }
    group.attrs[META_KEY] = final
    fsync_path(staging / ZARR_JSON)
    publish_directory(staging, output)  # an update's old cache there is swapped out
    shutil.rmtree(output / BUILD_DIR, ignore_errors=True)
    return output


def finish_sentences(
    staging: Path,
    output: Path,
    sentences: SentenceColumns,
    arrays: dict[str, np.ndarray],
    metadata: dict[str, Any],
    vector_sums: dict[int, tuple[int, int]] | None = None,
) -> Path:
    """:func:`finish_group` with the per-sentence ``arrays`` derived from ``sentences``
    (:meth:`SentenceColumns.arrays`), their declarations, and the columns staged in chunks moved into the
    group: how the single writer and the parallel writer both finish."""
    columns = sentences.array_columns()
    return finish_group(staging, output, arrays, metadata, vector_sums, columns, sentences.staged_chunks(arrays))
