"""ASGI middleware: request ids and 5xx hygiene, ``Allow``/``OPTIONS``, request body limit, timing and metrics.

All are plain ASGI (not ``BaseHTTPMiddleware``) so responses stream through
untouched and the overhead per request stays in microseconds.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid

from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from elmo_cache.errors import NotReadyError
from elmo_cache.server.errors import internal_error_body, refusal_response
from elmo_cache.server.metrics import Metrics
from elmo_cache.server.service import Timings

__all__ = [
    "AllowMiddleware",
    "BodyLimitMiddleware",
    "BodyTooLarge",
    "Drain",
    "DrainMiddleware",
    "RequestIdMiddleware",
    "TimingMiddleware",
]

_log = logging.getLogger("elmo_cache.server")

# Methods an ``Allow`` header may list (OPTIONS is answered here for every routed path).
_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")

# An incoming X-Request-ID is kept only when it is short and plain (it goes into logs and headers).
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")


class RequestIdMiddleware:
    """Gives every request an id, echoed as ``X-Request-ID``; makes every 5xx close its connection.

    The outermost middleware, so it also catches what nothing else did: an exception escaping
    the app becomes a 500 with a stable code and the request id (the exception, with its
    traceback, goes to the log) instead of Starlette's plain-text 500 followed by uvicorn
    dropping the connection under a client that may already be reusing it.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for name, value in scope.get("headers", ()) if name == b"x-request-id"), b"")
        text = given.decode("latin-1")
        request_id = text if _REQUEST_ID.fullmatch(text) else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        started = False

        async def tagged_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode()))
                # A client must not send its next request on this connection: the server may be in
                # trouble, and after an exception uvicorn closes the connection anyway.
                if message["status"] >= 500 and not any(k.lower() == b"connection" for k, _ in headers):
                    headers.append((b"connection", b"close"))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, tagged_send)
        except Exception as exc:
            _log.error("request %s failed: %s", request_id, exc, exc_info=exc)
            if started:
                raise  # half a response is out: only dropping the connection can tell the client
            body = json.dumps({"error": internal_error_body(exc, request_id)}).encode()
            await tagged_send(
                {"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]}
            )
            await tagged_send({"type": "http.response.body", "body": body})


class Drain:
    """Whether the server is draining (told to stop) and how many requests it is still answering.

    Written by :class:`DrainMiddleware` in the event loop and read by the server's shutdown
    (``elmo_cache.server.shutdown``), which stops listening once ``in_flight`` reaches 0.
    """

    def __init__(self) -> None:
        self.draining = False
        self.in_flight = 0


class DrainMiddleware:
    """While draining, every new request is 503 ``shutting_down`` with ``Connection: close``; the
    others are counted while they run.

    A client (or load balancer) learns the server is going away from an answer it can read, and
    does not send its next request on this connection, while the requests in flight finish.
    """

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            refusal = NotReadyError(
                "the server is shutting down; send the request again elsewhere", code="shutting_down"
            )
            response = refusal_response(refusal, scope.get("state", {}).get("request_id"))
            assert response is not None  # NotReadyError is in errors.STATUS
            response.headers["connection"] = "close"
            await response(scope, receive, send)
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


class AllowMiddleware:
    """``OPTIONS`` answers with every method of the path, and a 405's ``Allow`` lists them all.

    Starlette stops at the first route whose path matches, so with GET and POST on ``/embed`` as
    two routes it answered ``Allow: GET`` to OPTIONS and to a wrong method.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @staticmethod
    def _methods(scope: Scope) -> list[str]:
        """Every method some route answers at this path (asked through ``Route.matches``, public API)."""
        routes = getattr(scope.get("app"), "routes", ())
        found = {
            method
            for method in _METHODS
            if any(route.matches({**scope, "method": method})[0] is Match.FULL for route in routes)
        }
        return sorted(found | {"OPTIONS"}) if found else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS":
            methods = self._methods(scope)
            if methods:
                allow = ", ".join(methods).encode()
                await send({"type": "http.response.start", "status": 204, "headers": [(b"allow", allow)]})
                await send({"type": "http.response.body", "body": b""})
                return

        async def allow_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                allow = ", ".join(self._methods(scope)).encode()
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                message = {**message, "headers": [*headers, (b"allow", allow)]}
            await send(message)

        await self.app(scope, receive, allow_send)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes the limit; FastAPI lets HTTPExceptions through."""

    code = "body_too_large"


# A declared body over the limit but at most this big is still read (and thrown away) after the 413,
# by uvicorn, which discards what follows a complete response: a client that writes its whole body
# before reading (http.client, requests, curl without Expect) then reads the 413 instead of a reset
# from a connection closed under its upload. Beyond it, reading to be polite costs more than a reset.
_DISCARD_BYTES = 64 * 1024 * 1024


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, before they are parsed.

    A declared ``Content-Length`` over the limit is refused without giving the app any of it; a body
    without one (chunked) is counted while it is read. Either way the 413 keeps the connection open
    while the rest of the body arrives and is discarded (up to ``_DISCARD_BYTES`` when declared).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self, size: str) -> str:
        return f"request body of {size} bytes; the limit is {self.max_bytes} bytes (max_body_bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.max_bytes:
                    request_id = scope.get("state", {}).get("request_id")
                    error = {
                        "code": "body_too_large",
                        "message": self._message(str(declared)),
                        "request_id": request_id,
                    }
                    body = json.dumps({"error": error})
                    headers = [(b"content-type", b"application/json")]
                    if declared > _DISCARD_BYTES:
                        headers.append((b"connection", b"close"))
                    await send({"type": "http.response.start", "status": 413, "headers": headers})
                    await send({"type": "http.response.body", "body": body.encode()})
                    return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(413, self._message(f"more than {self.max_bytes}"))
            return message

        await self.app(scope, limited_receive, send)


class TimingMiddleware:
    """Adds ``X-Process-Time`` and ``Server-Timing`` headers and records request metrics.

    Routes put per-stage times (cache, queue, encode, serialize) into
    ``scope["state"]["timings"]``; they appear as ``Server-Timing`` entries.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        timings = Timings()
        scope.setdefault("state", {})["timings"] = timings
        status = 500

        async def timed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                elapsed = time.perf_counter() - started
                entries = [f"{name};dur={seconds * 1000:.3f}" for name, seconds in timings.parts.items()]
                entries.append(f"total;dur={elapsed * 1000:.3f}")
                headers = list(message.get("headers", []))
                headers.append((b"x-process-time", f"{elapsed:.6f}".encode()))
                headers.append((b"server-timing", ", ".join(entries).encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            route = scope.get("route")
            # The route template, not the raw path, keeps label cardinality bounded.
            label = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            self.metrics.requests.labels(method, label, str(status)).inc()
            self.metrics.latency.labels(method, label).observe(time.perf_counter() - started)
