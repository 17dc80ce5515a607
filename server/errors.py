"""Errors as JSON: ``{"error": {"code": ..., "message": ...}}`` for every 4xx/5xx the server sends.

One handler (:func:`error_handler`) is registered for library errors
(:class:`ElmoCacheError`), request validation problems and HTTP exceptions, so a
client always gets the same shape whatever went wrong. This module is the only place
that knows HTTP statuses: the service, the batcher and the dependencies raise library
errors (:class:`~elmo_cache.errors.QueueFullError`, ...) and :data:`STATUS` maps them.
"""

from __future__ import annotations

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
    ElmoCacheError,
    InvalidParameterError,
    LimitExceededError,
    LiveTimeoutError,
    ModelNotFoundError,
    NotInCacheError,
    NotReadyError,
    QueueFullError,
    ServiceError,
)

__all__ = ["ErrorBody", "ErrorResponse", "STATUS", "error_handler", "error_responses", "HANDLED"]


class ErrorBody(BaseModel):
    code: str = Field(description="stable machine-readable reason, e.g. `not_in_cache`, `queue_full`")
    message: str = Field(description="what went wrong, naming the parameter and the valid choices")
    details: list[dict[str, Any]] | None = Field(None, description="per-field problems of a validation error")


class ErrorResponse(BaseModel):
    """The body of every error response."""

    error: ErrorBody


# Library error -> (HTTP status, code; None: the error's own ``code``), first match wins. Other
# library errors that reach a route are user mistakes about parameters or data: 400.
STATUS: tuple[tuple[type[ElmoCacheError], int, str | None], ...] = (
    (QueueFullError, 429, None),
    (NotReadyError, 503, None),
    (LiveTimeoutError, 503, None),
    (LimitExceededError, 413, None),
    (NotInCacheError, 404, None),
    (AuthenticationError, 401, None),
    (InvalidParameterError, 422, "invalid_parameter"),
    (CacheNotFoundError, 404, "cache_not_found"),
    (ModelNotFoundError, 404, "model_not_found"),
    (CacheFormatError, 500, "cache_format"),
)

# Headers that tell a client what to do next, per refusal.
_HEADERS: dict[type[ElmoCacheError], dict[str, str]] = {
    QueueFullError: {"Retry-After": "1"},
    LiveTimeoutError: {"Retry-After": "1"},
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


def _json_error(status: int, code: str, message: str, *, details=None, headers=None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status, headers=headers)


def _describe_validation(exc: RequestValidationError) -> tuple[str, list[dict[str, Any]]]:
    details, parts = [], []
    for error in exc.errors():
        where = ".".join(str(part) for part in error.get("loc", ()))
        message = error.get("msg", "invalid")
        details.append({"loc": where, "message": message})
        parts.append(f"{where}: {message}" if where else message)
    return "; ".join(parts) or "invalid request", details


async def error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Turn any handled exception into the uniform JSON error body."""
    if isinstance(exc, RequestValidationError):
        message, details = _describe_validation(exc)
        return _json_error(422, "validation_error", message, details=details)
    if isinstance(exc, StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        code = getattr(exc, "code", None) or _HTTP_CODES.get(exc.status_code, "http_error")
        return _json_error(exc.status_code, code, message, headers=getattr(exc, "headers", None))
    for cls, status, code in STATUS:
        if isinstance(exc, cls):
            own = exc.code if isinstance(exc, ServiceError) else None
            return _json_error(status, code or own or "error", str(exc), headers=_HEADERS.get(cls))
    if isinstance(exc, ElmoCacheError):
        return _json_error(400, "bad_request", str(exc))
    return _json_error(500, "internal_error", f"internal error ({type(exc).__name__}): {exc}")


HANDLED = (ElmoCacheError, RequestValidationError, StarletteHTTPException)
"""Exception classes :func:`error_handler` is registered for."""


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` entries documenting error statuses of a route."""
    texts = {
        400: "the request body is not JSON text (e.g. invalid UTF-8) (`bad_request`)",
        401: "missing or wrong `Authorization: Bearer <key>` (only when the server has an API key)",
        404: "sentence not in the cache and no model loaded to encode it (`not_in_cache`)",
        413: "a limit was exceeded: `too_many_tokens` (tokens per sentence), `too_many_sentences` "
        "(sentences per request) or `body_too_large` (request body bytes); see `GET /info`",
        422: "invalid parameter: unknown or unavailable layer, bad mix weights, `layers` with `mix`, "
        "unknown format (`invalid_parameter` / `validation_error`)",
        429: "the live-encoding queue is full; retry later (`queue_full`)",
        503: "the server is still loading or shutting down (`not_ready`, `shutting_down`), or a live encoding "
        "took longer than `live_timeout_s` (`live_timeout`, with `Retry-After`)",
    }
    return {status: {"model": ErrorResponse, "description": texts[status]} for status in statuses}
