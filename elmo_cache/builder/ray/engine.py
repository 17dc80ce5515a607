"""The distributed build (``engine="ray"``): one zarr cache written by many workers on Ray Data.

It writes the cache ``build()`` writes, byte for byte on the same device type, in four steps:

1. **First pass** (driver, no model, :mod:`~elmo_cache.builder.firstpass`): every line tokenised,
   hashed, deduplicated and cut into the local build's windows; offsets, lengths, the stored
   tokens and each window's rows are fixed and saved under ``<output>.partial/.build/plan/``.
2. **Parts** (:mod:`~elmo_cache.builder.ray.parts`): runs of consecutive windows (:func:`cut_parts`),
   cut where possible at row-file boundaries (``ParallelWriter.file_rows`` rows: one zarr shard).
   A part owns every file whose rows all lie in its range and writes it whole through the sink the
   container's :class:`~elmo_cache.store.container.ParallelWriter` gives; rows of a file shared with a
   neighbour go to a small fragment file under ``.build/fragments/``. When its files are durable, the
   part writes its marker ``.build/parts/<i>.done`` (atomically), holding each file's size and CRC-32.
3. **Ray** (:mod:`~elmo_cache.builder.ray.raydata`): the part specs go through ``map_batches`` to a
   pool of actors (:class:`~elmo_cache.builder.ray.parts.PartWriter`), each holding one encoder (a GPU
   each on CUDA); actors return small status rows only, vectors never pass through the object
   store. A failing part is reported, the others finish.
4. **Finish** (driver, :mod:`~elmo_cache.builder.ray.stitch`): fragments stitched into their files, the
   parts' values of the declared per-sentence columns (:mod:`~elmo_cache.builder.ray.columns`) joined in line
   order, the small arrays derived from the declared columns as the single writer derives them
   (:class:`~elmo_cache.store.staging.SentenceColumns`), checksums, ``complete: true`` last, rename to the
   output (the container's ``ParallelWriter.stitch`` and ``finish``).

The per-sentence columns are the layout's declarations (``Layout.sentence_columns``): the first pass writes the
built-in ones, the parts every other one (``--pool``'s pooled vectors). A layout without token rows
(``--pool-only``) writes no ``vectors`` row: the parts encode and write their columns only, and the offsets
count the rows a build with them would have, as the local engine's.

The engine knows no store format: it writes through the container's ``parallel_writer()`` and refuses a
container that has none.

The steps every build shares (plan, output, summary) are :mod:`elmo_cache.builder.skeleton`'s; this
module is the engine (:class:`RayEngine`). Ray is imported by ``raydata`` only, when a build uses it.

Resuming: the same command again reuses the plan (checked against the options, the model and
the corpus's size and modification time), skips parts with a marker and redoes the others.
Every worker must see the output's folder and the model files at the same paths (a shared
filesystem on a real cluster, see docs/DISTRIBUTED.md).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from elmo_cache.builder.api import run_build
from elmo_cache.builder.codebooks import final_arrays, train_on_ray
from elmo_cache.builder.encoding import default_batch_tokens, windows_entry
from elmo_cache.builder.engine import BuildJob, Finished
from elmo_cache.builder.firstpass import (
    PLAN_DIR,
    PLAN_FILE,
    FirstPass,
    corpus_signature,
    first_pass,
    load_first_pass,
)
from elmo_cache.builder.options import BuildOptions, BuildSummary
from elmo_cache.builder.output import check_resumed
from elmo_cache.builder.plan import Plan, metadata, options_json
from elmo_cache.builder.ray.parts import FAIL_PART_ENV, PARTS_DIR, PartJob, PartSpec, cut_parts, marker_path
from elmo_cache.builder.ray.raydata import connect, import_ray, run_parts
from elmo_cache.builder.ray.stitch import publish, stitch
from elmo_cache.errors import CacheExistsError, ElmoCacheError, InvalidParameterError
from elmo_cache.model.identity import model_differences
from elmo_cache.store.container import OutputKind, OutputState, ParallelWriter
from elmo_cache.store.durable import atomic_write_json
from elmo_cache.store.format import BUILD_DIR, staging_path
from elmo_cache.store.parallel import short_files
from elmo_cache.store.registry import containers, get_container
from elmo_cache.store.staging import Progress
from elmo_cache.text.corpus import Corpus

__all__ = [
    "FAIL_PART_ENV",
    "RayEngine",
    "RayRun",
    "build_distributed",
]

# Parts per worker by default: enough to balance uneven parts, few enough that the edge files
# stitched by the driver (at most one per cut) stay a small share of the vectors.
_PARTS_PER_WORKER = 4
# ... and at most this many vectors files per part, so a failure redoes a bounded amount of work.
_MAX_FILES_PER_PART = 16


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
    that did not finish. Only containers with a parallel writer (zarr). Raises what ``build`` raises.
    """
    engine = RayEngine(address=address, workers=workers, parts=parts, cpus_per_worker=cpus_per_worker)
    return run_build(corpus, options or BuildOptions(), engine)


