"""Sampled softmax with a log-uniform sampler (training) and the full softmax (evaluation).

As in TensorFlow's ``sampled_softmax_loss`` with ``log_uniform_candidate_sampler``, which
bilm-tf trains with: ``num_sampled`` distinct candidates are drawn for each batch from
P(k) = log((k + 2) / (k + 1)) / log(V + 1), a Zipf-like law that matches a vocabulary
sorted by falling frequency; every logit is corrected by the log of its expected count,
and a candidate that happens to be a row's own target is masked out for that row.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["LogUniformSampler", "sampled_softmax_loss", "full_softmax_loss"]

# Draws per attempt, as a multiple of the distinct candidates wanted.
_OVERDRAW = 4


class LogUniformSampler:
    """Draws distinct word ids, frequent (small) ids most often; its state is checkpointed."""

    def __init__(self, vocab_size: int, num_sampled: int, seed: int = 0):
        self.vocab_size = vocab_size
        self.num_sampled = min(num_sampled, vocab_size)
        self.rng = np.random.default_rng(seed)
        ids = np.arange(vocab_size, dtype=np.float64)
        self.log_range = math.log(vocab_size + 1)
        self.probabilities = np.log1p(1.0 / (ids + 1.0)) / self.log_range

    def sample(self) -> tuple[np.ndarray, int]:
        """``(candidates, num_tries)``: distinct ids in draw order and the draws it took."""
        if self.num_sampled == self.vocab_size:
            return np.arange(self.vocab_size), self.vocab_size
        draws: list[np.ndarray] = []
        while True:
            block = (
                np.floor(np.exp(self.rng.random(_OVERDRAW * self.num_sampled) * self.log_range)).astype(np.int64) - 1
            )
            draws.append(np.clip(block, 0, self.vocab_size - 1))
            joined = np.concatenate(draws)
            unique, first = np.unique(joined, return_index=True)
            if len(unique) >= self.num_sampled:
                first.sort()
                kept = first[: self.num_sampled]
                return joined[kept], int(kept[-1]) + 1

    def log_expected_count(self, ids: np.ndarray | torch.Tensor, num_tries: int) -> torch.Tensor:
        """log E[times id appears among ``num_tries`` draws]: 1 - (1 - p)^tries for a unique sampler."""
        p = torch.as_tensor(self.probabilities, dtype=torch.float64)[torch.as_tensor(ids).cpu()]
        if self.num_sampled == self.vocab_size:  # every id is a candidate, with certainty
            return torch.zeros(p.shape)
        return torch.log(-torch.expm1(num_tries * torch.log1p(-p))).float()


def sampled_softmax_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
    softmax_weight: torch.Tensor,
    softmax_bias: torch.Tensor,
    sampler: LogUniformSampler,
) -> torch.Tensor:
    """Per-row loss (N,) of hidden states (N, P) against target ids (N,); rows with weight 0 give 0."""
    candidates, tries = sampler.sample()
    device = hidden.device
    candidates_t = torch.from_numpy(candidates).to(device)
    true_correction = sampler.log_expected_count(targets, tries).to(device)
    sampled_correction = sampler.log_expected_count(candidates, tries).to(device)
    # Where a row's target is among the candidates, that candidate must not count against it.
    slot_of = torch.full((softmax_weight.shape[0],), -1, dtype=torch.int64, device=device)
    slot_of[candidates_t] = torch.arange(len(candidates), device=device)
    hit_slot = slot_of[targets]
    hit_rows = torch.nonzero(hit_slot >= 0).squeeze(1)
    return _SampledSoftmax.apply(
        hidden,
        softmax_weight[targets],
        softmax_bias[targets] - true_correction,
        softmax_weight[candidates_t],
        softmax_bias[candidates_t] - sampled_correction,
        hit_rows,
        hit_slot[hit_rows],
        weights,
    )


class _SampledSoftmax(torch.autograd.Function):
    """Cross-entropy of [true logit, sampled logits] per row, with the (N, num_sampled) logit
    matrix computed once and turned into probabilities in place: autograd's version keeps
    several copies of that matrix, the largest tensor of a training step, and is 3x slower."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        true_w: torch.Tensor,
        true_b: torch.Tensor,
        sampled_w: torch.Tensor,
        sampled_b: torch.Tensor,
        hit_rows: torch.Tensor,
        hit_slots: torch.Tensor,
        weights: torch.Tensor,
    ) -> torch.Tensor:
        logits = torch.addmm(sampled_b, hidden, sampled_w.T)
        logits[hit_rows, hit_slots] = float("-inf")
        true_logits = (hidden * true_w).sum(1) + true_b
        top = torch.maximum(logits.amax(1), true_logits)
        probs = logits.sub_(top.unsqueeze(1)).exp_()
        true_exp = torch.exp(true_logits - top)
        total = probs.sum(1) + true_exp
        probs.div_(total.unsqueeze(1))
        loss = (torch.log(total) - (true_logits - top)) * weights
        ctx.save_for_backward(hidden, true_w, sampled_w, probs, true_exp / total, weights)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        hidden, true_w, sampled_w, probs, true_prob, weights = ctx.saved_tensors
        scale = grad_loss * weights
        # d loss / d logit: p for sampled logits, p - 1 for the true one, times the row's scale.
        grad_sampled = probs * scale.unsqueeze(1)
        grad_true = (true_prob - 1.0) * scale
        grad_hidden = grad_sampled @ sampled_w + grad_true.unsqueeze(1) * true_w
        grad_sampled_w = grad_sampled.T @ hidden
        grad_sampled_b = grad_sampled.sum(0)
        grad_true_w = grad_true.unsqueeze(1) * hidden
        return grad_hidden, grad_true_w, grad_true, grad_sampled_w, grad_sampled_b, None, None, None


def full_softmax_loss(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    softmax_weight: torch.Tensor,
    softmax_bias: torch.Tensor,
    chunk: int = 4096,
) -> torch.Tensor:
    """Exact negative log-likelihood (N,) over the whole vocabulary, ``chunk`` rows at a time."""
    losses = []
    for start in range(0, hidden.shape[0], chunk):
        logits = hidden[start : start + chunk] @ softmax_weight.T + softmax_bias
        losses.append(
            torch.nn.functional.cross_entropy(logits.float(), targets[start : start + chunk], reduction="none")
        )
    return torch.cat(losses) if losses else hidden.new_zeros(0)
