"""A straightforward ELMo, run the way the original tools run it: the speed baseline.

This is deliberately *not* optimised. It does what bilm-tf (TensorFlow ``LSTMCell`` inside
``dynamic_rnn``) and the original PyTorch port do for each batch:

- batches of 64 sentences in file order, padded to the batch's longest sentence plus the
  ``<S>``/``</S>`` boundaries, no length sorting;
- the char-CNN, highway and projection computed for every token occurrence (no word cache),
  over all 50 character slots;
- each LSTM layer and direction stepped one timestep at a time, with the input projection
  inside the loop: ``[x_t, h_{t-1}] @ W_0`` on the concatenation, as TensorFlow's LSTMCell does;
- padded timesteps masked: the state is carried through unchanged and the output is zero.

It reads the weights itself, straight from the HDF5 file in the original layout, so that it
shares no code with the encoder it is compared with (only the character ids, from
:func:`elmo_cache.model.chars.sentence_char_ids`). Its output has the layout of
``Encoder.embed_batch``: one ``(3, n_tokens, 2P)`` float32 array per sentence.

Precision ``"bf16"`` (or ``"fp16"``, for GPUs) casts the weights and the inputs of every matmul
and convolution to that type; biases, gates, the cell state and the clipping stay in float32.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F

from elmo_cache.model.chars import sentence_char_ids
from elmo_cache.model.options import ModelOptions

__all__ = ["ReferenceElmo"]

_PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class ReferenceElmo:
    """The baseline ELMo (zero initial state, stateless across batches)."""

    def __init__(
        self,
        options_file: str | Path,
        weight_file: str | Path,
        *,
        precision: str = "fp32",
        device: str | torch.device = "cpu",
        batch_size: int = 64,
    ) -> None:
        if precision not in _PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}; choose from {sorted(_PRECISIONS)}")
        self.options = ModelOptions.from_file(options_file)
        self.precision = precision
        self.dtype = _PRECISIONS[precision]
        self.device = torch.device(device)
        self.batch_size = batch_size
        self._load(Path(weight_file))

    # -- weights ---------------------------------------------------------------------------

    def _load(self, path: Path) -> None:
        o = self.options
        mm, dev = self.dtype, self.device

        def get(name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.from_numpy(np.asarray(f[name], dtype=np.float32)).to(device=dev, dtype=dtype)

        with h5py.File(path, "r") as f:
            # Row 0 is the padding character the original tools prepend (all zeros).
            table = np.asarray(f["char_embed"], dtype=np.float32)
            table = np.concatenate([np.zeros((1, table.shape[1]), np.float32), table])
            self.char_embed = torch.from_numpy(table).to(device=dev, dtype=mm)
            self.convs = []
            for i in range(len(o.filters)):
                w = get(f"CNN/W_cnn_{i}")[0]  # (width, C, num)
                # TF conv2d (1, width, C, num) over NHWC == conv1d with weight (num, C, width).
                self.convs.append((w.permute(2, 1, 0).contiguous().to(mm), get(f"CNN/b_cnn_{i}")))
            self.highways = [
                (
                    get(f"CNN_high_{k}/W_carry", mm),
                    get(f"CNN_high_{k}/b_carry"),
                    get(f"CNN_high_{k}/W_transform", mm),
                    get(f"CNN_high_{k}/b_transform"),
                )
                for k in range(o.n_highway)
            ]
            self.w_proj, self.b_proj = get("CNN_proj/W_proj", mm), get("CNN_proj/b_proj")
            # lstm[direction][layer] = (W_0 (2P, 4D), B (4D,) with forget bias, W_P (D, P))
            self.lstm = []
            for direction in (0, 1):
                layers = []
                for layer in range(o.n_layers):
                    prefix = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
                    bias = get(f"{prefix}/B")
                    d = o.lstm_dim
                    bias[2 * d : 3 * d] += 1.0  # TF LSTMCell's forget_bias, not stored in the file
                    layers.append((get(f"{prefix}/W_0", mm), bias, get(f"{prefix}/W_P_0", mm)))
                self.lstm.append(layers)

    # -- the network -----------------------------------------------------------------------

    def _token_vectors(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(N, 50) +1-shifted char ids -> (N, P) float32 context-independent vectors."""
        o = self.options
        x = self.char_embed[char_ids].transpose(1, 2)  # (N, C, 50)
        pooled = []
        for weight, bias in self.convs:
            # The bias is constant over positions, so adding it after the max is exact and
            # spares a copy of the (N, num, positions) activations.
            pooled.append(F.conv1d(x, weight).max(dim=2).values.float() + bias)
        h = torch.cat(pooled, dim=1)
        h = torch.relu(h) if o.activation == "relu" else torch.tanh(h)
        mm = self.dtype
        for w_carry, b_carry, w_transform, b_transform in self.highways:
            gate = torch.sigmoid((h.to(mm) @ w_carry).float() + b_carry)
            transform = torch.relu((h.to(mm) @ w_transform).float() + b_transform)
            h = gate * transform + (1.0 - gate) * h
        return (h.to(mm) @ self.w_proj).float() + self.b_proj

    def _lstm_layer(self, x: torch.Tensor, mask: torch.Tensor, params: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """One layer-direction over (B, T, P) inputs, one timestep at a time."""
        o = self.options
        w, bias, w_p = params
        batch, steps, _ = x.shape
        d, mm = o.lstm_dim, self.dtype
        c = x.new_zeros(batch, d)
        h = x.new_zeros(batch, o.projection_dim)
        outputs = []
        for t in range(steps):
            gates = (torch.cat([x[:, t], h], dim=1).to(mm) @ w).float() + bias
            # Contiguous copies: torch's CPU kernels for sigmoid/tanh are ~50x slower on the
            # strided column views split() returns, which would make this baseline a straw man.
            i, j, f, og = (g.contiguous() for g in gates.split(d, dim=1))
            c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(j)
            if o.cell_clip is not None:
                c_new = c_new.clamp(-o.cell_clip, o.cell_clip)
            h_new = ((torch.sigmoid(og) * torch.tanh(c_new)).to(mm) @ w_p).float()
            if o.proj_clip is not None:
                h_new = h_new.clamp(-o.proj_clip, o.proj_clip)
            m = mask[:, t, None]
            c = torch.where(m, c_new, c)
            h = torch.where(m, h_new, h)
            outputs.append(torch.where(m, h_new, torch.zeros_like(h_new)))
        return torch.stack(outputs, dim=1)

    @staticmethod
    def _reverse(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Reverse each row within its own length (TF ``reverse_sequence``); padding stays put."""
        steps = x.shape[1]
        pos = torch.arange(steps, device=x.device)[None, :]
        index = torch.where(pos < lengths[:, None], lengths[:, None] - 1 - pos, pos)
        return x.gather(1, index[:, :, None].expand(-1, -1, x.shape[2]))

    @torch.inference_mode()
    def embed_batch(self, sentences: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One ``(3, n, 2P)`` float32 array per sentence; <S>/</S> removed."""
        o = self.options
        if not sentences:
            return []
        lengths = [len(s) + 2 for s in sentences]  # with <S> and </S>
        steps = max(lengths)
        ids = np.zeros((len(sentences), steps, o.max_characters_per_token), dtype=np.int64)
        for row, tokens in enumerate(sentences):
            ids[row, : lengths[row]] = sentence_char_ids(list(tokens), o.max_characters_per_token)
        ids_t = torch.from_numpy(ids).to(self.device)
        lens = torch.tensor(lengths, device=self.device)
        mask = torch.arange(steps, device=self.device)[None, :] < lens[:, None]
        # Every slot, padding included, goes through the char-CNN, as in the original graph.
        tokens = self._token_vectors(ids_t.view(-1, ids.shape[2])).view(len(sentences), steps, -1)
        tokens = tokens * mask[:, :, None]
        layers = [torch.cat([tokens, tokens], dim=2)]
        per_direction = []
        for direction in (0, 1):
            x = tokens if direction == 0 else self._reverse(tokens, lens)
            outs = []
            for layer in range(o.n_layers):
                y = self._lstm_layer(x, mask, self.lstm[direction][layer])
                if o.use_skip_connections and layer > 0:
                    y = y + x
                outs.append(y)
                x = y
            if direction == 1:
                outs = [self._reverse(y, lens) for y in outs]
            per_direction.append(outs)
        for layer in range(o.n_layers):
            layers.append(torch.cat([per_direction[0][layer], per_direction[1][layer]], dim=2))
        stacked = torch.stack(layers, dim=1).cpu().numpy()  # (B, 3, T, 2P)
        return [stacked[row, :, 1 : lengths[row] - 1].copy() for row in range(len(sentences))]

    def embed_sentences(self, sentences: Sequence[Sequence[str]]) -> Iterator[np.ndarray]:
        """Batches of ``batch_size`` sentences in input order, one array per sentence."""
        for start in range(0, len(sentences), self.batch_size):
            yield from self.embed_batch(sentences[start : start + self.batch_size])