class RayEngine:
    """The ray engine: a first pass in the driver, parts written by actors, the finish in the driver."""

    name = "ray"
    # build --update is the local engine's (elmo_cache.builder.update): why this one refuses it.
    updates = False
    no_update = (
        "the ray engine does not update a cache in place: its first pass cuts the whole corpus into parts for "
        "workers that would each need the old cache's rows; run the update with --engine local (a cache it "
        "updates holds the same bytes as a ray build of the new corpus)"
    )

    def __init__(
        self,
        *,
        address: str | None = None,
        workers: int | None = None,
        parts: int | None = None,
        cpus_per_worker: float | None = None,
    ):
        # build_distributed()'s arguments (see there); None: the defaults, fixed once the cluster is known.
        self.address = address
        self.workers = workers
        self.parts = parts
        self.cpus_per_worker = cpus_per_worker
        # The ray module, imported by check().
        self.ray: Any = None

    @classmethod
    def from_arguments(cls, *, encoder: Any, address: str | None, workers: int | None) -> RayEngine:
        if encoder is not None:
            raise InvalidParameterError(
                "encoder: the ray engine loads the model in every worker; name it in the options instead"
            )
        return cls(address=address, workers=workers)

    def check(self, source: Corpus, plan: Plan) -> None:
        if get_container(plan.format).parallel_writer() is None:
            able = [c.name for c in containers() if c.parallel_writer() is not None]
            raise InvalidParameterError(
                f"format: the ray engine's workers write separate files of one cache at once, and a {plan.format} "
                f"cache has a single writer; build {' or '.join(able)} (or use --engine local)"
            )
        if self.workers is not None and self.workers < 1:
            raise InvalidParameterError(f"workers: must be at least 1, got {self.workers}")
        if self.parts is not None and self.parts < 1:
            raise InvalidParameterError(f"parts: must be at least 1, got {self.parts}")
        if self.cpus_per_worker is not None and self.cpus_per_worker <= 0:
            raise InvalidParameterError(f"cpus_per_worker: must be positive, got {self.cpus_per_worker}")
        if source.path is None or not source.is_regular_file:
            raise InvalidParameterError(
                f"corpus: the ray engine reads the corpus from a regular file (a resumed build checks its size and "
                f"time), not {source.name}; save it to a file first"
            )
        self.ray = import_ray()

    @contextmanager
    def session(self, job: BuildJob) -> Iterator[None]:
        ray = self.ray
        started_ray = False
        if not ray.is_initialized():
            connect(ray, self.address)
            started_ray = True
        try:
            yield
        finally:
            if started_ray:
                ray.shutdown()

    def interrupted(self, output: Path, found: OutputState) -> bool:
        return (staging_path(output) / BUILD_DIR / PLAN_DIR / PLAN_FILE).is_file()  # a finished first pass

    def start(self, job: BuildJob, found: OutputState) -> RayRun:
        return RayRun(self, job, found)


