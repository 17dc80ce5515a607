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
* Every product's rows are rounded up to a multiple (:data:`ROW_MULTIPLE` for the LSTM's, :data:`WORD_MULTIPLE`
  for the char-CNN's words), the extra rows thrown away. A GEMM library picks its kernel, its blocking and its
  threads' split by the row count, and a row's last bits follow that choice: on a 2-core Zen 4 with oneDNN/MKL,
  products of 1-3 rows gave other bits than larger ones, and the char-CNN's rows depended on their place in a
  large call with two threads. Rounded so, a sentence's vectors there are the same bits in any batch
  (benchmarks/batch_invariance.py, 0 of 348 sentences differ; fp32 and bf16), which lets an update copy any
  unchanged sentence's rows (:mod:`elmo_cache.encoder.batch_free` checks it on the device at hand).
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from elmo_cache.model.float32 import ieee_float32
from elmo_cache.model.options import ModelOptions
from elmo_cache.model.weights import ElmoWeights

__all__ = ["BiLM", "PackedBatch", "FusedCell"]

# Each LSTM product's rows and each char-CNN call's words are rounded up to these multiples (module docstring).
ROW_MULTIPLE = 4
WORD_MULTIPLE = 16

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
        # bf16 on a CPU: the LSTM's products through oneDNN on weights packed once per layer, on first use
        # (PackedMatmuls; ~1.2x there). False: batched matmuls everywhere (a benchmark's side-by-side).
        self.packed_matmuls = True
        self._packed: dict[int, PackedMatmuls] = {}
        # What products are rounded up to (1: not at all, the shapes as they come; a benchmark's side-by-side).
        self.row_multiple = ROW_MULTIPLE
        self.word_multiple = WORD_MULTIPLE

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
        self._packed = {}  # packed from the weights where they were
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
        n = char_ids.shape[0]
        extra = round_up(n, self.word_multiple) - n
        if extra:  # copies of the first word, computed and thrown away (module docstring)
            char_ids = torch.cat([char_ids, char_ids[:1].expand(extra, *char_ids.shape[1:])])
            if word_ids is not None:
                word_ids = torch.cat([word_ids, word_ids[:1].expand(extra)])
        return self._padded_token_embeddings(char_ids, word_ids)[:n]

    def _padded_token_embeddings(self, char_ids: torch.Tensor, word_ids: torch.Tensor | None) -> torch.Tensor:
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
        for layer in range(len(self.lstm)):
            h_out = self._run_layer(x, packed, self._layer_matmuls(layer), final_h[layer], final_c[layer])
            if layer > 0 and options.use_skip_connections:
                h_out = h_out + x
            outputs.append(h_out)
            x = h_out
        return outputs, final_h, final_c

    def _run_layer(
        self,
        x: torch.Tensor,
        packed: PackedBatch,
        matmuls: LayerMatmuls,
        h: torch.Tensor,
        c: torch.Tensor,
    ) -> torch.Tensor:
        """One layer, both directions; writes final states into ``h``/``c`` (2, batch, .).

        Each step runs on its live rows rounded up to ``row_multiple`` (module docstring): the rows past the live
        ones are those of sentences that finished (their stale state) or zeros, and their results are never read,
        so no copy pads a step. The input chunks are rounded up too, over zero rows past the layer's last."""
        cd = self.compute_dtype
        cell_clip = float("inf") if self.options.cell_clip is None else float(self.options.cell_clip)
        proj_clip = self.options.proj_clip
        cell_step = self._fused_cell or _call
        multiple = self.row_multiple
        out = torch.empty_like(x)
        x_cd = x.to(cd)
        # Rows the rounded steps of the last chunk read past the layer's end, and their own rounding.
        spare = 2 * (multiple - 1)
        if spare:
            x_cd = torch.cat([x_cd, x_cd.new_zeros(2, spare, x_cd.shape[2])], dim=1)
        gates_x: Any = None  # set at step 0: every layer starts a chunk there
        chunk_end_step = 0
        chunk_row0 = 0
        h_prev, c_prev = h.to(cd), c
        first_extra = round_up(h.shape[1], multiple) - h.shape[1]
        if first_extra:  # the first step's rounded rows: zero states
            h_prev = torch.cat([h_prev, h_prev.new_zeros(2, first_extra, h.shape[2])], dim=1)
            c_prev = torch.cat([c, c.new_zeros(2, first_extra, c.shape[2])], dim=1)
        for t in range(packed.max_len):
            if t == chunk_end_step:
                # Input projections of the next block of timesteps in one large GEMM.
                chunk_row0 = packed.starts[t]
                end = t + 1
                while end < packed.max_len and packed.starts[end + 1] - chunk_row0 <= _INPUT_CHUNK_ROWS:
                    end += 1
                chunk_end_step = end
                # Its last step reads up to multiple - 1 rows past the chunk's own.
                rows = round_up(packed.starts[end] - chunk_row0 + multiple - 1, multiple)
                gates_x = matmuls.input_gates(x_cd[:, chunk_row0 : chunk_row0 + rows])
            n = packed.sizes[t]
            rounded = round_up(n, multiple)
            r0 = packed.starts[t] - chunk_row0
            gates_h = matmuls.recurrent(h_prev[:, :rounded])
            hidden, cell = cell_step(matmuls.cell, gates_x, r0, gates_h, c_prev, cell_clip)
            projected = matmuls.project(hidden).float()
            if proj_clip is not None:
                projected.clamp_(-proj_clip, proj_clip)
            row = packed.starts[t]
            out[:, row : row + n] = projected[:, :n]
            # Sequences only ever leave the live prefix, so the newest tensors serve as the
            # state of the next step without copying; sequences ending now keep theirs.
            n_next = packed.sizes[t + 1] if t + 1 < packed.max_len else 0
            if n_next < n:
                h[:, n_next:n] = projected[:, n_next:n]
                c[:, n_next:n] = cell[:, n_next:n]
            h_prev = projected.to(cd)
            c_prev = cell
        return out

    def _layer_matmuls(self, layer: int) -> LayerMatmuls:
        """Layer ``layer``'s three products: oneDNN on weights packed once where that is faster (bf16 on a CPU
        whose oneDNN runs it natively), else batched matmuls over both directions."""
        weights = self.lstm[layer]
        if not (self.packed_matmuls and self.compute_dtype == torch.bfloat16 and weights[0].device.type == "cpu"):
            return BatchedMatmuls(*weights, self.compute_dtype)
        packed = self._packed.get(layer)
        if packed is None:
            try:
                if not _onednn_native_bf16():
                    raise RuntimeError("oneDNN has no native bf16 on this CPU")
                packed = PackedMatmuls(*weights)
            except (RuntimeError, AttributeError) as exc:  # emulated bf16, or a torch without the packed linear
                warnings.warn(f"bf16 LSTM matmuls stay batched: {exc}", stacklevel=3)
                self.packed_matmuls = False
                return BatchedMatmuls(*weights, self.compute_dtype)
            self._packed[layer] = packed
        return packed


