"""What ``/embed`` does, without HTTP: resolve the asked output, answer from the cache, encode the rest live.

The *output spec* of a request is either a subset of layers or one fixed mix. With
no ``layers`` and no ``mix`` it is what the cache stores (its layers, or its mix),
or all three layers without a cache, so cache hits and live answers of one server
always have the same shape and dtype:

* a layered cache answers any subset of its stored layers, and any mix whose
  non-zero weights fall on stored layers (mixed in float32, then cast);
* a mixed cache answers only its own mix (same effective weights and gamma);
* anything else is encoded live when a model is loaded, and is a 422 listing
  what the cache holds when none is;
* the answer's dtype is the cache's dtype (live answers are cast to it), or
  float32 without a cache.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from elmo_cache.errors import InvalidParameterError
from elmo_cache.mix import ALL_LAYERS, MixSpec, parse_layers
from elmo_cache.server.batcher import LiveBatcher
from elmo_cache.server.errors import ApiError
from elmo_cache.server.metrics import Metrics
from elmo_cache.server.settings import Settings
from elmo_cache.tokenize import sentence_key, tokenize

__all__ = ["OutputSpec", "Embedding", "EmbedService", "Timings"]


@dataclass(frozen=True)
class OutputSpec:
    """The form of every answer of one request."""

    # Layer ids returned, in order (shape (len(layers), n_tokens, dim)); None when mixing.
    layers: tuple[int, ...] | None
    # Fixed mix returned instead (shape (n_tokens, dim)); None when returning layers.
    mix: MixSpec | None
    # dtype of the returned vectors.
    dtype: np.dtype

    def describe(self) -> dict[str, Any]:
        """JSON form echoed in responses."""
        return {
            "layers": None if self.layers is None else list(self.layers),
            "mix": None if self.mix is None else self.mix.to_metadata(),
        }


@dataclass
class Embedding:
    """The answer for one sentence."""

    tokens: list[str]
    vectors: np.ndarray
    source: str  # "cache" or "live"


@dataclass
class Timings:
    """Seconds spent per stage of one request, sent back as ``Server-Timing``."""

    parts: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.parts[name] = self.parts.get(name, 0.0) + seconds


# Most sentences of one request looked up in the event loop (uncompressed stores only).
_INLINE_LOOKUPS = 8


def _same_mix(a: MixSpec, b: MixSpec) -> bool:
    close = lambda x, y: math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)  # noqa: E731
    return len(a.weights) == len(b.weights) and all(map(close, a.weights, b.weights)) and close(a.gamma, b.gamma)


def _mix_desc(mix: MixSpec) -> str:
    return f"weights {list(mix.weights)}, gamma {mix.gamma}"


class EmbedService:
    """Answers embedding requests from a cache and/or a live encoder (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        *,
        cache: Any | None = None,
        encoder: Any | None = None,
        batcher: LiveBatcher | None = None,
    ) -> None:
        if cache is None and encoder is None:
            raise InvalidParameterError("the server needs a cache, a model, or both")
        self.settings = settings
        self.metrics = metrics
        self.cache = cache
        self.encoder = encoder
        self.batcher = batcher
        self.kind = getattr(cache, "kind", None)
        self.stored_layers: tuple[int, ...] | None = None
        self.stored_mix: MixSpec | None = None
        self._inline_lookups = False
        if cache is not None:
            if self.kind == "mix":
                raw = cache.metadata["mix"]
                self.stored_mix = MixSpec(
                    weights=tuple(float(w) for w in raw["weights"]),
                    gamma=float(raw["gamma"]),
                    raw=None if raw.get("raw") is None else tuple(raw["raw"]),
                )
            else:
                self.stored_layers = tuple(int(layer) for layer in cache.layers)
            self.dtype = np.dtype(cache.dtype)
            metadata = cache.metadata
            self.dim = int(metadata["dim"])
            # Uncompressed stores are memory-mapped: a lookup is a hash, a binary search and a view
            # (microseconds), cheaper in the event loop than a thread hop. Compressed zarr chunks
            # must be decoded (milliseconds), so those lookups go to a thread.
            self._inline_lookups = metadata.get("compression") in (None, "none")
        else:
            self.dtype = np.dtype(np.float32)
            self.dim = int(encoder.output_dim)
        self.default_spec = OutputSpec(
            layers=None if self.stored_mix else (self.stored_layers or ALL_LAYERS),
            mix=self.stored_mix,
            dtype=self.dtype,
        )

    # -- request parsing ---------------------------------------------------------------------

    def resolve(
        self,
        layers: str | Sequence[int] | None,
        mix: str | Sequence[float] | None,
        gamma: float | None,
        softmax: bool,
    ) -> OutputSpec:
        """The output spec of a request; 422 when it asks for something this server cannot give."""
        if layers is not None and mix is not None:
            raise InvalidParameterError("layers and mix: give one of them, not both (mix already combines all layers)")
        if mix is None and (gamma is not None or softmax):
            raise InvalidParameterError("gamma and softmax apply only with mix=s0,s1,s2")
        if mix is not None:
            spec = OutputSpec(None, MixSpec.from_raw(mix, gamma=1.0 if gamma is None else gamma, softmax=softmax),
                              self.dtype)
        elif layers is not None:
            spec = OutputSpec(parse_layers(layers), None, self.dtype)
        else:
            return self.default_spec
        if self.encoder is None and not self._cache_can_serve(spec):
            raise InvalidParameterError(self._unavailable_message(spec))
        return spec

    def _unavailable_message(self, spec: OutputSpec) -> str:
        if self.stored_mix is not None:
            return (
                f"this cache stores only one fixed mix ({_mix_desc(self.stored_mix)}) and no model is loaded; "
                "omit layers and mix (or pass that mix), or start the server with a model to compute others"
            )
        stored = list(self.stored_layers or ())
        if spec.mix is not None:
            needed = [j for j, w in enumerate(spec.mix.weights) if w != 0.0]
            return (
                f"mix: needs layers {needed} but this cache stores layers {stored} and no model is loaded; "
                f"give zero weight to layers outside {stored}, or start the server with a model"
            )
        missing = [layer for layer in spec.layers or () if layer not in stored]
        return (
            f"layers: layer(s) {missing} are not stored in this cache and no model is loaded; choose from {stored}"
        )

    def tokenize_all(self, sentences: Sequence[str]) -> list[list[str]]:
        """Tokenise as ``build`` does and enforce the size limits (413)."""
        limit = self.settings.max_sentences_per_request
        if len(sentences) > limit:
            raise ApiError(
                413, "too_many_sentences",
                f"sentences: {len(sentences)} sentences in one request; the limit is {limit} "
                "(max_sentences_per_request); split the request",
            )
        token_lists = [tokenize(sentence) for sentence in sentences]
        limit = self.settings.max_tokens_per_sentence
        for i, tokens in enumerate(token_lists):
            if len(tokens) > limit:
                which = "sentence" if len(token_lists) == 1 else f"sentences[{i}]"
                raise ApiError(
                    413, "too_many_tokens",
                    f"{which}: {len(tokens)} tokens; the limit is {limit} tokens per sentence (max_tokens_per_sentence)",
                )
        return token_lists

    # -- answering -----------------------------------------------------------------------------

    async def embed(self, token_lists: list[list[str]], spec: OutputSpec, timings: Timings) -> list[Embedding]:
        """Answer every sentence, from the cache when possible, else live (404 when neither can)."""
        answers: list[np.ndarray | None] = [None] * len(token_lists)
        if self.cache is not None:
            t0 = time.perf_counter()
            if self._cache_can_serve(spec):
                if self._inline_lookups and len(token_lists) <= _INLINE_LOOKUPS:
                    answers = self._lookup(token_lists, spec)
                else:
                    answers = await asyncio.to_thread(self._lookup, token_lists, spec)
            timings.add("cache", time.perf_counter() - t0)
            hits = sum(answer is not None for answer in answers)
            self.metrics.cache_hits.inc(hits)
            self.metrics.cache_misses.inc(len(answers) - hits)
        missing = [i for i, answer in enumerate(answers) if answer is None]
        sources = ["cache"] * len(token_lists)
        if missing:
            if self.encoder is None:
                raise self._not_found(token_lists, missing)
            for i in missing:
                sources[i] = "live"
            todo = [i for i in missing if token_lists[i]]
            for i in missing:
                if not token_lists[i]:  # nothing to encode: an empty sentence has no vectors
                    answers[i] = self._empty(spec)
            if todo:
                encoded, job = await self.batcher.submit(
                    [token_lists[i] for i in todo], lambda arrays: [self.finish_live(a, spec) for a in arrays]
                )
                timings.add("queue", job.waited)
                timings.add("encode", job.encoded)
                for i, vectors in zip(todo, encoded):
                    answers[i] = vectors
        return [Embedding(tokens, vectors, source) for tokens, vectors, source in zip(token_lists, answers, sources)]

    def _not_found(self, token_lists: list[list[str]], missing: list[int]) -> ApiError:
        if len(token_lists) == 1:
            shown = sentence_key(token_lists[0])
            message = f"sentence not in the cache: {shown[:200]!r}; no model is loaded to encode it live"
        else:
            first = ", ".join(str(i) for i in missing[:10]) + (", ..." if len(missing) > 10 else "")
            message = (
                f"{len(missing)} of {len(token_lists)} sentences are not in the cache (sentences[{first}]); "
                "no model is loaded to encode them live"
            )
        return ApiError(404, "not_in_cache", message + " (start the server with --model to do so)")

    def _cache_can_serve(self, spec: OutputSpec) -> bool:
        if self.cache is None:
            return False
        if self.stored_mix is not None:
            return spec.mix is not None and _same_mix(spec.mix, self.stored_mix)
        stored = set(self.stored_layers or ())
        if spec.mix is not None:
            return all(w == 0.0 or j in stored for j, w in enumerate(spec.mix.weights))
        return set(spec.layers or ()) <= stored

    def _lookup(self, token_lists: list[list[str]], spec: OutputSpec) -> list[np.ndarray | None]:
        """Runs in a worker thread: reading the store may touch the disk."""
        out: list[np.ndarray | None] = []
        for tokens in token_lists:
            index = self.cache.find(tokens)
            out.append(None if index is None else self.finish_cached(self.cache[index], spec))
        return out

    def finish_cached(self, stored: np.ndarray, spec: OutputSpec) -> np.ndarray:
        """A cached sentence in the asked form: (n_layers, n_tokens, dim) layers, or (n_tokens, dim) mix."""
        if self.stored_mix is not None:
            return np.ascontiguousarray(stored, dtype=spec.dtype)
        stored_layers = list(self.stored_layers or ())
        if spec.mix is None:
            positions = [stored_layers.index(layer) for layer in spec.layers]
            if positions != list(range(len(stored_layers))):
                stored = np.asarray(stored)[positions]
            return np.ascontiguousarray(stored, dtype=spec.dtype)
        full = torch.zeros((len(ALL_LAYERS), stored.shape[-2], stored.shape[-1]), dtype=torch.float32)
        for position, layer in enumerate(stored_layers):
            full[layer] = torch.from_numpy(np.array(stored[position], dtype=np.float32))  # a copy: the store is read-only
        return spec.mix.apply(full).numpy().astype(spec.dtype, copy=False)

    def finish_live(self, acts: np.ndarray, spec: OutputSpec) -> np.ndarray:
        """An encoder output (3, n_tokens, dim) float32 in the asked form and dtype."""
        if spec.mix is not None:
            out = spec.mix.apply(torch.from_numpy(np.asarray(acts, dtype=np.float32))).numpy()
        else:
            out = np.asarray(acts)[list(spec.layers)]
        return np.ascontiguousarray(out, dtype=spec.dtype)

    def _empty(self, spec: OutputSpec) -> np.ndarray:
        shape = (0, self.dim) if spec.mix is not None else (len(spec.layers), 0, self.dim)
        return np.zeros(shape, dtype=spec.dtype)

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` shows about the data side."""
        return {
            "model": None if self.encoder is None else self.encoder.identity,
            "cache": None if self.cache is None else {
                "path": str(self.settings.cache_path) if self.settings.cache_path else None,
                "sentences": len(self.cache),
                "metadata": self.cache.metadata,
            },
            "default_output": self.default_spec.describe(),
            "dtype": self.dtype.name,
            "dim": self.dim,
            "available_layers": list(ALL_LAYERS) if self.encoder is not None else (
                list(self.stored_layers) if self.stored_layers else []
            ),
        }
