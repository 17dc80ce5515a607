"""The distributed build engine (``--engine ray``): :mod:`~elmo_cache.builder.ray.engine` is its face;
Ray itself is imported only by :mod:`~elmo_cache.builder.ray.raydata`, when a build asks for it."""
