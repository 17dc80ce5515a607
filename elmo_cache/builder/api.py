"""``build()``, the public entry of every build: the corpus opened, the engine made, and the build
run by the steps of :mod:`~elmo_cache.builder.skeleton`. A ``--pool-only`` build is one of them too: its
layout declares no token rows (``Layout.token_rows``), and every engine writes what the layout declares.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from elmo_cache.builder.engine import Engine, make_engine
from elmo_cache.builder.options import BuildOptions, BuildSummary
from elmo_cache.builder.plan import open_corpus
from elmo_cache.builder.skeleton import build_cache
from elmo_cache.text.corpus import Corpus

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder

__all__ = ["build", "run_build"]


def build(
    corpus: str | os.PathLike[str] | Corpus,
    options: BuildOptions | None = None,
    encoder: Encoder | None = None,
    *,
    engine: str = "local",
    address: str | None = None,
    workers: int | None = None,
) -> BuildSummary:
    """Encode every line of ``corpus`` and write the cache; returns a :class:`BuildSummary`.

    ``corpus``: a path (``-`` for stdin; gzip is detected) or a :class:`~elmo_cache.text.corpus.Corpus`.
    ``encoder``: an :class:`~elmo_cache.Encoder` to use instead of loading ``options.model``.
    Running the same build again after an interruption (even ``kill -9``) resumes it and
    ends with the cache an uninterrupted build writes; on a complete cache it does nothing.
    Raises :class:`~elmo_cache.errors.CacheExistsError` when the output holds a cache or an
    interrupted build made with other options (unless ``overwrite``),
    :class:`~elmo_cache.errors.CorpusError` for unreadable input (lines before the bad one are
    committed first), :class:`~elmo_cache.errors.InvalidParameterError` for bad options.

    ``engine`` (:data:`~elmo_cache.builder.engine.ENGINES`): ``"local"``, one process; ``"ray"`` builds
    the same cache on a Ray cluster (``pip install "elmo-cache[ray]"``; zarr only): ``address`` names the
    cluster (None: a local one), ``workers`` the encoder actors; see
    :func:`elmo_cache.builder.ray.engine.build_distributed` and docs/DISTRIBUTED.md.
    """
    options = options or BuildOptions()
    return run_build(corpus, options, make_engine(engine, encoder=encoder, address=address, workers=workers), encoder)


def run_build(
    corpus: str | os.PathLike[str] | Corpus, options: BuildOptions, engine: Engine, encoder: Encoder | None = None
) -> BuildSummary:
    """The build of ``corpus`` by ``engine`` (``encoder``: the one to use instead of ``options.model``)."""
    return build_cache(open_corpus(corpus, options, encoder), options, engine, encoder)
