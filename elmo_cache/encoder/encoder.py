"""The public ELMo encoder: token lists in, three layers of contextual vectors out.

>>> enc = Encoder.load(("options.json", "weights.hdf5"))     # doctest: +SKIP
>>> enc.embed_sentence(["The", "cat", "sat", "."]).shape        # doctest: +SKIP
(3, 4, 1024)

Stateless by default: every sentence starts from the same initial LSTM state, so
its vectors do not depend on which batch, padding or order it comes in. The original
implementation instead carries the LSTM state from one batch to the next, row by
row; ``initial_state="carry"`` reproduces that (for comparisons with it only), and
``initial_state="warm"`` starts every sentence from the fixed state reached after
reading :data:`WARMUP_TEXT`, which its maintainers noted is closer to the state the
model saw in training than zeros.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmo_cache.encoder.hardware import (
    ALLOW_SLOW_BF16_ENV,
    ALLOW_SLOW_FP16_ENV,
    PRECISIONS,
    check_precision,
    cpu_bf16_problem,
    default_fuse_cell,
    resolve_device,
)
from elmo_cache.encoder.lstm_states import InitialStates
from elmo_cache.encoder.names import BATCH_TOKENS, batch_tokens_for
from elmo_cache.encoder.transfer import HostCopy, to_device
from elmo_cache.encoder.word_cache import WordVectorCache
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model import formats, hub, sources
from elmo_cache.model.bilm import BiLM, PackedBatch
from elmo_cache.model.chars import ByteTokenIds, TokenIds
from elmo_cache.model.files import ModelFiles
from elmo_cache.model.identity import ModelDescription, model_identity
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.sources import ModelSpec

__all__ = [
    "Encoder",
    "FORMAT_ENCODERS",
    "validate_sentences",
    "PRECISIONS",
    "INITIAL_STATES",
    "WARMUP_TEXT",
    "ALLOW_SLOW_BF16_ENV",
    "ALLOW_SLOW_FP16_ENV",
    "cpu_bf16_problem",
]

INITIAL_STATES = ("zero", "warm", "carry")

# Fixed text whose final LSTM state is the "warm" initial state. Changing it changes
# every warm encoding, so it is versioned by its hash in ``Encoder.identity``.
WARMUP_TEXT = (
    "The committee met on Tuesday to discuss the new budget .",
    "Officials said the plan would be published later this year , after a public consultation .",
    "It was not clear how many people would be affected by the changes .",
    '" We are confident that this is the right decision , " she said .',
)

# What versions the warm initial state in an identity (Encoder.identity, Encoder.describe).
_WARMUP_SHA256 = hashlib.sha256("\n".join(WARMUP_TEXT).encode()).hexdigest()

# Model formats (elmo_cache.model.formats) whose models are not a biLM: the Encoder subclass that runs them, as
# (module, class); it has a ``from_files(files, *, device, precision, initial_state)`` constructor.
FORMAT_ENCODERS = {formats.TRANSFORMERS: ("elmo_cache.encoder.transformer", "TransformerEncoder")}

DEFAULT_BATCH_TOKENS = BATCH_TOKENS["cpu"]
DEFAULT_WORD_CACHE_SIZE = 20000


def validate_sentences(sentences: Sequence[Sequence[str]]) -> None:
    """Refuse a sentence given as a string where a list of tokens belongs (every encoder's first check)."""
    for i, sentence in enumerate(sentences):
        if isinstance(sentence, str):
            raise InvalidParameterError(
                f"sentence {i}: expected a list of tokens, got a string; split it first "
                "(elmo_cache.text.tokenize) or call embed_sentence(tokens)"
            )


class Encoder:
    """An ELMo biLM on one device, turning tokenised sentences into vectors."""

    def __init__(
        self,
        options: ModelOptions,
        bilm: BiLM,
        *,
        device: torch.device,
        precision: str,
        initial_state: str = "zero",
        name: str | None = None,
        weight_file: Path | None = None,
        directory: Path | None = None,
        word_cache_size: int = DEFAULT_WORD_CACHE_SIZE,
        fuse_cell: bool | None = None,
        tokens: TokenIds | None = None,
        options_dict: dict[str, Any] | None = None,
        weights_sha256: str | None = None,
    ):
        if initial_state not in INITIAL_STATES:
            raise InvalidParameterError(f"initial_state: {initial_state!r} is not one of {list(INITIAL_STATES)}")
        self.options = options
        self.bilm = bilm
        self.device = device
        self.precision = precision
        self.initial_state = initial_state
        self.name = name
        self.weight_file = weight_file
        # The local directory the model was named by, recorded in the identity so `serve` finds it again.
        self.directory = directory
        # How tokens become ids (bilm-tf: UTF-8 bytes), the options as the identity records them, and
        # the weights SHA-256 where loading computed it (else hashed from weight_file): see model.formats.
        self.tokens: TokenIds = tokens or ByteTokenIds(options.max_characters_per_token)
        self._options_dict = options_dict
        self._weights_sha256 = weights_sha256
        self.output_dim = options.output_dim
        bilm.fused = default_fuse_cell(options, device) if fuse_cell is None else fuse_cell
        self.n_layers = options.n_layers + 1
        self._words = WordVectorCache(word_cache_size, options.projection_dim, device, self._token_vectors)
        self._states = self._new_states(carry=initial_state == "carry")
        if initial_state == "warm":
            self._states.start_from(*self._warm_state())

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(
        cls,
        model: ModelSpec = None,
        *,
        options_file: str | os.PathLike[str] | None = None,
        weight_file: str | os.PathLike[str] | None = None,
        device: str | torch.device | None = None,
        precision: str = "fp32",
        initial_state: str = "zero",
        word_cache_size: int = DEFAULT_WORD_CACHE_SIZE,
        fuse_cell: bool | None = None,
    ) -> Encoder:
        """Load an ELMo model: the one way to get an encoder.

        ``model``: None or "bundled" for the model shipped with the package (no network); a
        published one ("original", "medium", "small", "original-5.5b", or "efml-LANG" for an
        ELMoForManyLangs model; downloaded once into the model cache); a local directory with one
        options JSON and one weights HDF5, or an ELMoForManyLangs model directory
        (:mod:`elmo_cache.model.efml`); an
        ``(options_file, weight_file)`` pair; or :class:`~elmo_cache.model.files.ModelFiles`
        already resolved. ``options_file`` + ``weight_file`` (both or neither) win over ``model``.
        Every source is in :mod:`elmo_cache.model.sources`.

        ``device``: None = CUDA when available, else CPU. ``precision``: "fp32" (exact),
        "bf16" or "fp16" (matmuls in reduced precision, LSTM cell state in fp32).
        ``initial_state``: "zero" (default), "warm" or "carry" (see the module docstring).
        ``word_cache_size``: how many distinct words keep their char-CNN vector (exact reuse).
        ``fuse_cell``: compile the LSTM cell update into one kernel (None: for models with
        at least 1024 LSTM cells, unless ``ATEN_CPU_CAPABILITY`` caps torch's CPU kernels).

        ``"hf:NAME"`` (a Transformer encoder's directory or hub name, :mod:`elmo_cache.model.transformer`)
        gives a :class:`~elmo_cache.encoder.transformer.TransformerEncoder`: the same interface, ``L + 1`` layers.
        """
        if initial_state not in INITIAL_STATES:
            raise InvalidParameterError(f"initial_state: {initial_state!r} is not one of {list(INITIAL_STATES)}")
        files = sources.resolve(model, options_file, weight_file)
        resolved = resolve_device(device)
        if files.format in FORMAT_ENCODERS:
            # A format with its own encoder behind this interface, a subclass in its own module imported by name
            # on first use (the Transformer's imports transformers, which an ELMo model never needs).
            module, name = FORMAT_ENCODERS[files.format]
            subclass = getattr(importlib.import_module(module), name)
            encoder: Encoder = subclass.from_files(
                files, device=resolved, precision=precision, initial_state=initial_state
            )
            return encoder
        dtype = check_precision(precision, resolved)
        loaded = formats.load(files)
        bilm = BiLM(loaded.options, loaded.weights, compute_dtype=dtype)
        bilm.to_device(resolved)
        return cls(
            loaded.options,
            bilm,
            device=resolved,
            precision=precision,
            initial_state=initial_state,
            name=files.name,
            weight_file=files.weight_file,
            directory=files.directory,
            word_cache_size=word_cache_size,
            fuse_cell=fuse_cell,
            tokens=loaded.tokens,
            options_dict=loaded.options_dict,
            weights_sha256=loaded.weights_sha256,
        )

    # ----------------------------------------------------------------- identity
    @cached_property
    def weights_sha256(self) -> str | None:
        """SHA-256 of the weights (of the weight file, computed once, on first use)."""
        if self._weights_sha256 is not None:
            return self._weights_sha256
        return None if self.weight_file is None else hub.file_sha256(self.weight_file)

    @property
    def identity(self) -> dict[str, Any]:
        """What determines this encoder's vectors, JSON-serialisable (stored in cache metadata)."""
        options = self.options.to_dict() if self._options_dict is None else self._options_dict
        warmup = _WARMUP_SHA256 if self.initial_state == "warm" else None
        return model_identity(
            self.name, options, self.weights_sha256, self.initial_state, self.precision, self.directory, warmup
        )

    @classmethod
    def describe(cls, files: ModelFiles, *, precision: str = "fp32", initial_state: str = "zero") -> ModelDescription:
        """The identity and output width ``Encoder.load(files, precision=..., initial_state=...)`` would give,
        read from the files without loading the weights (they are hashed, not parsed): what a build plans with."""
        if initial_state not in INITIAL_STATES:
            raise InvalidParameterError(f"initial_state: {initial_state!r} is not one of {list(INITIAL_STATES)}")
        warmup = _WARMUP_SHA256 if initial_state == "warm" else None
        return formats.describe(files, precision, initial_state, warmup)

    def __repr__(self) -> str:
        return (
            f"Encoder(name={self.name!r}, dim={self.output_dim}, device={str(self.device)!r}, "
            f"precision={self.precision!r}, initial_state={self.initial_state!r})"
        )

    # ------------------------------------------------------------------- public
    def embed_batch(self, sentences: Sequence[Sequence[str]], *, batch_tokens: int | None = None) -> list[np.ndarray]:
        """Vectors of each sentence, ``(3, n_tokens, output_dim)`` float32, in input order.

        Layer 0 is the char-CNN token vector duplicated to the LSTM layers' width, as in
        the original. Large inputs are split into length-sorted sub-batches of at most
        ``batch_tokens`` tokens (None: :meth:`default_batch_tokens`; in "carry" mode the
        batch is the unit).

        The arrays of one sub-batch are views of one host buffer (each sentence's block is
        contiguous, so nothing is copied per sentence): keeping a few of many sentences keeps
        their sub-batch's buffer; ``.copy()`` them to let the rest go.
        """
        batch_tokens = self.default_batch_tokens if batch_tokens is None else batch_tokens
        results: list[np.ndarray | None] = [None] * len(sentences)
        in_flight: deque[tuple[list[int], np.ndarray, HostCopy]] = deque()

        def finish_oldest() -> None:
            indices, offsets, copy = in_flight.popleft()
            array = copy.result(own=True)
            layers = self.n_layers
            for k, i in enumerate(indices):
                begin, end = int(offsets[k]), int(offsets[k + 1])
                results[i] = array[layers * begin : layers * end].reshape(layers, end - begin, self.output_dim)

        for indices in self._plan_batches(sentences, batch_tokens):
            flat, offsets = self.encode_flat([sentences[i] for i in indices])
            # Two sub-batches in flight: the device computes one while the other crosses to the host, and
            # device memory holds at most two batches' outputs whatever the input's size.
            if len(in_flight) == 2:
                finish_oldest()
            in_flight.append((indices, offsets, HostCopy(self._sentence_major(flat, offsets))))
        while in_flight:
            finish_oldest()
        return results  # type: ignore[return-value]

    @property
    def default_batch_tokens(self) -> int:
        """Tokens per sub-batch when none is asked for: larger on a GPU, where a batch's
        fixed costs (one kernel launch per timestep and layer) are the larger share."""
        return batch_tokens_for(self.device.type)

    def _sentence_major(self, flat: torch.Tensor, offsets: np.ndarray) -> torch.Tensor:
        """``(layers, tokens, dim)`` rearranged so that each sentence's ``(layers, n, dim)`` block is
        contiguous: ``(layers * tokens, dim)``, sentence ``k`` from row ``layers * offsets[k]``."""
        layers, total = self.n_layers, int(offsets[-1])
        lengths = np.diff(offsets)
        sentence = np.repeat(np.arange(len(lengths)), lengths)
        position = np.arange(total) - offsets[:-1][sentence]
        first = layers * offsets[:-1][sentence] + position  # destination of each token's layer-0 row
        source = np.empty(layers * total, dtype=np.int64)
        for layer in range(layers):
            source[first + layer * lengths[sentence]] = layer * total + np.arange(total)
        return flat.reshape(layers * total, self.output_dim).index_select(0, to_device(source, self.device))

    def embed_sentence(self, tokens: Sequence[str]) -> np.ndarray:
        """Vectors of one tokenised sentence, ``(3, n_tokens, output_dim)`` float32."""
        if isinstance(tokens, str):
            raise InvalidParameterError(
                "embed_sentence expects a list of tokens; use elmo_cache.text.tokenize(text) first"
            )
        return self.embed_batch([tokens])[0]

    def embed_sentences(
        self,
        sentences: Iterable[Sequence[str]],
        *,
        batch_tokens: int | None = None,
        window: int = 8,
    ) -> Iterator[np.ndarray]:
        """Stream vectors for an iterable of token lists, in input order.

        Reads about ``window * batch_tokens`` tokens ahead, sorts them by length into
        batches of at most ``batch_tokens`` tokens (None: :meth:`default_batch_tokens`), and
        yields results in input order (see :meth:`embed_batch` on the arrays' memory).
        """
        batch_tokens = self.default_batch_tokens if batch_tokens is None else batch_tokens
        buffer: list[Sequence[str]] = []
        tokens = 0
        for sentence in sentences:
            buffer.append(sentence)
            tokens += len(sentence) + 2
            if tokens >= window * batch_tokens:
                yield from self.embed_batch(buffer, batch_tokens=batch_tokens)
                buffer, tokens = [], 0
        if buffer:
            yield from self.embed_batch(buffer, batch_tokens=batch_tokens)

    def encode_padded(self, sentences: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch as a padded tensor on the encoder's device.

        Returns ``(acts, lengths)``: ``acts`` float32 ``(batch, 3, max_tokens, output_dim)``,
        zero beyond each sentence's length, in input order; ``lengths`` int64 on the CPU.
        """
        validate_sentences(sentences)  # before the early return for all-empty batches
        lengths = torch.tensor([len(s) for s in sentences], dtype=torch.int64)
        max_tokens = int(lengths.max()) if len(sentences) else 0
        acts = torch.zeros(len(sentences), self.n_layers, max_tokens, self.output_dim, device=self.device)
        if max_tokens == 0:
            return acts, lengths
        flat, offsets = self.encode_flat(sentences)
        sentence_of_token = torch.repeat_interleave(torch.arange(len(sentences)), lengths)
        position = torch.arange(int(offsets[-1])) - torch.repeat_interleave(torch.as_tensor(offsets[:-1]), lengths)
        index = (sentence_of_token * max_tokens + position).to(self.device)
        view = acts.view(len(sentences), self.n_layers, -1).transpose(0, 1).reshape(self.n_layers, -1, self.output_dim)
        view.index_copy_(1, index, flat)
        acts = view.reshape(self.n_layers, len(sentences), max_tokens, self.output_dim).transpose(0, 1).contiguous()
        return acts, lengths

    def clear_word_cache(self) -> None:
        """Forget the cached char-CNN vectors. A word's cached vector carries the float
        rounding of the batch it was first computed in (~1e-7); clearing at fixed points
        makes results a function of the input since that point alone."""
        self._words.clear()

    def reset_state(self) -> None:
        """Forget the carried-over state ("carry" mode): the next batch starts from zeros."""
        self._states.reset()

    @property
    def start_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The state every sentence starts from in "zero" and "warm" mode: ``(h, c)``, each
        ``(n_lstm_layers, 2 directions, 1, dim)``."""
        return self._states.h0, self._states.c0

    # ----------------------------------------------------------------- internals
    def _plan_batches(self, sentences: Sequence[Sequence[str]], batch_tokens: int) -> list[list[int]]:
        if batch_tokens < 1:
            raise InvalidParameterError(f"batch_tokens: must be positive, got {batch_tokens}")
        if self.initial_state == "carry":
            return [list(range(len(sentences)))] if sentences else []
        order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]), reverse=True)
        batches: list[list[int]] = []
        current: list[int] = []
        tokens = 0
        for i in order:
            cost = len(sentences[i]) + 2
            if current and tokens + cost > batch_tokens:
                batches.append(current)
                current, tokens = [], 0
            current.append(i)
            tokens += cost
        if current:
            batches.append(current)
        return batches

    def _token_vectors(self, words: list[str]) -> torch.Tensor:
        """Token vectors (char-CNN, highway, projection) of ``words``, computed now."""
        ids = to_device(self.tokens.char_ids(words), self.device)
        word_ids = self.tokens.word_ids(words)
        return self.bilm.token_embeddings(ids, None if word_ids is None else to_device(word_ids, self.device))

    def _new_states(self, *, carry: bool) -> InitialStates:
        o = self.options
        return InitialStates(o.n_layers, o.projection_dim, o.lstm_dim, self.device, carry=carry)

    @torch.inference_mode()
    def encode_flat(self, sentences: Sequence[Sequence[str]]) -> tuple[torch.Tensor, np.ndarray]:
        """One batch without padding: ``(3, total_tokens, output_dim)`` float32 on the device,
        sentences concatenated in input order, and each sentence's token offset (a numpy array
        of ``len(sentences) + 1`` entries). The cheapest form for writers."""
        validate_sentences(sentences)
        batch = len(sentences)
        n_tokens = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=batch)
        offsets = np.zeros(batch + 1, dtype=np.int64)
        np.cumsum(n_tokens, out=offsets[1:])
        if batch == 0 or (offsets[-1] == 0 and not self._states.carry):
            return torch.zeros(self.n_layers, int(offsets[-1]), self.output_dim, device=self.device), offsets

        # Token embeddings of "<S> tokens </S>" (the format's boundary tokens) for every sentence, input order.
        bos, eos = self.tokens.boundaries
        distinct: dict[str, int] = {bos: 0, eos: 1}
        token_ids = np.empty(int(offsets[-1]) + 2 * batch, dtype=np.int64)
        position = 0
        for sentence in sentences:
            token_ids[position] = 0
            for k, token in enumerate(sentence, start=position + 1):
                token_ids[k] = distinct.setdefault(token, len(distinct))
            position += len(sentence) + 2
            token_ids[position - 1] = 1
        word_vectors = self._words.vectors(list(distinct))
        embedded = word_vectors.index_select(0, to_device(token_ids, self.device))  # (n_with_bounds, P)

        # Pack longest first; row starts[t] + k is step t of sorted sentence k.
        seq_lengths = n_tokens + 2
        order = sorted(range(batch), key=lambda i: -seq_lengths[i])
        lengths_sorted = seq_lengths[order]
        packed = PackedBatch(lengths_sorted.tolist())
        seq_starts = np.zeros(batch + 1, dtype=np.int64)
        np.cumsum(seq_lengths, out=seq_starts[1:])
        sorted_sentence = np.repeat(np.arange(batch), lengths_sorted)
        step = np.arange(packed.n_rows) - np.repeat(np.cumsum(lengths_sorted) - lengths_sorted, lengths_sorted)
        rows = np.asarray(packed.starts[:-1], dtype=np.int64)[step] + sorted_sentence
        first = seq_starts[:-1][order][sorted_sentence]
        forward_source = np.empty(packed.n_rows, dtype=np.int64)
        backward_source = np.empty(packed.n_rows, dtype=np.int64)
        forward_source[rows] = first + step
        backward_source[rows] = first + lengths_sorted[sorted_sentence] - 1 - step
        forward_index = to_device(forward_source, self.device)
        backward_index = to_device(backward_source, self.device)

        inputs = torch.stack([embedded.index_select(0, forward_index), embedded.index_select(0, backward_index)])
        h0, c0 = self._states.for_batch(order)
        layer_outputs, final_h, final_c = self.bilm.lstm_layers(inputs, packed, h0, c0)
        self._states.after_batch(order, final_h, final_c)

        # Back to input order, drop <S>/</S>, layer 0 = token vector twice.
        keep = to_device(
            np.delete(np.arange(len(token_ids)), np.concatenate([seq_starts[:-1], seq_starts[1:] - 1])), self.device
        )
        p = self.options.projection_dim
        out = torch.empty(self.n_layers, len(token_ids), self.output_dim, device=self.device)
        out[0, :, :p] = embedded
        out[0, :, p:] = embedded
        for layer, hidden in enumerate(layer_outputs, start=1):
            out[layer, :, :p].index_copy_(0, forward_index, hidden[0])
            out[layer, :, p:].index_copy_(0, backward_index, hidden[1])
        return out.index_select(1, keep), offsets

    def _warm_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Final state after reading WARMUP_TEXT sentence by sentence from zeros, carrying state."""
        states, self._states = self._states, self._new_states(carry=True)
        try:
            for sentence in WARMUP_TEXT:
                self.encode_flat([sentence.split()])
            return self._states.carried()
        finally:
            self._states = states
