"""One training step's loss as a module, so that DistributedDataParallel can wrap it.

DDP hooks the parameters a module's forward uses; the sampled softmax reads the softmax
rows outside the biLM's forward, so the whole loss (biLM, dropout, sampled softmax) is
one forward here. Every parameter gets a gradient on every step (the softmax gradient
is dense: rows are gathered by indexing, not by a sparse embedding), so DDP needs neither
``find_unused_parameters`` nor a static graph, and Adagrad steps on identical averaged
gradients on every rank. The truncated-BPTT state is an input, detached between steps, so
the carried LSTM state does not get in DDP's way.
"""

from __future__ import annotations

import torch
from torch import nn

from elmo_cache.train.bilm import TrainableBiLM
from elmo_cache.train.softmax import LogUniformSampler, sampled_softmax_loss

__all__ = ["StepLoss"]

State = list[tuple[torch.Tensor, torch.Tensor]]


class StepLoss(nn.Module):
    """The loss of this process's rows of a (global) batch."""

    def __init__(self, model: TrainableBiLM, sampler: LogUniformSampler):
        super().__init__()
        self.model = model
        # Not a module: its generator state is checkpointed by the trainer, alike on every rank.
        self.sampler = sampler

    def forward(
        self,
        inputs: torch.Tensor,
        char_table: torch.Tensor,
        state: State,
        resets: torch.Tensor | None,
        targets: torch.Tensor,
        weights: torch.Tensor,
        counts: torch.Tensor,
    ) -> tuple[torch.Tensor, State]:
        """``(loss, final state)``: the mean over both directions of this rank's summed loss over the
        *global* batch's prediction count ``counts`` (2,), so that the ranks' losses add up to the
        loss of the whole batch (and their gradients, summed, to its gradient)."""
        _, outputs, final = self.model(inputs, char_table, state, resets)
        hidden = self.model.top_hidden(outputs)
        per_row = sampled_softmax_loss(
            hidden.reshape(-1, hidden.shape[-1]),
            targets.reshape(-1),
            weights.reshape(-1),
            self.model.softmax_weight,
            self.model.softmax_bias,
            self.sampler,
        ).view(2, -1)
        return (per_row.sum(1) / counts.clamp_min(1.0)).mean(), final
