"""``elmo-cache serve``: answer embedding requests over HTTP from a cache and/or a live model."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from elmo_cache.errors import ElmoCacheError

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.reader.cache import Cache
    from elmo_cache.server.settings import Settings
    from elmo_cache.server.writeback import WriteBack

__all__ = ["serve_command", "run_server"]

# The `server` extra: a plain `pip install elmo-cache` (build and read) installs none of these.
_SERVER_EXTRA = {"fastapi", "starlette", "uvicorn", "pydantic", "pydantic_settings", "prometheus_client", "orjson"}


def _missing_extra(exc: ImportError) -> ElmoCacheError:
    if (exc.name or "").split(".")[0] not in _SERVER_EXTRA:
        raise exc  # a broken install of ours, not a missing extra
    return ElmoCacheError(
        f'`elmo-cache serve` needs the server extra ({exc.name} is not installed): pip install "elmo-cache[server]"'
    )


def _load_settings() -> Any:
    """The settings' loader alone (pydantic, no torch): flags are checked before the app is imported."""
    try:
        from elmo_cache.server.settings import load_settings
    except ImportError as exc:
        raise _missing_extra(exc) from None
    return load_settings


def _server_modules() -> tuple[Any, tuple[Any, Any, Any]]:
    """uvicorn and the server's entry points, imported only here so that nothing else needs them."""
    try:
        import uvicorn

        from elmo_cache.server.app import check_openai_mix, create_app, load_resources
    except ImportError as exc:
        raise _missing_extra(exc) from None
    return uvicorn, (create_app, load_resources, check_openai_mix)


