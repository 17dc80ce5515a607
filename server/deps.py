"""``Annotated`` dependencies shared by the routers."""

from __future__ import annotations

import secrets
from typing import Annotated
from urllib.parse import unquote_to_bytes

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from elmo_cache.errors import AuthenticationError, InvalidParameterError, NotReadyError
from elmo_cache.server.metrics import Metrics
from elmo_cache.server.service import EmbedService, Timings
from elmo_cache.server.settings import Settings

__all__ = ["SettingsDep", "ServiceDep", "MetricsDep", "TimingsDep", "require_api_key", "require_utf8_query"]


# Dependencies are ``async def`` on purpose: FastAPI runs plain ``def`` dependencies in its
# thread pool, a thread hop per dependency per request for what are attribute reads.


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_metrics(request: Request) -> Metrics:
    return request.app.state.metrics


async def get_service(request: Request) -> EmbedService:
    service = getattr(request.app.state, "service", None)
    if service is None:
        raise NotReadyError("the server is still loading its model/cache; retry shortly")
    return service


async def get_timings(request: Request) -> Timings:
    timings = request.scope.get("state", {}).get("timings")
    return timings if timings is not None else Timings()


SettingsDep = Annotated[Settings, Depends(get_settings)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
ServiceDep = Annotated[EmbedService, Depends(get_service)]
TimingsDep = Annotated[Timings, Depends(get_timings)]

_bearer = HTTPBearer(auto_error=False, description="the server's API key, when it was started with one")


async def require_api_key(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries ``Authorization: Bearer <api_key>`` (no-op without a key)."""
    if settings.api_key is None:
        return
    expected = settings.api_key.get_secret_value().encode()
    given = credentials.credentials.encode() if credentials is not None else b""
    if credentials is None or not secrets.compare_digest(given, expected):
        reason = "missing" if credentials is None else "wrong"
        raise AuthenticationError(f"{reason} API key: send the header 'Authorization: Bearer <key>'")


async def require_utf8_query(request: Request) -> None:
    """422 naming the parameter and the byte when a query value's percent-decoded bytes are not UTF-8.

    Starlette decodes query values with ``errors="replace"``: ``?sentence=%ED%A0%80`` (a surrogate's
    bytes) would silently become three U+FFFD and be embedded as a sentence nobody sent.
    """
    query = request.scope.get("query_string", b"")
    for pair in query.split(b"&"):
        name, _, value = pair.partition(b"=")
        raw = unquote_to_bytes(value.replace(b"+", b" "))
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            shown = unquote_to_bytes(name.replace(b"+", b" ")).decode("utf-8", "backslashreplace")
            raise InvalidParameterError(
                f"{shown}: not valid UTF-8 text: byte 0x{raw[exc.start]:02X} at byte {exc.start} of the "
                "percent-decoded value; percent-encode the text's UTF-8 bytes"
            ) from None
