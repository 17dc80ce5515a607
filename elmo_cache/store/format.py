"""docs/FORMAT.md in code: every name and value the store format fixes, and the one metadata parser.

The two containers (:mod:`elmo_cache.store.zarr`, :mod:`elmo_cache.store.hdf5`), the reader, the
build, ``verify`` and ``info`` all take these constants from here, so a change of the format is a
change of this module and FORMAT.md, nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elmo_cache.errors import CacheFormatError
from elmo_cache.model.identity import identity_layers

__all__ = [
    "META_KEY",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "TOKEN_LIST_FORMAT_VERSION",
    "POOL_ONLY_FORMAT_VERSION",
    "WINDOW_FILES_FORMAT_VERSION",
    "TOKENIZATIONS",
    "ARRAYS",
    "ARRAYS_V1",
    "OPTIONAL_ARRAYS",
    "POOLED_ARRAY",
    "POOL_METHODS",
    "pooled_block_rows",
    "TOKEN_ARRAYS",
    "CODEBOOKS",
    "arrays_of",
    "INDEX_DTYPES",
    "TEXT_ENCODING",
    "CHECKSUM_ALGORITHM",
    "CHECKSUMS_FILE",
    "checksum",
    "metadata_checksum",
    "BLOCK_SUMS_ALGORITHM",
    "BLOCK_SUMS",
    "block_sums_name",
    "SMALL_BLOCK_ROWS",
    "vector_block_rows",
    "VECTOR_DTYPES",
    "POOLED_CHUNK_BLOCKS",
    "QUANTIZED_DTYPE",
    "OPQ_ROTATION",
    "SCALE_BYTES",
    "KINDS",
    "LAYER_IDS",
    "TOKENIZATION",
    "SENTENCE_HASH",
    "STAGING_SUFFIX",
    "REPLACED_SUFFIX",
    "aside_path",
    "LOCK_SUFFIX",
    "BUILD_DIR",
    "PROGRESS_FILE",
    "ZARR_JSON",
    "HDF5_SIGNATURE",
    "staging_path",
    "decode_metadata",
    "parse_metadata",
]

META_KEY = "elmo_cache"
"""Root attribute holding the metadata (zarr: a JSON attribute; HDF5: a string attribute of JSON text)."""

FORMAT_NAME = "elmo-cache"
"""Value of the metadata key ``format``."""

FORMAT_VERSION = 2
"""Version this elmo-cache writes for whitespace-tokenised input."""

TOKEN_LIST_FORMAT_VERSION = 3
"""Version written for pre-tokenised input (tsv, CoNLL-U): version 2 whose keys may be token-list keys
(:func:`elmo_cache.text.tokenize.sentence_key`), which readers of version 2 would split wrongly."""

POOL_ONLY_FORMAT_VERSION = 4
"""Version written for ``build --pool-only``: version 3 whose ``vectors`` hold no rows (metadata ``pool.only``),
so that readers of versions 2 and 3 (which would read every sentence as empty) refuse it."""

WINDOW_FILES_FORMAT_VERSION = 5
"""Version written for a zarr cache with token rows: version 3 whose every window's rows start a vectors file of
their own (docs/FORMAT.md, "Windows"), so that a file before the last may end short (its missing chunks read as
zeros) and rows between windows hold no sentence, which readers of versions 2-4 would take for damage."""

FORMAT_VERSIONS = (1, 2, 3, 4, 5)
"""Versions this elmo-cache reads (1: no stored tokens, no checksums; 3: tokens as given by the input)."""

ARRAYS_V1 = ("vectors", "offsets", "lengths", "index/hashes", "index/rows")
"""The arrays of a version-1 cache."""

TOKEN_ARRAYS = ("tokens/bytes", "tokens/offsets")
"""Each sentence's tokens (version 2): UTF-8 bytes of the sentence key, and where each sentence's bytes start."""

ARRAYS = ARRAYS_V1 + TOKEN_ARRAYS
"""Every array of a cache this elmo-cache writes (``vectors``' dtype comes from the metadata)."""

INDEX_DTYPES = {
    "offsets": "int64",
    "lengths": "int32",
    "index/hashes": "uint64",
    "index/rows": "int64",
    "tokens/bytes": "uint8",
    "tokens/offsets": "int64",
}
"""dtype of each array but ``vectors``."""

TEXT_ENCODING = ("utf-8", "surrogatepass")
"""How ``tokens/bytes`` encodes a sentence key (tokens joined by one space), as the sentence hash does."""

CHECKSUM_ALGORITHM = "crc32"
"""Metadata ``checksums.algorithm``: zlib's CRC-32 of the stored bytes."""

CHECKSUMS_FILE = "checksums.json"
"""zarr: file at the group root holding the size and CRC-32 of every file but the root ``zarr.json``."""

BLOCK_SUMS_ALGORITHM = "crc32c"
"""Metadata ``checksums.blocks.algorithm``: CRC-32C (Castagnoli; hardware-accelerated by google-crc32c)
of each block of rows, so that a reader can check a block the first time it touches it."""

POOLED_ARRAY = "pooled"
"""The pooled sentence vectors of a cache built with ``--pool`` (one row per sentence; metadata ``pool``)."""

CODEBOOKS = "quantization/codebooks"
"""A product-quantised cache's centroids, and for ``opq`` its rotations after them (float32, 1-D; metadata
``quantization``, FORMAT.md)."""

OPTIONAL_ARRAYS = (POOLED_ARRAY, CODEBOOKS)
"""Arrays only some caches hold (their metadata says so); covered by checksums and block sums like the
others, and named only when a cache holds them; older readers ignore them."""

POOL_METHODS = ("mean", "max", "first-last")
"""Metadata ``pool.method`` values (elmo_cache.rows.pooling)."""


def block_sums_name(name: str) -> str:
    """The uint32 array holding the CRC-32C of each block of rows of array ``name`` (FORMAT.md)."""
    return "blocksums/" + name.replace("/", "_")


BLOCK_SUMS = {name: block_sums_name(name) for name in ARRAYS + OPTIONAL_ARRAYS}
"""For each array, the uint32 array holding the CRC-32C of each of its blocks of rows (FORMAT.md)."""

SMALL_BLOCK_ROWS = 1 << 16
"""Entries per checked block of the 1-D arrays (512 KiB of int64: ~0.1 ms to check on first touch; a
divisor of the zarr chunk of 2**20 entries, so a block never straddles two files)."""

_VECTOR_BLOCK_BYTES = 1 << 22


def vector_block_rows(row_bytes: int, chunk_rows: int | None) -> int:
    """Rows per checked block of ``vectors``: the zarr chunk (a block then lies in one file and, compressed,
    is one decoded chunk), or for HDF5 the rows of about 4 MiB (one ~1 ms CRC-32C on first touch)."""
    return int(chunk_rows) if chunk_rows else max(1, _VECTOR_BLOCK_BYTES // max(1, row_bytes))


def pooled_block_rows(row_bytes: int) -> int:
    """Rows per checked block of ``pooled`` (a zarr chunk of it is :data:`POOLED_CHUNK_BLOCKS` blocks): about
    4 MiB, as HDF5 ``vectors`` (a pooled row is KiBs: 65,536 of them would be too big to check on a read)."""
    return vector_block_rows(row_bytes, None)


POOLED_CHUNK_BLOCKS = 64
"""zarr: blocks of ``pooled`` per chunk file (about 256 MiB files, as ``vectors`` shards are)."""


VECTOR_DTYPES = ("float16", "float32")
"""Storage dtypes of float ``vectors``."""

QUANTIZED_DTYPE = "int8"
"""Storage dtype of ``vectors`` in a quantised cache (metadata ``quantization``; elmo_cache.rows.quantize)."""

OPQ_ROTATION = "after-centroids"
"""Metadata ``quantization.rotation`` of an ``opq`` cache: where its rotations are (FORMAT.md)."""

SCALE_BYTES = 4
"""Bytes of a quantised vector's scale (float32, little-endian), stored right after its codes."""

KINDS = ("layers", "mix")
"""What a cache stores: a subset of layers, or one fixed mix."""

LAYER_IDS = (0, 1, 2)
"""ELMo's layers: 0 = the char-CNN token vector, 1 and 2 = the LSTM layers."""

TOKENIZATION = "whitespace"
"""Metadata ``tokenization`` of a whitespace-split corpus: tokens are ``line.split()`` (BOM dropped), see
elmo_cache.text.tokenize."""

TOKENIZATIONS = {"lines": TOKENIZATION, "tsv": "tsv", "conllu": "conllu"}
"""Metadata ``tokenization`` for each input format (elmo_cache.text.formats): how the tokens were read."""

SENTENCE_HASH = "blake2b-64-le"
"""Metadata ``sentence_hash``: the hash the index is sorted by (elmo_cache.text.tokenize.sentence_hash)."""

STAGING_SUFFIX = ".partial"
"""A build writes ``<output>.partial/`` and renames it (or the HDF5 file inside) to the output at the end."""

REPLACED_SUFFIX = ".replaced"
"""Where an update's publish renames the cache it replaces for a moment, where the system cannot swap two folders
in one step (elmo_cache.store.durable.publish_directory); readers finding the cache missing look there."""

LOCK_SUFFIX = ".lock"
"""A build holds an exclusive lock on ``<output>.lock`` from start to finish (elmo_cache.store.lock)."""

BUILD_DIR = ".build"
"""Folder of the staging directory holding the raw per-sentence files and the progress."""

PROGRESS_FILE = "progress.json"
"""What is durably committed, inside :data:`BUILD_DIR`."""

ZARR_JSON = "zarr.json"
"""zarr v3 metadata file of the group and of every array."""

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
"""First bytes of an HDF5 file (at offset 0 or after a user block of 512 * 2**k bytes)."""


def arrays_of(version: int) -> tuple[str, ...]:
    """The arrays a cache of format ``version`` holds."""
    return ARRAYS_V1 if version == 1 else ARRAYS


def checksum(data: Any, value: int = 0) -> int:
    """CRC-32 of ``data`` (bytes or a C-contiguous array), continuing from ``value``."""
    if isinstance(data, bytes):
        return zlib.crc32(data, value)
    view = memoryview(data)
    return zlib.crc32(view.cast("B") if view.nbytes else b"", value)


def metadata_checksum(meta: dict[str, Any]) -> int:
    """CRC-32 of the metadata's canonical JSON, leaving out ``checksums`` itself and the ``build`` log."""
    kept = {k: v for k, v in meta.items() if k not in ("checksums", "build")}
    return zlib.crc32(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode("utf-8"))


def metadata_digest(meta: dict[str, Any]) -> str:
    """A digest of the whole metadata, the build's record and checksums included: it tells one build of a cache from
    any other (an interrupted update records the one it replaces, :attr:`Progress.updating
    <elmo_cache.store.staging.Progress.updating>`)."""
    canonical = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.blake2b(canonical, digest_size=16).hexdigest()


def staging_path(output: Path) -> Path:
    """Where the build of ``output`` keeps its work until it is final."""
    return output.with_name(output.name + STAGING_SUFFIX)


def aside_path(output: Path) -> Path:
    """Where a publish by renames (:data:`REPLACED_SUFFIX`) keeps the cache at ``output`` it replaces, for a moment."""
    return output.with_name(output.name + REPLACED_SUFFIX)


def decode_metadata(raw: Any) -> dict[str, Any] | None:
    """The metadata attribute as a dict when it is elmo-cache's (JSON text or an object), else None."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return None
    return raw if isinstance(raw, dict) and raw.get("format") == FORMAT_NAME else None


def _model_layers(raw: dict[str, Any]) -> int:
    """How many layers the cache's model gives (ELMo's 3; a Transformer's, as its identity records)."""
    model = raw.get("model")
    try:
        return identity_layers(model if isinstance(model, dict) else None)
    except (KeyError, TypeError, ValueError):
        return len(LAYER_IDS)


def parse_metadata(
    where: Path, raw: Any, quantization_problem: Callable[[dict[str, Any]], str | None] | None = None
) -> dict[str, Any]:
    """Validate the metadata attribute ``raw`` of the cache at ``where``; every problem is named.

    Raises :class:`~elmo_cache.errors.CacheFormatError` when it is missing, not JSON, not
    elmo-cache's, of an unknown version, or holds values outside FORMAT.md. The ``quantization`` of a
    quantised cache is the row codec's to judge (``quantization_problem``, e.g.
    :func:`elmo_cache.rows.codecs.quantization_problem`: the format does not know the registered codecs;
    None: not checked here).
    """
    if raw is None:
        raise CacheFormatError(f"{where}: no {META_KEY!r} metadata attribute; not an elmo-cache store")
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CacheFormatError(f"{where}: the {META_KEY!r} metadata attribute is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise CacheFormatError(f"{where}: metadata 'format' is not {FORMAT_NAME!r}; not an elmo-cache store")
    version = raw.get("format_version")
    if version not in FORMAT_VERSIONS:
        raise CacheFormatError(
            f"{where}: unsupported format_version {version!r}; this elmo-cache reads {list(FORMAT_VERSIONS)} "
            "(upgrade elmo-cache or rebuild the cache)"
        )
    problems: list[str] = []
    kind = raw.get("kind")
    if kind not in KINDS:
        problems.append(f"kind {kind!r} (expected 'layers' or 'mix')")
    quantization = raw.get("quantization")
    if quantization is None and raw.get("dtype") not in VECTOR_DTYPES:
        problems.append(f"dtype {raw.get('dtype')!r} (expected 'float16' or 'float32')")
    if quantization is not None and quantization_problem is not None:
        problem = quantization_problem(raw)
        if problem is not None:
            problems.append(problem)
    pool = raw.get("pool")
    if pool is not None and (
        not isinstance(pool, dict)
        or set(pool) - {"only"} != {"method", "dtype"}
        or pool.get("method") not in POOL_METHODS
        or pool.get("dtype") not in VECTOR_DTYPES
        or pool.get("only", True) is not True
    ):
        problems.append(
            f"pool {pool!r} (expected {{'method': one of {list(POOL_METHODS)}, 'dtype': one of "
            f"{list(VECTOR_DTYPES)}}}, and 'only': true in a --pool-only cache; a newer elmo-cache may read it)"
        )
    if isinstance(pool, dict) and pool.get("only") and version != POOL_ONLY_FORMAT_VERSION:
        problems.append(f"pool.only with format_version {version!r} (a --pool-only cache is version 4)")
    dim = raw.get("dim")
    if not isinstance(dim, int) or dim <= 0:
        problems.append(f"dim {dim!r} (expected a positive integer)")
    layers = raw.get("layers")
    if kind == "layers" and (
        not isinstance(layers, list)
        or not layers
        or not all(isinstance(layer, int) and layer >= 0 for layer in layers)
        or layers != sorted(set(layers))
        or not set(layers) <= set(range(_model_layers(raw)))
    ):
        problems.append(
            f"layers {layers!r} (expected a sorted non-empty subset of {list(range(_model_layers(raw)))}, "
            "the model's layers)"
        )
    if not isinstance(raw.get("complete"), bool):
        problems.append(f"complete {raw.get('complete')!r} (expected true or false)")
    if problems:
        raise CacheFormatError(f"{where}: invalid metadata: " + "; ".join(problems))
    checksums = raw.get("checksums")
    blocks = checksums.get("blocks") if isinstance(checksums, dict) else None
    if (
        raw.get("checksums_required") is True
        and raw.get("complete") is True
        and not (isinstance(blocks, dict) and isinstance(blocks.get("digests"), dict))
    ):
        problems.append(
            "'checksums' (with 'blocks.digests') is missing, but 'checksums_required' says the build wrote them: "
            "removed or damaged after the build, so nothing read from it could be checked; rebuild or re-copy it"
        )
    if problems:
        raise CacheFormatError(f"{where}: invalid metadata: " + "; ".join(problems))
    return raw
