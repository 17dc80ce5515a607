"""``verify --sample``: re-encode a random sample of a cache's sentences and compare the vectors.

The model is the one given, else the one the cache records (found locally without a download,
else loaded by its recorded name); it must be the same model (same weights, options, precision
and initial state) or the comparison is refused rather than reported as damage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.identity import model_differences
from elmo_cache.progress import progress_bar
from elmo_cache.rows.codecs import codec_of_metadata
from elmo_cache.rows.selection import Selection
from elmo_cache.store.staging import decode_tokens

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.verify.report import VerifyReport

__all__ = ["tolerance", "sampled_tokens", "choose", "load_model", "check_sample"]


# Sentences re-encoded per call: a bar that moves, and the encoder's own batching within each call.
_SAMPLE_BATCH = 64


def tolerance(dtype: str, precision: str) -> tuple[float, float]:
    """``(atol, rtol)`` between stored vectors and a fresh fp32 encoding.

    fp32 storage of an fp32 encoder: 1e-5 absolute (batches of other sizes change the last
    bits). float16 storage adds its rounding: one unit in the last place is 2**-10 relative.
    A reduced-precision encoder (bf16/fp16 arithmetic) differs from batch to batch by its own
    rounding, which is far larger: 5e-2.
    """
    if precision != "fp32":
        return 5e-2, 5e-2
    return (1e-5, 2.0**-10) if dtype == "float16" else (1e-5, 0.0)


def _expected(reference: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    """What the cache should hold for a fresh ``(3, n, D)`` float32 encoding, token-major, before the cast."""
    selected = Selection.from_metadata(meta).apply_array(reference)
    return selected if meta["kind"] == "mix" else selected.transpose(1, 0, 2)


def sampled_tokens(texts: list[bytes], lengths: np.ndarray, sample: int, seed: int) -> dict[int, list[str]]:
    """The tokens of ``sample`` random non-empty sentences, from the stored text."""
    chosen = choose(lengths, sample, seed)
    return {i: decode_tokens(texts[i]) for i in sorted(chosen)}


def choose(lengths: np.ndarray, sample: int, seed: int) -> set[int]:
    if not sample:
        return set()
    candidates = np.flatnonzero(lengths > 0)
    if not len(candidates):
        return set()
    rng = np.random.default_rng(seed)
    return set(rng.choice(candidates, size=min(sample, len(candidates)), replace=False).tolist())


def load_model(
    meta: dict[str, Any], model: str | None, options_file: Any, weight_file: Any, device: str | None
) -> Encoder:
    """The model asked for, else the one the cache records (found locally, else loaded by its recorded name)."""
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.model import sources

    identity = meta.get("model") or {}
    kwargs = {
        "device": device,
        "precision": identity.get("precision", "fp32"),
        "initial_state": identity.get("initial_state", "zero"),
    }
    if options_file is not None or weight_file is not None or model is not None:
        return Encoder.load(model, options_file=options_file, weight_file=weight_file, **kwargs)
    files, _ = sources.locate(identity)
    if files is not None:
        return Encoder.load(files, **kwargs)
    name = identity.get("name")
    if not name:
        raise InvalidParameterError("the cache does not name its model; pass --model or --options-file/--weight-file")
    try:
        return Encoder.load(name, **kwargs)
    except Exception as exc:
        raise InvalidParameterError(
            f"cannot load the model {name!r} the cache names ({exc}); pass --model or --options-file/--weight-file"
        ) from None


def check_sample(
    meta: dict[str, Any],
    arrays: dict[str, Any],
    tokens: dict[int, list[str]],
    report: VerifyReport,
    encoder: Encoder | None,
    model: str | None,
    options_file: Any,
    weight_file: Any,
    device: str | None,
    progress: bool = False,
) -> None:
    if encoder is None:
        encoder = load_model(meta, model, options_file, weight_file, device)
    stored_model = meta.get("model") or {}
    differences = model_differences(stored_model, encoder.identity)
    if differences:
        report.problems.append(f"the model given differs from the one that built the cache ({differences[0]})")
        return
    lines = sorted(tokens)
    references = []
    with progress_bar(desc="re-encoding the sample", unit=" sent", total=len(lines), disable=not progress) as bar:
        for start in range(0, len(lines), _SAMPLE_BATCH):
            chunk = lines[start : start + _SAMPLE_BATCH]
            references += encoder.embed_batch([tokens[i] for i in chunk])
            bar.update(len(chunk))
    atol, rtol = tolerance(meta["dtype"], stored_model.get("precision", "fp32"))
    offsets = arrays["offsets"]
    lengths = arrays["lengths"]
    codec = codec_of_metadata(meta).with_arrays(arrays, "verify")
    pool = meta.get("pool") or {}
    if pool.get("only"):
        _check_pooled_sample(meta, arrays, lines, references, pool["method"], (atol, rtol), report)
        return
    worst = 0.0
    for i, reference in zip(lines, references):
        start, length = int(offsets[i]), int(lengths[i])
        stored = np.asarray(arrays["vectors"][start : start + length])
        # The codec knows how far its stored rows may be from the floats (int8: half a step; pq: a nearest
        # centroid), on top of the encoder's own tolerance.
        problem, error = codec.sample_problem(stored, _expected(reference, meta), atol, rtol)
        worst = max(worst, error)
        if problem is not None:
            report.problems.append(f"sentence {i}: {problem}")
            return
    report.sampled = len(lines)
    report.max_abs_error = worst
    report.checks.append(f"{len(lines)} sampled sentences match a fresh encoding (max abs error {worst:.3g})")


def _check_pooled_sample(
    meta: dict[str, Any],
    arrays: dict[str, Any],
    lines: list[int],
    references: list[np.ndarray],
    method: str,
    tolerances: tuple[float, float],
    report: VerifyReport,
) -> None:
    """The sample check of a ``--pool-only`` cache, which has no token rows: each sampled sentence's stored
    pooled vector against the pool of a fresh encoding. A pool (a mean, a maximum, or stored values) is off
    by no more than the values it is taken from, so the token vectors' tolerance holds for it too."""
    from elmo_cache.rows.pooling import POOLED, pool_rows

    atol, rtol = tolerances
    worst = 0.0
    for i, reference in zip(lines, references):
        expected = pool_rows(_expected(reference, meta), method)
        stored = np.asarray(arrays[POOLED][i], dtype=np.float32)
        error = np.abs(stored - expected)
        worst = max(worst, float(error.max()))
        # float16 storage rounds the pool once more: a unit in the last place (2**-10 relative).
        limit = atol + (rtol + (2.0**-10 if meta["dtype"] == "float16" else 0.0)) * np.abs(expected)
        if (error > limit).any():
            report.problems.append(
                f"sentence {i}: the stored {method} vector differs from the {method} of a fresh encoding by up to "
                f"{float(error.max()):.3g} (tolerance {atol:g} + {rtol:g} x |value|)"
            )
            return
    report.sampled = len(lines)
    report.max_abs_error = worst
    report.checks.append(
        f"{len(lines)} sampled sentences: stored {method} vectors match the {method} of a fresh encoding "
        f"(max abs error {worst:.3g}; a --pool-only cache has no token vectors to compare)"
    )