def round_up(n: int, multiple: int = ROW_MULTIPLE) -> int:
    """``n`` rounded up to a multiple of ``multiple``: the rows a product gets (module docstring). Products outside
    the encoder that must give a row the same bits in any batch (the pq codecs') round theirs with it too."""
    return -(-n // multiple) * multiple


def _onednn_native_bf16() -> bool:
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class LayerMatmuls:
    """The three matrix products of one biLSTM layer, both directions at once, in the compute dtype:
    ``input_gates`` the input-to-gate products (plus bias) of a block of rows ``(2, rows, P)``, ``recurrent``
    the hidden-to-gate products of ``(2, n, P)``, ``project`` the cell output's projection ``(2, n, D) -> (2, n,
    P)``. The gates come in the shape the implementation's ``cell`` (the LSTM cell's element-wise update) takes."""

    cell: Callable[..., tuple[torch.Tensor, torch.Tensor]]

    def input_gates(self, x: torch.Tensor) -> Any:
        raise NotImplementedError

    def recurrent(self, h: torch.Tensor) -> Any:
        raise NotImplementedError

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class BatchedMatmuls(LayerMatmuls):
    """One batched matmul over the direction dimension per product: every device and dtype."""

    def __init__(
        self,
        w_input: torch.Tensor,
        w_hidden: torch.Tensor,
        bias: torch.Tensor,
        w_proj: torch.Tensor,
        dtype: torch.dtype,
    ) -> None:
        self.w_input, self.w_hidden, self.w_proj = w_input, w_hidden, w_proj
        self.bias = bias.unsqueeze(1).to(dtype)
        self.cell = _lstm_cell

    def input_gates(self, x: torch.Tensor) -> torch.Tensor:  # (2, rows, 4 * D)
        return torch.baddbmm(self.bias, x, self.w_input)

    def recurrent(self, h: torch.Tensor) -> torch.Tensor:  # (2, n, 4 * D)
        return torch.bmm(h, self.w_hidden)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.bmm(hidden, self.w_proj)


class PackedMatmuls(LayerMatmuls):
    """oneDNN's linear on weights reordered once into its blocked layout (what torch.compile's CPU freezing
    does), one call per direction. A plain bf16 matmul takes the weight as it lies on every call, and at the
    recurrent step's small row counts that costs most (16 rows: 160 against 374 GFLOP/s packed, on a 2-core Zen
    4; benchmarks/RESULTS.md). Taken for bf16 on a CPU; the products are the same in any dtype oneDNN packs. The
    packed weights are a second copy of the LSTM's (~150 MB for the Original model in bf16)."""

    def __init__(self, w_input: torch.Tensor, w_hidden: torch.Tensor, bias: torch.Tensor, w_proj: torch.Tensor) -> None:
        reorder = torch.ops.mkldnn._reorder_linear_weight
        dtype = w_input.dtype

        def packed(weight: torch.Tensor, rows_hint: int) -> list[torch.Tensor]:
            return [reorder(weight[d].t().contiguous(), rows_hint) for d in range(2)]

        self.w_input = packed(w_input, _INPUT_CHUNK_ROWS)
        self.w_hidden = packed(w_hidden, 256)
        self.w_proj = packed(w_proj, 256)
        self.bias = [bias[d].to(dtype) for d in range(2)]
        self.linear = torch.ops.mkldnn._linear_pointwise
        self.cell = _lstm_cell_per_direction

    def input_gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            self.linear(x[0], self.w_input[0], self.bias[0], "none", [], ""),
            self.linear(x[1], self.w_input[1], self.bias[1], "none", [], ""),
        )

    def recurrent(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            self.linear(h[0], self.w_hidden[0], None, "none", [], ""),
            self.linear(h[1], self.w_hidden[1], None, "none", [], ""),
        )

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([self.linear(hidden[d], self.w_proj[d], None, "none", [], "") for d in range(2)])


