"""The ELMo biLM computation in PyTorch: char-CNN, highway, projection, biLSTM.

Inference only, written for throughput on packed (length-sorted) batches:

* Both LSTM directions run together as one batched matmul (dim 0 = direction).
* The input-to-gate products are computed for many timesteps at once (one large
  GEMM per chunk of steps); only the recurrent product stays inside the loop.
* Sentences are sorted by length, longest first, so at step ``t`` the live
  sentences are a prefix of the batch: no padding is ever computed, and a finished
  sentence's state simply stops being updated (which is also its final state).
* Matmuls run in the compute dtype (float32, bfloat16 or float16); gate
  non-linearities, the cell state and all outputs stay in float32.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Any

import torch
import torch.nn.functional as F

from elmo_cache.model.float32 import ieee_float32
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.weights import ElmoWeights

__all__ = ["BiLM", "PackedBatch", "FusedCell"]

# Rows per input-projection GEMM: big enough to run near peak, small enough that the
# (2, rows, 4 * lstm_dim) gate buffer stays modest (2048 rows: 268 MB fp32 for the Original).
_INPUT_CHUNK_ROWS = 2048


class PackedBatch:
    """Time-major packing of length-sorted sequences (longest first).

    Row ``starts[t] + b`` holds timestep ``t`` of sequence ``b`` for ``b < sizes[t]``.
    """

    def __init__(self, lengths_sorted: list[int]):
        self.lengths = lengths_sorted
        self.max_len = lengths_sorted[0] if lengths_sorted else 0
        sizes = []
        live = len(lengths_sorted)
        for t in range(self.max_len):
            while live and lengths_sorted[live - 1] <= t:
                live -= 1
            sizes.append(live)
        self.sizes = sizes
        self.starts = [0]
        for size in sizes:
            self.starts.append(self.starts[-1] + size)
        self.n_rows = self.starts[-1]


class BiLM:
    """ELMo biLM weights on one device in one compute dtype (inference only: no autograd state)."""

    def __init__(self, options: ModelOptions, weights: ElmoWeights, compute_dtype: torch.dtype = torch.float32):
        self.options = options
        self.compute_dtype = compute_dtype
        cd = compute_dtype
        # The embedding table stays float32: it is tiny and feeds the convolutions exactly.
        self.char_embed = weights.char_embed
        self.conv_weights = [w.to(cd) for w, _ in weights.convolutions]
        self.conv_biases = [b for _, b in weights.convolutions]
        self.highways = [(wc.to(cd), bc, wt.to(cd), bt) for wc, bc, wt, bt in weights.highways]
        self.proj_weight = weights.proj_weight.to(cd)
        self.proj_bias = weights.proj_bias
        # A word embedding added to the projection (ELMoForManyLangs models), else None.
        self.word_embed = weights.word_embed
        self.word_proj = None if weights.word_proj is None else weights.word_proj.to(cd)
        self.lstm = [
            (layer.w_input.to(cd), layer.w_hidden.to(cd), layer.bias, layer.w_proj.to(cd)) for layer in weights.lstm
        ]
        self.activation = torch.relu if options.activation == "relu" else torch.tanh
        # The LSTM cell's element-wise work compiled into one kernel, or None for eager (set by the encoder).
        self._fused_cell: FusedCell | None = None

    @property
    def fused(self) -> bool:
        """Whether the LSTM cell runs compiled (:class:`FusedCell`)."""
        return self._fused_cell is not None

    @fused.setter
    def fused(self, value: bool) -> None:
        if value != self.fused:
            self._fused_cell = FusedCell() if value else None

    def to_device(self, device: torch.device) -> BiLM:
        """Move every tensor to ``device``."""
        self.char_embed = self.char_embed.to(device)
        self.conv_weights = [w.to(device) for w in self.conv_weights]
        self.conv_biases = [b.to(device) for b in self.conv_biases]
        self.highways = [
            (wc.to(device), bc.to(device), wt.to(device), bt.to(device)) for wc, bc, wt, bt in self.highways
        ]
        self.proj_weight = self.proj_weight.to(device)
        self.proj_bias = self.proj_bias.to(device)
        if self.word_embed is not None and self.word_proj is not None:
            self.word_embed = self.word_embed.to(device)
            self.word_proj = self.word_proj.to(device)
        self.lstm = [(wi.to(device), wh.to(device), b.to(device), wp.to(device)) for wi, wh, b, wp in self.lstm]
        return self

    # ---------------------------------------------------------------- char-CNN
    @torch.inference_mode()
    def token_embeddings(self, char_ids: torch.Tensor, word_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(n_words, max_chars) char ids (bilm-tf: +1-shifted) -> (n_words, projection_dim) float32.

        ``word_ids`` (n_words,): rows of the word embedding, for models that have one (its
        projection is added to the char-CNN's: the projection of the two concatenated)."""
        with self._exact_float32():
            return self._token_embeddings(char_ids, word_ids)

    def _exact_float32(self) -> contextlib.AbstractContextManager[None]:
        """IEEE float32 on CUDA while an fp32 model runs (:mod:`elmo_cache.model.float32`)."""
        if self.compute_dtype != torch.float32:
            return contextlib.nullcontext()
        return ieee_float32(self.char_embed.device)

    def _token_embeddings(self, char_ids: torch.Tensor, word_ids: torch.Tensor | None) -> torch.Tensor:
        cd = self.compute_dtype
        embedded = F.embedding(char_ids, self.char_embed).transpose(1, 2).to(cd)  # (n, C, max_chars)
        pooled = []
        for weight, bias in zip(self.conv_weights, self.conv_biases):
            conv = F.conv1d(embedded, weight)  # (n, num, max_chars - width + 1)
            # max-pool then activation, as the original (equal either way for monotonic activations)
            pooled.append(self.activation(conv.amax(dim=2).float() + bias))
        x = torch.cat(pooled, dim=1)
        for w_carry, b_carry, w_transform, b_transform in self.highways:
            xc = x.to(cd)
            # The original's names are inverted: the "carry" matrix computes the gate
            # that scales the *transformed* path.
            gate = torch.sigmoid((xc @ w_carry).float() + b_carry)
            transformed = torch.relu((xc @ w_transform).float() + b_transform)
            x = torch.lerp(x, transformed, gate)  # gate * transformed + (1 - gate) * x
        projected = (x.to(cd) @ self.proj_weight).float() + self.proj_bias
        if self.word_embed is not None and self.word_proj is not None:
            if word_ids is None:
                raise ValueError("this model has a word embedding: token_embeddings needs word_ids")
            words = F.embedding(word_ids, self.word_embed).to(cd)
            projected = projected + (words @ self.word_proj).float()
        return projected

    # ------------------------------------------------------------------ biLSTM
    @torch.inference_mode()
    def lstm_layers(
        self,
        inputs: torch.Tensor,
        packed: PackedBatch,
        initial_h: torch.Tensor,
        initial_c: torch.Tensor,
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Run every LSTM layer over packed inputs.

        ``inputs``: (2, n_rows, P) float32, direction 1 already time-reversed per sequence.
        ``initial_h``: (n_layers, 2, batch, P), ``initial_c``: (n_layers, 2, batch, D), float32,
        rows in sorted order. Returns the per-layer outputs (2, n_rows, P) float32 (with the
        skip connection applied) and the final states, same shapes as the initial ones.
        """
        with self._exact_float32():
            return self._lstm_layers(inputs, packed, initial_h, initial_c)

    def _lstm_layers(
        self, inputs: torch.Tensor, packed: PackedBatch, initial_h: torch.Tensor, initial_c: torch.Tensor
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        options = self.options
        final_h = initial_h.clone()
        final_c = initial_c.clone()
        outputs = []
        x = inputs
        for layer, weights in enumerate(self.lstm):
            h_out = self._run_layer(x, packed, weights, final_h[layer], final_c[layer])
            if layer > 0 and options.use_skip_connections:
                h_out = h_out + x
            outputs.append(h_out)
            x = h_out
        return outputs, final_h, final_c

    def _run_layer(
        self,
        x: torch.Tensor,
        packed: PackedBatch,
        weights: tuple[torch.Tensor, ...],
        h: torch.Tensor,
        c: torch.Tensor,
    ) -> torch.Tensor:
        """One layer, both directions; writes final states into ``h``/``c`` (2, batch, .)."""
        w_input, w_hidden, bias, w_proj = weights
        cd = self.compute_dtype
        cell_clip = float("inf") if self.options.cell_clip is None else float(self.options.cell_clip)
        proj_clip = self.options.proj_clip
        cell_step = self._fused_cell or _lstm_cell
        out = torch.empty_like(x)
        bias3 = bias.unsqueeze(1).to(cd)
        x_cd = x.to(cd)
        gates_x = x_cd[:, :0]  # replaced at step 0: every layer starts a chunk there
        chunk_end_step = 0
        chunk_row0 = 0
        h_prev = h.to(cd)
        c_prev = c
        for t in range(packed.max_len):
            if t == chunk_end_step:
                # Input projections of the next block of timesteps in one large GEMM.
                chunk_row0 = packed.starts[t]
                end = t + 1
                while end < packed.max_len and packed.starts[end + 1] - chunk_row0 <= _INPUT_CHUNK_ROWS:
                    end += 1
                chunk_end_step = end
                gates_x = torch.baddbmm(bias3, x_cd[:, chunk_row0 : packed.starts[end]], w_input)
            n = packed.sizes[t]
            r0 = packed.starts[t] - chunk_row0
            gates_h = torch.bmm(h_prev[:, :n], w_hidden)
            hidden, cell = cell_step(gates_x, r0, gates_h, c_prev, cell_clip)
            projected = torch.bmm(hidden.to(cd), w_proj).float()
            if proj_clip is not None:
                projected.clamp_(-proj_clip, proj_clip)
            row = packed.starts[t]
            out[:, row : row + n] = projected
            # Sequences only ever leave the live prefix, so the newest tensors serve as the
            # state of the next step without copying; sequences ending now keep theirs.
            n_next = packed.sizes[t + 1] if t + 1 < packed.max_len else 0
            if n_next < n:
                h[:, n_next:n] = projected[:, n_next:n]
                c[:, n_next:n] = cell[:, n_next:n]
            h_prev = projected.to(cd)
            c_prev = cell
        return out


def _lstm_cell(
    gates_x: torch.Tensor, row0: int, gates_h: torch.Tensor, c_prev: torch.Tensor, cell_clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate non-linearities and cell update in float32; gate columns are i, f, o, j.

    ``gates_x`` is a whole chunk of input projections and ``c_prev`` the previous step's whole
    cell tensor; the live rows are sliced here, so the compiled kernel always sees contiguous
    inputs (views with varying strides would make torch.compile recompile per pattern).
    """
    n = gates_h.shape[1]
    d = c_prev.shape[-1]
    c = c_prev[:, :n]
    gates = gates_x[:, row0 : row0 + n].float() + gates_h.float()
    sig = torch.sigmoid(gates[..., : 3 * d])
    candidate = torch.tanh(gates[..., 3 * d :])
    cell = torch.addcmul(sig[..., d : 2 * d] * c, sig[..., :d], candidate).clamp_(-cell_clip, cell_clip)
    return sig[..., 2 * d :] * torch.tanh(cell), cell


# Compiled versions of the LSTM cell dynamo may keep (torch's default is 8).
RECOMPILE_LIMIT = 64


def _compile(function: Any) -> Any:
    """``torch.compile`` with shapes left dynamic. A build meets more specialisations of the cell's inputs than
    torch's default of 8 compiled versions: torch 2.13 takes a per-function ``recompile_limit``. Older releases
    (2.11 on a lent GPU machine, 2.5 in the Docker image) have no such argument: there the process-wide limit
    (``recompile_limit``, ``cache_size_limit`` before 2.6) is raised while the cell runs, which is when dynamo
    reads it, so that other compiled code keeps its own."""
    if "recompile_limit" in inspect.signature(torch.compile).parameters:
        return torch.compile(function, dynamic=True, recompile_limit=RECOMPILE_LIMIT)  # type: ignore[call-overload]
    compiled = torch.compile(function, dynamic=True)
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if not hasattr(config, name):
        return compiled

    def with_limit(*args: Any) -> Any:
        with config.patch(**{name: max(RECOMPILE_LIMIT, getattr(config, name))}):
            return compiled(*args)

    return with_limit


class FusedCell:
    """:func:`_lstm_cell` compiled into one kernel: the cell update is memory-bound, and fusing its
    ~8 passes over the (2, batch, 4 * lstm_dim) gates into one pays on every device. Falls back
    to the eager version (same numbers within float32 round-off), once and for good, where
    torch.compile cannot build a kernel, e.g. without a C++ compiler."""

    def __init__(self) -> None:
        self._compiled: Any = None
        self.failed = False

    def __call__(
        self, gates_x: torch.Tensor, row0: int, gates_h: torch.Tensor, c_prev: torch.Tensor, cell_clip: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.failed:
            return _lstm_cell(gates_x, row0, gates_h, c_prev, cell_clip)
        try:
            if self._compiled is None:
                self._compiled = _compile(_lstm_cell)
            result: tuple[torch.Tensor, torch.Tensor] = self._compiled(gates_x, row0, gates_h, c_prev, cell_clip)
            return result
        except Exception as exc:
            self.failed = True
            warnings.warn(
                f"torch.compile of the LSTM cell failed, running eager ({type(exc).__name__}: {exc})", stacklevel=2
            )
            return _lstm_cell(gates_x, row0, gates_h, c_prev, cell_clip)
