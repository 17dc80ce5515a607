"""The behaviour every row codec (elmo_cache.rows.codecs.RowCodec) shares, written once.

A codec's test is a tiny subclass of :class:`CodecContract` (tests/test_codecs.py) naming its ``--quantize``
value and how close its round trip must be; the class is not collected itself (its name does not start with
"Test"). Build, resume, verify and server behaviour stay in the codecs' own test files.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from elmo_cache.reader.dataset import collate
from elmo_cache.rows.codecs import RowCodec, codec_for_option, codec_of_metadata, quantization_problem
from elmo_cache.rows.selection import MixSpec, Selection

DIM = 32
MIX = MixSpec.from_raw([0.2, 0.3, 0.5])
# A stored selection and the vectors per row it gives.
SELECTIONS = {"layers": (Selection(layers=(0, 1, 2)), 3), "two-layers": (Selection(layers=(0, 2)), 2),
              "mix": (Selection(layers=None, mix=MIX), 1)}  # fmt: skip


def encoder_like(n: int, slots: int, seed: int = 0) -> np.ndarray:
    """float32 rows ``(n, slots, DIM)`` with ELMo-like spreads: each slot and dimension of its own scale."""
    rng = np.random.default_rng(seed)
    scale = np.linspace(0.05, 2.0, DIM, dtype=np.float32) * np.arange(1, slots + 1, dtype=np.float32)[:, None]
    return (rng.standard_normal((n, slots, DIM)).astype(np.float32) * scale).astype(np.float32)


_TRAINED: dict[tuple[type, int], RowCodec] = {}


class CodecContract:
    """Shared behaviours of a row codec; a subclass sets :attr:`option` and may tighten :meth:`assert_close`."""

    # The --quantize value (None: floats), and --fp16.
    option: str | None = None
    fp16: bool = False
    # Token rows the codec is trained on, when it is trained.
    training_rows = 2048

    # -- what a subclass says ---------------------------------------------------------------------

    def assert_close(self, x: np.ndarray, back: np.ndarray) -> None:
        """``back`` (a round trip of float rows ``x``, ``(..., DIM)``) is as close to ``x`` as the codec promises."""
        raise NotImplementedError

    # -- helpers ----------------------------------------------------------------------------------

    def unbound(self) -> RowCodec:
        return codec_for_option(self.option, fp16=self.fp16)

    def codec(self, slots: int = 3) -> RowCodec:
        """The codec bound to rows of ``slots`` vectors, trained (as a build trains it) when it is trained."""
        key = (type(self), slots)
        if key not in _TRAINED:  # training (opq's rotations above all) is the slow part: once per class and slots
            codec = self.unbound().bind(DIM, slots)
            if codec.training_vectors is not None:
                sample = encoder_like(self.training_rows, slots, 1)
                codec = codec.with_training_vectors(self.training_rows).train(sample)
            _TRAINED[key] = codec
        return _TRAINED[key]

    def meta(self, codec: RowCodec, kind: str = "layers") -> dict[str, Any]:
        """Metadata of a cache of ``codec``, through JSON as it is stored."""
        layers = {"layers": [0, 1, 2]} if kind == "layers" else {"mix": MIX.to_metadata()}
        meta: dict[str, Any] = {"dim": DIM, "kind": kind, **layers, "dtype": codec.dtype}
        if codec.to_metadata() is not None:
            meta["quantization"] = codec.to_metadata()
        return json.loads(json.dumps(meta))

    # -- the contract -----------------------------------------------------------------------------

    @pytest.mark.parametrize("slots", [3, 1])
    def test_round_trip_is_within_the_codecs_bound(self, slots):
        codec = self.codec(slots)
        x = encoder_like(500, slots, 2)
        rows = x if slots > 1 else x[:, 0]
        back = codec.roundtrip(rows)
        assert back.dtype == np.float32 and back.shape == rows.shape
        self.assert_close(rows, back)
        stored = codec.encode(torch.from_numpy(rows))
        np.testing.assert_array_equal(codec.decode(stored), back)  # roundtrip is encode, then decode

    def test_metadata_round_trips_and_is_valid(self):
        codec = self.codec()
        for kind in ("layers", "mix"):
            meta = self.meta(codec, kind)
            again = codec_of_metadata(meta)
            assert again.to_metadata() == codec.to_metadata() and again.dtype == codec.dtype
            assert again.name == codec.name and again.quantized == codec.quantized
            row = (3, DIM) if kind == "layers" else (DIM,)
            assert again.stored_shape(row) == self.codec(3 if kind == "layers" else 1).stored_shape(row)
            assert quantization_problem(meta) is None
        assert codec_for_option(codec.name if codec.quantized else None, fp16=self.fp16).to_metadata() == (
            self.unbound().to_metadata()
        )

    def test_invalid_metadata_is_named(self):
        codec = self.codec()
        if codec.to_metadata() is None:
            pytest.skip("a float cache records no quantization")
        meta = {**self.meta(codec), "dtype": "complex64"}
        problem = quantization_problem(meta)
        assert problem is not None and "complex64" in problem and "a newer elmo-cache may read it" in problem

    @pytest.mark.parametrize("slots", [3, 1])
    def test_stored_shape_and_dtype(self, slots):
        codec = self.codec(slots)
        row = (slots, DIM) if slots > 1 else (DIM,)
        x = torch.from_numpy(encoder_like(7, slots, 3).reshape(7, *row))
        stored = codec.encode(x)
        assert stored.dtype == np.dtype(codec.dtype)
        assert stored.shape == (7, *codec.stored_shape(row))
        assert codec.decode(stored).shape == (7, *row)

    def test_a_whole_sentence_decodes_as_its_rows(self):
        codec = self.codec(3)
        stored = codec.encode(torch.from_numpy(encoder_like(9, 3, 4)))  # token-major, as the store holds rows
        rows = np.asarray(codec.decoder(lambda start, stop: stored[start:stop])(2, 7), dtype=np.float32)
        np.testing.assert_array_equal(rows, codec.decode(stored[2:7]))
        sentence = codec.raw(stored[2:7].transpose(1, 0, 2))  # (layers, tokens, stored), as Cache.quantized(i)
        assert sentence.shape == (3, 5, DIM) and sentence.ndim == 3
        np.testing.assert_array_equal(np.asarray(sentence, dtype=np.float32), rows.transpose(1, 0, 2))
        mixed = self.codec(1)
        stored = mixed.encode(torch.from_numpy(encoder_like(9, 1, 4)[:, 0]))
        np.testing.assert_array_equal(np.asarray(mixed.raw(stored[3:8]), dtype=np.float32), mixed.decode(stored[3:8]))

    @pytest.mark.parametrize("slots", [3, 1])
    def test_collate_pads_with_zeros(self, slots):
        codec = self.codec(slots)
        items = []
        for n in (4, 0, 6, 1):
            stored = codec.encode(torch.from_numpy(encoder_like(n, slots, n)))
            items.append(codec.raw(stored.transpose(1, 0, 2) if slots > 1 else stored[:, 0]))
        # By default a batch is in the dtype cache[i] reads in (a float16 cache's stays float16); float32 asked.
        read_dtype = torch.from_numpy(np.empty(0, dtype=codec.read_dtype)).dtype
        assert collate(items).vectors.dtype == read_dtype
        batch = collate(items, dtype=torch.float32)
        assert batch.vectors.dtype == torch.float32
        assert torch.equal(collate(items).vectors.float(), batch.vectors)
        assert batch.lengths.tolist() == [4, 0, 6, 1] and batch.mask.sum().item() == 11
        vectors = batch.vectors.numpy()
        for b, item in enumerate(items):
            n = batch.lengths[b].item()
            want = np.asarray(item, dtype=np.float32)
            if slots > 1:
                np.testing.assert_array_equal(vectors[b, :, :n], want)
                assert not vectors[b, :, n:].any()
            else:
                np.testing.assert_array_equal(vectors[b, :n], want)
                assert not vectors[b, n:].any()
        np.testing.assert_array_equal(codec.pad(items, 6).numpy(), vectors)

    @pytest.mark.parametrize("stored_name", list(SELECTIONS))
    def test_live_answers_equal_cache_hits(self, stored_name):
        stored, slots = SELECTIONS[stored_name]
        codec = self.codec(slots)
        acts = encoder_like(8, 3, 5).transpose(1, 0, 2).copy()  # (3, tokens, DIM), an encoder's output
        live = codec.live_as_cached(acts, stored, stored, codec.read_dtype)
        floats = stored.apply_array(acts, np.float32)  # (layers, tokens, DIM) or (tokens, DIM)
        token_major = floats.transpose(1, 0, 2) if stored.layers is not None else floats
        hit = codec.decoder(lambda start, stop: codec.encode(torch.from_numpy(np.ascontiguousarray(token_major))))(0, 8)
        hit = hit.transpose(1, 0, 2) if stored.layers is not None else hit
        assert live.dtype == codec.read_dtype and live.shape == hit.shape
        np.testing.assert_array_equal(live, hit)