@click.command("serve")
@click.argument("cache", required=False, type=click.Path(path_type=Path))
@click.option(
    "--model",
    help="Model for live encodings: a name (bundled, original, ...), a directory or an NLPL .zip. "
    "[default: the model that built CACHE when it is available locally, else none (cache only)] "
    "[env: ELMO_CACHE_MODEL]",
)
@click.option("--options-file", type=click.Path(path_type=Path), help="options.json of the model (with --weight-file).")
@click.option("--weight-file", type=click.Path(path_type=Path), help="Weight file of the model (with --options-file).")
@click.option("--device", help="Torch device of the encoder (cpu, cuda, cuda:1); default: CUDA when available.")
@click.option("--precision", help="Encoder precision (fp32, bf16, fp16). [default: the cache's, else fp32]")
@click.option("--host", help="Interface to listen on. [default: 127.0.0.1]")
@click.option("--port", type=int, help="TCP port. [default: 8000]")
@click.option(
    "--api-key",
    help="Require 'Authorization: Bearer <key>' on every route except GET /health and OPTIONS (which answers "
    "only Allow and CORS headers); /docs, /redoc and /openapi.json need it too unless --open-docs. "
    "[env: ELMO_CACHE_API_KEY]",
)
@click.option(
    "--open-docs/--no-open-docs",
    default=None,
    help="With --api-key: serve /docs, /redoc and /openapi.json without the key. [default: off]",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    help="Let browser pages from this origin (e.g. https://app.example.org; repeat for more; * for any) call the "
    "API (CORS). [default: none: CORS off] [env: ELMO_CACHE_CORS_ORIGINS, a JSON list]",
)
@click.option(
    "--openai-pool",
    type=click.Choice(["mean", "max", "first-last"]),
    help="POST /v1/embeddings: how a text's token vectors become its one vector. [default: mean]",
)
@click.option(
    "--openai-mix",
    help="POST /v1/embeddings: layer weights s0,s1,s2 of the vectors pooled. [default: the average of the layers "
    "the cache stores (all three without a cache), or a mixed cache's own mix]",
)
@click.option("--max-tokens-per-sentence", type=int, help="Refuse longer sentences (413). [default: 400]")
@click.option("--max-sentences-per-request", type=int, help="Refuse bigger POST /embed requests (413). [default: 256]")
@click.option("--max-body-bytes", type=int, help="Refuse bigger request bodies (413). [default: 1000000]")
@click.option("--batch-tokens", type=int, help="Token budget of one live encoder batch. [default: 4096]")
@click.option("--max-wait-ms", type=float, help="Longest wait to fill a live batch, in ms. [default: 5]")
@click.option("--queue-size", type=int, help="Live requests allowed to wait; more get 429. [default: 64]")
@click.option(
    "--live-timeout",
    "live_timeout_s",
    type=float,
    help="Seconds a live request may wait for its answer (queue included); longer ones get 503 "
    "'live_timeout'. 0: no limit. [default: 60]",
)
@click.option(
    "--max-response-bytes",
    type=int,
    help="Refuse requests whose answer could be bigger, before reading or encoding (413). [default: 67108864]",
)
@click.option(
    "--request-timeout",
    "request_timeout_s",
    type=float,
    help="Seconds a request's cache read (or response write) may take; longer ones get 503 'cache_timeout'. "
    "0: no limit. [default: 30]",
)
@click.option("--read-threads", type=int, help="Threads for cache reads and response writing. [default: 4]")
@click.option(
    "--threads",
    type=int,
    help="CPU threads of the encoder. [default: the CPUs this process may use: affinity, cgroup quota]",
)
@click.option(
    "--graceful-timeout",
    "graceful_timeout_s",
    type=float,
    help="On SIGTERM/SIGINT, seconds requests in flight get to finish (new ones get 503 meanwhile) before the "
    "server exits. [default: 10]",
)
@click.option(
    "--write-back/--no-write-back",
    default=None,
    help="Keep the live encodings of misses in CACHE's journal (CACHE.writeback, beside it) and answer them as hits "
    "from then on; each miss is encoded alone, as a build stores it. Needs the model that built CACHE. "
    "[default: off]",
)
@click.option(
    "--write-back-max-bytes",
    type=int,
    help="Largest size of the write-back journal; when full, misses are still answered but no longer kept "
    "(counted in /metrics). [default: 1073741824]",
)
@click.option(
    "--write-back-commit-ms",
    type=float,
    help="The journal is written and fsynced once the oldest kept miss is this old: a kill -9 or a power cut "
    "loses at most the misses answered in the last N ms (plus the time the commits take). [default: 50]",
)
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug", "trace"]))
@click.option("--access-log/--no-access-log", default=None, help="Log one line per request. [default: on]")
def serve_command(cache: Path | None, **flags: Any) -> None:
    """Serve CACHE (optional when a model is given) over HTTP with FastAPI + uvicorn.

    Sentences missing from CACHE are encoded live with --model, or without it with the model
    recorded in CACHE when that model is here (the bundled one always is; a published one once
    downloaded; a local directory while it holds the same weights); otherwise CACHE alone is
    served and the reason is logged.

    Every option can also be set with an ELMO_CACHE_<OPTION> environment variable
    (e.g. ELMO_CACHE_API_KEY, ELMO_CACHE_PORT; CACHE is ELMO_CACHE_CACHE_PATH); flags win. The model and cache are
    loaded before the server starts listening, so a mistake is reported at once.
    Docs of the HTTP API: http://HOST:PORT/docs once it runs (with --api-key, they need the key too
    unless --open-docs). POST /v1/embeddings answers in the OpenAI embeddings API's shape.
    """
    flags["cors_origins"] = list(flags["cors_origins"]) or None  # no flag: the environment's, else none
    settings = _load_settings()(cache_path=cache, **flags)  # a clear error without the server extra
    settings.check_something_to_serve()
    _, (_, load_resources, check_openai_mix) = _server_modules()
    encoder, store = load_resources(settings)
    check_openai_mix(settings, encoder, store)
    writeback = None
    if settings.write_back:
        from elmo_cache.server.writeback import WriteBack

        writeback = WriteBack(store, encoder, settings)  # a journal of another cache, or locked: refused here
    what = " and ".join(
        part
        for part in (
            f"cache {settings.cache_path}" if store is not None else "",
            f"the live model {encoder.name!r}" if encoder is not None else "",
        )
        if part
    ) + ("" if encoder is not None else " only (no live encodings)")
    if writeback is not None:
        what += f", keeping misses in {writeback.journal.path} ({len(writeback.journal)} sentences)"
    click.echo(f"elmo-cache: serving {what} on http://{settings.host}:{settings.port}", err=True)
    try:
        run_server(settings, encoder=encoder, cache=store, writeback=writeback)
    finally:
        if writeback is not None:
            writeback.close()


def run_server(
    settings: Settings,
    *,
    encoder: Encoder | None = None,
    cache: Cache | None = None,
    writeback: WriteBack | None = None,
) -> None:
    """Serve with uvicorn until SIGTERM/SIGINT, then drain for ``graceful_timeout_s`` and return.

    While draining (elmo_cache.server.shutdown) the listener stays open, new requests get 503
    ``shutting_down`` with ``Connection: close`` and the requests in flight finish; once none is
    left, or ``graceful_timeout_s`` has passed, uvicorn stops listening and cancels the rest. A cache
    read stuck in a pool thread (a dead disk) does not hold the process: the pool's threads are
    daemons, and the cache is then left open rather than closed under it.
    """
    uvicorn, (create_app, _, _) = _server_modules()
    from elmo_cache.server.shutdown import DrainingServer

    app = create_app(settings, encoder=encoder, cache=cache, writeback=writeback)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        timeout_graceful_shutdown=math.ceil(settings.graceful_timeout_s),
    )
    server = DrainingServer(config, app.state.drain, settings.graceful_timeout_s)
    server.run()
    if not server.started:
        raise SystemExit(3)  # what uvicorn.run exits with when the server could not start (port taken)
    pool = getattr(app.state, "read_pool", None)
    if pool is not None and pool.busy:
        logging.getLogger("elmo_cache.server").warning("exiting with %d cache read(s) stuck", pool.busy)
    elif cache is not None and hasattr(cache, "close"):
        cache.close()
