"""Entry point of the ``elmo-cache`` command: a click group whose commands live in sibling modules.

Commands are thin: they turn flags into library options and call the library.
Library errors (:class:`elmo_cache.ElmoCacheError`) are caught here, in one place,
printed plainly on stderr, and turn into exit code 1.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from elmo_cache.errors import ElmoCacheError
from elmo_cache.version import __version__


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ElmoCacheError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="elmo-cache")
def cli() -> None:
    """Precompute ELMo embeddings once, read them straight from disk, serve them fast."""


def _register() -> None:
    from elmo_cache.cli.build import build_command
    from elmo_cache.cli.elmo import elmo_command
    from elmo_cache.cli.export import export_command
    from elmo_cache.cli.info import info_command
    from elmo_cache.cli.perplexity import perplexity_command
    from elmo_cache.cli.serve import serve_command
    from elmo_cache.cli.train import train_command
    from elmo_cache.cli.verify import verify_command

    commands = (
        build_command,
        info_command,
        verify_command,
        export_command,
        serve_command,
        train_command,
        perplexity_command,
        elmo_command,
    )
    for command in commands:
        cli.add_command(command)


_register()


def main() -> None:
    """Console-script entry point."""
    cli()