def _call(cell: Callable[..., tuple[torch.Tensor, torch.Tensor]], *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The cell run eagerly (:class:`FusedCell` is the compiled counterpart)."""
    return cell(*args)


def _lstm_cell(
    gates_x: torch.Tensor, row0: int, gates_h: torch.Tensor, c_prev: torch.Tensor, cell_clip: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate non-linearities and cell update in float32, the hidden output in the gates' (compute) dtype; gate
    columns are i, f, o, j.

    ``gates_x`` is a whole chunk of input projections and ``c_prev`` the previous step's whole
    cell tensor; the live rows are sliced here, so the compiled kernel always sees contiguous
    inputs (views with varying strides would make torch.compile recompile per pattern).
    """
    n = gates_h.shape[1]
    gates = gates_x[:, row0 : row0 + n].float() + gates_h.float()
    return _cell_update(gates, c_prev[:, :n], cell_clip, gates_h.dtype)


def _lstm_cell_per_direction(
    gates_x: tuple[torch.Tensor, torch.Tensor],
    row0: int,
    gates_h: tuple[torch.Tensor, torch.Tensor],
    c_prev: torch.Tensor,
    cell_clip: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_lstm_cell` on gates that come one tensor per direction (a packed matmul gives one per call).
    Stacking them first would cost a pass over the gates (compiled, a conditional load per element); each
    direction's results are written into the stacked outputs instead."""
    n = gates_h[0].shape[0]
    dtype = gates_h[0].dtype
    h0, c0 = _cell_update(gates_x[0][row0 : row0 + n].float() + gates_h[0].float(), c_prev[0, :n], cell_clip, dtype)
    h1, c1 = _cell_update(gates_x[1][row0 : row0 + n].float() + gates_h[1].float(), c_prev[1, :n], cell_clip, dtype)
    return torch.stack((h0, h1)), torch.stack((c0, c1))


def _cell_update(
    gates: torch.Tensor, c: torch.Tensor, cell_clip: float, hidden_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gates' non-linearities and the cell update: the hidden output in ``hidden_dtype`` (the compute dtype,
    all the projection reads, so no pass of its own converts it), the cell in float32.

    Each gate's sigmoid is taken on its own slice: one sigmoid over the three gates makes the compiled kernel
    write them out and read them back (a pass over 3/4 of the gates), where per-gate slices fuse into one pass
    (the compiled cell 1.4-1.6x faster on a 2-core Zen 5). The values are the same bits either way."""
    d = c.shape[-1]
    input_gate = torch.sigmoid(gates[..., :d])
    forget_gate = torch.sigmoid(gates[..., d : 2 * d])
    output_gate = torch.sigmoid(gates[..., 2 * d : 3 * d])
    candidate = torch.tanh(gates[..., 3 * d :])
    cell = torch.addcmul(forget_gate * c, input_gate, candidate).clamp_(-cell_clip, cell_clip)
    return (output_gate * torch.tanh(cell)).to(hidden_dtype), cell


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
    """The LSTM cell (:func:`_lstm_cell`, or :func:`_lstm_cell_per_direction` behind packed matmuls) compiled
    into one kernel: the cell update is memory-bound, and fusing its ~8 passes over the (2, batch, 4 *
    lstm_dim) gates into one pays on every device. Falls back to the eager version (same numbers within
    float32 round-off), once and for good, where torch.compile cannot build a kernel, e.g. without a C++
    compiler."""

    def __init__(self) -> None:
        self._compiled: dict[Callable[..., Any], Any] = {}
        self.failed = False

    def __call__(
        self, cell: Callable[..., tuple[torch.Tensor, torch.Tensor]], *args: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.failed:
            return cell(*args)
        try:
            compiled = self._compiled.get(cell)
            if compiled is None:
                compiled = self._compiled[cell] = _compile(cell)
            result: tuple[torch.Tensor, torch.Tensor] = compiled(*args)
            return result
        except Exception as exc:
            self.failed = True
            warnings.warn(
                f"torch.compile of the LSTM cell failed, running eager ({type(exc).__name__}: {exc})", stacklevel=2
            )
            return cell(*args)
