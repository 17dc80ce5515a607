"""``--nproc N``: start N local training processes with torchrun's elastic launcher.

This is ``torchrun --standalone --nproc-per-node N`` run in process: the launcher's agent
holds a c10d rendezvous on a free localhost port, starts the workers, watches them, and
when one dies (an exception, kill -9, out of memory) stops the rest and reports it; with
``max_restarts`` it starts the whole group again instead, and the workers resume from the
last checkpoint. Many nodes: run ``torchrun`` itself on every node (docs/TRAINING.md);
each worker is then an ``elmo-cache train`` that finds its group in the environment.
"""

from __future__ import annotations

import os
import signal
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from elmo_cache.errors import ElmoCacheError, InvalidParameterError, TrainingFailedError
from elmo_cache.train.checkpoint import CHECKPOINT_FILE, load_checkpoint
from elmo_cache.train.config import TrainOptions, TrainResult
from elmo_cache.train.distributed import check_device_count, launched_by_torchrun

__all__ = ["launch"]

# How often the agent looks at its workers (seconds): a dead rank stops the others this soon.
_MONITOR_SECONDS = 0.1


def launch(corpus: str | os.PathLike[str], output: str | os.PathLike[str], options: TrainOptions) -> TrainResult:
    """Train with ``options.nproc`` local processes; rank 0's :class:`TrainResult`.

    The cheap checks (options, corpus, start model, a checkpoint of other settings or another
    number of processes) run here first, so that a mistake is reported once, before any process starts.
    """
    options.validate()
    if launched_by_torchrun():
        raise InvalidParameterError(
            f"nproc: this process is already rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')} "
            "started by torchrun; leave --nproc out (torchrun's --nproc-per-node sets the processes)"
        )
    check_device_count(options.device, options.nproc)
    from elmo_cache.train.prepare import plan

    _, fingerprint, _ = plan(corpus, options, options.nproc)
    load_checkpoint(Path(output) / CHECKPOINT_FILE, fingerprint, options.overwrite, mmap=True)

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=options.nproc,
        run_id=f"elmo-cache-train-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # port 0: a free one, so that runs side by side never collide
        max_restarts=options.max_restarts,
        monitor_interval=_MONITOR_SECONDS,
        start_method="spawn",
    )
    try:
        outcomes = elastic_launch(config, _worker)(str(corpus), str(output), replace(options, nproc=1))
    except ChildFailedError as exc:
        raise TrainingFailedError(_describe_failure(exc, Path(output))) from None
    for rank in sorted(outcomes):
        if isinstance(outcomes[rank], ElmoCacheError):
            raise outcomes[rank]
    result = outcomes[0]
    assert isinstance(result, TrainResult)
    return result


def _worker(corpus: str, output: str, options: TrainOptions) -> TrainResult | ElmoCacheError:
    """One rank (run by the launcher in a fresh interpreter): train as the rank the environment names.

    A library error (bad input, a checkpoint of other settings) is raised on every rank alike, so
    it is handed back to the launcher as a value, to be raised there as it is: no traceback.
    """
    from elmo_cache.train.trainer import train_rank

    try:
        return train_rank(corpus, output, options)
    except ElmoCacheError as exc:
        return exc


def _describe_failure(exc: Any, output: Path) -> str:
    """Which rank ended how, and where the run stands."""
    rank, failure = exc.get_first_failure()
    if failure.exitcode < 0:
        try:
            how = f"was killed by {signal.Signals(-failure.exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-failure.exitcode}"
    else:
        # The worker's exception, where it got as far as recording one (else the message is a generic hint).
        recorded = failure.error_file_data.get("message") if failure.error_file_data else None
        message = recorded.get("message") if isinstance(recorded, dict) else recorded
        how = f"exited with code {failure.exitcode}" + (f" ({message})" if message else "")
    checkpoint = output / CHECKPOINT_FILE
    where = (
        f"run the same command to resume from the last checkpoint ({checkpoint})"
        if checkpoint.is_file()
        else "no checkpoint was written yet: the same command starts over"
    )
    return f"training process of rank {rank} (pid {failure.pid}) {how}; the others were stopped; {where}"
