"""``build``: walk a corpus once and write its ELMo vectors into a cache (docs/FORMAT.md).

* :mod:`~elmo_cache.builder.options`: what a build is asked to do and what it did;
* :mod:`~elmo_cache.builder.plan`: validating options, naming the output, the build's identity
  and what to do about a cache or an interrupted build already at the output;
* :mod:`~elmo_cache.builder.sizes`: the default zarr chunk and shard sizes;
* :mod:`~elmo_cache.builder.dedupe`: which sentences are repeats and where their rows are;
* :mod:`~elmo_cache.builder.encoding`: the window cuts and window encoding both engines share;
* :mod:`~elmo_cache.builder.skeleton`: :func:`build`, every build's steps whichever engine runs it;
* :mod:`~elmo_cache.builder.engine`: the engine seam (:class:`~elmo_cache.builder.engine.Engine`) and
  its registry;
* :mod:`~elmo_cache.builder.local`: the local engine, reader, encoder and writer threads;
* :mod:`~elmo_cache.builder.ray.engine` (with ``firstpass``, ``_parts``, ``_stitch``): the ray
  engine, the same build on a Ray cluster (``build(..., engine="ray")``; imports ray only when used).

(The package is ``builder`` because ``elmo_cache.build`` is the public function.)
"""

from __future__ import annotations

from elmo_cache.builder.api import build
from elmo_cache.builder.options import BuildOptions, BuildSummary
from elmo_cache.builder.plan import default_output, resolve_output
from elmo_cache.builder.sizes import DEFAULT_CHUNK_ROWS, default_chunk_rows, default_shard_rows

__all__ = [
    "BuildOptions",
    "BuildSummary",
    "build",
    "DEFAULT_CHUNK_ROWS",
    "default_chunk_rows",
    "default_shard_rows",
    "default_output",
    "resolve_output",
]
