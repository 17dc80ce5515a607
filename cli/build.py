"""``elmo-cache build``: encode a corpus into a cache (elmo_cache.builder)."""

from __future__ import annotations

import sys

import click

from elmo_cache.builder.engine import ENGINES
from elmo_cache.cli._options import SELECTION_FLAGS, model_options
from elmo_cache.store.format import POOL_METHODS

__all__ = ["build_command"]

_BUILD_EPILOG = """\b
Input: one sentence per line, tokens separated by whitespace; "-" reads stdin;
gzip is detected. Line i is sentence i: empty lines are sentences of 0 tokens.
CRLF and a leading BOM are ignored; a NUL byte stays inside its token; bytes that
are not UTF-8 stop the build with the line number (or become U+FFFD with
--errors replace); a line over 64 MiB is refused. Long lines and tokens are fine.

\b
Tokens with spaces inside (pre-tokenised text): --input-format tsv reads one
sentence per line with tab-separated tokens, kept exactly as written;
--input-format conllu reads CoNLL-U (the FORM column, one sentence per block;
multiword ranges and empty nodes skipped). Look such sentences up by token list.

\b
Interrupted (Ctrl-C, kill -9, a bad line)? Run the same command again: it resumes
from the last commit and ends with the same cache. --overwrite starts from scratch.

\b
Corpus edited or grown? A rerun stops and says what changed; --update brings the
cache up to date, re-encoding only the windows of new or changed lines.
"""


