"""The FastAPI server (installed as ``elmo_cache.server``).

``create_app()`` builds the app; :class:`Settings` holds every setting
(``ELMO_CACHE_*`` environment variables); ``elmo-cache serve`` runs it with uvicorn.
"""

from elmo_cache.server.app import check_compatible, create_app, load_resources
from elmo_cache.server.settings import Settings, load_settings

__all__ = ["create_app", "load_resources", "check_compatible", "Settings", "load_settings"]
