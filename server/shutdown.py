"""Shutting down without dropping requests: on SIGTERM/SIGINT, drain, then stop.

uvicorn's own shutdown closes the listener at once, so a request arriving during the drain met a
refused connection, or a keep-alive connection closed under it. Here the first signal only sets
the app's :class:`~elmo_cache.server.middleware.Drain`: the listener stays open, new requests get
503 ``shutting_down`` with ``Connection: close`` (a readable answer a load balancer acts on), and
the requests in flight go on. Once none is left, or ``graceful_timeout_s`` has passed, uvicorn's
shutdown runs: the listener closes (later connections are refused), what is still running is
cancelled, and the process exits 0. A second signal skips the rest of the drain (uvicorn's own
handling: it stops, and re-raises the signal once stopped).
"""

from __future__ import annotations

import math
import time
from types import FrameType

import uvicorn

from elmo_cache.server.middleware import Drain

__all__ = ["DrainingServer"]


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose first SIGTERM/SIGINT drains ``drain`` for up to ``timeout_s`` seconds."""

    def __init__(self, config: uvicorn.Config, drain: Drain, timeout_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.timeout_s = timeout_s
        self._deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._deadline is None and not self.should_exit:
            # Flags only: a signal handler runs between any two bytecodes of the event loop. Not
            # recorded as uvicorn's captured signal either: a completed drain is a clean exit (0).
            self._deadline = time.monotonic() + self.timeout_s
            self.drain.draining = True
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        # uvicorn calls this every 0.1 s from its main loop; should_exit starts its shutdown.
        if self._deadline is not None and not self.should_exit:
            left = self._deadline - time.monotonic()
            if self.drain.in_flight == 0 or left <= 0:
                # The drain used part of the budget: uvicorn's wait for what is left gets the rest.
                self.config.timeout_graceful_shutdown = max(0, math.ceil(left))
                self.should_exit = True
        return await super().on_tick(counter)
