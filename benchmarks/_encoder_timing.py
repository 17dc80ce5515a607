"""bench_encoder.py's parts: the model's cost in FLOPs, the cached random models it times, and the timing helpers."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _corpus import take_tokens
from _machine import synchronize
from _reference import ReferenceElmo

from elmo_cache.model.options import ModelOptions
from elmo_cache.model.random_model import write_random_model

# -- the model's cost ------------------------------------------------------------------------


def flops_per_token(o: ModelOptions) -> dict[str, int]:
    """FLOPs (2 x multiply-adds) the model needs per real token, by part.

    The char-CNN runs over all ``max_characters_per_token`` slots (padding slots included:
    they have a learned embedding, so the original counts them and so must any exact
    implementation, unless it caches per word type). Elementwise work is not counted.
    The LSTMs also run over <S> and </S>, which are not counted as tokens: that overhead
    is the implementation's, and it shows up as lower achieved FLOP/s.
    """
    slots, c, nf, p, d = (
        o.max_characters_per_token,
        o.char_embedding_dim,
        o.n_filters,
        o.projection_dim,
        o.lstm_dim,
    )
    char_cnn = sum(2 * width * c * num * (slots - width + 1) for width, num in o.filters)
    highway = o.n_highway * 2 * (2 * nf * nf)
    projection = 2 * nf * p
    lstm = 2 * o.n_layers * (2 * (2 * p) * (4 * d) + 2 * d * p)  # 2 directions
    return {
        "char_cnn": char_cnn,
        "highway": highway,
        "projection": projection,
        "lstm": lstm,
        "total": char_cnn + highway + projection + lstm,
    }


# -- inputs ----------------------------------------------------------------------------------


def cache_root() -> Path:
    return Path(os.environ.get("ELMO_CACHE_BENCH_DIR", Path.home() / ".cache" / "elmo-cache-bench"))


def cached_model(size: str, seed: int = 0) -> tuple[Path, Path]:
    """``(options, weights)`` of the random model of ``size``; generated once, then reused."""
    directory = cache_root() / f"{size}-seed{seed}"
    options_path = directory / "model_options.json"
    weights_path = directory / "model_weights.hdf5"
    if (directory / "COMPLETE").is_file():
        return options_path, weights_path
    # Generate next to the final place and rename, so an interrupted run leaves no half file.
    tmp = directory.with_name(f"{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    start = time.perf_counter()
    print(f"generating random {size} model (seed {seed}) in {directory} ...", flush=True)
    write_random_model(tmp, size, seed=seed, name="model")
    (tmp / "COMPLETE").write_text("ok\n")
    shutil.rmtree(directory, ignore_errors=True)
    tmp.rename(directory)
    print(f"  done in {time.perf_counter() - start:.0f} s", flush=True)
    return options_path, weights_path


# -- measuring -------------------------------------------------------------------------------


def best_of(measures):
    """The fastest of the runs ``measure()`` for each callable (tuples starting with a Stopwatch).

    Shared machines only ever make things slower, so the best run is the closest to what
    the code can do; encoder, reference and matmul peak are all treated the same way.
    """
    runs = [measure() for measure in measures]
    return min(runs, key=lambda run: run[0].seconds / run[1])


def _count_tokens(outputs, sentences, output_dim: int) -> int:
    n = 0
    for array, sentence in zip(outputs, sentences, strict=True):
        if array.shape != (3, len(sentence), output_dim):
            raise AssertionError(f"output shape {array.shape} for a sentence of {len(sentence)} tokens")
        n += array.shape[1]
    return n


class Stopwatch:
    """Wall time, plus the share of the CPU this process actually got meanwhile.

    On a shared machine other jobs steal cores; ``cpu_share`` = process CPU time / (wall x
    torch threads) makes that visible next to every figure (1.0: all threads busy all the time;
    on CUDA it is naturally low).
    """

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self) -> Stopwatch:
        synchronize(self.device)
        self._cpu, self._wall = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self._wall
        self.cpu_share = (time.process_time() - self._cpu) / (self.seconds * torch.get_num_threads())


def time_encoder(enc, sentences, batch_tokens: int | None, device: torch.device, *, keep: bool = False):
    """Time turning ``sentences`` into numpy arrays on the host.

    Returns ``(stopwatch, real tokens, outputs or None)``; outputs are kept only on request,
    since holding them costs memory (24 KB per token for the Original).
    """
    kwargs = {} if batch_tokens is None else {"batch_tokens": batch_tokens}
    kept: list[np.ndarray] = []
    with Stopwatch(device) as watch:
        stream = enc.embed_sentences(sentences, **kwargs)
        if keep:
            kept.extend(stream)
            stream = kept
        n = _count_tokens(stream, sentences, enc.output_dim)
    return watch, n, (kept if keep else None)


def time_reference(ref: ReferenceElmo, sentences) -> tuple[Stopwatch, int, list[np.ndarray]]:
    with Stopwatch(ref.device) as watch:
        outputs = list(ref.embed_sentences(sentences))
    return watch, _count_tokens(outputs, sentences, ref.options.output_dim), outputs


def compare(test: list[np.ndarray], truth: list[np.ndarray]) -> dict:
    """Max abs difference and per-token cosine similarity, per layer and overall."""
    a = np.concatenate(test, axis=1).astype(np.float64)  # (3, N, 2P)
    b = np.concatenate(truth, axis=1).astype(np.float64)
    diff = np.abs(a - b)
    dot = (a * b).sum(-1)
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    cos = np.where(norms > 0, dot / np.maximum(norms, 1e-300), 1.0)  # (3, N)
    return {
        "max_abs": float(diff.max()),
        "max_abs_by_layer": [float(x) for x in diff.max(axis=(1, 2))],
        "mean_abs": float(diff.mean()),
        "mean_cosine": float(cos.mean()),
        "mean_cosine_by_layer": [float(x) for x in cos.mean(axis=1)],
        "min_cosine": float(cos.min()),
        "tokens": int(a.shape[1]),
    }


def _reference_slice(sentences, n_tokens: int, batch: int) -> list[list[str]]:
    # Whole batches of 64 only: a half-empty last batch would understate the reference.
    head = take_tokens(sentences, n_tokens)
    n = min(len(sentences), max(batch, round(len(head) / batch) * batch))
    return sentences[:n]


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _profile(enc, sentences, batch_tokens, rows: int = 15) -> str:
    from torch.profiler import ProfilerActivity, profile

    kwargs = {} if batch_tokens is None else {"batch_tokens": batch_tokens}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if enc.device.type == "cuda" else [])
    # with_flops: the table then shows each matmul kind's FLOPs next to its time.
    with profile(activities=activities, with_flops=True) as prof:
        for _ in enc.embed_sentences(sentences, **kwargs):
            pass
    key = "self_cuda_time_total" if enc.device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)
