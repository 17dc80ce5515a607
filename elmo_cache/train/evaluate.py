"""Full-softmax perplexity of a trained model directory on a text (``elmo-cache perplexity``).

Every sentence of n tokens counts n + 1 predictions per direction: the forward model
predicts its tokens and ``</S>`` from ``<S>``, the backward one its tokens reversed and
``<S>`` from ``</S>``. That is what an n-gram model scores, so the figures compare.

Two ways to read the text:

* ``stream`` (default; how bilm-tf evaluates): the text in file order, the LSTM state
  carried from sentence to sentence, as in training.
* ``sentence``: every sentence alone from the zero state, as the Encoder runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from elmo_cache.encoder.hardware import resolve_device
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.chars import sentence_char_ids
from elmo_cache.train.bilm import TrainableBiLM
from elmo_cache.train.config import PERPLEXITY_MODES
from elmo_cache.train.data import StreamBatch, TokenizedCorpus
from elmo_cache.train.files import load_trained_model
from elmo_cache.train.softmax import full_softmax_loss
from elmo_cache.train.vocab import BOS, EOS

__all__ = ["PerplexityResult", "perplexity", "warm_state", "MODES"]

# stream: state carried across sentences in file order (as bilm-tf trains); sentence: every
# sentence from the zero state (the encoder's default); warm: every sentence from the encoder's
# "warm" state (the state reached after reading WARMUP_TEXT).
MODES = PERPLEXITY_MODES


@dataclass(frozen=True)
class PerplexityResult:
    """Perplexities of one evaluation; ``mean`` is exp of the two directions' mean loss."""

    forward: float
    backward: float
    mean: float
    # Predictions scored per direction (tokens + one sentence end per sentence).
    predictions: int
    sentences: int
    tokens: int
    # Share of tokens outside the vocabulary (scored as <UNK>).
    oov_rate: float
    mode: str

    def as_dict(self) -> dict[str, float | int | str]:
        return dict(self.__dict__)


@torch.no_grad()
def perplexity(
    model_dir: str | os.PathLike[str],
    text: str | os.PathLike[str],
    *,
    mode: str = "stream",
    batch_size: int = 32,
    unroll: int = 20,
    device: str | None = None,
) -> PerplexityResult:
    """Perplexity of the biLM in ``model_dir`` on ``text`` (one sentence per line), full softmax."""
    if mode not in MODES:
        raise InvalidParameterError(f"mode: {mode!r} is not one of {list(MODES)}")
    if batch_size < 1 or unroll < 1:
        raise InvalidParameterError("batch_size and unroll must be >= 1")
    resolved = resolve_device(device)
    model, vocab = load_trained_model(model_dir)
    model.to(resolved)
    data = TokenizedCorpus.from_file(text, vocab, model.options.max_characters_per_token)
    char_table = torch.from_numpy(data.char_ids).to(device=resolved, dtype=torch.int32)
    nll = np.zeros(2)
    counted = np.zeros(2)
    batches = data.evaluation_batches(batch_size, unroll) if mode == "stream" else _sentence_batches(data, batch_size)
    warm = warm_state(model) if mode == "warm" else None
    state = None
    for batch in batches:
        inputs = torch.from_numpy(batch.inputs).to(device=resolved, dtype=torch.int64)
        if warm is not None:
            state = [(h.expand(-1, inputs.shape[1], -1), c.expand(-1, inputs.shape[1], -1)) for h, c in warm]
        elif mode == "sentence" or state is None:
            state = model.zero_state(inputs.shape[1], resolved)
        _, outputs, state = model(inputs, char_table, state)
        top = outputs[-1]
        losses = full_softmax_loss(
            top.reshape(-1, top.shape[-1]),
            torch.from_numpy(batch.targets).to(resolved).reshape(-1),
            model.softmax_weight,
            model.softmax_bias,
        ).view(2, -1)
        weights = torch.from_numpy(batch.weights).to(resolved).view(2, -1)
        nll += (losses * weights).sum(1).double().cpu().numpy()
        counted += weights.sum(1).double().cpu().numpy()
    forward, backward = (nll / np.maximum(counted, 1)).tolist()
    return PerplexityResult(
        forward=math.exp(forward),
        backward=math.exp(backward),
        mean=math.exp((forward + backward) / 2),
        predictions=int(counted[0]),
        sentences=data.n_sentences,
        tokens=data.n_tokens,
        oov_rate=data.oov_rate(),
        mode=mode,
    )


def warm_state(model: TrainableBiLM) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The encoder's "warm" initial state for a trainable model: per layer ``(h (2, 1, P), c (2, 1, D))``
    after reading :data:`~elmo_cache.encoder.encoder.WARMUP_TEXT` from zeros, one sentence after another,
    each direction reading every sentence in its own order (as the encoder's carried state does)."""
    from elmo_cache.encoder.encoder import WARMUP_TEXT

    device = model.softmax_weight.device
    state = model.zero_state(1, device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for sentence in WARMUP_TEXT:
                chars = sentence_char_ids(sentence.split(), model.options.max_characters_per_token) - 1
                embedded = model.token_embeddings(torch.from_numpy(chars).to(device))
                _, state = model.lstm(torch.stack([embedded, embedded.flip(0)]).unsqueeze(1), state)
    finally:
        model.train(was_training)
    return state


def _sentence_batches(data: TokenizedCorpus, batch_size: int) -> Iterator[StreamBatch]:
    """Sentences of similar length padded into batches; padding comes after each sentence's end,
    so (the LSTM being causal) it never changes a counted prediction."""
    bos, eos = data.vocab.id(BOS), data.vocab.id(EOS)
    order = np.argsort(-data.lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        width = int(data.lengths[chosen[0]]) + 1
        inputs = np.zeros((2, len(chosen), width), dtype=np.int64)
        targets = np.zeros_like(inputs)
        weights = np.zeros(inputs.shape, dtype=np.float32)
        for row, i in enumerate(chosen):
            tokens = data.tokens[data.offsets[i] : data.offsets[i + 1]]
            n = len(tokens)
            words = data.type_to_target[tokens]
            inputs[0, row, : n + 1] = np.concatenate([[bos], tokens])
            targets[0, row, : n + 1] = np.concatenate([words, [eos]])
            inputs[1, row, : n + 1] = np.concatenate([[eos], tokens[::-1]])
            targets[1, row, : n + 1] = np.concatenate([words[::-1], [bos]])
            weights[:, row, : n + 1] = 1.0
        yield StreamBatch(inputs, targets, weights)
