"""Micro-batching of live encodings: concurrent requests share one encoder call.

Requests enter a bounded :class:`asyncio.Queue`; when it is full the request is
refused at once (:class:`~elmo_cache.errors.QueueFullError`, a 429) rather than left
waiting. One worker task takes the oldest request, then keeps adding queued requests
until the batch holds ``batch_tokens`` tokens or ``max_wait`` has passed since it started
gathering, and runs the encoder in a dedicated thread so the event loop keeps answering cache hits meanwhile.
A request that waits longer than ``timeout_s`` in all (queued and encoding) gets
:class:`~elmo_cache.errors.LiveTimeoutError` (a 503) and is dropped from its batch
when that has not started yet; the worker itself is never interrupted.
While the encoder runs, new requests pile up and form the next batch, so under
load batches grow by themselves and the encoder is never idle.

When a batch leaves the queue empty, the encoder thread hands the C heap's free pages back to the system
(:func:`~elmo_cache.builder.alloc.trim_heap`, a few ms): each batch frees buffers of its own sizes, and without
that a server's resident memory crept up burst after burst (bundled model, 30 bursts of 8-60 distinct misses:
RssAnon 276 -> 343 MiB, against 231-273 MiB trimmed; ``benchmarks/bench_server_heap.py``). Never between two
batches of a burst, where the pages would only be faulted in again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from elmo_cache.builder.alloc import trim_heap
from elmo_cache.errors import LiveTimeoutError, NotReadyError, QueueFullError
from elmo_cache.server.metrics import Metrics

__all__ = ["LiveBatcher"]

EncodeFn = Callable[[list[list[str]]], Sequence[np.ndarray]]


@dataclass(eq=False)
class _Job:
    # Non-empty token lists of one request, in request order.
    sentences: list[list[str]]
    # Turns the encoder's (3, n_tokens, dim) float32 arrays into the request's answer; runs in the
    # encoder thread so layer selection, mixing and casting never block the event loop.
    finish: Callable[[list[np.ndarray]], Any]
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)
    # Seconds spent queued and encoding, reported back in Server-Timing.
    waited: float = 0.0
    encoded: float = 0.0

    @property
    def n_tokens(self) -> int:
        return sum(len(tokens) for tokens in self.sentences)


@dataclass
class _Failed:
    """What a job's ``finish`` raised, carried back to that job's request alone."""

    error: Exception


class LiveBatcher:
    """Gathers live-encoding requests into encoder batches (see the module docstring)."""

    def __init__(
        self,
        encode: EncodeFn,
        *,
        metrics: Metrics,
        batch_tokens: int = 4096,
        max_wait_s: float = 0.005,
        queue_size: int = 64,
        timeout_s: float | None = None,
    ) -> None:
        self._encode = encode
        # Longest wait of one request for its answer (None or 0: no limit).
        self.timeout_s = timeout_s or None
        self._metrics = metrics
        self.batch_tokens = batch_tokens
        self.max_wait_s = max_wait_s
        self.queue_size = queue_size
        self._queue: asyncio.Queue[_Job] | None = None
        self._arrived: asyncio.Event | None = None
        self._carry: _Job | None = None
        self._worker: asyncio.Task | None = None
        # One thread: encoder calls never overlap (they would only fight over the same cores / GPU).
        self._executor: ThreadPoolExecutor | None = None

    @property
    def running(self) -> bool:
        """Whether the worker is alive (``GET /health`` reports it)."""
        return self._worker is not None and not self._worker.done()

    async def start(self) -> None:
        """Start the worker on the running event loop."""
        self._queue = asyncio.Queue(maxsize=self.queue_size)
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elmo-cache-encoder")
        self._worker = asyncio.create_task(self._run(), name="elmo-cache-batcher")

    async def close(self) -> None:
        """Stop the worker; requests still waiting get :class:`~elmo_cache.errors.NotReadyError` (shutting down)."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None
        pending = [self._carry] if self._carry else []
        while self._queue is not None and not self._queue.empty():
            pending.append(self._queue.get_nowait())
        self._carry = None
        for job in pending:
            if not job.future.done():
                job.future.set_exception(NotReadyError("the server is shutting down", code="shutting_down"))
        self._metrics.queue_depth.set(0)
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    async def submit(self, sentences: list[list[str]], finish: Callable[[list[np.ndarray]], Any]) -> tuple[Any, _Job]:
        """Queue ``sentences`` (non-empty token lists) for the encoder; returns ``finish(arrays)`` and the job.

        Raises :class:`~elmo_cache.errors.QueueFullError` at once when ``queue_size`` requests are already waiting,
        :class:`~elmo_cache.errors.LiveTimeoutError` when the answer takes longer than ``timeout_s``.
        """
        if self._queue is None or self._arrived is None or not self.running:
            raise NotReadyError("live encoding is not running (the server is starting or stopping)")
        job = _Job(sentences=sentences, finish=finish, future=asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self._metrics.rejected.inc()
            raise QueueFullError(
                f"{self.queue_size} live requests are already waiting for the encoder (queue_size); retry later"
            ) from None
        self._metrics.queue_depth.set(self._queue.qsize())
        self._arrived.set()
        # On timeout the job's future is cancelled: the worker skips the job, or drops its result
        # when its batch is already encoding; either way the worker and later requests carry on.
        deadline = asyncio.timeout(self.timeout_s)
        try:
            async with deadline:
                result = await job.future
        except TimeoutError:
            if not deadline.expired():  # the encoder's own error, not this deadline
                raise
            self._metrics.timeouts.inc()
            raise LiveTimeoutError(
                f"the live encoding took longer than {self.timeout_s:g} s (live_timeout_s), queue included; "
                "the server is busy: retry later, or send fewer or shorter sentences"
            ) from None
        return result, job

    async def _next_batch(self) -> list[_Job]:
        assert self._queue is not None and self._arrived is not None
        first = self._carry or await self._queue.get()
        self._carry = None
        jobs, tokens = [first], first.n_tokens
        deadline = time.perf_counter() + self.max_wait_s
        while tokens < self.batch_tokens:
            if self._queue.empty():
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                # Waiting on an Event (not on queue.get) so a timeout can never swallow a job.
                self._arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                continue
            job = self._queue.get_nowait()
            if tokens + job.n_tokens > self.batch_tokens:
                self._carry = job  # first of the next batch, keeps its place in line
                break
            jobs.append(job)
            tokens += job.n_tokens
        self._metrics.queue_depth.set(self._queue.qsize())
        return jobs

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._next_batch()
            jobs = [job for job in jobs if not job.future.done()]  # clients that gave up
            if not jobs:
                continue
            started = time.perf_counter()
            for job in jobs:
                job.waited = started - job.enqueued
                self._metrics.queue_wait.observe(job.waited)
            self._metrics.batch_requests.observe(len(jobs))
            try:
                results = await loop.run_in_executor(self._executor, self._encode_jobs, jobs)
            except asyncio.CancelledError:
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(NotReadyError("the server is shutting down", code="shutting_down"))
                raise
            except Exception as exc:  # the encoder failed: every request of the batch learns why
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            for job, result in zip(jobs, results):
                if job.future.done():
                    continue
                if isinstance(result, _Failed):
                    job.future.set_exception(result.error)
                else:
                    job.future.set_result(result)
            if self._carry is None and self._queue is not None and self._queue.empty():
                await loop.run_in_executor(self._executor, trim_heap)

    def _encode_jobs(self, jobs: list[_Job]) -> list[Any]:
        """Runs in the encoder thread: encode every sentence of ``jobs`` in budget-sized slices."""
        flat = [tokens for job in jobs for tokens in job.sentences]
        arrays: list[np.ndarray] = []
        started = time.perf_counter()
        with torch.inference_mode():
            for chunk in _slices(flat, self.batch_tokens):
                t0 = time.perf_counter()
                arrays.extend(self._encode(chunk))
                n_tokens = sum(len(tokens) for tokens in chunk)
                self._metrics.encode_seconds.observe(time.perf_counter() - t0)
                self._metrics.batch_sentences.observe(len(chunk))
                self._metrics.batch_tokens.observe(n_tokens)
                self._metrics.live_sentences.inc(len(chunk))
                self._metrics.live_tokens.inc(n_tokens)
            encoded = time.perf_counter() - started
            results, start = [], 0
            for job in jobs:
                stop = start + len(job.sentences)
                job.encoded = encoded
                # One request's bad answer (e.g. a mix that overflows) fails that request only.
                try:
                    results.append(job.finish(arrays[start:stop]))
                except Exception as exc:
                    results.append(_Failed(exc))
                start = stop
        return results


def _slices(sentences: list[list[str]], budget: int) -> list[list[list[str]]]:
    """Consecutive groups of at most ``budget`` tokens (a longer single sentence forms its own group)."""
    groups: list[list[list[str]]] = []
    current: list[list[str]] = []
    tokens = 0
    for sentence in sentences:
        if current and tokens + len(sentence) > budget:
            groups.append(current)
            current, tokens = [], 0
        current.append(sentence)
        tokens += len(sentence)
    if current:
        groups.append(current)
    return groups
