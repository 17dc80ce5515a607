"""ASGI middleware: request body limit, timing headers and request metrics.

Both are plain ASGI (not ``BaseHTTPMiddleware``) so responses stream through
untouched and the overhead per request stays in microseconds.
"""

from __future__ import annotations

import json
import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from elmo_cache.server.metrics import Metrics
from elmo_cache.server.service import Timings

__all__ = ["BodyLimitMiddleware", "TimingMiddleware", "BodyTooLarge"]


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a body passes the limit; FastAPI lets HTTPExceptions through."""

    code = "body_too_large"


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413, before they are parsed.

    A declared ``Content-Length`` over the limit is refused without reading; a body
    without one (chunked) is counted while it is read.
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
                    body = json.dumps({"error": {"code": "body_too_large", "message": self._message(str(declared))}})
                    await send(
                        {
                            "type": "http.response.start",
                            "status": 413,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
                        }
                    )
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
