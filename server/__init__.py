"""The FastAPI server (installed as ``elmo_cache.server``).

``create_app()`` builds the app; :class:`Settings` holds every setting
(``ELMO_CACHE_*`` environment variables); ``elmo-cache serve`` runs it with uvicorn.

The names are imported on first use: ``elmo-cache serve`` checks its settings
(:mod:`~elmo_cache.server.settings`) before the app, and torch with it, is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elmo_cache.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from elmo_cache.server.app import check_compatible as check_compatible
    from elmo_cache.server.app import create_app as create_app
    from elmo_cache.server.app import load_resources as load_resources
    from elmo_cache.server.settings import Settings as Settings
    from elmo_cache.server.settings import load_settings as load_settings

# name -> module that defines it
_EXPORTS = {
    "create_app": "elmo_cache.server.app",
    "load_resources": "elmo_cache.server.app",
    "check_compatible": "elmo_cache.server.app",
    "Settings": "elmo_cache.server.settings",
    "load_settings": "elmo_cache.server.settings",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
