"""The FastAPI application factory.

``create_app()`` builds an app whose lifespan loads the model and the cache once
(unless already-built objects are passed in, as the CLI and tests do) and starts
the live batcher; requests never load anything.

Run it directly with ``uvicorn --factory elmo_cache.server.app:create_app`` and
``ELMO_CACHE_*`` environment variables, or with ``elmo-cache serve``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from elmo_cache.errors import InvalidParameterError
from elmo_cache.model import sources
from elmo_cache.model.identity import model_differences
from elmo_cache.rows.selection import Selection
from elmo_cache.server.batcher import LiveBatcher
from elmo_cache.server.deps import require_api_key
from elmo_cache.server.errors import HANDLED, error_handler
from elmo_cache.server.formats import EXPOSED_HEADERS
from elmo_cache.server.metrics import Metrics
from elmo_cache.server.middleware import (
    AllowMiddleware,
    BodyLimitMiddleware,
    Drain,
    DrainMiddleware,
    RequestIdMiddleware,
    TimingMiddleware,
)
from elmo_cache.server.routers import docs, embed, embeddings, health, info, metrics
from elmo_cache.server.service import EmbedService, served_layers
from elmo_cache.server.settings import NOTHING_TO_SERVE, Settings, load_settings
from elmo_cache.server.workers import ReadPool
from elmo_cache.server.writeback import WriteBack, check_write_back
from elmo_cache.version import __version__

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.reader.cache import Cache

__all__ = ["create_app", "load_resources", "check_compatible", "check_openai_mix"]

_log = logging.getLogger("elmo_cache.server")

_DESCRIPTION = """\
Contextual ELMo vectors, answered from a precomputed elmo-cache store when the
sentence is there and encoded live (batched across concurrent requests) when a
model is loaded. Every error is JSON: `{"error": {"code": ..., "message": ..., "request_id": ...}}`;
every response carries `X-Request-ID` (yours when you send a plain one), and every 5xx `Connection: close`.
"""


def check_compatible(cache: Cache, encoder: Encoder) -> None:
    """Refuse a model that differs from the one that built the cache: hits and live answers would disagree."""
    metadata = getattr(cache, "metadata", None) or {}
    built_with = metadata.get("model") or {}
    identity = getattr(encoder, "identity", None) or {}
    differences = model_differences(built_with, identity)
    if differences:
        key = differences[0]
        theirs, ours = (
            (repr(built_with.get(key)), repr(identity.get(key))) if key != "options" else ("others", "others")
        )
        raise InvalidParameterError(
            f"model: the cache was built with {key} {theirs} but the loaded model has {ours}; "
            "live answers would not match cached ones (serve the cache with the model, --precision and "
            "initial state that built it)"
        )
    dim = metadata.get("dim")
    if dim is not None and int(dim) != int(encoder.output_dim):
        raise InvalidParameterError(
            f"model: the cache holds {dim}-wide vectors but the model produces {encoder.output_dim}-wide ones"
        )


def check_openai_mix(settings: Settings, encoder: Encoder | None, cache: Cache | None) -> None:
    """Refuse an ``openai_mix`` this server cannot pool: one weight per layer of its model (ELMo's 3, a Transformer's
    L + 1), and of layers its cache holds when no model is loaded. The settings check only that it is numbers: the
    count needs the model (``serve`` checks before it listens, :func:`create_app` as it starts)."""
    if settings.openai_mix is None:
        return
    try:
        selection = Selection.parse(None, settings.openai_mix, None, False, n_layers=served_layers(encoder, cache))
        stored = Selection.from_metadata(cache.metadata) if cache is not None else None
        if encoder is None and stored is not None and selection is not None and not selection.answerable_from(stored):
            raise InvalidParameterError(selection.unavailable_message(stored))
    except InvalidParameterError as exc:
        raise InvalidParameterError(f"openai_mix (ELMO_CACHE_OPENAI_MIX): {exc}") from None


def load_resources(
    settings: Settings, *, encoder: Encoder | None = None, cache: Cache | None = None
) -> tuple[Encoder | None, Cache | None]:
    """Load whatever ``settings`` name and was not passed in; returns ``(encoder, cache)``.

    Without a model in ``settings``, a cache is served with the model recorded in its metadata
    when that model is here (:func:`elmo_cache.model.sources.locate`: the bundled one, a downloaded
    published one, or the directory it came from), so misses are encoded as the hits were;
    otherwise the cache alone is served, and the log says why.

    Raises :class:`ElmoCacheError` subclasses (missing files, bad model, foreign
    cache, model/cache mismatch) so the CLI can print them plainly.
    """
    if cache is None and settings.cache_path is not None:
        import elmo_cache

        cache = elmo_cache.open(settings.cache_path)
    why_no_model: str | None = None
    if encoder is None and (settings.has_model or cache is not None):
        from elmo_cache.encoder.encoder import Encoder
        from elmo_cache.threads import apply_threads

        apply_threads(settings.threads)

        # Live answers must match cached ones: by default encode as the cache was built.
        built_with = ((getattr(cache, "metadata", None) or {}).get("model") or {}) if cache is not None else {}
        kwargs = {
            "device": settings.device,
            "precision": settings.precision or built_with.get("precision") or "fp32",
            "initial_state": built_with.get("initial_state") or "zero",
        }
        if settings.has_model:
            encoder = Encoder.load(
                settings.model, options_file=settings.options_file, weight_file=settings.weight_file, **kwargs
            )
        else:
            files, why = sources.locate(built_with)
            if files is not None:
                try:
                    encoder = Encoder.load(files, **kwargs)
                except InvalidParameterError as exc:
                    # The recorded precision is refused here (bf16/fp16 emulated on this CPU): the
                    # cache is still worth serving; the user asked for no model in particular.
                    why = f"{exc} (or pass --precision to serve live answers that differ from the cached ones)"
            if encoder is None:
                why_no_model = why
                _log.warning("serving %s from the cache only, no live encodings: %s", settings.cache_path, why)
    if cache is None and encoder is None:
        raise InvalidParameterError(NOTHING_TO_SERVE)
    if cache is not None and encoder is not None:
        check_compatible(cache, encoder)
    if settings.write_back:
        check_write_back(cache, encoder, why_no_model)
    return encoder, cache


def create_app(
    settings: Settings | None = None,
    *,
    encoder: Encoder | None = None,
    cache: Cache | None = None,
    writeback: WriteBack | None = None,
) -> FastAPI:
    """Build the app. ``encoder`` / ``cache`` (and with ``write_back`` the :class:`WriteBack` of that cache) may
    be passed already built; the rest loads in the lifespan."""
    settings = settings if settings is not None else load_settings()
    app_metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded_encoder, loaded_cache = await asyncio.to_thread(load_resources, settings, encoder=encoder, cache=cache)
        kept = writeback
        if settings.write_back and kept is None:
            assert loaded_cache is not None and loaded_encoder is not None  # load_resources checked
            kept = await asyncio.to_thread(WriteBack, loaded_cache, loaded_encoder, settings)
        if kept is not None:
            kept.attach(app_metrics)
        batcher = None
        if loaded_encoder is not None:
            batcher = LiveBatcher(
                # With write-back every miss is encoded alone, as a build encodes it (elmo_cache.server.writeback).
                loaded_encoder.embed_batch if kept is None else kept.encode,
                metrics=app_metrics,
                batch_tokens=settings.batch_tokens,
                max_wait_s=settings.max_wait_ms / 1000,
                queue_size=settings.queue_size,
                timeout_s=settings.live_timeout_s,
            )
            await batcher.start()
        pool = app.state.read_pool = ReadPool(settings.read_threads)
        app.state.service = EmbedService(
            settings,
            app_metrics,
            cache=loaded_cache,
            encoder=loaded_encoder,
            batcher=batcher,
            pool=pool,
            writeback=kept,
        )
        try:
            check_openai_mix(settings, loaded_encoder, loaded_cache)
            yield
        finally:
            app.state.service = None
            pool.close()
            if batcher is not None:
                await batcher.close()
            if kept is not None and writeback is None:
                await asyncio.to_thread(kept.close)  # commits what is queued
            # Close only what this lifespan opened; injected objects belong to the caller. Never under
            # a read still stuck in a pool thread: unmapping its memory would crash the process.
            stuck = pool.busy
            if stuck:
                _log.warning("%d cache read(s) still stuck at shutdown; the cache is left open", stuck)
            elif cache is None and loaded_cache is not None and hasattr(loaded_cache, "close"):
                loaded_cache.close()

    app = FastAPI(
        title="elmo-cache",
        version=__version__,
        description=_DESCRIPTION,
        lifespan=lifespan,
        # Served by routers/docs.py instead, behind the API key when there is one.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = app_metrics
    app.state.service = None
    app.state.read_pool = None
    # Set draining by the server on SIGTERM/SIGINT (elmo_cache.server.shutdown); in-process tests never do.
    app.state.drain = drain = Drain()
    for exc_class in (*HANDLED, Exception):
        app.add_exception_handler(exc_class, error_handler)
    # Only a server with a key checks it: no dependency to solve per request otherwise, and the
    # OpenAPI docs show the bearer scheme exactly when it is required. /health stays open.
    auth = [Depends(require_api_key)] if settings.api_key is not None else []
    app.include_router(health.router)
    for module in (embed, embeddings, info, metrics):
        app.include_router(module.router, dependencies=auth)
    app.include_router(docs.router, dependencies=[] if settings.open_docs else auth)
    # Added last = outermost: timing sees every response, including early 413s and OPTIONS; the
    # request id is given first and catches whatever escapes the rest.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(AllowMiddleware)
    # Inside timing and the request id: a draining server's 503s are counted and carry an id.
    app.add_middleware(DrainMiddleware, drain=drain)
    app.add_middleware(TimingMiddleware, metrics=app_metrics)
    app.add_middleware(RequestIdMiddleware)
    if settings.cors_origins:
        # Outermost: a preflight OPTIONS is answered before routing or the key, and every response
        # (errors included) carries the CORS headers a browser needs to read it.
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Server-Timing", *EXPOSED_HEADERS],
        )
    return app
