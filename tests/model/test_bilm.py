"""The biLM's matrix-product seam (elmo_cache.model.bilm.LayerMatmuls): oneDNN on packed weights for bf16 on a
CPU gives what the batched matmuls give, batch-invariantly, and steps aside where it cannot run."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from elmo_cache import Encoder
from elmo_cache.model import bilm as bilm_module
from elmo_cache.model.bilm import BatchedMatmuls, PackedMatmuls

requires_onednn_bf16 = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    reason="oneDNN has no native bf16 on this CPU: the packed path is not taken",
)

LINES = [
    "the cat sat on the mat .",
    "a much longer sentence about the committee that met on tuesday to discuss the budget",
    "one",
    "Hello , world !",
    "the quick brown fox jumps over the lazy dog again and again",
]
SENTENCES = [line.split() for line in LINES]


def bf16_encoder(model, packed: bool) -> Encoder:
    encoder = Encoder.load(model, device="cpu", precision="bf16")
    encoder.bilm.packed_matmuls = packed
    return encoder


@requires_onednn_bf16
def test_packed_bf16_matmuls_give_what_batched_matmuls_give(tiny_model, native_bf16):
    packed, batched = bf16_encoder(tiny_model, True), bf16_encoder(tiny_model, False)
    a, b = packed.embed_batch(SENTENCES), batched.embed_batch(SENTENCES)
    # Both paths were taken: each layer's products packed once on one side, none on the other.
    assert sorted(packed.bilm._packed) == list(range(len(packed.bilm.lstm))) and not batched.bilm._packed
    assert all(isinstance(m, PackedMatmuls) for m in packed.bilm._packed.values())
    for x, y in zip(a, b, strict=True):
        # The same products in the same precision: equal but for the accumulation order of one kernel or another
        # (far below bf16's own error against fp32, ~1e-2).
        np.testing.assert_allclose(x, y, atol=1e-4, rtol=0)


@requires_onednn_bf16
def test_packed_bf16_vectors_do_not_depend_on_the_batch(tiny_model, native_bf16):
    encoder = bf16_encoder(tiny_model, True)
    together = encoder.embed_batch(SENTENCES)
    for sentence, vectors in zip(SENTENCES, together, strict=True):
        encoder.clear_word_cache()  # the char-CNN's per-word cache carries its first batch's rounding
        np.testing.assert_array_equal(encoder.embed_batch([sentence])[0], vectors)
        encoder.clear_word_cache()


def test_packed_matmuls_compute_each_product_of_each_direction(tiny_model):
    """The products one by one, in float32 (oneDNN packs it on every x86 CPU, so this runs everywhere)."""
    model = Encoder.load(tiny_model, device="cpu").bilm
    generator = torch.Generator().manual_seed(0)
    for weights in model.lstm:
        w_input, w_hidden, _, w_proj = weights
        packed, batched = PackedMatmuls(*weights), BatchedMatmuls(*weights, torch.float32)
        rows = torch.randn(2, 7, w_input.shape[1], generator=generator)
        states = torch.randn(2, 6, w_hidden.shape[1], generator=generator)
        hidden = torch.randn(2, 5, w_proj.shape[1], generator=generator)
        for a, b in (
            *zip(packed.input_gates(rows), batched.input_gates(rows), strict=True),
            *zip(packed.recurrent(states), batched.recurrent(states), strict=True),
            (packed.project(hidden), batched.project(hidden)),
        ):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_batched_matmuls_stay_on_other_precisions(tiny_model):
    encoder = Encoder.load(tiny_model, device="cpu")
    assert isinstance(encoder.bilm._layer_matmuls(0), BatchedMatmuls)
    encoder.embed_batch(SENTENCES)
    assert not encoder.bilm._packed


def test_without_the_packed_linear_bf16_falls_back_with_a_warning(tiny_model, native_bf16, monkeypatch):
    def unavailable(*args):
        raise RuntimeError("no packed linear in this torch (test)")

    monkeypatch.setattr(bilm_module, "_onednn_native_bf16", lambda: True)  # on any CPU, reach the packing
    monkeypatch.setattr(bilm_module.PackedMatmuls, "__init__", unavailable)
    encoder = bf16_encoder(tiny_model, True)
    with pytest.warns(UserWarning, match=r"stay batched: .*no packed linear in this torch \(test\)"):
        fallen_back = encoder.embed_batch(SENTENCES)
    assert encoder.bilm.packed_matmuls is False and not encoder.bilm._packed
    for x, y in zip(fallen_back, bf16_encoder(tiny_model, False).embed_batch(SENTENCES), strict=True):
        np.testing.assert_array_equal(x, y)


def test_the_per_direction_cell_updates_what_the_stacked_cell_updates():
    """Packed matmuls hand the cell one tensor per direction; its update is the stacked cell's, element for element."""
    generator = torch.Generator().manual_seed(1)
    gates_x, gates_h = torch.randn(2, 9, 16, generator=generator), torch.randn(2, 4, 16, generator=generator)
    c_prev = torch.randn(2, 6, 4, generator=generator)
    stacked = bilm_module._lstm_cell(gates_x, 3, gates_h, c_prev, 0.5)
    apart = bilm_module._lstm_cell_per_direction((gates_x[0], gates_x[1]), 3, (gates_h[0], gates_h[1]), c_prev, 0.5)
    for a, b in zip(apart, stacked, strict=True):
        assert a.shape == b.shape == (2, 4, 4)
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("packed", [False, True])
def test_every_product_sees_rows_rounded_up_and_the_extra_rows_change_nothing(tiny_model, packed):
    """A GEMM library picks its kernel and its threads' split by the row count, and a row's last bits follow: every
    LSTM product gets a multiple of ROW_MULTIPLE rows and every char-CNN call a multiple of WORD_MULTIPLE words
    (what makes a sentence's rows batch-free: elmo_cache.encoder.batch_free), and the rows past the live ones
    (stale states, zeros) leave the live rows' values as the unrounded products give them (to float round-off)."""
    encoder = Encoder.load(tiny_model, device="cpu")
    model = encoder.bilm
    rows: list[int] = []
    kind = PackedMatmuls if packed else BatchedMatmuls

    def layer_matmuls(self, layer):  # packed in float32 too: oneDNN packs it on every x86 CPU
        return PackedMatmuls(*self.lstm[layer]) if packed else BatchedMatmuls(*self.lstm[layer], self.compute_dtype)

    def spied(name):
        product = getattr(kind, name)

        def run(self, x):  # (2 directions, rows, dim) for both kinds
            rows.append(int(x.shape[1]))
            return product(self, x)

        return run

    words: list[int] = []
    embeddings = bilm_module.BiLM._padded_token_embeddings

    def spied_embeddings(self, char_ids, word_ids):
        words.append(int(char_ids.shape[0]))
        return embeddings(self, char_ids, word_ids)

    patch = pytest.MonkeyPatch()
    for name in ("input_gates", "recurrent", "project"):
        patch.setattr(kind, name, spied(name))
    patch.setattr(bilm_module.BiLM, "_padded_token_embeddings", spied_embeddings)
    patch.setattr(bilm_module.BiLM, "_layer_matmuls", layer_matmuls)
    try:
        rounded = encoder.embed_batch(SENTENCES)
    finally:
        patch.undo()
    # Batch sizes 1-5 and 5 sentences of 3-17 tokens: most steps' live rows are not a multiple of 4 themselves.
    assert rows and all(n % bilm_module.ROW_MULTIPLE == 0 for n in rows), rows
    assert words and all(n % bilm_module.WORD_MULTIPLE == 0 for n in words), words
    encoder.clear_word_cache()
    model.row_multiple = model.word_multiple = 1
    plain = encoder.embed_batch(SENTENCES)
    for x, y in zip(rounded, plain, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)