class RayRun:
    """One ray build: the first pass (or its saved plan) and the parts' cuts made; runs the parts, then finishes."""

    def __init__(self, engine: RayEngine, job: BuildJob, found: OutputState):
        ray, options, plan, ident = engine.ray, job.options, job.plan, job.identity
        self.ray, self.job = ray, job
        device = _device(ray, options)
        batch_tokens = default_batch_tokens(options, device.split(":")[0], job.model.identity)
        window_tokens = batch_tokens * options.window_batches
        # The local engine records the same (both cut by WindowCutter): their caches are byte-identical.
        self.windows = windows_entry(batch_tokens, options.window_batches)
        self.staging = staging = staging_path(plan.output)
        plan_info = {
            "identity": ident,
            "corpus": corpus_signature(job.source),
            "window_tokens": window_tokens,
            "batch_tokens": batch_tokens,
            "started": _now(),
        }
        dim = job.model.output_dim
        self.layout = layout = plan.layout(dim)
        # Each window's rows start a vectors file of their own, as the local engine places them.
        plan_info["window_rows"] = layout.window_rows
        begin = time.monotonic()
        self.first = first = _first_pass(job, staging, plan_info, resumed=found.kind is OutputKind.RESUMABLE)
        self.first_pass_seconds = time.monotonic() - begin
        writer = _parallel_writer(plan.format)
        self.writer = writer
        file_rows = writer.file_rows(layout)
        self.progress = Progress(
            identity=ident, lines=first.n_lines, rows=first.n_rows, tokens=first.n_tokens, windows=self.windows
        )
        # The rows of ``vectors``: none for a layout without token rows (--pool-only), whose offsets still address
        # the rows a build with them would have (first.n_rows), as the local writer's do.
        self.stored_rows = stored_rows = first.n_rows if layout.token_rows else 0
        self.build_info: dict[str, Any] = {
            "args": options_json(options),
            "input": job.source.describe(),
            "engine": "ray",
            "started": first.info.get("started"),
        }
        writer.create(
            staging,
            layout,
            stored_rows,
            metadata(
                ident, self.progress, complete=False, n_unique=0, build_info=self.build_info, windows=self.windows
            ),
        )
        (staging / BUILD_DIR / PARTS_DIR).mkdir(parents=True, exist_ok=True)

        self.gpu = gpu = device.startswith("cuda")
        self.workers, self.cpus_per_worker = workers, cpus_per_worker = _pool(
            ray.cluster_resources(), gpu, engine.workers, engine.cpus_per_worker
        )
        n_parts = engine.parts
        if n_parts is None:
            n_parts = max(_PARTS_PER_WORKER * workers, -(-first.n_rows // (_MAX_FILES_PER_PART * file_rows)))
        self.specs = _cuts(staging, first, file_rows, n_parts)
        self.todo = [s for s in self.specs if not marker_path(staging, s.index).is_file()]

        fail = os.environ.get(FAIL_PART_ENV)
        self.part_job = PartJob(
            staging,
            plan,
            layout,
            stored_rows,
            writer,
            job.model_files,
            # An actor with one GPU sees only that one (Ray sets CUDA_VISIBLE_DEVICES): "cuda", whatever index asked.
            "cuda" if gpu else device,
            options.precision,
            options.initial_state,
            batch_tokens,
            max(1, int(cpus_per_worker)),
            int(fail) if fail else None,
            job.source.name,
            short_files(first.windows, file_rows) if layout.token_rows else {},
        )
        self.statuses: list[dict[str, Any]] = []
        self.parts_seconds = 0.0

    def run(self) -> None:
        begin = time.monotonic()
        todo, show = self.todo, self.job.options.progress
        # pq: the codebooks every worker reads from the staging, trained before any part writes a row.
        train_on_ray(self.ray, self.part_job, self.job.model.output_dim, gpu=self.gpu, cpus=self.cpus_per_worker)
        self.statuses = run_parts(
            self.ray, self.part_job, todo, len(self.specs), self.workers, self.cpus_per_worker, self.gpu, show
        )
        self.parts_seconds = time.monotonic() - begin
        errors = [s for s in self.statuses if s["error"]]
        if errors:
            named = "; ".join(f"part {s['part']} on {s['worker']}: {s['error']}" for s in errors)
            raise ElmoCacheError(
                f"{len(errors)} of {len(todo)} parts of {self.job.plan.output} failed ({named}); the finished parts "
                "are kept: fix the cause and rerun the same command to redo only the parts that did not finish"
            )
        for s in self.statuses:
            differ = model_differences(json.loads(s["model"]), self.job.identity["model"])
            if differ:
                raise ElmoCacheError(
                    f"worker {s['worker']} loaded another model than the driver ({', '.join(differ)} differ); "
                    "every node must see the same model files"
                )

    def finish(self) -> Finished:
        """Stitch the shared vectors files from their fragments, then write everything else and publish."""
        first, began = self.first, self.job.began
        tokens_run = sum(int(s["tokens"]) for s in self.statuses)
        worker_names = sorted({str(s["worker"]) for s in self.statuses})
        # Where this run's time went: the first pass (0 when reused), the actors (start-up, model load,
        # encoding, writing), and the tokens/s of that second phase alone.
        self.build_info.update(
            workers=worker_names,
            parts=len(self.specs),
            parts_run=len(self.todo),
            first_pass_seconds=round(self.first_pass_seconds, 3),
            parts_seconds=round(self.parts_seconds, 3),
            parts_tokens_per_s=round(tokens_run / self.parts_seconds, 1) if self.parts_seconds > 0 else None,
        )
        sums = stitch(self.writer, self.staging, self.layout, self.stored_rows, self.specs, self.part_job.ends)

        def meta_of(n_unique: int, corpus: dict[str, Any]) -> dict[str, Any]:
            seconds = time.monotonic() - began
            build_info = {
                **self.build_info,
                "finished": _now(),
                # this run's wall time (first pass, workers, finishing) and the tokens its parts encoded per second
                "seconds": round(seconds, 3),
                "tokens_per_s": round(tokens_run / seconds, 1) if seconds > 0 else None,
            }
            return metadata(
                self.job.identity,
                self.progress,
                complete=True,
                n_unique=n_unique,
                build_info=build_info,
                corpus=corpus,
                windows=self.windows,
            )

        # A pool-only cache holds no codebooks: it has no codes (as the local engine).
        extra = final_arrays(self.staging, self.job.plan, self.job.model.output_dim) if self.layout.token_rows else {}
        path, n_unique = publish(
            self.writer, self.staging, self.job.plan.output, first, sums, meta_of, self.layout, self.specs, extra
        )
        return Finished(
            path,
            first.n_lines,
            first.n_tokens,
            self.stored_rows,
            n_unique,
            time.monotonic() - began,
            tokens_run,
            {
                "workers": tuple(worker_names),
                "parts": len(self.specs),
                "parts_run": len(self.todo),
                "workers_asked": self.workers,
            },
        )


def _parallel_writer(format: str) -> ParallelWriter:
    writer = get_container(format).parallel_writer()
    assert writer is not None  # check() refused the containers without one
    return writer


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _device(ray: Any, options: BuildOptions) -> str:
    if options.device is not None:
        return options.device
    # Like build(): CUDA when there is one (here: in the cluster, not necessarily in the driver).
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


def _first_pass(job: BuildJob, staging: Path, plan_info: dict[str, Any], *, resumed: bool) -> FirstPass:
    """The plan of an interrupted build (checked to be this build's), else a new first pass."""
    plan_dir = staging / BUILD_DIR / PLAN_DIR
    if resumed:
        saved = load_first_pass(plan_dir)
        assert saved is not None  # interrupted() found its plan.json
        check_resumed(staging, saved.info["identity"], job.identity)
        for key in ("corpus", "window_tokens", "window_rows"):
            if saved.info.get(key) != plan_info[key]:
                raise CacheExistsError(
                    f"{staging} holds an interrupted build of another corpus or window size ({key}: "
                    f"{saved.info[key]!r} there, {plan_info[key]!r} now); pass --overwrite to start over"
                )
        return saved
    job.plan.output.parent.mkdir(parents=True, exist_ok=True)
    return first_pass(
        job.source,
        plan_dir,
        plan_info["window_tokens"],
        bool(job.options.dedupe),
        plan_info,
        plan_info["window_rows"],
    )


def _pool(
    resources: dict[str, float], gpu: bool, workers: int | None, cpus_per_worker: float | None
) -> tuple[int, float]:
    """The actors and the CPUs each reserves: as asked, else the defaults for the cluster's ``resources``."""
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
    return workers, cpus_per_worker


def _cuts(staging: Path, first: FirstPass, file_rows: int, n_parts: int) -> list[PartSpec]:
    """The parts: a resumed build keeps its first run's cuts (its markers name them), a new one cuts and saves them."""
    parts_file = staging / BUILD_DIR / "parts.json"
    if parts_file.is_file():
        return [PartSpec(*s) for s in json.loads(parts_file.read_text(encoding="utf-8"))]
    specs = cut_parts(first.windows, file_rows, n_parts)
    atomic_write_json(parts_file, [[s.index, s.first_window, s.end_window, s.first_row, s.end_row] for s in specs])
    return specs
