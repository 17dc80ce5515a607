"""What ``/embed`` does, without HTTP: resolve the asked output, answer from the cache, encode the rest live.

What a request asks for is a :class:`~elmo_cache.rows.selection.Selection`: a subset of layers or one fixed mix. With
no ``layers`` and no ``mix`` it is what the cache stores (its layers, or its mix),
or all three layers without a cache, so cache hits and live answers of one server
always have the same shape and dtype:

* a layered cache answers any subset of its stored layers, and any mix whose
  non-zero weights fall on stored layers (mixed in float32, then cast);
* a mixed cache answers only its own mix (same effective weights and gamma);
* anything else is encoded live when a model is loaded, and is a 422 listing
  what the cache holds when none is;
* the answer's dtype is the cache's dtype (live answers are cast to it), or
  float32 without a cache or with a quantised one (whose live answers are
  quantised and decoded as its rows are, so they equal its hits).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import (
    CacheFormatError,
    CacheReplacedError,
    ElmoCacheError,
    InvalidParameterError,
    LimitExceededError,
    NotInCacheError,
    NotReadyError,
)
from elmo_cache.model.identity import identity_layers
from elmo_cache.rows.selection import MixSpec, Selection
from elmo_cache.server.batcher import LiveBatcher
from elmo_cache.server.metrics import Metrics
from elmo_cache.server.pooled import (
    pool_only_refusal,
    pooled_cached,
    pooled_empty,
    pooled_live,
    pooled_written_back,
    stored_pool_answers,
)
from elmo_cache.server.settings import Settings
from elmo_cache.server.workers import ReadPool
from elmo_cache.server.writeback import key_of
from elmo_cache.store.journal import encoding_identity
from elmo_cache.text.tokenize import PTB, WHITESPACE, sentence_key, tokenizer_for

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.reader.cache import Cache
    from elmo_cache.server.writeback import WriteBack

__all__ = ["Embedding", "EmbedService", "Timings", "REOPEN_CHECK_S"]

_log = logging.getLogger("elmo_cache.server")

REOPEN_CHECK_S = 1.0
"""How often (seconds, at most) a lookup checks whether a new generation of the cache was published at its path."""


def _generation(path: Any) -> tuple[int, int] | None:
    """Which file or folder ``path`` names now (device, inode), or None when nothing is there (mid-publish)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@dataclass
class Embedding:
    """The answer for one sentence."""

    tokens: list[str]
    vectors: np.ndarray
    source: str  # "cache" or "live"
    pool: str | None = None  # the pool of a pooled answer (one vector for the sentence), else None


@dataclass
class Timings:
    """Seconds spent per stage of one request, sent back as ``Server-Timing``."""

    parts: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds


