"""``elmo-cache verify``: check a cache's structure and, optionally, a sample of its vectors."""

from __future__ import annotations

import click

from elmo_cache.cli._options import cache_model_options
from elmo_cache.errors import CacheFormatError, InvalidParameterError

__all__ = ["verify_command"]


@click.command("verify")
@click.argument("cache", type=click.Path())
@click.option(
    "--sample", type=int, default=0, show_default=True, help="Re-encode this many random sentences and compare."
)
@click.option(
    "--corpus",
    default=None,
    help="The corpus the cache was built from, to check every line against it too (read only when given; "
    "a format-1 cache, which stores no text, needs it to check its index).",
)
@cache_model_options
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def verify_command(
    cache: str,
    sample: int,
    corpus: str | None,
    model: str | None,
    options_file: str | None,
    weight_file: str | None,
    device: str | None,
    seed: int,
    no_progress: bool,
) -> None:
    """Check the structure of CACHE and optionally a sample of its vectors."""
    from elmo_cache.verify.checks import verify

    if sample < 0:
        raise InvalidParameterError(f"--sample: must be >= 0, got {sample}")
    report = verify(
        cache,
        sample=sample,
        corpus=corpus,
        model=model,
        options_file=options_file,
        weight_file=weight_file,
        device=device,
        seed=seed,
        progress=not no_progress,
    )
    click.echo(str(report))
    if not report.ok:
        raise CacheFormatError(f"{cache} failed verification: " + "; ".join(report.problems))
