"""``elmo-cache build | info | verify | export``: thin wrappers over elmo_cache.builder/verify/export."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from elmo_cache.errors import CacheNotFoundError, CacheFormatError, InvalidParameterError

__all__ = ["build_command", "info_command", "verify_command", "export_command"]

_BUILD_EPILOG = """\b
Input: one sentence per line, tokens separated by whitespace; "-" reads stdin;
gzip is detected. Line i is sentence i: empty lines are sentences of 0 tokens.
CRLF and a leading BOM are ignored; a NUL byte stays inside its token; bytes that
are not UTF-8 stop the build with the line number (or become U+FFFD with
--errors replace); a line over 64 MiB is refused. Long lines and tokens are fine.

\b
Interrupted (Ctrl-C, kill -9, a bad line)? Run the same command again: it resumes
from the last commit and ends with the same cache. --overwrite starts from scratch.
"""


def _model_options(function):
    for option in reversed([
        click.option("--model", default=None, help="Model name (original, medium, small, original-5.5b) or a directory "
                     "with options JSON + weights HDF5. Default: original."),
        click.option("--options-file", type=click.Path(dir_okay=False), default=None, help="options.json of the model."),
        click.option("--weight-file", type=click.Path(dir_okay=False), default=None, help="Weights HDF5 of the model."),
        click.option("--device", default=None, help="cpu, cuda or cuda:N. Default: CUDA when available."),
    ]):
        function = option(function)
    return function


@click.command("build", epilog=_BUILD_EPILOG)
@click.argument("corpus")
@click.option("-o", "--output", default=None, help="Cache path. Default: beside the corpus (corpus.txt -> corpus.zarr).")
@click.option("--format", "format_", default=None, help="zarr (a directory, default) or hdf5 (one file). "
              "Default: from the output suffix (.zarr, .h5, .hdf5).")
@click.option("--layers", default=None, help="Layers to store, a subset of 0,1,2 like '1,2'. Default: all three.")
@click.option("--mix", default=None, help="Store one mixed vector per token: weights s0,s1,s2 of gamma * sum s_j h_j.")
@click.option("--gamma", type=float, default=None, help="Scale of --mix (default 1).")
@click.option("--mix-softmax", is_flag=True, help="--mix holds raw scalar-mix parameters: apply the softmax to them.")
@click.option("--fp16", is_flag=True, help="Store float16 (mixing happens in float32 first). Default float32.")
@click.option("--compression", default=None, help="zarr only: none (default), zstd, blosc-lz4 or blosc-zstd. "
              "Float vectors compress ~10%.")
@click.option("--chunk-rows", type=int, default=None, help="zarr rows per chunk. Default: the most rows within 3 MiB (512 for Original fp16 layers).")
@click.option("--dedupe", is_flag=True, help="Encode and store repeated sentences once.")
@_model_options
@click.option("--precision", default="fp32", show_default=True, help="Encoder arithmetic: fp32, bf16 or fp16.")
@click.option("--initial-state", default="zero", show_default=True, help="LSTM initial state: zero or warm.")
@click.option("--batch-tokens", type=int, default=None, help="Tokens per encoder batch. Default 8192 on CPU, 32768 on CUDA.")
@click.option("--window-batches", type=int, default=8, show_default=True, help="Sort by length within this many batches.")
@click.option("--errors", default="strict", show_default=True, help="Invalid UTF-8: strict (stop, naming the line) or replace.")
@click.option("--overwrite", is_flag=True, help="Discard an existing cache or interrupted build at the output; start over.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--commit-seconds", type=float, default=10.0, hidden=True, help="Seconds between commits (0: every window).")
def build_command(corpus, output, format_, layers, mix, gamma, mix_softmax, fp16, compression, chunk_rows, dedupe, model,
                  options_file, weight_file, device, precision, initial_state, batch_tokens, window_batches, errors,
                  overwrite, no_progress, commit_seconds):
    """Encode every line of CORPUS once and write the vectors to a cache."""
    from elmo_cache.builder import BuildOptions, build, resolve_output
    from elmo_cache.corpus import Corpus
    from elmo_cache.mix import MixSpec

    if mix is None and (gamma is not None or mix_softmax):
        raise InvalidParameterError("--gamma and --mix-softmax only apply with --mix s0,s1,s2")
    spec = MixSpec.from_raw(mix, gamma=1.0 if gamma is None else gamma, softmax=mix_softmax) if mix is not None else None
    options = BuildOptions(
        output=output, format=format_, layers=layers, mix=spec, fp16=fp16, compression=compression, chunk_rows=chunk_rows,
        dedupe=dedupe, model=model, options_file=options_file, weight_file=weight_file, device=device, precision=precision,
        initial_state=initial_state, batch_tokens=batch_tokens, window_batches=window_batches, errors=errors,
        overwrite=overwrite, progress=not no_progress, commit_seconds=commit_seconds,
    )
    source = Corpus(corpus, errors=errors)
    click.echo(f"building {resolve_output(source, options)}", err=True)  # said before the model loads
    try:
        summary = build(source, options)
    except KeyboardInterrupt:
        click.echo("interrupted; run the same command again to resume", err=True)
        sys.exit(130)
    click.echo(str(summary))


def _describe(path: Path) -> dict:
    from elmo_cache.store import load_progress, read_metadata, staging_path

    meta = read_metadata(path) if path.exists() else None
    if meta is not None:
        return meta
    progress = load_progress(path)
    if progress is not None:
        return {"complete": False, "interrupted_build": str(staging_path(path)), "committed_sentences": progress.lines,
                "committed_tokens": progress.tokens, "committed_rows": progress.rows, "finished_reading": progress.done,
                **{k: v for k, v in progress.identity.items()}}
    if not path.exists():
        raise CacheNotFoundError(f"cache not found: {path}")
    raise CacheFormatError(f"{path}: no elmo-cache metadata; not an elmo-cache store")


@click.command("info")
@click.argument("cache", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the whole metadata as JSON.")
def info_command(cache, as_json):
    """Print the metadata and counts of CACHE (or the state of its interrupted build)."""
    meta = _describe(Path(cache))
    if as_json:
        click.echo(json.dumps(meta, indent=2, sort_keys=True))
        return
    model = meta.get("model") or {}
    what = f"layers {meta.get('layers')}" if meta.get("kind") == "layers" else f"mix {meta.get('mix')}"
    lines = [f"path:         {cache}"]
    if "interrupted_build" in meta:
        lines.append(f"state:        interrupted build in {meta['interrupted_build']} ({meta['committed_sentences']:,} "
                     "sentences committed); run the same build command to resume")
    else:
        lines.append(f"complete:     {meta.get('complete')}")
        lines.append(f"counts:       {meta.get('n_sentences', 0):,} sentences, {meta.get('n_tokens', 0):,} tokens, "
                     f"{meta.get('n_rows', 0):,} rows, {meta.get('n_unique', 0):,} distinct")
    lines += [
        f"stores:       {what}, dim {meta.get('dim')}, {meta.get('dtype')}, dedupe {meta.get('dedupe')}",
        f"storage:      compression {meta.get('compression')}, chunk_rows {meta.get('chunk_rows')}",
        f"model:        {model.get('name')} (weights sha256 {str(model.get('weights_sha256'))[:16]}..., "
        f"precision {model.get('precision')}, initial state {model.get('initial_state')})",
    ]
    build = meta.get("build") or {}
    if build.get("seconds") is not None:
        lines.append(f"build:        {build.get('seconds')} s, {build.get('tokens_per_s')} tokens/s, "
                     f"from {(build.get('input') or {}).get('path')}, finished {build.get('finished')}")
    if meta.get("elmo_cache_version"):
        lines.append(f"written by:   elmo-cache {meta.get('elmo_cache_version')}, format version {meta.get('format_version')}")
    click.echo("\n".join(lines))


@click.command("verify")
@click.argument("cache", type=click.Path())
@click.option("--sample", type=int, default=0, show_default=True, help="Re-encode this many random sentences and compare.")
@click.option("--corpus", default=None, help="The corpus the cache was built from. Default: the recorded input path.")
@_model_options
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample.")
def verify_command(cache, sample, corpus, model, options_file, weight_file, device, seed):
    """Check the structure of CACHE and optionally a sample of its vectors."""
    from elmo_cache.verify import verify

    if sample < 0:
        raise InvalidParameterError(f"--sample: must be >= 0, got {sample}")
    report = verify(cache, sample=sample, corpus=corpus, model=model, options_file=options_file, weight_file=weight_file,
                    device=device, seed=seed)
    click.echo(str(report))
    if not report.ok:
        raise CacheFormatError(f"{cache} failed verification: " + "; ".join(report.problems))


@click.command("export")
@click.argument("cache", type=click.Path())
@click.argument("output", type=click.Path())
@click.option("--corpus", default=None, help="Corpus for sentence_to_index. Default: the recorded input path.")
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
def export_command(cache, output, corpus, overwrite):
    """Write CACHE to OUTPUT in the original allennlp HDF5 layout (one dataset per line)."""
    from elmo_cache.export import export

    click.echo(str(export(cache, output, corpus=corpus, overwrite=overwrite)))