@click.command("build", epilog=_BUILD_EPILOG)
@click.argument("corpus")
@click.option(
    "-o", "--output", default=None, help="Cache path. Default: beside the corpus (corpus.txt -> corpus.zarr)."
)
@click.option(
    "--format",
    "format_",
    default=None,
    help="zarr (a directory, default) or hdf5 (one file). Default: from the output suffix (.zarr, .h5, .hdf5).",
)
@click.option("--layers", default=None, help="Layers to store, a subset of 0,1,2 like '1,2'. Default: all three.")
@click.option("--mix", default=None, help="Store one mixed vector per token: weights s0,s1,s2 of gamma * sum s_j h_j.")
@click.option("--gamma", type=float, default=None, help="Scale of --mix (default 1).")
@click.option("--mix-softmax", is_flag=True, help="--mix holds raw scalar-mix parameters: apply the softmax to them.")
@click.option(
    "--fp16",
    is_flag=True,
    help="Store float16 (half the bytes; mixing happens in float32 first). Storage only: the arithmetic is "
    "--precision's. Default float32.",
)
@click.option(
    "--quantize",
    default=None,
    help="Store the vectors quantised: none (default), int8 (one int8 code per value and one float32 scale per "
    "vector: about half the bytes of --fp16), pq:M (M one-byte codes per vector, product quantisation with "
    'codebooks trained on the corpus: needs faiss, pip install "elmo-cache[pq]"; M divides the model\'s width) '
    "or opq:M (as pq:M, each vector rotated first by a rotation trained with the codebooks: closer vectors, a "
    "dim x dim product per vector read). Reads return float32. Not with --fp16. A pq/opq build of a corpus "
    "too small for its codebooks (a larger cache than int8's) warns, naming both sizes.",
)
@click.option(
    "--codebook-sample",
    type=int,
    default=None,
    metavar="ROWS",
    help="With --quantize pq:M or opq:M: train the codebooks on the corpus's first ROWS token rows (default 65536). "
    "Fewer train faster and fit worse; opq of the Original model takes hours of one core at the default.",
)
@click.option(
    "--pool",
    type=click.Choice(["none", *POOL_METHODS]),
    default=None,
    help="Also store one vector per sentence: mean, max or first-last (the first and the last token's vectors "
    "side by side) of its token vectors, per stored layer or of the mix, in float32 before any cast; read with "
    "cache.sentence_vector(i) or GET /embed?pool=. Default none.",
)
@click.option(
    "--pool-only",
    is_flag=True,
    default=False,
    help="With --pool: store the pooled vectors instead of the token vectors (one row per sentence; cache[i] "
    "is refused, cache.sentence_vector(i) reads it). Needs disk for the full build while it runs.",
)
@click.option(
    "--compression",
    default=None,
    help="zarr only: none (default), zstd, blosc-lz4 or blosc-zstd. Float vectors compress ~10%.",
)
@click.option(
    "--chunk-rows",
    type=int,
    default=None,
    help="zarr rows per chunk. Default: the most rows within 3 MiB (512 for Original fp16 layers); a corpus "
    "of up to 4 such chunks is cut into as many equal chunks (multiples of 16 rows) in one file.",
)
@click.option(
    "--shard-rows",
    type=int,
    default=None,
    help="zarr rows per vectors file (whole chunks). Default: the most chunks within 64 MiB, no more than "
    "the corpus fills.",
)
@click.option("--dedupe", is_flag=True, help="Encode and store repeated sentences once.")
@model_options
@click.option("--precision", default="fp32", show_default=True, help="Encoder arithmetic: fp32, bf16 or fp16.")
@click.option("--initial-state", default="zero", show_default=True, help="LSTM initial state: zero or warm.")
@click.option(
    "--batch-tokens", type=int, default=None, help="Tokens per encoder batch. Default 8192 on CPU, 32768 on CUDA."
)
@click.option(
    "--window-batches", type=int, default=8, show_default=True, help="Sort by length within this many batches."
)
@click.option(
    "--errors", default="strict", show_default=True, help="Invalid UTF-8: strict (stop, naming the line) or replace."
)
@click.option(
    "--input-format",
    default="lines",
    show_default=True,
    help="lines (one sentence a line, split by --tokenize), tsv (tab-separated tokens, spaces kept) or conllu "
    "(FORM column).",
)
@click.option(
    "--tokenize",
    type=click.Choice(["whitespace", "ptb"]),
    default=None,
    help="How lines become tokens: whitespace, or ptb (PTB-style: punctuation and clitics split, the rules the "
    "bundled model's training text went through). Default: ptb for the bundled model, whitespace for any other. "
    "Recorded in the cache; lookups by text split the same way.",
)
@click.option(
    "--overwrite", is_flag=True, help="Discard an existing cache or interrupted build at the output; start over."
)
@click.option(
    "--update",
    is_flag=True,
    help="The cache at the output was built from an older version of CORPUS: bring it up to date in place. The "
    "stored rows of unchanged lines are copied and only the windows holding new or changed lines are encoded; "
    "the result equals a fresh build's, byte for byte. Same options as the cache's (--batch-tokens: the cache's "
    "when left out); local engine only. Without a cache at the output it is an ordinary build.",
)
@click.option(
    "--engine",
    type=click.Choice(list(ENGINES)),
    default="local",
    show_default=True,
    help="local: one process. ray: workers on a Ray cluster (pip install 'elmo-cache[ray]'; zarr only; "
    "see docs/DISTRIBUTED.md).",
)
@click.option(
    "--address", default=None, help="--engine ray: the Ray cluster ('auto', host:port). Default: a local one."
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="--engine ray: encoder actors. Default: one per GPU on CUDA, else one per 4 CPUs of the cluster.",
)
@click.option(
    "--threads",
    type=int,
    default=None,
    help="CPU threads for the encoder. Default: $ELMO_CACHE_THREADS, else the CPUs this process may use "
    "(affinity and cgroup quota).",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option(
    "--commit-seconds", type=float, default=10.0, hidden=True, help="Seconds between commits (0: every window)."
)
def build_command(
    corpus: str,
    output: str | None,
    format_: str | None,
    layers: str | None,
    mix: str | None,
    gamma: float | None,
    mix_softmax: bool,
    fp16: bool,
    quantize: str | None,
    codebook_sample: int | None,
    pool: str | None,
    pool_only: bool,
    compression: str | None,
    chunk_rows: int | None,
    shard_rows: int | None,
    dedupe: bool,
    model: str | None,
    options_file: str | None,
    weight_file: str | None,
    device: str | None,
    precision: str,
    initial_state: str,
    batch_tokens: int | None,
    window_batches: int,
    errors: str,
    input_format: str,
    tokenize: str | None,
    overwrite: bool,
    update: bool,
    engine: str,
    address: str | None,
    workers: int | None,
    threads: int | None,
    no_progress: bool,
    commit_seconds: float,
) -> None:
    """Encode every line of CORPUS once and write the vectors to a cache."""
    from elmo_cache.builder import BuildOptions, build, resolve_output
    from elmo_cache.builder.plan import open_corpus
    from elmo_cache.rows.selection import Selection, check_distinct_layers
    from elmo_cache.threads import apply_threads, choose_threads

    choose_threads(threads)  # checked with the other options, before torch is imported
    check_distinct_layers(layers, parameter="--layers")  # parse would merge "1,1" into "1"
    from elmo_cache.model.transformer import layer_count

    n_layers = layer_count(model)  # a Transformer's blocks + 1 (its config is read), else ELMo's 3
    selection = Selection.parse(layers, mix, gamma, mix_softmax, names=SELECTION_FLAGS, n_layers=n_layers) or (
        Selection(layers=tuple(range(n_layers)))
    )
    options = BuildOptions(
        output=output,
        format=format_,
        layers=selection.layers,
        mix=selection.mix,
        fp16=fp16,
        quantize=quantize,
        codebook_sample=codebook_sample,
        pool=pool,
        pool_only=pool_only,
        compression=compression,
        chunk_rows=chunk_rows,
        shard_rows=shard_rows,
        dedupe=dedupe,
        model=model,
        options_file=options_file,
        weight_file=weight_file,
        device=device,
        precision=precision,
        initial_state=initial_state,
        batch_tokens=batch_tokens,
        window_batches=window_batches,
        errors=errors,
        input_format=input_format,
        tokenize=tokenize,
        overwrite=overwrite,
        update=update,
        progress=not no_progress,
        commit_seconds=commit_seconds,
    )
    source = open_corpus(corpus, options)
    # Every option is checked here (resolve_output makes the plan) before torch and the model load.
    click.echo(f"building {resolve_output(source, options)}", err=True)
    apply_threads(threads)
    try:
        summary = build(source, options, engine=engine, address=address, workers=workers)
    except KeyboardInterrupt:
        click.echo("interrupted; run the same command again to resume", err=True)
        sys.exit(130)
    click.echo(str(summary))
