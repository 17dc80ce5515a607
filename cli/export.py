"""``elmo-cache export``: a cache in the original allennlp HDF5 layout, or as Parquet."""

from __future__ import annotations

import click

__all__ = ["export_command"]


@click.command("export")
@click.argument("cache", type=click.Path())
@click.argument("output", type=click.Path())
@click.option(
    "--corpus",
    default=None,
    help="Corpus for sentence_to_index (its lines as allennlp keys them). Default: the cache's stored tokens.",
)
@click.option("--overwrite", is_flag=True, help="Replace OUTPUT if it exists.")
@click.option(
    "--format",
    "format_",
    type=click.Choice(["hdf5", "parquet"]),
    default=None,
    help="hdf5: allennlp's layout (one dataset per line). parquet: one row per line (line, tokens, vectors as "
    'float32 nested lists), read by pyarrow and Hugging Face datasets (pip install "elmo-cache[parquet]"). '
    "Default: parquet for a .parquet or .pq OUTPUT, else hdf5.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def export_command(
    cache: str, output: str, corpus: str | None, overwrite: bool, format_: str | None, no_progress: bool
) -> None:
    """Write CACHE to OUTPUT in the original allennlp HDF5 layout (one dataset per line) or as Parquet."""
    from elmo_cache.compat.export import export

    summary = export(cache, output, corpus=corpus, overwrite=overwrite, format=format_, progress=not no_progress)
    click.echo(str(summary))
