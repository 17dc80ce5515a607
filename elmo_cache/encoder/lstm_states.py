"""Where each batch's biLSTM state starts, by the encoder's ``initial_state`` mode.

"zero" and "warm" give every sentence one fixed state (zeros, or the final state after the encoder's warm-up
text), so a sentence's vectors do not depend on its batch. "carry" gives each batch position the final state
its sentence of the batch before left there, as bilm-tf and allennlp 0.9 did: vectors then depend on what came
before (the compat ElmoEmbedder's ``stateful=True``, and the warm-up itself).
"""

from __future__ import annotations

import torch

__all__ = ["InitialStates"]


class InitialStates:
    """The start state of each batch (``(n_lstm, 2, batch, dim)`` for h and c) and, when carrying, the carry."""

    def __init__(self, n_lstm: int, projection_dim: int, lstm_dim: int, device: torch.device, *, carry: bool):
        self.carry = carry
        self.device = device
        # The fixed start of "zero" and "warm" (one batch position, expanded per batch).
        self.h0 = torch.zeros(n_lstm, 2, 1, projection_dim, device=device)
        self.c0 = torch.zeros(n_lstm, 2, 1, lstm_dim, device=device)
        # "carry": the final state per batch position (grown to the largest batch seen).
        self._carry_h = torch.zeros(n_lstm, 2, 0, projection_dim, device=device)
        self._carry_c = torch.zeros(n_lstm, 2, 0, lstm_dim, device=device)

    def start_from(self, h0: torch.Tensor, c0: torch.Tensor) -> None:
        """Make ``(h0, c0)`` (one batch position) the fixed start: the warm state."""
        self.h0, self.c0 = h0, c0

    def for_batch(self, order: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The start states of a batch whose sorted position ``k`` holds input sentence ``order[k]``."""
        batch = len(order)
        if not self.carry:
            return self.h0.expand(-1, -1, batch, -1).contiguous(), self.c0.expand(-1, -1, batch, -1).contiguous()
        self._grow(batch)
        index = torch.tensor(order, device=self.device)
        return self._carry_h.index_select(2, index), self._carry_c.index_select(2, index)

    def after_batch(self, order: list[int], final_h: torch.Tensor, final_c: torch.Tensor) -> None:
        """Keep a batch's final states for the next batch ("carry"; nothing otherwise)."""
        if self.carry:
            index = torch.tensor(order, device=self.device)
            self._carry_h.index_copy_(2, index, final_h)
            self._carry_c.index_copy_(2, index, final_c)

    def carried(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of the carried states, one per batch position seen."""
        return self._carry_h.clone(), self._carry_c.clone()

    def reset(self) -> None:
        """Forget the carried states: the next batch starts from zeros."""
        self._carry_h = self._carry_h[:, :, :0]
        self._carry_c = self._carry_c[:, :, :0]

    def _grow(self, batch: int) -> None:
        have = self._carry_h.shape[2]
        if batch > have:
            n_lstm, _, _, p = self._carry_h.shape
            d = self._carry_c.shape[3]
            self._carry_h = torch.cat([self._carry_h, torch.zeros(n_lstm, 2, batch - have, p, device=self.device)], 2)
            self._carry_c = torch.cat([self._carry_c, torch.zeros(n_lstm, 2, batch - have, d, device=self.device)], 2)