class _Shapes(TorchDispatchMode):
    """Every tensor an operator makes, by shape and dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[tuple[int, ...], torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(tensor, torch.Tensor):
                self.made.append((tuple(tensor.shape), tensor.dtype))
        return result


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cell_makes_no_tensor_wider_than_one_gate_and_hands_the_projection_its_dtype(dtype):
    """Compiled, the cell is one pass over the gates only if no step of it makes a tensor spanning several gates
    (one sigmoid over the i, f, o columns made the kernel write them out and read them back: 1.4-1.6x the cell's
    time). Its hidden output comes in the gates' dtype, all the projection reads (no conversion pass of its own)."""
    generator = torch.Generator().manual_seed(2)
    d = 8
    gates_x = torch.randn(2, 9, 4 * d, generator=generator).to(dtype)
    gates_h = torch.randn(2, 4, 4 * d, generator=generator).to(dtype)
    c_prev = torch.randn(2, 6, d, generator=generator)
    with _Shapes() as shapes:
        hidden, cell = bilm_module._lstm_cell(gates_x, 3, gates_h, c_prev, 0.5)
    # The gates' sum is the one tensor of all four gates; nothing else spans more than one.
    wide = [shape for shape, _ in shapes.made if shape[-1] > d]
    assert wide and all(shape[-1] == 4 * d for shape in wide), wide
    assert [shape for shape in wide if shape[-1] == 4 * d] == [(2, 4, 4 * d)] * len(wide)
    assert hidden.dtype == dtype and cell.dtype == torch.float32
    # The values: the textbook LSTM update in float32 (to its round-off), the hidden output in the gates' dtype.
    gates = gates_x[:, 3:7].float() + gates_h.float()
    i, f, o, j = gates.split(d, dim=-1)
    want_cell = (torch.sigmoid(f) * c_prev[:, :4] + torch.sigmoid(i) * torch.tanh(j)).clamp(-0.5, 0.5)
    torch.testing.assert_close(cell, want_cell, atol=1e-6, rtol=0)
    one_rounding = 0.0 if dtype == torch.float32 else 2.0**-8
    torch.testing.assert_close(hidden.float(), torch.sigmoid(o) * torch.tanh(want_cell), atol=1e-6, rtol=one_rounding)
