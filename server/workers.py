"""A bounded pool of daemon threads for the blocking parts of a request: cache reads and response writing.

Why not ``asyncio.to_thread`` / ``ThreadPoolExecutor``: their threads are joined when the
interpreter exits (and ``asyncio.run`` waits for the default executor), so one read stuck on a
dead disk or a FIFO would keep the process alive after SIGTERM. These threads are daemons: a
stuck one is abandoned at exit. Waiting is bounded too: :meth:`ReadPool.run` gives up after
``timeout_s`` (:class:`~elmo_cache.errors.CacheTimeoutError`, a 503) and the event loop, ``/health``
and live requests never wait for a pool thread.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from elmo_cache.errors import CacheTimeoutError, NotReadyError

__all__ = ["ReadPool"]

T = TypeVar("T")

_STOP = None


class ReadPool:
    """``threads`` daemon threads running submitted callables in order."""

    def __init__(self, threads: int, *, name: str = "elmo-cache-read") -> None:
        self._jobs: queue.SimpleQueue[tuple[Future, Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._busy = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    @property
    def busy(self) -> int:
        """Threads running a job now (stuck ones included)."""
        with self._lock:
            return self._busy

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is _STOP:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():  # the request gave up before the job started
                continue
            with self._lock:
                self._busy += 1
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the awaiting request, which maps it to a response
                future.set_exception(exc)
            else:
                future.set_result(result)
            finally:
                with self._lock:
                    self._busy -= 1

    async def run(self, timeout_s: float | None, what: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a pool thread; :class:`CacheTimeoutError` after ``timeout_s`` (None: no limit).

        On timeout the request goes on without the thread: a job not started yet is dropped, a
        running one finishes (or stays stuck) on its own and its result is discarded.
        """
        if self._closed:
            raise NotReadyError("the server is shutting down", code="shutting_down")
        future: Future = Future()
        self._jobs.put((future, fn, args))
        deadline = asyncio.timeout(timeout_s)
        try:
            async with deadline:
                return await asyncio.wrap_future(future)
        except TimeoutError:
            if not deadline.expired():
                raise  # the job's own TimeoutError, not this deadline
            raise CacheTimeoutError(
                f"{what} took longer than {timeout_s:g} s (request_timeout_s); the storage is slow or stuck: "
                "retry later"
            ) from None

    def close(self) -> None:
        """Stop idle threads; stuck ones are daemons and do not hold the process."""
        self._closed = True
        for _ in self._threads:
            self._jobs.put(_STOP)