def _check_utf8(text: str, where: str) -> None:
    """:class:`InvalidParameterError` naming ``where`` and the position when ``text`` has no UTF-8 form.

    JSON may escape a lone surrogate (``"\\ud800"``) and Python decodes it into a string that no cache
    key, hash, response body or header can encode: checked once here, before any of them, so every
    format answers 422 instead of a 500 from whichever encoder meets it first.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise InvalidParameterError(
            f"{where}: not valid UTF-8 text: a lone surrogate U+{ord(bad):04X} at character {exc.start}; "
            "send text as UTF-8 (a JSON \\uD83D\\uDE00 pair is one character, a lone \\uD800 is none)"
        ) from None


def _tokenization(cache: Any, encoder: Any) -> str:
    """The tokenisation text requests get: the cache's, else the model's own (PTB for the bundled model)."""
    if cache is not None:
        return str(getattr(cache, "metadata", {}).get("tokenization", WHITESPACE))
    from elmo_cache.model.hub import BUNDLED

    return PTB if (getattr(encoder, "identity", None) or {}).get("name") == BUNDLED else WHITESPACE


def served_layers(encoder: Encoder | None, cache: Any) -> int:
    """How many layers the served model gives (ELMo's 3, a Transformer's L + 1): the live encoder's, else the
    model that built the cache."""
    built_with = encoder.identity if encoder is not None else (cache.metadata if cache is not None else {}).get("model")
    return identity_layers(built_with)


class EmbedService:
    """Answers embedding requests from a cache and/or a live encoder (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        cache: Cache | None = None,
        encoder: Encoder | None = None,
        batcher: LiveBatcher | None = None,
        pool: ReadPool | None = None,
        writeback: WriteBack | None = None,
    ) -> None:
        if cache is None and encoder is None:
            raise InvalidParameterError("the server needs a cache, a model, or both")
        self.settings = settings
        self.metrics = metrics
        self.cache = cache
        # Where the cache lives and which file or folder it was (device, inode): a build --update publishes a new
        # generation there, which _current_cache opens.
        self._cache_path = settings.cache_path if settings.cache_path is not None else getattr(cache, "path", None)
        self._generation = None if cache is None or self._cache_path is None else _generation(self._cache_path)
        self._checked_at = time.monotonic()
        self._reopen_lock = threading.Lock()
        self._refused: tuple[int, int] | None = None
        self.encoder = encoder
        self.batcher = batcher
        # serve --write-back: misses kept in the cache's journal, and the encodings in flight by sentence key.
        self.writeback = writeback
        self._in_flight: dict[bytes, asyncio.Future] = {}
        # Cache reads run here, never in the event loop: a page may sit on a slow or dead disk.
        self.pool = pool if pool is not None else ReadPool(settings.read_threads)
        self.kind = getattr(cache, "kind", None)
        # How a text becomes tokens: as the cache's build split its lines (metadata "tokenization"), so a sentence
        # in the cache is found whatever spacing the caller used; without a cache, as the model's training text
        # was (PTB-style for the bundled model).
        self.split = tokenizer_for(_tokenization(cache, encoder))
        # What the cache stores (None without a cache).
        self.stored: Selection | None = None
        if cache is not None:
            metadata = cache.metadata
            self.stored = Selection.from_metadata(metadata)
            self.dtype = np.dtype(cache.dtype)
            self.dim = int(metadata["dim"])
        else:
            assert encoder is not None
            self.dtype = np.dtype(np.float32)
            self.dim = int(encoder.output_dim)
        # How many layers the model gives (ELMo's 3, a Transformer's L + 1): what layers and mix are checked against.
        self.n_layers = served_layers(encoder, cache)
        # Without layers and mix a request gets what the cache stores (all layers without a cache).
        self.default_selection = self.stored or Selection(layers=tuple(range(self.n_layers)))

    # -- request parsing ---------------------------------------------------------------------

    def resolve(
        self,
        layers: str | Sequence[int] | None,
        mix: str | Sequence[float] | None,
        gamma: float | None,
        softmax: bool,
    ) -> Selection:
        """What a request asks for; InvalidParameterError when this server cannot give it."""
        selection = Selection.parse(layers, mix, gamma, softmax, n_layers=self.n_layers)
        if selection is None:
            return self.default_selection
        if self.encoder is None and self.stored is not None and not selection.answerable_from(self.stored):
            raise InvalidParameterError(selection.unavailable_message(self.stored))
        return selection

    def tokenize_all(self, sentences: Sequence[str | Sequence[str]], *, name: str = "sentences") -> list[list[str]]:
        """Tokenise texts as ``build`` does (token lists are taken as they are) and enforce the size limits
        (:class:`LimitExceededError`); text that is not UTF-8 is :class:`InvalidParameterError`.

        ``name`` is the request parameter the sentences came from: ``sentence`` (GET, one text) is named
        alone, ``sentences`` (POST) with each sentence's index."""
        limit = self.settings.max_sentences_per_request
        if len(sentences) > limit:
            raise LimitExceededError(
                f"sentences: {len(sentences)} sentences in one request; the limit is {limit} "
                "(max_sentences_per_request); split the request",
                code="too_many_sentences",
            )
        for i, sentence in enumerate(sentences):
            where = name if name == "sentence" else f"{name}[{i}]"
            if isinstance(sentence, str):
                _check_utf8(sentence, where)
            else:
                for j, token in enumerate(sentence):
                    _check_utf8(token, f"{where}[{j}]")
        split = self.split
        token_lists = [split(sentence) if isinstance(sentence, str) else list(sentence) for sentence in sentences]
        limit = self.settings.max_tokens_per_sentence
        for i, tokens in enumerate(token_lists):
            if len(tokens) > limit:
                which = "sentence" if len(token_lists) == 1 else f"sentences[{i}]"
                raise LimitExceededError(
                    f"{which}: {len(tokens)} tokens; the limit is {limit} tokens per sentence "
                    "(max_tokens_per_sentence)",
                    code="too_many_tokens",
                )
        return token_lists

    # -- answering -----------------------------------------------------------------------------

    async def embed(
        self, token_lists: list[list[str]], selection: Selection, timings: Timings, pool: str | None = None
    ) -> list[Embedding]:
        """Answer every sentence, from the cache when possible (then its write-back journal, with
        ``--write-back``), else live (404 when neither can); with ``pool`` one pooled vector per sentence
        (elmo_cache.server.pooled)."""
        answers: list[np.ndarray | None] = [None] * len(token_lists)
        if self.cache is not None:
            t0 = time.perf_counter()
            if self._cache_can_serve(selection) and not self._pool_only_miss(selection, pool):
                answers, kept = await self.pool.run(
                    self.timeout_s, "reading the cache", self._lookup, token_lists, selection, pool
                )
                self.metrics.writeback_hits.inc(kept)
            timings.add("cache", time.perf_counter() - t0)
            hits = sum(answer is not None for answer in answers)
            self.metrics.cache_hits.inc(hits)
            self.metrics.cache_misses.inc(len(answers) - hits)
        missing = [i for i, answer in enumerate(answers) if answer is None]
        sources = ["cache"] * len(token_lists)
        if missing:
            if self.encoder is None:
                if self._pool_only_miss(selection, pool):
                    assert self.cache is not None
                    raise InvalidParameterError(pool_only_refusal(self.cache, pool))
                raise self._not_found(token_lists, missing)
            assert self.batcher is not None  # create_app gives every encoder its batcher
            for i in missing:
                sources[i] = "live"
            todo = [i for i in missing if token_lists[i]]
            for i in missing:
                if not token_lists[i]:  # nothing to encode: an empty sentence has no vectors
                    answers[i] = self._empty(selection, pool)
            if todo and self.writeback is not None:
                for i, once in zip(todo, await self._live_once(token_lists, todo, selection, timings, pool)):
                    answers[i] = once
            elif todo:
                encoded, job = await self.batcher.submit(
                    [token_lists[i] for i in todo],
                    lambda arrays: [self.finish_live(a, selection, pool) for a in arrays],
                )
                timings.add("queue", job.waited)
                timings.add("encode", job.encoded)
                for i, vectors in zip(todo, encoded):
                    answers[i] = vectors
        done: list[np.ndarray] = []
        for vectors in answers:
            assert vectors is not None  # every sentence was answered above: cached, live or empty
            done.append(vectors)
        return [Embedding(t, vectors, source, pool) for t, vectors, source in zip(token_lists, done, sources)]

    async def _live_once(
        self, token_lists: list[list[str]], todo: list[int], selection: Selection, timings: Timings, pool: str | None
    ) -> list[np.ndarray]:
        """The live answers of sentences ``todo`` with write-back: each distinct sentence is encoded once however
        many requests ask for it at the same time (a single flight: later askers await the first one's encoding),
        and kept in the journal by the encoder (elmo_cache.server.writeback)."""
        assert self.batcher is not None and self.writeback is not None
        writeback = self.writeback
        keys = [key_of(token_lists[i]) for i in todo]
        tokens_of = {key: token_lists[i] for i, key in zip(todo, keys)}
        # Written back between this request's lookup and now (another request's encoding just finished).
        late = {
            key: tokens for key, tokens in tokens_of.items() if key not in self._in_flight and key in writeback.journal
        }
        if self._pool_only_miss(selection, pool):  # a pool-only cache's journal holds pooled vectors only
            late = {}
        found: dict[bytes, Any] = {}
        if late:

            def read_late() -> dict[bytes, Any]:
                return {key: writeback.lookup(tokens) for key, tokens in late.items()}

            found = {
                k: v for k, v in (await self.pool.run(self.timeout_s, "reading the cache", read_late)).items() if v
            }
        loop = asyncio.get_running_loop()
        mine: dict[bytes, asyncio.Future] = {}
        theirs: dict[bytes, asyncio.Future] = {}
        for key in tokens_of:
            if key in found:
                continue
            flight = self._in_flight.get(key)
            if flight is not None:
                theirs[key] = flight
                self.metrics.writeback_shared.inc()
            else:
                flight = loop.create_future()
                # Nobody may be left to read a failure: mark it read so asyncio does not log it.
                flight.add_done_callback(lambda f: f.cancelled() or f.exception())
                self._in_flight[key] = flight
                mine[key] = flight
        outputs: dict[bytes, np.ndarray] = {}
        if mine:
            try:
                encoded, job = await self.batcher.submit([tokens_of[key] for key in mine], lambda a: a)
                timings.add("queue", job.waited)
                timings.add("encode", job.encoded)
                for (key, flight), acts in zip(mine.items(), encoded):
                    flight.set_result(acts)
                    outputs[key] = acts
            except BaseException as exc:
                failure = exc if isinstance(exc, Exception) else NotReadyError("the request was cancelled")
                for flight in mine.values():
                    if not flight.done():
                        flight.set_exception(failure)
                raise
            finally:
                for key in mine:
                    self._in_flight.pop(key, None)
        for key, flight in theirs.items():
            outputs[key] = await asyncio.shield(flight)

        def finish() -> list[np.ndarray]:
            answers = {key: self._kept_answer(item, selection, pool) for key, item in found.items()}
            answers.update((key, self.finish_live(acts, selection, pool)) for key, acts in outputs.items())
            return [answers[key] for key in keys]

        return await self.pool.run(self.timeout_s, "finishing live answers", finish)

    def _not_found(self, token_lists: list[list[str]], missing: list[int]) -> NotInCacheError:
        if len(token_lists) == 1:
            shown = sentence_key(token_lists[0])
            message = f"sentence not in the cache: {shown[:200]!r}; no model is loaded to encode it live"
        else:
            first = ", ".join(str(i) for i in missing[:10]) + (", ..." if len(missing) > 10 else "")
            message = (
                f"{len(missing)} of {len(token_lists)} sentences are not in the cache (sentences[{first}]); "
                "no model is loaded to encode them live"
            )
        return NotInCacheError(message + " (start the server with --model to do so)")

    def _cache_can_serve(self, selection: Selection) -> bool:
        return self.stored is not None and selection.answerable_from(self.stored)

    def _pool_only_miss(self, selection: Selection, pool: str | None) -> bool:
        """A --pool-only cache asked for what its pooled rows are not (token vectors, another pool or mix): it
        has no token vectors to compute that from, so the request goes live, or is refused without a model."""
        cache = self.cache
        if cache is None or not cache.pool_only or self.stored is None:
            return False
        return not stored_pool_answers(cache, selection, self.stored, pool)

    def _lookup(
        self, token_lists: list[list[str]], selection: Selection, pool: str | None = None
    ) -> tuple[list[np.ndarray | None], int]:
        """Runs in a worker thread: reading the store may touch the disk. The answers (None: a miss), and how many
        came from the write-back journal. A cache replaced at its path since it was opened (``build --update``)
        is reopened first, or when a read finds it replaced (:class:`CacheReplacedError`), and the lookup redone."""
        try:
            return self._lookup_in(self._current_cache(), token_lists, selection, pool)
        except CacheReplacedError:
            cache = self._current_cache(replaced=True)
            return self._lookup_in(cache, token_lists, selection, pool)

    def _current_cache(self, *, replaced: bool = False) -> Cache:
        """The cache to read: the one at the served path, reopened when another generation was published there
        (checked at most every REOPEN_CHECK_S, and whenever a read found its cache replaced). A new generation of
        other options or another model is not taken: it would not answer as this server's settings say."""
        cache = self.cache
        assert cache is not None
        now = time.monotonic()
        if self._cache_path is None or (not replaced and now - self._checked_at < REOPEN_CHECK_S):
            return cache
        self._checked_at = now
        generation = _generation(self._cache_path)
        if generation is None or (generation in (self._generation, self._refused) and not replaced):
            return cache  # unchanged, or a cache of other options already refused (logged once)
        with self._reopen_lock:
            if self.cache is not cache and self.cache is not None:  # another thread reopened it meanwhile
                return self.cache
            import elmo_cache

            try:
                fresh = elmo_cache.open(self._cache_path)
            except ElmoCacheError as exc:  # caught mid-publish, or a broken new cache: keep the old one
                _log.warning(
                    "the cache at %s changed but cannot be opened now (%s); still serving the old one",
                    self._cache_path,
                    exc,
                )
                if replaced:
                    raise
                return cache
            if encoding_identity(fresh.metadata) != encoding_identity(cache.metadata):
                if generation != self._refused:
                    self._refused = generation
                    _log.error(
                        "the cache at %s was replaced by one of other options or another model; this server keeps "
                        "answering from the one it opened (what it can still read): restart it to serve the new one",
                        self._cache_path,
                    )
                fresh.close()
                if replaced:
                    raise CacheReplacedError(
                        f"{self._cache_path}: the cache was replaced by one of other options; restart the server"
                    )
                return cache
            self.cache, self._generation = fresh, generation
            self.metrics.cache_reopened.inc()
            _log.info(
                "the cache at %s was replaced (build --update?): serving the new one, %d sentences",
                self._cache_path,
                len(fresh),
            )
            # The old one is left to the garbage collector: reads in other threads may still hold it.
            return fresh

    def _lookup_in(
        self, cache: Cache, token_lists: list[list[str]], selection: Selection, pool: str | None
    ) -> tuple[list[np.ndarray | None], int]:
        out: list[np.ndarray | None] = []
        kept = 0
        for tokens in token_lists:
            index = cache.find(tokens)
            if index is None:
                found = self.writeback.lookup(tokens) if self.writeback is not None and tokens else None
                if found is None:
                    out.append(None)
                    continue
                kept += 1
                out.append(self._kept_answer(found, selection, pool))
            elif pool is not None:
                assert self.stored is not None
                pooled = pooled_cached(cache, index, selection, self.stored, pool, self.dtype)
                if not np.isfinite(pooled).all():
                    self.finish_cached(cache[index], selection)  # names a mix or gamma that overflows, or damage
                    raise CacheFormatError("the cache holds non-finite values (NaN or infinity) in a pooled vector")
                out.append(pooled)
            else:
                out.append(self.finish_cached(cache[index], selection))
        return out, kept

    def _kept_answer(
        self, found: tuple[np.ndarray, np.ndarray | None], selection: Selection, pool: str | None
    ) -> np.ndarray:
        """A written-back sentence (its vectors as ``cache[i]`` gives them, and its stored pooled vector) in the asked
        form, checked as a cached one is."""
        vectors, pooled = found
        if pool is None:
            return self.finish_cached(vectors, selection)
        assert self.cache is not None and self.stored is not None
        answer = pooled_written_back(self.cache, vectors, pooled, selection, self.stored, pool, self.dtype)
        if not np.isfinite(answer).all():
            self.finish_cached(vectors, selection)  # names a mix or gamma that overflows, or damage
            raise CacheFormatError("the write-back journal holds non-finite values in a pooled vector")
        return answer

    @property
    def timeout_s(self) -> float | None:
        """Longest wait for one request's cache read or response write (None: no limit)."""
        return self.settings.request_timeout_s or None

    def finish_cached(self, stored: np.ndarray, selection: Selection) -> np.ndarray:
        """A cached sentence in the asked form: (n_layers, n_tokens, dim) layers, or (n_tokens, dim) mix.

        Never a wrong vector: a non-finite answer is refused, as the mix's fault (422) when the
        stored row is finite, else as a damaged cache. Checking also reads every page of the row
        here, in a pool thread, rather than later while the response is written.
        """
        held = self.stored
        assert held is not None
        out = selection.extract(held, stored, self.dtype)
        if not np.isfinite(out).all():
            if not np.isfinite(stored).all():
                raise CacheFormatError("the cache holds non-finite values (NaN or infinity) in a requested row")
            raise self._overflow(selection, lambda sel: sel.extract(held, stored, self.dtype))
        return out

    def finish_live(self, acts: np.ndarray, selection: Selection, pool: str | None = None) -> np.ndarray:
        """An encoder output (3, n_tokens, dim) float32 in the asked form and dtype (non-finite refused)."""
        if pool is not None:
            pooled = pooled_live(acts, selection, pool, self.dtype)
            if not np.isfinite(pooled).all():
                self.finish_live(acts, selection)  # names the mix or gamma that overflows, when it is theirs
                raise ArithmeticError(f"a live pooled answer is not finite in {self.dtype.name}")
            return pooled
        codec = getattr(self.cache, "codec", None)
        if codec is not None and self.stored is not None:  # rounded as the cache rounds its hits
            out = codec.live_as_cached(acts, selection, self.stored, self.dtype)
        else:
            out = selection.apply_array(acts, self.dtype)
        if not np.isfinite(out).all():
            if selection.mix is None or not np.isfinite(acts).all():
                # Not the client's doing: the model's own output, or its cast to the cache's dtype, overflows.
                raise ArithmeticError(
                    f"live vectors are not finite in {self.dtype.name} (model output finite: {np.isfinite(acts).all()})"
                )
            raise self._overflow(selection, lambda sel: sel.apply_array(acts, self.dtype))
        return out

    def _overflow(self, selection: Selection, compute: Callable[[Selection], np.ndarray]) -> InvalidParameterError:
        """Which of ``mix`` and ``gamma`` makes a mix of finite vectors overflow (the message names it)."""
        assert selection.mix is not None
        mix = selection.mix
        unscaled = Selection(layers=None, mix=MixSpec(weights=mix.weights, gamma=1.0, raw=mix.raw))
        where = f"{self.dtype.name}" + ("" if self.dtype == np.float32 else " (the dtype of this server's answers)")
        if mix.gamma != 1.0 and np.isfinite(compute(unscaled)).all():
            return InvalidParameterError(
                f"gamma: {mix.gamma:g} makes the mixed vectors overflow {where} (the result is not finite); "
                "use a smaller gamma"
            )
        return InvalidParameterError(
            f"mix: the weights {list(mix.weights)} make the mixed vectors overflow {where} (the result is not "
            "finite); use smaller weights"
        )

    def _empty(self, selection: Selection, pool: str | None = None) -> np.ndarray:
        if pool is not None:
            return pooled_empty(selection, self.dim, pool, self.dtype)
        return np.zeros(selection.vector_shape(0, self.dim), dtype=self.dtype)

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` shows about the data side."""
        return {
            "model": None if self.encoder is None else self.encoder.identity,
            "cache": None
            if self.cache is None
            else {
                "path": str(self.settings.cache_path) if self.settings.cache_path else None,
                "sentences": len(self.cache),
                "metadata": self.cache.metadata,
            },
            "default_output": self.default_selection.describe(),
            "dtype": self.dtype.name,
            "dim": self.dim,
            "write_back": None if self.writeback is None else self.writeback.info(),
            "available_layers": list(range(self.n_layers))
            if self.encoder is not None
            else list((self.stored.layers if self.stored is not None else None) or ()),
        }
