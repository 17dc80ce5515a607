"""Prometheus metrics of one app, in a registry of its own.

A per-app :class:`CollectorRegistry` (rather than the global default) lets several
apps live in one process, as tests do, without "duplicated timeseries" errors.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_SENTENCE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_BATCH_TOKEN_BUCKETS = (8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384, 65536)


class Metrics:
    """Every counter, gauge and histogram the server exports on ``GET /metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "elmo_cache_requests", "HTTP requests answered", ["method", "route", "status"], registry=r
        )
        self.latency = Histogram(
            "elmo_cache_request_seconds",
            "Time to answer an HTTP request",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_hits = Counter("elmo_cache_cache_hits", "Sentences answered from the cache", registry=r)
        self.cache_misses = Counter(
            "elmo_cache_cache_misses",
            "Sentences a loaded cache could not answer (absent, or not in the asked form)",
            registry=r,
        )
        self.live_sentences = Counter("elmo_cache_live_sentences", "Sentences encoded live", registry=r)
        self.live_tokens = Counter("elmo_cache_live_tokens", "Tokens encoded live", registry=r)
        self.batch_sentences = Histogram(
            "elmo_cache_live_batch_sentences",
            "Sentences per live encoder call",
            buckets=_BATCH_SENTENCE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "elmo_cache_live_batch_tokens", "Tokens per live encoder call", buckets=_BATCH_TOKEN_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "elmo_cache_live_batch_requests",
            "Requests merged into one live batch",
            buckets=_BATCH_SENTENCE_BUCKETS,
            registry=r,
        )
        self.encode_seconds = Histogram(
            "elmo_cache_live_encode_seconds", "Time of one live encoder call", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.queue_wait = Histogram(
            "elmo_cache_live_queue_wait_seconds",
            "Time a live request waited before its batch started",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("elmo_cache_live_queue_depth", "Live requests waiting for the encoder", registry=r)
        self.rejected = Counter(
            "elmo_cache_live_rejected", "Live requests refused with 429 because the queue was full", registry=r
        )
        self.timeouts = Counter(
            "elmo_cache_live_timeouts",
            "Live requests answered 503 because their encoding took longer than live_timeout_s",
            registry=r,
        )

        self.cache_reopened = Counter(
            "elmo_cache_cache_reopened",
            "Times the cache was reopened because a new generation was published at its path (build --update)",
            registry=r,
        )
        self.writeback_hits = Counter(
            "elmo_cache_writeback_hits",
            "Sentences answered from the write-back journal (counted in cache_hits too)",
            registry=r,
        )
        self.writeback_written = Counter(
            "elmo_cache_writeback_written",
            "Sentences written back: encoded live, then written and fsynced to the journal",
            registry=r,
        )
        self.writeback_failures = Counter(
            "elmo_cache_writeback_failures",
            "Sentences whose write-back failed (a disk error, e.g. full): answered, not kept",
            registry=r,
        )
        self.writeback_full = Counter(
            "elmo_cache_writeback_full",
            "Sentences not written back because the journal reached write_back_max_bytes: answered, not kept",
            registry=r,
        )
        self.writeback_shared = Counter(
            "elmo_cache_writeback_shared",
            "Misses answered by another request's encoding of the same sentence, already in flight",
            registry=r,
        )
        self.writeback_bytes = Gauge("elmo_cache_writeback_bytes", "Size of the write-back journal", registry=r)
        self.writeback_commit_seconds = Histogram(
            "elmo_cache_writeback_commit_seconds",
            "Time of one write-back commit (write and fsync)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
