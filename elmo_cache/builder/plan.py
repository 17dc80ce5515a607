"""Planning a build: validate the options, name the output, and decide what to do with what is already there.

A build's *identity* (:func:`identity`) is everything that changes what the cache holds: the
container, the selection, dtype and quantisation, the pool, dedupe, chunking, the model and the tokenisation.
A cache or an interrupted build at the output is reused only when its identity is the command's.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.builder.options import BuildOptions
from elmo_cache.builder.sizes import SMALL_CORPUS_CHUNKS, default_chunk_rows, default_shard_rows
from elmo_cache.encoder.names import check_device_name, check_precision_name
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.hub import BUNDLED
from elmo_cache.model.identity import comparable_model, model_differences
from elmo_cache.model.transformer import layer_count
from elmo_cache.rows.codecs import FLOAT32, RowCodec, codec_for_option
from elmo_cache.rows.pooling import POOLS, Pool, parse_pool
from elmo_cache.rows.selection import MixSpec, Selection, check_distinct_layers
from elmo_cache.store import Layout, Progress, infer_format
from elmo_cache.store.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    POOL_ONLY_FORMAT_VERSION,
    SENTENCE_HASH,
    TOKEN_LIST_FORMAT_VERSION,
    TOKENIZATION,
    WINDOW_FILES_FORMAT_VERSION,
)
from elmo_cache.store.registry import container_names, get_container
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.formats import check_input_format
from elmo_cache.text.tokenize import PTB, WHITESPACE
from elmo_cache.version import __version__

if TYPE_CHECKING:
    pass

__all__ = [
    "IDENTITY_KEYS",
    "Plan",
    "default_output",
    "make_plan",
    "open_corpus",
    "resolve_output",
    "identity",
    "comparable_identity",
    "differences",
    "metadata",
    "options_json",
]

# Identity keys: options that change what the cache holds. A cache or interrupted build
# whose identity differs from the command's cannot be reused.
IDENTITY_KEYS = (
    "container",
    "kind",
    "layers",
    "mix",
    "dim",
    "dtype",
    "dedupe",
    "compression",
    "chunk_rows",
    "shard_rows",
    "model",
    "tokenization",
    "sentence_hash",
    "quantization",
    "pool",
)


def default_output(corpus: str | os.PathLike[str], format: str) -> Path:
    """The cache path beside a corpus: ``data/corpus.txt(.gz)`` -> ``data/corpus.zarr`` (or ``.h5``)."""
    path = Path(corpus)
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    stem = Path(name).stem or name
    return path.with_name(stem + get_container(format).suffixes[0])


@dataclass(frozen=True)
class Plan:
    """The validated, resolved form of :class:`BuildOptions`: what the output will hold and where."""

    # The cache path.
    output: Path
    # Container name (elmo_cache.store.container): "zarr" or "hdf5".
    format: str
    # The layers or the mix stored.
    selection: Selection
    # Storage dtype name: the codec's ("float16", "float32", "int8", "uint8" for pq).
    dtype: str
    # zarr rows per chunk (None for HDF5, and for zarr until the model's width is known).
    chunk_rows: int | None
    # zarr compressor name, None for raw bytes.
    compression: str | None
    # zarr rows per vectors file (None for HDF5, and for zarr until the model's width is known).
    shard_rows: int | None = None
    # How rows are stored (elmo_cache.rows.codecs): parsed from --quantize and --fp16 once, here; bound to the
    # model's width by with_model.
    codec: RowCodec = FLOAT32
    # How the corpus was split into tokens (elmo_cache.text.formats.INPUT_FORMATS).
    input_format: str = "lines"
    # Metadata "tokenization": how its lines became tokens (Corpus.tokenization).
    tokenization: str = TOKENIZATION
    # Pooled sentence vectors stored beside the token vectors (elmo_cache.rows.pooling.POOLS), None for none.
    pool: str | None = None
    # --pool-only: the pooled vectors instead of the token vectors (its layout has no token rows: Layout.token_rows).
    pool_only: bool = False
    # The model's output width: None until with_model.
    dim: int | None = None
    # Which of chunk_rows and shard_rows were not asked for (zarr): with_model fills in their defaults, which
    # follow the corpus's size, and a cache or interrupted build there that differs only in them is still this
    # build (adopt_chunking).
    defaulted: tuple[str, ...] = ()

    def pooling(self) -> Pool | None:
        """What the ``pooled`` array holds (None: built without --pool)."""
        return None if self.pool is None else Pool.for_cache(self.pool, self.dtype, only=self.pool_only)

    def layout(self, dim: int | None = None) -> Layout:
        """How the store lays out the rows (and pooled vectors) of a model of width ``dim`` (None: the plan's)."""
        dim = self._dim(dim)
        pooling = self.pooling()
        return Layout(
            self.format,
            self.row_shape(dim),
            self.dtype,
            self.chunk_rows,
            self.compression,
            self.shard_rows,
            None if pooling is None else pooling.shape(self.selection.row_shape(dim)),
            None if pooling is None else pooling.dtype,
            token_rows=not self.pool_only,
        )

    def _dim(self, dim: int | None) -> int:
        if dim is not None:
            return int(dim)
        if self.dim is None:
            raise InvalidParameterError("plan: the model's width is not known yet (Plan.with_model)")
        return self.dim

    def bound_codec(self, dim: int | None = None) -> RowCodec:
        """The codec of rows of a model of width ``dim`` (None: the plan's; pq: untrained)."""
        dim = self._dim(dim)
        if self.dim == dim:
            return self.codec  # bound by with_model
        row = self.selection.row_shape(dim)
        return self.codec.bind(dim, row[0] if len(row) == 2 else 1)

    def row_shape(self, dim: int | None = None) -> tuple[int, ...]:
        """One stored row: the selection's, in the codec's stored form (int8: its last axis widened by the scale)."""
        dim = self._dim(dim)
        return self.bound_codec(dim).stored_shape(self.selection.row_shape(dim))

    def with_model(self, dim: int, corpus: Corpus | None = None) -> Plan:
        """This plan once the model's output width ``dim`` is known: it keeps ``dim``, its codec is bound to it,
        and the default chunk_rows and shard_rows are filled in (no larger than ``corpus`` needs, when it is
        given and smaller than one default chunk)."""
        row = self.selection.row_shape(dim)
        plan = dataclasses.replace(self, dim=int(dim), codec=self.codec.bind(dim, row[0] if len(row) == 2 else 1))
        return plan._with_chunks(dim, corpus)

    def _with_chunks(self, dim: int, corpus: Corpus | None) -> Plan:
        if not get_container(self.format).chunked:
            return self
        row_bytes = int(np.prod(self.row_shape(dim))) * np.dtype(self.dtype).itemsize
        chunk_rows = self.chunk_rows or default_chunk_rows(row_bytes)
        # The corpus's tokens (an upper bound of its rows), counted only as far as a few chunks: a larger corpus
        # keeps the byte rules, so the scan costs at most that much tokenising (far less than encoding it). The
        # same corpus gives the same count, so a resumed build chunks as its first run did.
        corpus_rows = None
        if corpus is not None and self.defaulted:
            corpus_rows = corpus.count_tokens(SMALL_CORPUS_CHUNKS * chunk_rows)
        if self.chunk_rows is None:
            chunk_rows = default_chunk_rows(row_bytes, corpus_rows)
        shard_rows = self.shard_rows or default_shard_rows(chunk_rows, row_bytes, corpus_rows)
        if shard_rows % chunk_rows:
            raise InvalidParameterError(
                f"shard_rows: {shard_rows} is not a multiple of chunk_rows ({chunk_rows}); "
                "a vectors file holds whole chunks"
            )
        return dataclasses.replace(self, chunk_rows=chunk_rows, shard_rows=shard_rows)


def make_plan(source: Corpus, options: BuildOptions) -> Plan:
    """Check every option against the others and the corpus; raise :class:`InvalidParameterError` naming it."""
    fmt, output = _output(source, options)
    check_distinct_layers(options.layers)
    # A Transformer's layer count comes from its config (ELMo's is 3), so --layers and --mix are checked now.
    selection = Selection.of(options.layers, options.mix, n_layers=layer_count(options.model))
    compression = None if options.compression in (None, "none") else options.compression
    # None: set once the model's width is known (Plan.with_model)
    chunk_rows = None if options.chunk_rows is None else int(options.chunk_rows)
    shard_rows = None if options.shard_rows is None else int(options.shard_rows)
    get_container(fmt).check_options(compression=compression, chunk_rows=chunk_rows, shard_rows=shard_rows)
    _check_running(options)
    _check_input(source, options)
    codec = _codec(options)
    pool = parse_pool(options.pool)
    if options.pool_only and pool is None:
        raise InvalidParameterError(
            "pool_only: --pool-only stores the pooled vectors instead of the token vectors, so it needs "
            f"--pool (one of {list(POOLS)})"
        )
    return Plan(
        output,
        fmt,
        selection,
        codec.dtype,
        chunk_rows,
        compression,
        shard_rows,
        codec,
        options.input_format,
        source.tokenization,
        pool,
        bool(options.pool_only),
        defaulted=tuple(name for name, rows in (("chunk_rows", chunk_rows), ("shard_rows", shard_rows)) if not rows),
    )


# Suffixes of other formats an output is sometimes named with; a cache written there would be a zarr
# directory under a name that promises something else (Parquet readers would find a folder of chunks).
_OTHER_FORMATS = frozenset(
    {".parquet", ".arrow", ".feather", ".npy", ".npz", ".csv", ".tsv", ".json", ".jsonl", ".txt", ".pt", ".pkl"}
)


def _output(source: Corpus, options: BuildOptions) -> tuple[str, Path]:
    """The container's name and the cache's path: asked for, implied by the output's suffix, or the defaults."""
    if options.format is not None:
        get_container(options.format)  # the error lists the valid formats
    if options.output is None and source.path is None:
        raise InvalidParameterError("output: reading the corpus from stdin needs -o/--output")
    if options.output is not None and "://" in os.fspath(options.output):
        # Path("s3://b/x.zarr") would quietly become a local folder named "s3:".
        raise InvalidParameterError(
            f"output: {os.fspath(options.output)!r} is a URL; caches are written to local (or mounted) "
            "filesystems, because they are published by atomic renames and read memory-mapped. Write to a "
            "local path, or a mounted bucket (mountpoint-s3, gcsfuse), and copy the cache up"
        )
    suffix_format = infer_format(options.output) if options.output is not None else None
    if options.format and suffix_format and options.format != suffix_format:
        raise InvalidParameterError(
            f"format: --format {options.format} contradicts the output suffix "
            f"{Path(options.output or '').suffix!r} ({suffix_format})"
        )
    fmt = options.format or suffix_format or container_names()[0]
    output = Path(options.output) if options.output is not None else default_output(source.path, fmt)  # type: ignore[arg-type]
    if source.path is not None and output.resolve() == source.path.resolve():
        raise InvalidParameterError(f"output: {output} is the corpus itself; choose another -o/--output")
    suffix = Path(options.output).suffix.lower() if options.output is not None else ""
    if options.format is None and suffix_format is None and suffix in _OTHER_FORMATS:
        raise InvalidParameterError(
            f"output: {os.fspath(options.output or '')!r} ends in {suffix!r}, another file format's suffix, but a "
            "build writes an elmo-cache cache: zarr (a .zarr directory) or HDF5 (.h5, .hdf5). Name the output "
            "with one of those suffixes, or pass --format zarr|hdf5 to use this path anyway"
        )
    return fmt, output


def _check_running(options: BuildOptions) -> None:
    """The options of how the build runs (not of what it writes)."""
    if options.batch_tokens is not None and options.batch_tokens < 1:
        raise InvalidParameterError(f"batch_tokens: must be positive, got {options.batch_tokens}")
    check_precision_name(options.precision)
    check_device_name(options.device)
    if options.initial_state not in ("zero", "warm"):
        raise InvalidParameterError(
            f"initial_state: {options.initial_state!r} is not valid for a build; choose from "
            "['zero', 'warm'] ('carry' makes vectors depend on batch order)"
        )
    if options.window_batches < 1:
        raise InvalidParameterError(f"window_batches: must be positive, got {options.window_batches}")
    if options.update and options.overwrite:
        raise InvalidParameterError(
            "update, overwrite: --update brings the cache at the output up to date, --overwrite discards it; "
            "pass one of them"
        )
    if options.commit_seconds < 0:
        raise InvalidParameterError(f"commit_seconds: must be >= 0, got {options.commit_seconds}")


def _check_input(source: Corpus, options: BuildOptions) -> None:
    check_input_format(options.input_format)
    if source.input_format != options.input_format:
        raise InvalidParameterError(
            f"input_format: the options say {options.input_format!r} but the corpus given was opened as "
            f"{source.input_format!r}; open it with Corpus(..., input_format={options.input_format!r})"
        )
    if options.tokenize is not None and source.tokenize != options.tokenize:
        raise InvalidParameterError(
            f"tokenize: the options say {options.tokenize!r} but the corpus given was opened with "
            f"{source.tokenize!r}; open it with Corpus(..., tokenize={options.tokenize!r})"
        )


def _codec(options: BuildOptions) -> RowCodec:
    """How the rows are stored, parsed once here (with its training sample, when it trains)."""
    codec = codec_for_option(options.quantize, fp16=bool(options.fp16))
    if options.codebook_sample is not None:
        if codec.training_vectors is None or options.codebook_sample < 1:
            quantize = None if options.quantize in (None, "none") else options.quantize
            raise InvalidParameterError(
                f"codebook_sample: {options.codebook_sample!r} is not a positive number of token rows for the "
                f"codebooks of --quantize pq:M or opq:M (quantize here: {quantize!r})"
            )
        codec = codec.with_training_vectors(options.codebook_sample)
    codec.require()
    return codec


def open_corpus(corpus: str | os.PathLike[str] | Corpus, options: BuildOptions, encoder: Any = None) -> Corpus:
    """``corpus`` as a :class:`Corpus` read the way ``options`` say (a Corpus is taken as it is); ``encoder``:
    the one the build uses instead of ``options.model``, whose tokenisation is the default."""
    if isinstance(corpus, Corpus):
        return corpus
    tokenize = options.tokenize or default_tokenize(options, encoder)
    return Corpus(corpus, errors=options.errors, input_format=options.input_format, tokenize=tokenize)


def default_tokenize(options: BuildOptions, encoder: Any = None) -> str:
    """The tokenisation of a build that names none: the one the model's training text went through, PTB-style
    for the bundled model (the one model whose training text this package knows), whitespace for any other
    (and for pre-tokenised input, which is not split at all)."""
    if options.input_format != "lines":
        return WHITESPACE
    if encoder is not None:
        name = (getattr(encoder, "identity", None) or {}).get("name")
        return PTB if name == BUNDLED else WHITESPACE
    named = options.options_file is not None or options.weight_file is not None
    return PTB if not named and options.model in (None, BUNDLED) else WHITESPACE


def resolve_output(corpus: str | os.PathLike[str] | Corpus, options: BuildOptions) -> Path:
    """The path ``build(corpus, options)`` will write (validating the options on the way)."""
    return make_plan(open_corpus(corpus, options), options).output


def identity(plan: Plan, model: Mapping[str, Any], dim: int | None = None, *, dedupe: bool) -> dict[str, Any]:
    """What the cache will hold, as compared with an existing cache or an interrupted build at the output.

    ``model`` is the model's identity (:attr:`Encoder.identity <elmo_cache.Encoder.identity>`) and
    ``dim`` the width of its vectors (None: the plan's, once :meth:`Plan.with_model` has it)."""
    dim = plan._dim(dim)
    quantization = plan.bound_codec(dim).to_metadata()
    return {
        "container": plan.format,
        **plan.selection.to_metadata(),
        "dim": int(dim),
        "dtype": plan.dtype,
        "dedupe": dedupe,
        "compression": plan.compression,
        "chunk_rows": plan.chunk_rows,
        "shard_rows": plan.shard_rows,
        "model": dict(model),
        "tokenization": plan.tokenization,
        "sentence_hash": SENTENCE_HASH,
        # Only quantised caches carry the key: float caches' metadata stays as it always was.
        **({} if quantization is None else {"quantization": quantization}),
        # Likewise only caches with pooled vectors carry "pool".
        **({} if (pooling := plan.pooling()) is None else {"pool": pooling.to_metadata()}),
    }


def comparable_identity(identity: dict[str, Any]) -> dict[str, Any]:
    out = {key: identity.get(key) for key in IDENTITY_KEYS}
    out["model"] = comparable_model(out["model"])  # where the model came from does not matter
    return out


def differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """What differs between two identities ("" when nothing does)."""
    a, b = comparable_identity(old), comparable_identity(new)
    parts = []
    for key in IDENTITY_KEYS:
        if a[key] != b[key]:
            if key == "model":
                parts.append(f"model ({', '.join(sorted(model_differences(a[key], b[key])))} differ)")
            else:
                parts.append(f"{key}: {a[key]!r} there, {b[key]!r} now")
    return "; ".join(parts)


def metadata(
    identity: dict[str, Any],
    progress: Progress,
    *,
    complete: bool,
    n_unique: int,
    build_info: dict[str, Any],
    corpus: dict[str, Any] | None = None,
    windows: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The cache metadata of FORMAT.md for a build at ``progress`` (``corpus``: what a finished build was
    built from, :func:`elmo_cache.builder.corpus_record.corpus_entry`; ``windows``: how it was cut into windows
    and batched, :func:`elmo_cache.builder.encoding.windows_entry`)."""
    meta = {
        "format": FORMAT_NAME,
        "format_version": format_version(identity),
        "complete": complete,
        **{k: v for k, v in identity.items() if k != "container"},
        "n_sentences": progress.lines,
        "n_tokens": progress.tokens,
        # A pool-only build counts the rows its offsets address but writes none.
        "n_rows": 0 if (identity.get("pool") or {}).get("only") else progress.rows,
        "n_unique": n_unique,
        **({"corpus": corpus} if corpus is not None else {}),
        # Not identity: a cache cut otherwise holds the same vectors but for their last bits. An update reuses
        # stored rows only when they were cut and batched as it would cut and batch them.
        **({"windows": windows} if windows is not None else {}),
        # This builder always writes checksums with bound block sums: a reader refuses the cache without them.
        "checksums_required": True,
        "elmo_cache_version": __version__,
        "build": build_info,
    }
    return meta


def format_version(identity: dict[str, Any]) -> int:
    """The format version a cache of ``identity`` is written as: the lowest whose readers read it right."""
    if (identity.get("pool") or {}).get("only"):
        return POOL_ONLY_FORMAT_VERSION
    if identity.get("shard_rows") is not None:  # zarr: every window's rows start a vectors file (Layout.window_rows)
        return WINDOW_FILES_FORMAT_VERSION
    return FORMAT_VERSION if identity["tokenization"] == TOKENIZATION else TOKEN_LIST_FORMAT_VERSION


def options_json(options: BuildOptions) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if isinstance(value, MixSpec):
            value = value.to_metadata()
        elif isinstance(value, os.PathLike):
            value = os.fspath(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out
