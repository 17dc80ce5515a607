"""The ``elmo-cache`` command line (installed as ``elmo_cache.cli``)."""
