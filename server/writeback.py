"""``serve --write-back``: the live encodings of misses kept beside the cache, and served as hits from then on.

Every miss is encoded alone, as a build of a one-line corpus would encode it
(:class:`~elmo_cache.builder.writeback.AloneEncoder`), so its answer, and every later hit on it, holds the
bytes a fresh build of that sentence holds; the stored rows go to the cache's journal
(:mod:`elmo_cache.store.journal`), committed by its writer thread every ``write_back_commit_ms``. A
write that fails (a full disk) or a journal at its ``write_back_max_bytes`` never fails the request: the
answer is served, the sentence is not kept, and the metrics count it. Concurrent misses of one sentence
share one encoding (``EmbedService``'s single flight).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import InvalidParameterError
from elmo_cache.reader.writeback import open_journal
from elmo_cache.store.format import TEXT_ENCODING
from elmo_cache.store.journal import journal_path
from elmo_cache.text.tokenize import sentence_key

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.reader.cache import Cache
    from elmo_cache.server.metrics import Metrics
    from elmo_cache.server.settings import Settings

__all__ = ["WriteBack", "check_write_back", "key_of"]

_log = logging.getLogger("elmo_cache.server")


def key_of(tokens: list[str]) -> bytes:
    """A sentence's key in the journal: its sentence key (the cache's), UTF-8."""
    return sentence_key(tokens).encode(*TEXT_ENCODING)


def check_write_back(cache: Cache | None, encoder: Encoder | None, why_no_model: str | None = None) -> None:
    """Refuse ``--write-back`` where the kept vectors could not be the cache's own (InvalidParameterError).

    The model must be the one that built the cache (:func:`elmo_cache.server.app.check_compatible` has
    compared them: weights, options, initial state, precision)."""
    if cache is None:
        raise InvalidParameterError("write_back: --write-back keeps misses in a cache: name the cache to serve")
    if encoder is None:
        raise InvalidParameterError(
            f"write_back: --write-back needs the model that built {cache.path} to encode misses, and none is loaded"
            + (f" ({why_no_model})" if why_no_model else "")
            + "; pass --model, or serve without --write-back"
        )


class WriteBack:
    """The journal of one served cache and the encoder that fills it (see the module docstring)."""

    def __init__(self, cache: Cache, encoder: Encoder, settings: Settings) -> None:
        from elmo_cache.builder.writeback import AloneEncoder
        from elmo_cache.encoder.batch_free import rows_batch_free

        check_write_back(cache, encoder)
        self.cache = cache
        self.alone = AloneEncoder.for_cache(encoder, cache)
        # Checked now (~0.4 s with the bundled model on a CPU), not in the first burst of misses it decides on.
        self.shared_batches = rows_batch_free(encoder)
        _log.info(
            "write-back: %s",
            "rows are batch-free on this device: concurrent misses share encoder batches"
            if self.shared_batches
            else "rows depend on their batch on this device: each miss is encoded alone",
        )
        self.metrics: Metrics | None = None
        self.journal = open_journal(
            cache,
            journal_path(settings.cache_path if settings.cache_path is not None else cache.path),
            writable=True,
            max_bytes=settings.write_back_max_bytes,
            commit_ms=settings.write_back_commit_ms,
            listener=self._event,
        )
        self._full_logged = False

    def attach(self, metrics: Metrics) -> None:
        """Report to ``metrics`` from now on."""
        self.metrics = metrics
        metrics.writeback_bytes.set_function(lambda: self.journal.size)

    def _event(self, event: str, value: float) -> None:
        metrics = self.metrics
        if event == "full" and not self._full_logged:
            self._full_logged = True
            _log.warning(
                "write-back journal %s reached --write-back-max-bytes (%d bytes): new misses are served but no "
                "longer kept (counted in elmo_cache_writeback_full_total)",
                self.journal.path,
                self.journal.max_bytes,
            )
        if metrics is None:
            return
        if event == "written":
            metrics.writeback_written.inc(value)
        elif event == "failed":
            metrics.writeback_failures.inc(value)
        elif event == "full":
            metrics.writeback_full.inc(value)
        elif event == "commit_seconds":
            metrics.writeback_commit_seconds.observe(value)

    def encode(self, sentences: list[list[str]]) -> list[np.ndarray]:
        """The live batcher's encoder: each sentence as a build of it alone stores it (in one batch where rows are
        batch-free: :meth:`AloneEncoder.encode_many`), kept in the journal; returns the float32 outputs
        ``(n_layers, n_tokens, dim)`` the answers are made from. Runs in the encoder thread."""
        out = []
        for tokens, alone in zip(sentences, self.alone.encode_many(sentences)):
            if alone.finite:  # a build refuses what would not read back finite; the answer path refuses it too
                self._keep(tokens, alone.rows, alone.pooled)
            out.append(alone.acts)
        return out

    def _keep(self, tokens: list[str], rows: np.ndarray, pooled: np.ndarray | None) -> None:
        try:
            self.journal.add(key_of(tokens), rows, pooled)
        except Exception:  # never the request's failure: it is answered anyway
            _log.exception("write-back journal %s: queueing a sentence failed", self.journal.path)
            if self.metrics is not None:
                self.metrics.writeback_failures.inc()

    def has(self, tokens: list[str]) -> bool:
        """Whether the sentence is written back (or queued): a dictionary lookup, no disk."""
        return key_of(tokens) in self.journal

    def lookup(self, tokens: list[str]) -> tuple[np.ndarray, np.ndarray | None] | None:
        """A written-back sentence as ``cache[i]`` gives a cached one, with its stored pooled vector (None without
        one), or None. May read the disk: call it from a pool thread."""
        found = self.journal.get(key_of(tokens))
        if found is None:
            return None
        rows, pooled = found
        # A --pool-only cache's records hold its pooled vector alone (rows of no values): only a request its pooled
        # vectors answer looks them up (Service._pool_only_miss).
        return (rows if self.cache.pool_only else self.cache.sentence_from_rows(rows)), pooled

    def close(self) -> None:
        """Commit what is queued and close the journal."""
        self.journal.close()

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` shows of it."""
        return {
            "journal": str(self.journal.path),
            "sentences": len(self.journal),
            "bytes": self.journal.size,
            "max_bytes": self.journal.max_bytes,
            "commit_ms": self.journal.commit_s * 1000,
            # Whether concurrent misses share encoder batches (rows batch-free on this device), else each alone.
            "shared_batches": self.shared_batches,
        }
