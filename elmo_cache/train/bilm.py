"""A trainable ELMo biLM, parameterised exactly as the bilm-tf weight file stores it.

Each parameter *is* one dataset of the file (same shape, same TensorFlow orientation,
gate order i, j, f, o, forget bias +1 added at run time, 261 unshifted character rows),
so exporting is a rename and the inference encoder reads what training optimised with no
conversion that could drift. The forward and backward LSTM stacks are separate parameters
but run together as one batched matmul (dim 0 = direction); the char-CNN, highway,
projection and softmax are shared by both directions, as in bilm-tf.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from elmo_cache.model.options import ModelOptions
from elmo_cache.model.weights import FORGET_BIAS, lstm_prefix

__all__ = ["TrainableBiLM"]

# Unshifted id of the padding character (the file's row 260).
PADDING_CHAR = 260

# Uniform init range of the char-CNN filters in bilm-tf (relu activation).
_CNN_INIT = 0.05
# Highway gate bias at init: carry most of the input through at first (bilm-tf).
_HIGHWAY_GATE_BIAS = -2.0


# Words are convolved in two groups, short and long; see _by_length.
_SHORT_WORD_SLOTS = 16


def _by_length(char_ids: torch.Tensor, options: ModelOptions) -> list[torch.Tensor]:
    """The words' char ids in groups that may be cut to fewer slots without changing any result.

    A word fills its first k slots (begin-of-word, bytes, end-of-word) and pads the rest, so
    every window of a filter that starts at or after slot k sees padding only, and all those
    windows give the same value. The max over positions is therefore unchanged when the
    slots are cut to k + widest filter: one all-padding window of every width remains. Most
    words are short, so convolving them over 16 + 5 slots instead of 50 halves the char-CNN.
    """
    cut = _SHORT_WORD_SLOTS + max(width for width, _ in options.filters)
    if cut >= char_ids.shape[1]:
        return [char_ids]
    short = _is_short(char_ids)
    return [char_ids[short, :cut], char_ids[~short]]


def _is_short(char_ids: torch.Tensor) -> torch.Tensor:
    return (char_ids != PADDING_CHAR).sum(1) <= _SHORT_WORD_SLOTS


def _restore_order(char_ids: torch.Tensor, options: ModelOptions) -> torch.Tensor:
    """Row permutation that puts the concatenated groups of :func:`_by_length` back in input order."""
    if _SHORT_WORD_SLOTS + max(width for width, _ in options.filters) >= char_ids.shape[1]:
        return torch.arange(char_ids.shape[0], device=char_ids.device)
    grouped = torch.cat([torch.nonzero(_is_short(char_ids)).squeeze(1), torch.nonzero(~_is_short(char_ids)).squeeze(1)])
    return torch.argsort(grouped)


class TrainableBiLM(nn.Module):
    """Char-CNN + highway + projection, two LSTM stacks, and a shared softmax over ``vocab_size`` words."""

    def __init__(self, options: ModelOptions, vocab_size: int, *, dropout: float = 0.1):
        super().__init__()
        self.options = options
        self.dropout = dropout
        c, p, d, nf = options.char_embedding_dim, options.projection_dim, options.lstm_dim, options.n_filters
        self.char_embed = nn.Parameter(torch.empty(options.n_characters - 1, c))
        # conv1d layout (num, C, width); the file's (1, width, C, num) is a transpose away.
        self.conv_weights = nn.ParameterList(nn.Parameter(torch.empty(num, c, width)) for width, num in options.filters)
        self.conv_biases = nn.ParameterList(nn.Parameter(torch.empty(num)) for _, num in options.filters)
        self.highway_weights = nn.ParameterList(nn.Parameter(torch.empty(nf, nf)) for _ in range(2 * options.n_highway))
        self.highway_biases = nn.ParameterList(nn.Parameter(torch.empty(nf)) for _ in range(2 * options.n_highway))
        self.proj_weight = nn.Parameter(torch.empty(nf, p))
        self.proj_bias = nn.Parameter(torch.empty(p))
        # Per layer, both directions: W_0 (2, 2P, 4D) rows [input; previous h], B (2, 4D), W_P_0 (2, D, P).
        self.lstm_weights = nn.ParameterList(
            nn.Parameter(torch.empty(2, 2 * p, 4 * d)) for _ in range(options.n_layers)
        )
        self.lstm_biases = nn.ParameterList(nn.Parameter(torch.empty(2, 4 * d)) for _ in range(options.n_layers))
        self.lstm_projections = nn.ParameterList(nn.Parameter(torch.empty(2, d, p)) for _ in range(options.n_layers))
        self.softmax_weight = nn.Parameter(torch.empty(vocab_size, p))
        self.softmax_bias = nn.Parameter(torch.empty(vocab_size))
        self.reset_parameters()

    @property
    def vocab_size(self) -> int:
        return self.softmax_weight.shape[0]

    def reset_parameters(self) -> None:
        """bilm-tf's initialisers (uniform char embeddings and filters, scaled normals, Glorot LSTMs)."""
        nf, p = self.options.n_filters, self.options.projection_dim
        with torch.no_grad():
            self.char_embed.uniform_(-1.0, 1.0)
            for weight, bias in zip(self.conv_weights, self.conv_biases):
                weight.uniform_(-_CNN_INIT, _CNN_INIT)
                bias.zero_()
            for k in range(self.options.n_highway):
                self.highway_weights[2 * k].normal_(0.0, math.sqrt(1.0 / nf))
                self.highway_biases[2 * k].fill_(_HIGHWAY_GATE_BIAS)
                self.highway_weights[2 * k + 1].normal_(0.0, math.sqrt(1.0 / nf))
                self.highway_biases[2 * k + 1].zero_()
            self.proj_weight.normal_(0.0, math.sqrt(1.0 / nf))
            self.proj_bias.zero_()
            for weight, bias, proj in zip(self.lstm_weights, self.lstm_biases, self.lstm_projections):
                limit = math.sqrt(6.0 / (weight.shape[1] + weight.shape[2]))
                weight.uniform_(-limit, limit)
                bias.zero_()
                limit = math.sqrt(6.0 / (proj.shape[1] + proj.shape[2]))
                proj.uniform_(-limit, limit)
            self.softmax_weight.normal_(0.0, 1.0 / math.sqrt(p))
            self.softmax_bias.zero_()

    # ------------------------------------------------------------------ layers
    def token_embeddings(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(n_words, max_chars) unshifted char ids -> (n_words, P)."""
        activation = torch.relu if self.options.activation == "relu" else torch.tanh
        x = torch.cat([self._pooled_filters(chars, activation) for chars in _by_length(char_ids, self.options)])
        for k in range(self.options.n_highway):
            # The file's names are swapped: "carry" computes the gate of the transformed path.
            gate = torch.sigmoid(x @ self.highway_weights[2 * k] + self.highway_biases[2 * k])
            transformed = torch.relu(x @ self.highway_weights[2 * k + 1] + self.highway_biases[2 * k + 1])
            x = gate * transformed + (1.0 - gate) * x
        return (x @ self.proj_weight + self.proj_bias)[_restore_order(char_ids, self.options)]

    def _pooled_filters(
        self, char_ids: torch.Tensor, activation: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        x = F.embedding(char_ids.long(), self.char_embed).transpose(1, 2)
        # Max over positions before the bias and activation: the same as after, and cheaper.
        pooled = [activation(F.conv1d(x, w).amax(dim=2) + b) for w, b in zip(self.conv_weights, self.conv_biases)]
        return torch.cat(pooled, dim=1)

    def zero_state(
        self, batch_size: int, device: torch.device | str = "cpu"
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer ``(h (2, B, P), c (2, B, D))`` of zeros."""
        p, d = self.options.projection_dim, self.options.lstm_dim
        return [
            (torch.zeros(2, batch_size, p, device=device), torch.zeros(2, batch_size, d, device=device))
            for _ in range(self.options.n_layers)
        ]

    def lstm(
        self,
        x: torch.Tensor,
        state: list[tuple[torch.Tensor, torch.Tensor]],
        resets: torch.Tensor | None = None,
    ) -> tuple[list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
        """Run both LSTM stacks over ``x`` (2, B, T, P) from ``state``.

        Returns every layer's output (2, B, T, P), skip connections applied, and the final state.
        Dropout (training mode) hits every layer's input, before the skip connection reads it.
        ``resets`` (B, T) bool: where True, row b reads step t from the zero state (both
        directions, every layer), as if the text before it were not there.
        """
        keep: dict[int, torch.Tensor] = {}
        if resets is not None:
            for t in torch.nonzero(resets.any(0)).flatten().tolist():
                keep[t] = (~resets[:, t]).to(x.dtype).view(1, -1, 1)
        options = self.options
        p, d = options.projection_dim, options.lstm_dim
        cell_clip, proj_clip = options.cell_clip, options.proj_clip
        batch, steps = x.shape[1], x.shape[2]
        outputs, final = [], []
        for layer in range(options.n_layers):
            w, b, w_p = self.lstm_weights[layer], self.lstm_biases[layer], self.lstm_projections[layer]
            if self.training and self.dropout > 0:
                x = F.dropout(x, self.dropout, training=True)
            # Input-to-gate products of all steps in one GEMM; only the recurrence stays in the loop.
            gates_x = torch.baddbmm(b.unsqueeze(1), x.reshape(2, batch * steps, p), w[:, :p]).view(
                2, batch, steps, 4 * d
            )
            # One view per step: unbind's backward is a single stack, slicing's a full zero tensor per step.
            gates_steps = gates_x.unbind(2)
            w_h = w[:, p:]
            h, c = state[layer]
            hs = []
            for t in range(steps):
                if t in keep:
                    h, c = h * keep[t], c * keep[t]
                gates = torch.baddbmm(gates_steps[t], h, w_h)
                i, j, f, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f + FORGET_BIAS) * c + torch.sigmoid(i) * torch.tanh(j)
                if cell_clip is not None:
                    c = c.clamp(-cell_clip, cell_clip)
                h = torch.bmm(torch.sigmoid(o) * torch.tanh(c), w_p)
                if proj_clip is not None:
                    h = h.clamp(-proj_clip, proj_clip)
                hs.append(h)
            out = torch.stack(hs, dim=2)
            if layer > 0 and options.use_skip_connections:
                out = out + x
            outputs.append(out)
            final.append((h, c))
            x = out
        return outputs, final

    def forward(
        self,
        type_ids: torch.Tensor,
        char_table: torch.Tensor,
        state: list[tuple[torch.Tensor, torch.Tensor]],
        resets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[tuple[torch.Tensor, torch.Tensor]]]:
        """Type ids (2, B, T) -> token embeddings (2, B, T, P), layer outputs, final state.

        The char-CNN runs once per distinct word of the batch, not once per token. ``resets``:
        see :meth:`lstm`.
        """
        unique, inverse = torch.unique(type_ids, return_inverse=True)
        embedded = self.token_embeddings(char_table[unique])[inverse]
        outputs, final = self.lstm(embedded, state, resets)
        return embedded, outputs, final

    def top_hidden(self, outputs: list[torch.Tensor]) -> torch.Tensor:
        """What the softmax reads: the top layer, with dropout while training."""
        top = outputs[-1]
        return F.dropout(top, self.dropout, training=True) if self.training and self.dropout > 0 else top

    # ------------------------------------------------------------- file layout
    def weight_datasets(self) -> dict[str, np.ndarray]:
        """Every dataset of the bilm-tf weight file (``dump_weights`` layout: no softmax), float32."""
        return {name: _array(view) for name, view in self._dataset_views().items() if not name.startswith("softmax/")}

    def softmax_datasets(self) -> dict[str, np.ndarray]:
        """``softmax/W`` (V, P) and ``softmax/b`` (V,): what perplexity and further training need."""
        return {name: _array(view) for name, view in self._dataset_views().items() if name.startswith("softmax/")}

    @torch.no_grad()
    def load_datasets(self, datasets: dict[str, np.ndarray]) -> None:
        """The inverse of :meth:`weight_datasets` + :meth:`softmax_datasets` (shapes already checked)."""
        for name, tensor in self._dataset_views().items():
            tensor.copy_(torch.from_numpy(np.asarray(datasets[name], dtype=np.float32)).reshape(tensor.shape))

    def _dataset_views(self) -> dict[str, torch.Tensor]:
        views = {"char_embed": self.char_embed.data}
        for i, (weight, bias) in enumerate(zip(self.conv_weights, self.conv_biases)):
            views[f"CNN/W_cnn_{i}"] = weight.data.permute(2, 1, 0).unsqueeze(0)
            views[f"CNN/b_cnn_{i}"] = bias.data
        for k in range(self.options.n_highway):
            views[f"CNN_high_{k}/W_carry"] = self.highway_weights[2 * k].data
            views[f"CNN_high_{k}/b_carry"] = self.highway_biases[2 * k].data
            views[f"CNN_high_{k}/W_transform"] = self.highway_weights[2 * k + 1].data
            views[f"CNN_high_{k}/b_transform"] = self.highway_biases[2 * k + 1].data
        views["CNN_proj/W_proj"] = self.proj_weight.data
        views["CNN_proj/b_proj"] = self.proj_bias.data
        for layer in range(self.options.n_layers):
            for direction in (0, 1):
                prefix = lstm_prefix(direction, layer)
                views[f"{prefix}/W_0"] = self.lstm_weights[layer].data[direction]
                views[f"{prefix}/B"] = self.lstm_biases[layer].data[direction]
                views[f"{prefix}/W_P_0"] = self.lstm_projections[layer].data[direction]
        views["softmax/W"] = self.softmax_weight.data
        views["softmax/b"] = self.softmax_bias.data
        return views


def _array(tensor: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(tensor.detach().to("cpu", torch.float32).numpy())
