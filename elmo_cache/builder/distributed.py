"""The distributed build (``engine="ray"``): one zarr cache written by many workers on Ray Data.

It writes the cache ``build()`` writes, byte for byte on the same device type, in four steps:

1. **First pass** (driver, no model, :mod:`~elmo_cache.builder.firstpass`): every line tokenised,
   hashed, deduplicated and cut into the local build's windows; offsets, lengths, the stored
   tokens and each window's rows are fixed and saved under ``<output>.partial/.build/plan/``.
2. **Parts**: runs of consecutive windows (:func:`cut_parts`), cut where possible at vectors-file
   boundaries (a vectors file is ``vectors_file_rows`` rows: one zarr shard). A part owns every file
   whose rows all lie in its range and writes it whole through the store
   (:func:`~elmo_cache.store.write_vectors_file`); rows of a file shared with a neighbour go to a
   small fragment file under ``.build/fragments/``. When its files are durable, the part writes its
   marker ``.build/parts/<i>.done`` (atomically), holding each file's size and CRC-32.
3. **Ray**: the part specs go through ``map_batches`` to a pool of actors (:class:`PartWriter`),
   each holding one encoder (a GPU each on CUDA); actors return small status rows only, vectors
   never pass through the object store. A failing part is reported, the others finish.
4. **Finish** (driver): fragments stitched into their files, the small arrays written, checksums,
   ``complete: true`` last, rename to the output.

Resuming: the same command again reuses the plan (checked against the options, the model and
the corpus's size and modification time), skips parts with a marker and redoes the others.
Every worker must see the output's folder and the model files at the same paths (a shared
filesystem on a real cluster, see docs/DISTRIBUTED.md).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.builder._rowsink import FRAGMENTS_DIR, RowSink, file_range, fragment_path
from elmo_cache.builder.encoding import WindowEncoder, default_batch_tokens
from elmo_cache.builder.firstpass import FirstPass, corpus_signature, first_pass, load_first_pass
from elmo_cache.builder.options import BuildOptions, BuildSummary, disk_bytes
from elmo_cache.builder.plan import (
    DISTRIBUTED_PLAN_DIR,
    Plan,
    differences,
    identity,
    make_plan,
    metadata,
    open_corpus,
    options_json,
    prepare_output,
)
from elmo_cache.errors import CacheExistsError, CacheFormatError, ElmoCacheError, InvalidParameterError
from elmo_cache.model.identity import model_differences
from elmo_cache.store import (
    Layout,
    Progress,
    create_group,
    finish_group,
    remove_output,
    vectors_file_rows,
)
from elmo_cache.store._sort import sort_index
from elmo_cache.store._staging import atomic_write_json, fsync_path, offsets_after_zero
from elmo_cache.store._vectorsfile import VectorsFileStream, copy_rows
from elmo_cache.store.container import containers, get_container
from elmo_cache.store.format import BUILD_DIR, staging_path
from elmo_cache.store.lock import output_lock
from elmo_cache.text.corpus import Corpus

__all__ = ["FAIL_PART_ENV", "PartSpec", "PartWriter", "build_distributed", "cut_parts"]

FAIL_PART_ENV = "ELMO_CACHE_TEST_FAIL_PART"
"""Test-only: the driver reads this part number from its environment and that part fails after writing its
files but before its marker, as a worker dying there would."""

PLAN_DIR = DISTRIBUTED_PLAN_DIR
PARTS_DIR = "parts"

# Parts per worker by default: enough to balance uneven parts, few enough that the edge files
# stitched by the driver (at most one per cut) stay a small share of the vectors.
_PARTS_PER_WORKER = 4
# ... and at most this many vectors files per part, so a failure redoes a bounded amount of work.
_MAX_FILES_PER_PART = 16


@dataclass(frozen=True)
class PartSpec:
    """One unit of work: windows ``[first_window, end_window)``, rows ``[first_row, end_row)``."""

    index: int
    first_window: int
    end_window: int
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


def _marker_path(staging: Path, index: int) -> Path:
    return staging / BUILD_DIR / PARTS_DIR / f"{index}.done"


@dataclass(frozen=True)
class _Job:
    """What every worker needs, fixed by the driver (paths, never names: workers download nothing)."""

    staging: Path
    plan: Plan
    layout: Layout
    n_rows: int
    model_files: Any  # sources.ModelFiles
    device: str
    precision: str
    initial_state: str
    batch_tokens: int
    torch_threads: int
    fail_part: int | None


def run_part(job: _Job, encode: WindowEncoder, plan: FirstPass, spec: PartSpec) -> dict[str, Any]:
    """Encode one part, write its vectors files and fragments, then its marker; returns its status."""
    import torch

    begin = time.monotonic()
    tokens = encoded = 0
    with RowSink(job.staging, job.layout, job.n_rows, spec.first_row, spec.end_row) as sink:
        with torch.inference_mode():
            for w in range(spec.first_window, spec.end_window):
                window, offsets, new, first_row = plan.window(w)
                vectors, count = encode.encode(window.tokens, window.lengths, offsets, new, first_row)
                sink.add(vectors)
                tokens += int(window.lengths.sum(dtype=np.int64))
                encoded += count
        sink.close()
    if job.fail_part == spec.index:
        raise ElmoCacheError(f"part {spec.index} failed on purpose ({FAIL_PART_ENV}, a test hook)")
    fsync_path(job.staging / BUILD_DIR / FRAGMENTS_DIR, directory=True)
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
    marker = {
        **status,
        "files": {str(k): list(v) for k, v in sink.files.items()},
        "fragments": [list(f) for f in sink.fragments],
    }
    atomic_write_json(_marker_path(job.staging, spec.index), marker)
    return status


class PartWriter:
    """The Ray Data callable class: one encoder per actor, one part per call (``batch_size=1``)."""

    def __init__(self, job: _Job):
        import torch

        from elmo_cache.encoder import Encoder

        torch.set_num_threads(job.torch_threads)
        self.job = job
        encoder = Encoder.load(
            job.model_files, device=job.device, precision=job.precision, initial_state=job.initial_state
        )
        self.encode = WindowEncoder(encoder, job.plan, job.batch_tokens)
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


def _import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise InvalidParameterError(
            'engine: "ray" needs Ray Data, which is not installed; install it with: pip install "elmo-cache[ray]"'
        ) from None
    return ray


def _connect(ray: Any, address: str | None) -> None:
    """``ray.init`` with a clear error when the named cluster is not there (Ray prints a traceback)."""
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, TimeoutError) as exc:
        if address is None:
            raise ElmoCacheError(f"engine: could not start a local Ray cluster ({exc})") from None
        raise InvalidParameterError(
            f"address: no Ray cluster answers at {address!r} ({str(exc).splitlines()[0]}). Start one first "
            "(`ray start --head` on this machine; `ray start --address HEAD:6379` on the others), or leave out "
            "--address to let the build start a local Ray of its own"
        ) from None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def build_distributed(
    corpus: str | os.PathLike[str] | Corpus,
    options: BuildOptions | None = None,
    *,
    address: str | None = None,
    workers: int | None = None,
    parts: int | None = None,
    cpus_per_worker: float | None = None,
) -> BuildSummary:
    """Build the cache of ``corpus`` on a Ray cluster; the same cache as :func:`elmo_cache.build` writes.

    ``address``: the Ray cluster (``ray.init(address=...)``: "auto", "ray://host:10001"...); None
    starts a local one, unless Ray is already initialised in this process (then that one is used).
    ``workers``: encoder actors (default: one per GPU on CUDA, else one per 4 CPUs of the cluster).
    ``parts``: units of work (default: 4 per worker, at most 16 vectors files each).
    ``cpus_per_worker``: CPUs each actor reserves (default: the cluster's CPUs shared among the
    workers on CPU, 1 with a GPU). Rerunning the same call after a failure redoes only the parts
    that did not finish. zarr output only. Raises what ``build`` raises.
    """
    options = options or BuildOptions()
    source = open_corpus(corpus, options)
    plan = make_plan(source, options)
    if not get_container(plan.format).parallel_writers:
        able = [c.name for c in containers() if c.parallel_writers]
        raise InvalidParameterError(
            f"format: the ray engine's workers write separate files of one cache at once, and a {plan.format} "
            f"cache has a single writer; build {' or '.join(able)} (or use --engine local)"
        )
    if workers is not None and workers < 1:
        raise InvalidParameterError(f"workers: must be at least 1, got {workers}")
    if parts is not None and parts < 1:
        raise InvalidParameterError(f"parts: must be at least 1, got {parts}")
    if cpus_per_worker is not None and cpus_per_worker <= 0:
        raise InvalidParameterError(f"cpus_per_worker: must be positive, got {cpus_per_worker}")
    if source.path is None or not source.is_regular_file:
        raise InvalidParameterError(
            f"corpus: the ray engine reads the corpus from a regular file (a resumed build checks its size and "
            f"time), not {source.name}; save it to a file first"
        )
    ray = _import_ray()
    run_start = time.monotonic()
    with output_lock(plan.output):  # the driver holds it for the workers: they write only what it assigns
        started_ray = False
        if not ray.is_initialized():
            _connect(ray, address)
            started_ray = True
        try:
            return _build(ray, source, plan, options, workers, parts, cpus_per_worker, run_start)
        finally:
            if started_ray:
                ray.shutdown()


def _device(ray: Any, options: BuildOptions) -> str:
    if options.device is not None:
        return options.device
    # Like build(): CUDA when there is one (here: in the cluster, not necessarily in the driver).
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def _build(
    ray: Any,
    source: Corpus,
    plan: Plan,
    options: BuildOptions,
    workers: int | None,
    n_parts: int | None,
    cpus_per_worker: float | None,
    run_start: float,
) -> BuildSummary:
    from elmo_cache.encoder import Encoder
    from elmo_cache.model import sources

    files = sources.resolve(options.model, options.options_file, options.weight_file)
    # The driver needs the model's width and identity only: fp32 on the CPU loads anywhere
    # (precision changes the identity, not the width, so it is set as the workers will run it).
    probe = Encoder.load(files, device="cpu", precision="fp32", initial_state=options.initial_state)
    ident_model = {**probe.identity, "precision": options.precision}
    dim = probe.output_dim
    del probe
    plan = plan.with_model(dim)

    ident = identity(plan, ident_model, dim, dedupe=bool(options.dedupe))
    device = _device(ray, options)
    batch_tokens = default_batch_tokens(options, device.split(":")[0])
    window_tokens = batch_tokens * options.window_batches
    staging = staging_path(plan.output)
    plan_dir = staging / BUILD_DIR / PLAN_DIR
    signature = corpus_signature(source)
    plan_info = {
        "identity": ident,
        "corpus": signature,
        "window_tokens": window_tokens,
        "batch_tokens": batch_tokens,
        "started": _now(),
    }

    summary = _prepare(plan, ident, options, staging, plan_dir, plan_info)
    if summary is not None:
        return summary
    begin = time.monotonic()
    first = load_first_pass(plan_dir)
    if first is None:
        first = first_pass(source, plan_dir, window_tokens, bool(options.dedupe), plan_info)
    first_pass_seconds = time.monotonic() - begin
    layout = Layout(plan.format, plan.row_shape(dim), plan.dtype, plan.chunk_rows, plan.compression, plan.shard_rows)
    file_rows = vectors_file_rows(layout)
    progress = Progress(identity=ident, lines=first.n_lines, rows=first.n_rows, tokens=first.n_tokens)
    build_info: dict[str, Any] = {
        "args": options_json(options),
        "input": source.describe(),
        "engine": "ray",
        "started": first.info.get("started"),
    }
    create_group(
        staging, layout, first.n_rows, metadata(ident, progress, complete=False, n_unique=0, build_info=build_info)
    )
    for sub in (PARTS_DIR, FRAGMENTS_DIR):
        (staging / BUILD_DIR / sub).mkdir(parents=True, exist_ok=True)

    resources = ray.cluster_resources()
    gpu = device.startswith("cuda")
    if workers is None:
        workers = max(1, int(resources.get("GPU", 0))) if gpu else max(1, int(resources.get("CPU", 1)) // 4)
    if cpus_per_worker is None:
        cpus_per_worker = 1.0 if gpu else max(1.0, float(int(resources.get("CPU", 1)) // workers))
    # An actor pool larger than the cluster would wait for resources forever: say so instead.
    if gpu and workers > resources.get("GPU", 0):
        raise InvalidParameterError(
            f"workers: {workers} workers need one GPU each; the Ray cluster has {resources.get('GPU', 0):g}"
        )
    if workers * cpus_per_worker > resources.get("CPU", 0):
        raise InvalidParameterError(
            f"workers: {workers} workers of {cpus_per_worker:g} CPUs need {workers * cpus_per_worker:g} CPUs; "
            f"the Ray cluster has {resources.get('CPU', 0):g}"
        )
    if n_parts is None:
        n_parts = max(_PARTS_PER_WORKER * workers, -(-first.n_rows // (_MAX_FILES_PER_PART * file_rows)))
    parts_file = staging / BUILD_DIR / "parts.json"
    if parts_file.is_file():  # a resumed build keeps its first run's cuts (the markers name them)
        specs = [PartSpec(*s) for s in json.loads(parts_file.read_text(encoding="utf-8"))]
    else:
        specs = cut_parts(first.windows, file_rows, n_parts)
        atomic_write_json(parts_file, [[s.index, s.first_window, s.end_window, s.first_row, s.end_row] for s in specs])
    todo = [s for s in specs if not _marker_path(staging, s.index).is_file()]

    fail = os.environ.get(FAIL_PART_ENV)
    job = _Job(
        staging,
        plan,
        layout,
        first.n_rows,
        files,
        # An actor with one GPU sees only that one (Ray sets CUDA_VISIBLE_DEVICES): "cuda", whatever index was asked.
        "cuda" if gpu else device,
        options.precision,
        options.initial_state,
        batch_tokens,
        max(1, int(cpus_per_worker)),
        int(fail) if fail else None,
    )
    begin = time.monotonic()
    statuses = _run_parts(ray, job, todo, len(specs), workers, cpus_per_worker, gpu, options.progress)
    parts_seconds = time.monotonic() - begin
    errors = [s for s in statuses if s["error"]]
    if errors:
        named = "; ".join(f"part {s['part']} on {s['worker']}: {s['error']}" for s in errors)
        raise ElmoCacheError(
            f"{len(errors)} of {len(todo)} parts of {plan.output} failed ({named}); the finished parts are kept: "
            "fix the cause and rerun the same command to redo only the parts that did not finish"
        )
    for s in statuses:
        differ = model_differences(json.loads(s["model"]), ident["model"])
        if differ:
            raise ElmoCacheError(
                f"worker {s['worker']} loaded another model than the driver ({', '.join(differ)} differ); "
                "every node must see the same model files"
            )

    tokens_run = sum(int(s["tokens"]) for s in statuses)
    worker_names = sorted({str(s["worker"]) for s in statuses})
    # Where this run's time went: the first pass (0 when reused), the actors (start-up, model load,
    # encoding, writing), and the tokens/s of that second phase alone.
    build_info.update(
        workers=worker_names,
        parts=len(specs),
        parts_run=len(todo),
        first_pass_seconds=round(first_pass_seconds, 3),
        parts_seconds=round(parts_seconds, 3),
        parts_tokens_per_s=round(tokens_run / parts_seconds, 1) if parts_seconds > 0 else None,
    )
    path, n_unique = _finish(
        staging, plan.output, layout, first, specs, ident, progress, build_info, tokens_run, run_start
    )
    seconds = time.monotonic() - run_start
    return BuildSummary(
        path,
        plan.format,
        first.n_lines,
        first.n_tokens,
        first.n_rows,
        n_unique,
        disk_bytes(path),
        seconds,
        tokens_run / max(seconds, 1e-9),
        engine="ray",
        workers=tuple(worker_names),
        parts=len(specs),
        parts_run=len(todo),
        workers_asked=workers,
    )


def _prepare(
    plan: Plan,
    ident: dict[str, Any],
    options: BuildOptions,
    staging: Path,
    plan_dir: Path,
    plan_info: dict[str, Any],
) -> BuildSummary | None:
    """Like ``prepare_output``, plus the distributed staging: a summary when the cache is already complete."""
    output = plan.output
    saved = load_first_pass(plan_dir) if staging.is_dir() and not output.exists() else None
    if saved is not None and not options.overwrite:
        there = saved.info["identity"]
        differ = differences(there, ident)
        if differ:
            raise CacheExistsError(
                f"{staging} holds an interrupted build with other options ({differ}); "
                "rerun it with its own options to resume it, or pass --overwrite to discard it"
            )
        for key in ("corpus", "window_tokens"):
            if saved.info[key] != plan_info[key]:
                raise CacheExistsError(
                    f"{staging} holds an interrupted build of another corpus or window size ({key}: "
                    f"{saved.info[key]!r} there, {plan_info[key]!r} now); pass --overwrite to start over"
                )
        return None
    action, state = prepare_output(plan, ident, options.overwrite)
    if action == "complete":
        return BuildSummary(
            output,
            plan.format,
            state["n_sentences"],
            state["n_tokens"],
            state["n_rows"],
            state["n_unique"],
            disk_bytes(output),
            0.0,
            0.0,
            already_complete=True,
            engine="ray",
        )
    if action == "resume":
        raise CacheExistsError(
            f"{staging} holds an interrupted build of the local engine; resume it with --engine local, "
            "or pass --overwrite to start over with the ray engine"
        )
    if staging.exists():  # an unfinished first pass, or overwrite
        remove_output(staging)
    output.parent.mkdir(parents=True, exist_ok=True)
    return None


def _run_parts(
    ray: Any,
    job: _Job,
    todo: list[PartSpec],
    total: int,
    workers: int,
    cpus_per_worker: float,
    gpu: bool,
    show_progress: bool,
) -> list[dict[str, Any]]:
    """Run the parts on a pool of ``workers`` actors; their status rows, as they finish."""
    if not todo:
        return []
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # ours counts parts and tokens
    # Ray Data logs every execution's plan at INFO and warns that its bars are off: noise on a CLI.
    ray_data_logger = logging.getLogger("ray.data")
    level = ray_data_logger.level
    ray_data_logger.setLevel(logging.ERROR)
    items = [
        {
            "index": s.index,
            "first_window": s.first_window,
            "end_window": s.end_window,
            "first_row": s.first_row,
            "end_row": s.end_row,
        }
        for s in todo
    ]
    dataset = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        PartWriter,
        fn_constructor_kwargs={"job": job},
        batch_size=1,
        compute=ray.data.ActorPoolStrategy(size=min(workers, len(todo))),
        num_cpus=cpus_per_worker,
        num_gpus=1 if gpu else 0,
    )
    bar = None
    if show_progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=total - len(todo), unit=" part", desc="encoding", file=sys.stderr)
    statuses: list[dict[str, Any]] = []
    tokens = 0
    begin = time.monotonic()
    try:
        for row in dataset.iter_rows():
            status = {key: (value.item() if hasattr(value, "item") else value) for key, value in row.items()}
            statuses.append(status)
            tokens += int(status["tokens"])
            if bar is not None:
                rate = tokens / max(1e-9, time.monotonic() - begin)
                bar.set_postfix_str(f"{tokens:,} tokens, {rate:,.0f} tok/s", refresh=False)
                bar.update(1)
    except Exception as exc:  # an actor that could not start (bad device, missing files...): Ray wraps it
        raise ElmoCacheError(
            f"the ray workers building {job.staging} failed: {_root_cause(exc)}; finished parts are kept, "
            "rerun the same command to resume"
        ) from None
    finally:
        ray_data_logger.setLevel(level)
        if bar is not None:
            bar.close()
    return statuses


def _root_cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return "".join(traceback.format_exception_only(exc)).strip()


def _finish(
    staging: Path,
    output: Path,
    layout: Layout,
    first: FirstPass,
    specs: list[PartSpec],
    ident: dict[str, Any],
    progress: Progress,
    build_info: dict[str, Any],
    tokens_run: int,
    run_start: float,
) -> tuple[Path, int]:
    """Stitch the shared vectors files from their fragments, then write everything else and publish."""
    file_rows = vectors_file_rows(layout)
    sums: dict[int, tuple[int, int]] = {}
    fragments: dict[int, list[tuple[int, int]]] = {}
    for spec in specs:
        marker = json.loads(_marker_path(staging, spec.index).read_text(encoding="utf-8"))
        sums.update({int(k): (int(v[0]), int(v[1])) for k, v in marker["files"].items()})
        for k, lo, hi in marker["fragments"]:
            fragments.setdefault(int(k), []).append((int(lo), int(hi)))
    for k, pieces in sorted(fragments.items()):
        start, stop = file_range(k, file_rows, first.n_rows)
        pieces.sort()
        if pieces[0][0] != start or pieces[-1][1] != stop or any(a[1] != b[0] for a, b in itertools.pairwise(pieces)):
            raise CacheFormatError(
                f"{staging}: the fragments of vectors file {k} ({pieces}) do not cover rows {start}-{stop}; "
                "rerun with --overwrite"
            )
        # Streamed fragment by fragment: gathered in memory, a shared file (up to 256 MiB) sat in the driver.
        with VectorsFileStream(staging, layout, first.n_rows, k) as stream:
            for lo, hi in pieces:
                copy_rows(fragment_path(staging, k, lo), hi - lo, layout, stream)
            sums[k] = stream.finish()
    n_files = -(-first.n_rows // file_rows)
    missing = sorted(set(range(n_files)) - set(sums))
    if missing:
        raise CacheFormatError(
            f"{staging}: vectors files {missing[:10]} were written by no part; rerun with --overwrite"
        )

    hashes, lines = sort_index(lambda a, b: first.hashes[a:b], first.n_lines, staging / BUILD_DIR / "index")
    starts = offsets_after_zero(first.directory / "text_ends.bin", first.n_lines, staging / BUILD_DIR / "offsets.bin")
    small = {
        "offsets": first.offsets,
        "lengths": first.lengths,
        "index/hashes": hashes,
        "index/rows": lines,
        "tokens/bytes": first.text,
        "tokens/offsets": starts,
    }
    seconds = time.monotonic() - run_start
    build_info = {
        **build_info,
        "finished": _now(),
        # this run's wall time (first pass, workers, finishing) and the tokens its parts encoded per second
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens_run / seconds, 1) if seconds > 0 else None,
    }
    meta = metadata(ident, progress, complete=True, n_unique=len(hashes), build_info=build_info)
    return finish_group(staging, output, small, meta, sums), len(hashes)
