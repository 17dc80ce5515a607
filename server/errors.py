"""Errors as JSON: ``{"error": {"code": ..., "message": ..., "request_id": ...}}`` for every 4xx/5xx the server sends.

One handler (:func:`error_handler`) is registered for library errors
(:class:`ElmoCacheError`), request validation problems and HTTP exceptions, so a
client always gets the same shape whatever went wrong. This module is the only place
that knows HTTP statuses: the service, the batcher and the dependencies raise library
errors (:class:`~elmo_cache.errors.QueueFullError`, ...) and :data:`STATUS` maps them.

A client sees only messages written for it: those of refusals (:class:`ServiceError`,
:class:`InvalidParameterError`, validation). Anything else that escapes a route is the server's
problem: a 500 with a stable code (``cache_corrupt``, ``internal_error``) and the request id, while
the real message, which may name files, goes to the log under that id. Every 5xx also says
``Connection: close`` (added by :class:`~elmo_cache.server.middleware.RequestIdMiddleware`).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from elmo_cache.errors import (
    AuthenticationError,
    CacheFormatError,
    CacheNotFoundError,
    CacheTimeoutError,
    ElmoCacheError,
    InvalidParameterError,
    LimitExceededError,
    LiveTimeoutError,
    NotInCacheError,
    NotReadyError,
    QueueFullError,
    ServiceError,
)

__all__ = [
    "ErrorBody",
    "ErrorResponse",
    "STATUS",
    "error_handler",
    "error_responses",
    "HANDLED",
    "internal_error_body",
    "refusal_response",
    "request_id_of",
]

_log = logging.getLogger("elmo_cache.server")


class ErrorBody(BaseModel):
    code: str = Field(description="stable machine-readable reason, e.g. `not_in_cache`, `queue_full`")
    message: str = Field(description="what went wrong, naming the parameter and the valid choices")
    details: list[dict[str, Any]] | None = Field(None, description="per-field problems of a validation error")
    request_id: str | None = Field(
        None, description="this request's id (also the `X-Request-ID` header); the server log has details under it"
    )


class ErrorResponse(BaseModel):
    """The body of every error response."""

    error: ErrorBody


# Library error -> (HTTP status, code; None: the error's own ``code``), first match wins. The
# messages of these are written for clients; every other error reaching a route is a 500 whose
# message stays in the log.
STATUS: tuple[tuple[type[ElmoCacheError], int, str | None], ...] = (
    (QueueFullError, 429, None),
    (NotReadyError, 503, None),
    (LiveTimeoutError, 503, None),
    (CacheTimeoutError, 503, None),
    (LimitExceededError, 413, None),
    (NotInCacheError, 404, None),
    (AuthenticationError, 401, None),
    (InvalidParameterError, 422, "invalid_parameter"),
)

# Server-side failures while answering: the client learns the kind, never the message (it may
# name files of the cache). A cache file missing at request time is damage too, not a 404.
_INTERNAL: tuple[tuple[type[BaseException], str, str], ...] = (
    (CacheFormatError, "cache_corrupt", "the cache is damaged or unreadable"),
    (CacheNotFoundError, "cache_corrupt", "the cache is damaged or unreadable"),
)

# Headers that tell a client what to do next, per refusal.
_HEADERS: dict[type[ElmoCacheError], dict[str, str]] = {
    QueueFullError: {"Retry-After": "1"},
    LiveTimeoutError: {"Retry-After": "1"},
    CacheTimeoutError: {"Retry-After": "1"},
    AuthenticationError: {"WWW-Authenticate": "Bearer"},
}

_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    503: "unavailable",
}


def request_id_of(request: Request) -> str | None:
    """The id :class:`~elmo_cache.server.middleware.RequestIdMiddleware` gave this request."""
    return request.scope.get("state", {}).get("request_id")


def _json_error(
    status: int,
    code: str,
    message: str,
    *,
    request_id: str | None,
    details: Any = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    body["request_id"] = request_id
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def internal_error_body(exc: BaseException, request_id: str | None) -> dict[str, Any]:
    """The ``error`` object a client sees for a server-side failure; the caller logs ``exc`` in full."""
    code, text = next(((c, t) for cls, c, t in _INTERNAL if isinstance(exc, cls)), ("internal_error", "internal error"))
    message = f"{text}; the server log has the details under request id {request_id}"
    return {"code": code, "message": message, "request_id": request_id}


# What the `layers` and `mix` patterns of the schema accept, in words.
_PATTERN_MEANING = {
    "layers": "a list of layer ids: comma-separated whole numbers, e.g. '1,2' (ELMo's layers are 0, 1 and 2; "
    "a Transformer's 0 to its number of blocks)",
    "mix": "comma-separated numbers, one weight per layer of the model (ELMo: s0,s1,s2), e.g. '0.2,0.3,0.5' (plain "
    "decimals of at most 20 digits before and after the point, exponents of at most 2 digits)",
}


def _describe_validation(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    details, parts = [], []
    for error in exc.errors():
        loc = error.get("loc", ())
        where = ".".join(str(part) for part in loc)
        message = error.get("msg", "invalid")
        if error.get("type") == "string_pattern_mismatch":
            # The pattern itself says little to a person: say what it means.
            field = next((part for part in reversed(loc) if part in _PATTERN_MEANING), None)
            if field is not None:
                message = f"{error.get('input')!r} is not {_PATTERN_MEANING[field]}"
        details.append({"loc": where, "message": message})
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request", details


def refusal_response(exc: BaseException, request_id: str | None) -> JSONResponse | None:
    """The response of a library refusal in :data:`STATUS` (None for anything else); middleware that
    refuses before routing (a draining server) answers with it too."""
    for cls, status, own_code in STATUS:
        if isinstance(exc, cls):
            code = own_code or (exc.code if isinstance(exc, ServiceError) else "error")
            if status >= 500:
                _log.warning("request %s: %s %s: %s", request_id, status, code, exc)
            return _json_error(status, code, str(exc), request_id=request_id, headers=_HEADERS.get(cls))
    return None


async def error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Turn any handled exception into the uniform JSON error body."""
    request_id = request_id_of(request)
    if isinstance(exc, RequestValidationError):
        message, details = _describe_validation(exc)
        return _json_error(422, "validation_error", message, request_id=request_id, details=details)
    if isinstance(exc, StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot decode before parsing it as JSON (bytes that are not UTF-8):
            # text that is not UTF-8 is a 422 in every format, as a lone surrogate inside valid JSON is.
            message = f"the request body is not JSON text in UTF-8 ({message.rstrip('.')})"
            return _json_error(422, "validation_error", message, request_id=request_id)
        code = getattr(exc, "code", None) or _HTTP_CODES.get(exc.status_code, "http_error")
        headers = getattr(exc, "headers", None)
        return _json_error(exc.status_code, code, message, request_id=request_id, headers=headers)
    refusal = refusal_response(exc, request_id)
    if refusal is not None:
        return refusal
    body = internal_error_body(exc, request_id)
    _log.error("request %s failed (%s): %s", request_id, body["code"], exc, exc_info=exc)
    return JSONResponse({"error": body}, status_code=500)


HANDLED = (ElmoCacheError, RequestValidationError, StarletteHTTPException)
"""Exception classes :func:`error_handler` is registered for."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries documenting error statuses of a route."""
    texts = {
        401: "missing or wrong `Authorization: Bearer <key>` (only when the server has an API key)",
        404: "sentence not in the cache and no model loaded to encode it (`not_in_cache`)",
        413: "a limit was exceeded: `too_many_tokens` (tokens per sentence), `too_many_sentences` "
        "(sentences per request), `body_too_large` (request body bytes) or `limit_exceeded` (the answer's "
        "estimated size over `max_response_bytes`); see `GET /info`",
        422: "invalid parameter: a value the schema refuses or a body that is not JSON text in UTF-8 "
        "(`validation_error`), or a rule across "
        "parameters (`invalid_parameter`): text that is not UTF-8 (a lone surrogate), `layers` with `mix`, "
        "`gamma`/`softmax` without `mix`, a layer this "
        "cache lacks with no model loaded, or a mix/gamma whose result overflows the answer's dtype",
        429: "the live-encoding queue is full; retry later (`queue_full`)",
        500: "a server-side failure: `cache_corrupt` (the cache is damaged) or `internal_error`; the message "
        "gives only the request id, whose log entry has the details",
        503: "the server is still loading or shutting down (`not_ready`, `shutting_down`), a live encoding "
        "took longer than `live_timeout_s` (`live_timeout`), or a cache read or response write longer than "
        "`request_timeout_s` (`cache_timeout`); both with `Retry-After`",
    }
    return {status: {"model": ErrorResponse, "description": texts[status]} for status in statuses}
