"""``elmo-cache info``: a cache's metadata and counts, or the state of its interrupted build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from elmo_cache.errors import CacheFormatError, CacheNotFoundError

__all__ = ["info_command"]


def _describe(path: Path) -> dict[str, Any]:
    from elmo_cache.store import load_progress, read_metadata, staging_path
    from elmo_cache.store.format import BUILD_DIR, STAGING_SUFFIX
    from elmo_cache.store.lock import current_builder

    if path.name.endswith(STAGING_SUFFIX) and (path / BUILD_DIR).is_dir():
        # OUTPUT.partial is the staging of OUTPUT: report its build, not the empty metadata it holds.
        path = path.with_name(path.name.removesuffix(STAGING_SUFFIX))
    meta = read_metadata(path) if path.exists() else None
    if meta is not None:
        return meta
    progress = load_progress(path)
    if progress is not None:
        owner = current_builder(path)
        return {
            "complete": False,
            "being_built_by": None if owner is None else owner.describe(),
            "interrupted_build": str(staging_path(path)),
            "committed_sentences": progress.lines,
            "committed_tokens": progress.tokens,
            "committed_rows": progress.rows,
            "finished_reading": progress.done,
            **{k: v for k, v in progress.identity.items()},
        }
    if not path.exists():
        raise CacheNotFoundError(f"cache not found: {path}")
    raise CacheFormatError(f"{path}: no elmo-cache metadata; not an elmo-cache store")


@click.command("info")
@click.argument("cache", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the whole metadata as JSON.")
def info_command(cache: str, as_json: bool) -> None:
    """Print the metadata and counts of CACHE (or the state of its interrupted build)."""
    from elmo_cache.store.format import WINDOW_FILES_FORMAT_VERSION

    meta = _describe(Path(cache))
    if as_json:
        click.echo(json.dumps(meta, indent=2, sort_keys=True))
        return
    model = meta.get("model") or {}
    what = f"layers {meta.get('layers')}" if meta.get("kind") == "layers" else f"mix {meta.get('mix')}"
    lines = [f"path:         {cache}"]
    if meta.get("being_built_by"):
        lines.append(
            f"state:        being built by {meta['being_built_by']} ({meta['committed_sentences']:,} sentences "
            "committed so far)"
        )
    elif "interrupted_build" in meta:
        lines.append(
            f"state:        interrupted build in {meta['interrupted_build']} ({meta['committed_sentences']:,} "
            "sentences committed); run the same build command to resume"
        )
    else:
        lines.append(f"complete:     {meta.get('complete')}")
        lines.append(
            f"counts:       {meta.get('n_sentences', 0):,} sentences, {meta.get('n_tokens', 0):,} tokens, "
            f"{meta.get('n_rows', 0):,} rows, {meta.get('n_unique', 0):,} distinct"
        )
        if meta.get("format_version") == WINDOW_FILES_FORMAT_VERSION:
            lines.append(
                "rows:         the length of the vectors array: each window's rows start a vectors file of "
                f"{meta.get('shard_rows') or 0:,} rows, and the rows from a window's end to the next file belong to no "
                "sentence (no bytes on disk; a whole-array read through zarr gives them as zeros)"
            )
    lines += [
        f"stores:       {what}, dim {meta.get('dim')}, {_storage(meta)}, dedupe {meta.get('dedupe')}",
        f"tokens:       {meta.get('tokenization')}",
        *(
            [
                f"pooled:       one {pool.get('method')} vector per sentence, {pool.get('dtype')}"
                + (" (--pool-only: no token vectors)" if pool.get("only") else "")
            ]
            if isinstance(pool := meta.get("pool"), dict)
            else []
        ),
        f"storage:      compression {meta.get('compression')}, chunk_rows {meta.get('chunk_rows')}, "
        f"shard_rows {meta.get('shard_rows')}",
        f"model:        {model.get('name')} (weights sha256 {str(model.get('weights_sha256'))[:16]}..., "
        f"precision {model.get('precision')}, initial state {model.get('initial_state')})",
    ]
    build = meta.get("build") or {}
    if build.get("seconds") is not None:
        lines.append(
            f"build:        {build.get('seconds')} s, {build.get('tokens_per_s')} tokens/s, "
            f"from {(build.get('input') or {}).get('path')}, finished {build.get('finished')}"
        )
    if meta.get("elmo_cache_version"):
        lines.append(
            f"written by:   elmo-cache {meta.get('elmo_cache_version')}, format version {meta.get('format_version')}"
        )
    click.echo("\n".join(lines))


def _storage(meta: dict) -> str:
    """The stored dtype, and how a quantised cache's rows decode."""
    quantization = meta.get("quantization")
    if not isinstance(quantization, dict):
        return str(meta.get("dtype"))
    return f"{meta.get('dtype')} ({quantization.get('scheme')} codes, {quantization.get('scale')} scale per vector)"
