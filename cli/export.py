"""``elmo-cache export``: a cache in the original allennlp HDF5 layout."""

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
def export_command(cache: str, output: str, corpus: str | None, overwrite: bool) -> None:
    """Write CACHE to OUTPUT in the original allennlp HDF5 layout (one dataset per line)."""
    from elmo_cache.compat.export import export

    click.echo(str(export(cache, output, corpus=corpus, overwrite=overwrite)))
