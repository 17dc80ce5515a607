"""The FastAPI server (installed as ``elmo_cache.server``)."""
