"""Ray itself, for the ray engine (:mod:`elmo_cache.builder.ray.engine`): importing it (only when a build
asks for it), connecting to a cluster, and running the parts through Ray Data on a pool of actors."""

from __future__ import annotations

import logging
import time
import traceback
from typing import Any

from elmo_cache.builder.ray.parts import PartJob, PartSpec, PartWriter
from elmo_cache.errors import ElmoCacheError, InvalidParameterError

__all__ = ["connect", "import_ray", "run_parts"]


def import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError:
        raise InvalidParameterError(
            'engine: "ray" needs Ray Data, which is not installed; install it with: pip install "elmo-cache[ray]"'
        ) from None
    return ray


def connect(ray: Any, address: str | None) -> None:
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


def run_parts(
    ray: Any,
    job: PartJob,
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
        from elmo_cache.progress import progress_bar

        bar = progress_bar(total=total, initial=total - len(todo), unit=" part", desc="encoding")
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
