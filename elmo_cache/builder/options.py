"""What a build is asked to do (:class:`BuildOptions`) and what it did (:class:`BuildSummary`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmo_cache.rows.selection import MixSpec

__all__ = ["BuildOptions", "BuildSummary", "disk_bytes"]


@dataclass(frozen=True)
class BuildOptions:
    """What to build and how (every field has a default; see ``elmo-cache build --help``)."""

    # Cache path; None: beside the corpus, "corpus.txt" -> "corpus.zarr" (or ".h5"). Needed for stdin.
    output: str | os.PathLike[str] | None = None
    # Container "zarr" or "hdf5"; None: from the output suffix (.zarr, .h5, .hdf5), else zarr.
    format: str | None = None
    # Layers to store, a subset of 0,1,2 as "1,2" or (1, 2) (a Transformer's: 0..L); None: all. Exclusive with mix.
    layers: str | Sequence[int] | None = None
    # Store one fixed mix gamma * sum_j s_j h_j per token instead of layers (MixSpec.from_raw).
    mix: MixSpec | None = None
    # Store float16 instead of float32 (half the bytes); selection and mixing happen in float32 first.
    fp16: bool = False
    # Quantise the stored vectors (elmo_cache.rows): None/"none" (floats), "int8" (one int8 code per value and
    # one float32 scale per vector), "pq:M" (M uint8 codes per vector, codebooks trained on the corpus) or
    # "opq:M" (pq after a learned rotation); done in float32 after selection/mixing. Exclusive with fp16.
    quantize: str | None = None
    # pq/opq: token rows of the corpus (its first, in line order) the codebooks are trained on; None: 65,536
    # (elmo_cache.rows.pq.Training). Fewer train faster (opq of the Original model: hours at the default) and fit worse.
    codebook_sample: int | None = None
    # Also store one pooled vector per sentence: None/"none", "mean", "max" or "first-last" (elmo_cache.rows.pooling),
    # over each stored layer or the mix, from the float32 rows before any cast; read by Cache.sentence_vector.
    pool: str | None = None
    # Store the pooled vectors *instead of* the token vectors (needs ``pool``): ``vectors`` gets no rows, so the
    # cache is about one row per sentence instead of one per token (docs/FORMAT.md, "Pool-only caches").
    pool_only: bool = False
    # zarr compressor: "none"/None, "zstd", "blosc-lz4", "blosc-zstd". HDF5 stays uncompressed (memmap).
    compression: str | None = None
    # zarr rows per vectors chunk; None: default_chunk_rows() (chunks of at most 3 MiB, no larger than a small corpus
    # needs). Not valid for HDF5.
    chunk_rows: int | None = None
    # zarr rows per vectors file, a shard of whole chunks (a multiple of chunk_rows); None:
    # default_shard_rows() (files of at most 64 MiB, no larger than a small corpus needs). Not valid for HDF5.
    shard_rows: int | None = None
    # Encode each distinct sentence once; repeated sentences point at its rows.
    dedupe: bool = False
    # Model name (elmo_cache.model.hub) or directory; None with no files given: the bundled model.
    model: str | None = None
    # Explicit options.json + weights HDF5 (both or neither); they win over ``model``.
    options_file: str | os.PathLike[str] | None = None
    weight_file: str | os.PathLike[str] | None = None
    # torch device: "cpu", "cuda", "cuda:N"; None: CUDA when available.
    device: str | None = None
    # Encoder arithmetic "fp32", "bf16" or "fp16" (part of the cache identity: it changes the vectors).
    precision: str = "fp32"
    # LSTM initial state "zero" or "warm" (see elmo_cache.encoder.encoder); "carry" is batch dependent, refused.
    initial_state: str = "zero"
    # Tokens per encoder batch (each sentence counts its length + 2 boundary tokens); None: 8192 CPU, 32768 CUDA.
    batch_tokens: int | None = None
    # Sentences are sorted by length within windows of this many batches' worth of tokens. Memory
    # holds about three windows of vectors (Original fp16 layers, CUDA defaults: ~1.5 GB each).
    window_batches: int = 8
    # Bytes that are not UTF-8: "strict" (CorpusError naming the line) or "replace" (U+FFFD).
    errors: str = "strict"
    # How the corpus holds sentences: "lines" (whitespace-split lines), "tsv" (tab-separated tokens,
    # kept exactly, spaces included) or "conllu" (the FORM column, a sentence per block); see
    # elmo_cache.text.formats.
    input_format: str = "lines"
    # How a "lines" corpus is split into tokens: "whitespace" (str.split) or "ptb" (elmo_cache.text.ptb: the
    # PTB-style rules the bundled model's training text went through); None: "ptb" for the bundled model,
    # "whitespace" for any other. Recorded (metadata "tokenization"); lookups by text split the same way.
    tokenize: str | None = None
    # Discard any existing cache or interrupted build at the output and start from scratch.
    overwrite: bool = False
    # A complete cache of the same options at the output, built from another version of the corpus, is brought
    # to this one in place (elmo_cache.builder.update): the stored rows of unchanged windows are copied, the
    # windows with new or changed lines encoded; the result is a fresh build's bytes. Local engine only.
    update: bool = False
    # Show a progress bar on stderr.
    progress: bool = True
    # Seconds between durable commits; 0 commits after every window (slower, for tests).
    commit_seconds: float = 10.0


@dataclass(frozen=True)
class BuildSummary:
    """What a build produced (``str()`` gives the one-paragraph summary the CLI prints)."""

    path: Path
    format: str
    n_sentences: int
    n_tokens: int
    n_rows: int
    n_unique: int
    bytes: int
    # Wall seconds of this run, and tokens (all sentences, repeats included) per second in it.
    seconds: float
    tokens_per_s: float
    # Lines already committed by an earlier, interrupted run.
    resumed_from: int = 0
    # True when the cache was already complete and nothing was done.
    already_complete: bool = False
    # "local" or "ray"; for ray: the workers that ran parts (host:pid), the parts, and those run now.
    engine: str = "local"
    workers: tuple[str, ...] = ()
    parts: int = 0
    parts_run: int = 0
    # For ray: the encoder actors the pool was given (more than len(workers) when some got no part).
    workers_asked: int = 0
    # True when this run updated a cache built from another version of the corpus (update=True).
    updated: bool = False
    # Windows (and their lines) this run encoded, and (an update) copied from the cache it updated.
    windows_encoded: int = 0
    lines_encoded: int = 0
    windows_reused: int = 0
    lines_reused: int = 0
    # zarr, an update: vectors files of the old cache kept as they are (hard links: their bytes not written again).
    files_linked: int = 0
    # HDF5, an update: rows of the old cache copied into the new file at the finish, never staged.
    rows_taken: int = 0
    # An update on a device whose rows are batch-free: a changed window's unchanged sentences were copied one by
    # one (counted in lines_reused; lines_encoded counts the lines encoded), not the whole window encoded again.
    batch_free: bool = False

    @classmethod
    def already_there(cls, output: Path, format: str, meta: Mapping[str, Any], engine: str) -> BuildSummary:
        """The summary of a build that found its cache complete at ``output`` (metadata ``meta``): nothing done."""
        counts = (meta["n_sentences"], meta["n_tokens"], meta["n_rows"], meta["n_unique"])
        return cls(output, format, *counts, disk_bytes(output), 0.0, 0.0, already_complete=True, engine=engine)

    def __str__(self) -> str:
        if self.already_complete:
            return (
                f"{self.path} is already complete ({self.n_sentences:,} sentences, {self.n_tokens:,} tokens); "
                "nothing to do (pass --overwrite to rebuild it)"
            )
        resumed = f", resumed after line {self.resumed_from:,}" if self.resumed_from else ""
        if self.updated:
            windows = self.windows_encoded + self.windows_reused
            resumed += (
                f"; updated: {self.windows_encoded:,} of {windows:,} windows encoded ({self.lines_encoded:,} lines), "
                f"the rows of {self.lines_reused:,} lines reused"
                + ("" if self.batch_free else " (rows depend on their batch on this device: whole windows encoded)")
                + (f", {self.files_linked:,} vectors files kept as they were" if self.files_linked else "")
                + (f", {self.rows_taken:,} rows copied from the old file (not staged)" if self.rows_taken else "")
            )
        engine = ""
        if self.engine != "local":
            redone = f"{self.parts_run} of {self.parts} parts" if self.parts_run < self.parts else f"{self.parts} parts"
            names = ", ".join(self.workers) if self.workers else "none: every part was already done"
            engine = f"; {self.engine}: {redone} on {len(self.workers)} workers ({names})"
            if self.workers and len(self.workers) < self.workers_asked:
                why = (
                    f"there {'was' if self.parts_run == 1 else 'were'} only {self.parts_run} "
                    f"part{'' if self.parts_run == 1 else 's'} to share (a small corpus is one part per window)"
                    if self.parts_run < self.workers_asked
                    else "the others got no part before the work ran out"
                )
                engine += f"; {self.workers_asked} workers were asked for, but {why}"
        return (
            f"wrote {self.path} ({self.format}): {self.n_sentences:,} sentences, {self.n_tokens:,} tokens, "
            f"{self.n_rows:,} rows, {self.n_unique:,} distinct sentences, {_human_bytes(self.bytes)} "
            f"in {self.seconds:.1f} s ({self.tokens_per_s:,.0f} tokens/s{resumed}{engine})"
        )


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    raise AssertionError


def disk_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
