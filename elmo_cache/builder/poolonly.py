"""``build --pool --pool-only`` by an engine that does not write the layout's declared columns (the ray engine):
its full ``--pool`` build, then the token rows stripped.

An engine that writes what the layout declares (``writes_declared_columns``, the local engine) builds a
pool-only cache directly: its layout has no token rows (``Layout.token_rows``), so the writer stages and
publishes only the per-sentence columns, the pooled one included, and the disk holds little more than the
finished cache. This module is the fallback for the others, kept apart until they adopt the columns.

The fallback runs in two steps, both resumable:

1. **The full build**, with the token vectors beside the pooled ones, by the engine asked for, at a hidden
   path next to the output (:func:`full_output`). It is an ordinary ``build --pool``: it resumes after a
   crash, deduplicates, and its bytes are the same from either engine, so everything the engines
   guarantee holds for the pooled rows taken from it.
2. **The strip**: the full cache's per-sentence arrays and pooled rows are copied into the output through
   the container's own writer, with ``vectors`` left empty (0 rows), then the full cache is removed. The
   strip is deterministic and starts afresh if interrupted (it reads a finished cache, so nothing is lost).

Why not drop the rows in the engines: both engines, their staging and their resume checks count and
verify token rows; taking them out of both would be a second implementation of every build path, while
this one reuses them unchanged. The price is disk while building: the full cache exists until the strip
is done (docs/FORMAT.md, "Pool-only caches").

The stored ``offsets`` are the full cache's: where the sentence's rows would be. They point at no rows, but
they keep which sentences a deduplicated build found to be repeats (a repeat shares its first occurrence's
offset), which the store's copy of repeated pooled rows and ``verify``'s repeat check read.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.builder.options import BuildOptions, BuildSummary, disk_bytes
from elmo_cache.builder.output import prepare_output
from elmo_cache.builder.plan import format_version, identity, make_plan, options_json
from elmo_cache.builder.skeleton import build_cache, model_description
from elmo_cache.errors import CacheFormatError
from elmo_cache.store import OutputKind, Progress, open_arrays, read_metadata, remove_output
from elmo_cache.store.format import ARRAYS, POOLED_ARRAY, TEXT_ENCODING, staging_path
from elmo_cache.store.lock import output_lock
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.tokenize import key_hash, split_key

if TYPE_CHECKING:
    from elmo_cache.builder.engine import Engine
    from elmo_cache.encoder.encoder import Encoder

__all__ = ["build_pool_only_by_stripping", "full_output"]

# Sentences copied at a time by the strip (their tokens are held as Python lists meanwhile).
_BLOCK_LINES = 1 << 15


def full_output(output: Path) -> Path:
    """Where a pool-only build of ``output`` writes its full cache (hidden, beside it, same suffix)."""
    return output.with_name(f".{output.name}.pool-only-full{output.suffix}")


def build_pool_only_by_stripping(
    source: Corpus, options: BuildOptions, engine: Engine, encoder: Encoder | None
) -> BuildSummary:
    """The pool-only build of ``source`` by ``engine``, through its full build (see the module docstring)."""
    began = time.monotonic()
    plan = make_plan(source, options)
    full = full_output(plan.output)
    with output_lock(plan.output):
        model, _ = model_description(options, encoder)
        plan = plan.with_model(model.output_dim)
        ident = identity(plan, model.identity, dedupe=bool(options.dedupe))
        # No engine resumes the output's own staging: the strip always starts again (engines=[]).
        found = prepare_output(plan, ident, options.overwrite, [])
        if found.kind is OutputKind.COMPLETE:
            assert found.meta is not None
            if full.exists():  # a crash between publishing the output and removing the full cache
                remove_output(full)
            meta = found.meta
            return BuildSummary.already_there(plan.output, plan.format, meta, engine.name)
        full_options = dataclasses.replace(options, output=full, format=plan.format, pool_only=False)
        summary = build_cache(source, full_options, engine, encoder)
        _strip(full, plan.output, plan.layout(), ident, options)
        remove_output(full)
        return dataclasses.replace(
            summary,
            path=plan.output,
            n_rows=0,
            bytes=disk_bytes(plan.output),
            seconds=time.monotonic() - began,
            already_complete=False,
        )


def _strip(full: Path, output: Path, layout: Any, ident: dict[str, Any], options: BuildOptions) -> None:
    """Write ``output``: the full cache at ``full`` without its token rows (``vectors`` of 0 rows)."""
    from elmo_cache.store import writer_class

    fmt, raw, arrays = open_arrays(full, (*ARRAYS, POOLED_ARRAY))
    meta = read_metadata(full)
    assert meta is not None and raw is not None
    if staging_path(output).exists():
        remove_output(staging_path(output))
    offsets, lengths, pooled = arrays["offsets"], arrays["lengths"], arrays[POOLED_ARRAY]
    starts, text = arrays["tokens/offsets"], arrays["tokens/bytes"]
    n = int(offsets.shape[0])
    # The build's record names what was asked (--pool-only, the output), not the hidden full build's options.
    build_info = {**meta.get("build", {}), "args": options_json(options)}
    final = {
        **{k: v for k, v in meta.items() if k not in ("checksums",)},
        **{k: v for k, v in ident.items() if k != "container"},
        "format_version": format_version(ident),
        "n_rows": 0,
        "build": build_info,
    }
    writer = writer_class(fmt).create(output, layout, Progress(identity=ident), {**final, "complete": False})
    try:
        empty = np.empty((0, *layout.row_shape), dtype=layout.dtype)
        for a in range(0, n, _BLOCK_LINES):
            b = min(n, a + _BLOCK_LINES)
            ends = np.asarray(starts[a : b + 1])
            block = bytes(np.asarray(text[int(ends[0]) : int(ends[-1])]))
            first = int(ends[0])
            keys = [block[int(s) - first : int(e) - first] for s, e in zip(ends[:-1].tolist(), ends[1:].tolist())]
            tokens = [split_key(key.decode(*TEXT_ENCODING)) for key in keys]
            # The per-line hashes the full build staged are not in the cache (only the index of distinct ones):
            # they are the hashes of the stored keys, taken again.
            hashes = np.fromiter((key_hash(key) for key in keys), dtype=np.uint64, count=len(keys))
            rows = (np.asarray(offsets[a:b]), np.asarray(lengths[a:b]))
            writer.append(empty, *rows, hashes, tokens, np.asarray(pooled[a:b]))
        writer.commit(done=True)
        # The hashes taken again must give the full build's index: anything else (a cache written with another
        # hash) would publish an index that finds the wrong sentences.
        hashes, first_lines = writer.index()
        same = np.array_equal(hashes, arrays["index/hashes"][:]) and np.array_equal(
            first_lines, arrays["index/rows"][:]
        )
        if not same:
            raise CacheFormatError(
                f"{full}: its sentence index is not the one its stored tokens give; rerun with --overwrite"
            )
        writer.finalize({**final, "complete": True})
    finally:
        writer.close()
