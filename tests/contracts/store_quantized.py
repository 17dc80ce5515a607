"""The store contract for int8-quantised vectors (``build --quantize int8``): rows of codes and a float32 scale
read back as floats within half a step, as codes, and covered by the checksums. A container's test class inherits
:class:`QuantizedStoreContract` beside :class:`tests.contracts.store.StoreContract`, whose hooks (``write``,
``data_of``, ``where``) it uses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import elmo_cache
from elmo_cache import store
from elmo_cache.errors import CacheCorruptError
from elmo_cache.rows.quantize import Quantization
from elmo_cache.verify.checks import verify
from tests.contracts.store import DIM, _sentences


class QuantizedStoreContract:
    """Quantised rows written through the container's writer: floats, codes and scales, a flipped scale bit found."""

    def quantized_cache(self, output: Path, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """A quantised cache of random float sentences (the first one 3 tokens long): (floats, stored rows)."""
        floats = _sentences(7, seed=seed)
        floats[0] = np.random.default_rng(seed).standard_normal((3, 2, DIM)).astype(np.float32) * 5
        quantization = Quantization("int8", DIM)
        packed = [quantization.quantize(torch.from_numpy(x)) for x in floats]
        self.write(output, packed, quantized=True)
        return floats, packed

    def test_quantized_rows_read_back_as_floats_within_half_a_step_and_as_codes(self, output):
        floats, packed = self.quantized_cache(output, seed=20)
        _, _, library, close = store.open_with_library(output)
        try:
            assert str(library["vectors"].dtype) == "int8" and library["vectors"].shape[1:] == (2, DIM + 4)
        finally:
            close()
        with elmo_cache.open(output) as cache:
            assert cache.dtype == np.float32 and cache.stored_dtype == np.int8
            assert cache.quantization == Quantization("int8", DIM)
            for i, (x, rows) in enumerate(zip(floats, packed)):
                raw = cache.quantized(i)
                assert raw.codes.dtype == np.int8 and raw.codes.shape == (2, len(x), DIM)
                # The stored bytes: codes then the float32 scale, per (token, layer) vector.
                np.testing.assert_array_equal(raw.codes, rows[..., :DIM].transpose(1, 0, 2))
                np.testing.assert_array_equal(raw.scales, rows[..., DIM:].copy().view("<f4")[..., 0].T)
                got = cache[i]
                assert got.dtype == np.float32 and got.shape == (2, len(x), DIM)
                np.testing.assert_array_equal(got, raw.codes.astype(np.float32) * raw.scales[..., None])
                np.testing.assert_array_equal(np.asarray(raw), got)
                # |x - x^| <= scale / 2, and the scale is the vector's absmax / 127.
                want = x.transpose(1, 0, 2)
                np.testing.assert_allclose(raw.scales, np.abs(want).max(axis=-1, initial=0) / 127, rtol=1e-6)
                assert (np.abs(got - want) <= raw.scales[..., None] * (0.5 + 1e-5) + 1e-7).all()
            assert np.abs(cache[0]).max() > 1  # not all zeros: the bound above is not vacuous
        assert verify(output).ok
        floats_only = output.with_name("floats" + output.suffix)
        self.write(floats_only, _sentences(3, seed=21))
        with elmo_cache.open(floats_only) as cache, pytest.raises(elmo_cache.InvalidParameterError, match="not quan"):
            cache.quantized(0)

    def test_a_flipped_bit_in_a_scale_is_found_by_reads_and_verify(self, output):
        self.quantized_cache(output, seed=22)
        with elmo_cache.open(output) as cache:
            before = cache[0]
        file, offset = self.data_of(output, "vectors")
        data = bytearray(file.read_bytes())
        data[offset + DIM + 3] ^= 0x10  # the high byte (sign, exponent) of row 0's first scale
        file.write_bytes(bytes(data))
        report = verify(output)
        assert not report.ok and self.where("vectors") in report.problems[0] and "CRC-32" in report.problems[0]
        with elmo_cache.open(output) as cache, pytest.raises(CacheCorruptError, match="vectors"):
            cache[0]  # the block's CRC-32C, checked on first touch, before any wrong float is returned
        assert np.abs(before).max() > 0
