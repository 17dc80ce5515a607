"""The vectors a quantised cache would return, for ``probe_quality.py --quantize``: int8 as is, pq/opq with
codebooks trained as a build of ``--train-text`` trains them."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache import Encoder
from elmo_cache.rows.codecs import codec_for_option


def quantizations(encoder: Encoder, args: argparse.Namespace) -> dict[str, Any]:
    """``--quantize``'s schemes, ready to round vectors ``(n, 3, dim)``: pq/opq codebooks trained as a build of
    ``--train-text`` trains them (its first ``--train-vectors`` token rows, all three layers)."""
    out: dict[str, Any] = {}
    sample = None
    for name in args.quantize:
        quantization = codec_for_option(name).bind(encoder.output_dim, encoder.n_layers)
        if quantization.training_vectors is not None:
            if sample is None:
                sample = _training_rows(encoder, args.train_text, args.train_vectors)
            start = time.perf_counter()
            quantization = quantization.with_training_vectors(len(sample)).train(sample)
            print(f"trained  {name} codebooks on {len(sample)} rows of {args.train_text} in "
                  f"{time.perf_counter() - start:.0f} s")  # fmt: skip
        out[name] = quantization
    return out


def _training_rows(encoder: Encoder, text: Path, n: int) -> np.ndarray:
    """The first ``n`` token rows ``(n, 3, dim)`` of ``text``'s sentences, in line order."""
    rows: list[np.ndarray] = []
    have = 0
    with text.open(encoding="utf-8") as lines:
        sentences = (line.split() for line in lines)
        for vectors in encoder.embed_sentences(sentences):
            rows.append(vectors.transpose(1, 0, 2))
            have += vectors.shape[1]
            if have >= n:
                break
    return np.ascontiguousarray(np.concatenate(rows)[:n])
