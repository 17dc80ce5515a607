"""Whether an encoder's rows are *batch-free* on the device at hand: a sentence gets the same bits alone and in
any batch.

An update (:mod:`elmo_cache.builder.update`) must write the bytes a fresh build writes. Where rows are batch-free
it copies the stored rows of every unchanged sentence and encodes only the new or edited ones, whatever batch a
fresh build would have put them in; elsewhere it must encode again every window (the sentences a build encodes
together) an edit touches. The biLM rounds its products' row counts up so that a GEMM library sees the same
shapes for a row in any batch (:mod:`elmo_cache.model.bilm`), which makes its rows batch-free on the CPUs measured
(benchmarks/batch_invariance.py); but a library may still choose its kernels or its threads' split by the shape
(a GPU's does), so this is checked, not assumed: :func:`rows_batch_free` encodes probe sentences alone and inside
two batches of other sentences and compares every bit, once per encoder and thread count.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder

__all__ = ["probe_batches", "rows_batch_free"]

# The probe: sentences of these lengths, each alone and in batches with the fillers (1-40 tokens of a vocabulary of
# VOCABULARY words, ~1,100 tokens in all: products from 1 row to a few hundred, char-CNN calls of 1 to ~350 words).
# Costs ~0.5 s with the bundled model on a 2-core CPU, once per update.
PROBE_LENGTHS = (1, 2, 3, 5, 8, 13, 21, 34, 55)
FILLERS = 48
VOCABULARY = 400

_checked: weakref.WeakKeyDictionary[Any, dict[int, bool]] = weakref.WeakKeyDictionary()


def probe_batches(seed: int = 0) -> tuple[list[list[str]], list[list[list[str]]]]:
    """The probe sentences, and the batches each of them is compared in (every probe sentence in each, with the
    fillers in two orders and counts). Words of letters and punctuation drawn at random: any char-CNN reads them,
    and a word vocabulary maps them to its unknown word."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ.,;'-0123456789"

    words = ["".join(rng.choices(alphabet, k=rng.randint(1, 12))) for _ in range(VOCABULARY)]

    def sentence(length: int) -> list[str]:
        return rng.choices(words, k=length)

    probes = [sentence(n) for n in PROBE_LENGTHS]
    fillers = [sentence(rng.randint(1, 40)) for _ in range(FILLERS)]
    return probes, [probes + fillers, fillers[: FILLERS // 3][::-1] + probes[::-1]]


def rows_batch_free(encoder: Encoder) -> bool:
    """Whether ``encoder`` gives each probe sentence the same float32 rows, bit for bit, alone and in the probe's
    batches, with torch's current thread count (checked once per encoder and thread count). An encoder that
    carries its state from batch to batch ("carry") is not batch-free by its nature."""
    import torch

    if getattr(encoder, "initial_state", "zero") == "carry":
        return False
    threads = torch.get_num_threads()
    known = _checked.setdefault(encoder, {})
    if threads not in known:
        known[threads] = _probe(encoder)
    return known[threads]


def _probe(encoder: Encoder) -> bool:
    probes, batches = probe_batches()
    alone = [_encoded(encoder, [sentence])[0] for sentence in probes]
    for batch in batches:
        rows = _encoded(encoder, batch)
        for want, sentence in zip(alone, probes):
            got = rows[next(k for k, s in enumerate(batch) if s is sentence)]
            if not bool((got == want).all()):
                return False
    return True


def _encoded(encoder: Encoder, batch: Sequence[Sequence[str]]) -> list[Any]:
    """Each sentence's rows ``(layers, tokens, dim)`` on the host, the batch encoded from an empty word cache (as a
    build's window starts), so each word's vector is computed in this batch's char-CNN call."""
    import torch

    encoder.clear_word_cache()
    with torch.inference_mode():
        flat, offsets = encoder.encode_flat(batch)
        host = flat.cpu()
    return [host[:, offsets[k] : offsets[k + 1]] for k in range(len(batch))]
