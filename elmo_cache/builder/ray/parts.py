"""The ray engine's unit of work, a *part*: how the windows are cut into parts, and what a worker does with one.

A part is a run of consecutive windows (:func:`cut_parts`), cut where possible at row-file boundaries (the
container's ``ParallelWriter.file_rows``: for zarr, one shard of ``vectors``). A part owns every file whose rows
all lie in its range and writes it whole; rows of a file shared with a neighbour go to a small fragment file.
How a file or a fragment is written is the container's business: a part puts its rows into the sink its
:class:`~elmo_cache.store.container.ParallelWriter` gives (:meth:`~ParallelWriter.part`). Beside them it writes
its values of the declared per-sentence columns the first pass does not hold (:mod:`~elmo_cache.builder.ray.columns`:
the pooled vectors); a layout without token rows (``--pool-only``) writes those values alone. When its files are
durable, the part writes its marker ``.build/parts/<i>.done`` (atomically), holding each file's size and CRC-32
and its fragments (:class:`~elmo_cache.store.container.PartFiles`).

:class:`PartWriter` is the callable class Ray Data runs in each actor; nothing here imports Ray.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.builder.encoding import WindowEncoder
from elmo_cache.builder.firstpass import PLAN_DIR, FirstPass, load_first_pass
from elmo_cache.builder.plan import Plan
from elmo_cache.builder.ray.columns import PartColumns, part_columns
from elmo_cache.errors import CacheFormatError, ElmoCacheError
from elmo_cache.store.container import ParallelWriter, PartFiles
from elmo_cache.store.durable import atomic_write_json
from elmo_cache.store.format import BUILD_DIR, POOLED_ARRAY
from elmo_cache.store.staging import Layout

__all__ = ["FAIL_PART_ENV", "PARTS_DIR", "PartJob", "PartSpec", "PartWriter", "cut_parts", "marker_path", "run_part"]

FAIL_PART_ENV = "ELMO_CACHE_TEST_FAIL_PART"
"""Test-only: the driver reads this part number from its environment and that part fails after writing its
files but before its marker, as a worker dying there would."""

PARTS_DIR = "parts"


@dataclass(frozen=True)
class PartSpec:
    """One unit of work: windows ``[first_window, end_window)``, rows ``[first_row, end_row)``."""

    # Its number: the name of its marker.
    index: int
    # Its windows (numbers in the first pass's plan).
    first_window: int
    end_window: int
    # Its rows of the vectors.
    first_row: int
    end_row: int


def cut_parts(windows: np.ndarray, file_rows: int, n_parts: int) -> list[PartSpec]:
    """Cut the windows (rows of ``(first_line, lines, first_row, rows)``) into about ``n_parts`` runs.

    Cuts fall on window boundaries (the windows are fixed by the corpus), as near as possible to
    multiples of ``file_rows`` spread evenly over the rows, so most vectors files have one owner.
    """
    n_windows = len(windows)
    if n_windows == 0:
        return []
    starts = windows[:, 2]
    n_rows = int(windows[-1, 2] + windows[-1, 3])
    n_parts = max(1, min(n_parts, n_windows))
    cuts = [0]
    for j in range(1, n_parts):
        if n_rows:
            target = j * n_rows / n_parts
            if file_rows <= n_rows / n_parts:
                target = round(target / file_rows) * file_rows
            w = int(np.searchsorted(starts, target))  # first window starting at or after the target
            if w >= n_windows or (w > 0 and target - starts[w - 1] < starts[w] - target):
                w -= 1  # the nearer of the two boundaries around the target
        else:
            w = round(j * n_windows / n_parts)
        if cuts[-1] < w < n_windows:
            cuts.append(w)
    cuts.append(n_windows)
    specs = []
    for i, (a, b) in enumerate(itertools.pairwise(cuts)):
        specs.append(PartSpec(i, a, b, int(windows[a, 2]), int(windows[b - 1, 2] + windows[b - 1, 3])))
    return specs


def marker_path(staging: Path, index: int) -> Path:
    """Where part ``index`` records that its files are on disk."""
    return staging / BUILD_DIR / PARTS_DIR / f"{index}.done"


@dataclass(frozen=True)
class PartJob:
    """What every worker needs, fixed by the driver (paths, never names: workers download nothing)."""

    # The output's staging folder, which every worker sees at this path.
    staging: Path
    # The build's plan (selection, dtype, chunking).
    plan: Plan
    # The vectors' layout in the store.
    layout: Layout
    # Rows of ``vectors`` in the cache: 0 for a layout without token rows (--pool-only).
    n_rows: int
    # How the container's files are written by several workers (its Container.parallel_writer()).
    writer: ParallelWriter
    # The model's files (files.ModelFiles), resolved by the driver.
    model_files: Any
    # The encoder's device, precision and initial state.
    device: str
    precision: str
    initial_state: str
    # Tokens per encoder batch (the same as the local build's on this device type).
    batch_tokens: int
    # torch threads per worker.
    torch_threads: int
    # The part made to fail (FAIL_PART_ENV), None normally.
    fail_part: int | None
    # The corpus as errors name it (a refused non-finite value names its line in it).
    corpus: str = "the corpus"
    # The vectors files whose rows end short of the file (a window's last), by the row they end at
    # (store.parallel.short_files).
    ends: dict[int, int] = field(default_factory=dict)


def run_part(job: PartJob, encode: WindowEncoder, plan: FirstPass, spec: PartSpec) -> dict[str, Any]:
    """Encode one part, write its vectors files and fragments (none for a layout without token rows) and its
    values of the declared columns the parts write, then its marker; returns its status."""
    import torch

    begin = time.monotonic()
    tokens = encoded = 0
    with ExitStack() as stack:
        columns = stack.enter_context(PartColumns(job.staging, spec.index, part_columns(job.layout)))
        sink = None
        if job.layout.token_rows:
            sink = stack.enter_context(
                job.writer.part(job.staging, job.layout, job.n_rows, spec.first_row, spec.end_row, job.ends)
            )
        with torch.inference_mode():
            for w in range(spec.first_window, spec.end_window):
                window, offsets, new, first_row = plan.window(w)
                vectors, window_pooled, count = encode.encode(
                    window.tokens, window.lengths, offsets, new, first_row, first_line=window.first_line
                )
                if sink is not None:
                    sink.add(vectors, first_row)
                # The encoding's values of the declared columns, by name (today the pooled vectors alone).
                values = {} if window_pooled is None else {POOLED_ARRAY: window_pooled}
                columns.add(values, len(window.lengths))
                tokens += int(window.lengths.sum(dtype=np.int64))
                encoded += count
        written = sink.finish() if sink is not None else PartFiles({}, ())
        columns.finish()  # durable at their final names before the marker says the part is done
    if job.fail_part == spec.index:
        raise ElmoCacheError(f"part {spec.index} failed on purpose ({FAIL_PART_ENV}, a test hook)")
    seconds = time.monotonic() - begin
    status = {
        "part": spec.index,
        "tokens": tokens,
        "encoded_tokens": encoded,
        "rows": spec.end_row - spec.first_row,
        "seconds": seconds,
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "model": encode.encoder.identity,
    }
    marker = {**status, **written.to_json()}
    atomic_write_json(marker_path(job.staging, spec.index), marker)
    return status


class PartWriter:
    """The Ray Data callable class: one encoder per actor, one part per call (``batch_size=1``)."""

    def __init__(self, job: PartJob):
        import torch

        from elmo_cache.encoder.encoder import Encoder

        torch.set_num_threads(job.torch_threads)
        self.job = job
        encoder = Encoder.load(
            job.model_files, device=job.device, precision=job.precision, initial_state=job.initial_state
        )
        self.encode = WindowEncoder(encoder, job.plan, job.batch_tokens, job.corpus)
        plan = load_first_pass(job.staging / BUILD_DIR / PLAN_DIR)
        if plan is None:
            raise CacheFormatError(f"{job.staging}: the build plan is missing on this worker (is the folder shared?)")
        self.plan = plan

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out: dict[str, list[Any]] = {"part": [], "tokens": [], "seconds": [], "worker": [], "error": [], "model": []}
        for values in zip(*(batch[name] for name in ("index", "first_window", "end_window", "first_row", "end_row"))):
            spec = PartSpec(*(int(v) for v in values))
            try:
                status = run_part(self.job, self.encode, self.plan, spec)
                error, model = "", json.dumps(status["model"], sort_keys=True)
            except Exception as exc:  # reported to the driver, which names the part; the other parts go on
                status = {"tokens": 0, "seconds": 0.0, "worker": f"{socket.gethostname()}:{os.getpid()}"}
                error = "".join(traceback.format_exception_only(exc)).strip()
                model = ""
            out["part"].append(spec.index)
            out["tokens"].append(status["tokens"])
            out["seconds"].append(status["seconds"])
            out["worker"].append(status["worker"])
            out["error"].append(error)
            out["model"].append(model)
        return {name: np.array(values) for name, values in out.items()}
