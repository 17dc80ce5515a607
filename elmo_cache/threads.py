"""How many CPU threads torch gets: the cores this process may use, not the machine's count.

torch sizes its intra-op pool by the machine's cores. On a shared box (a container with a CPU
quota, a job pinned to some cores, or a scheduler slot) that is more threads than the process can
run at once, and OpenMP threads that wait for a descheduled peer burn the CPU the others need
(a build beside other jobs was measured at a tenth of its quiet speed, each token costing 2.4x
the CPU). So every command that runs the model
(``build``, ``serve``, ``train``) sizes the pool from what this process may really use: its CPU
affinity and its cgroup's CPU quota. ``--threads`` or ``ELMO_CACHE_THREADS`` override it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from elmo_cache.errors import InvalidParameterError

__all__ = ["THREADS_ENV", "usable_cpus", "choose_threads", "apply_threads"]

THREADS_ENV = "ELMO_CACHE_THREADS"
"""Environment variable overriding the default thread count (a positive integer)."""

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cgroup_quota(root: Path = _CGROUP_ROOT) -> float | None:
    """CPUs the cgroup quota allows (cgroup v2 ``cpu.max``, else v1 ``cfs_quota_us``), or None if unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max" and float(period) > 0:
            return float(quota) / float(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota_us = float((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = float((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota_us / period_us if quota_us > 0 and period_us > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(cgroup_root: Path = _CGROUP_ROOT) -> int:
    """CPUs this process may run on: its affinity mask, capped by its cgroup quota (at least 1)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call (macOS, Windows)
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup_root)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def choose_threads(requested: int | None = None) -> int:
    """``requested`` (``--threads``), else ``ELMO_CACHE_THREADS``, else :func:`usable_cpus`."""
    source = "threads"
    if requested is None:
        value = os.environ.get(THREADS_ENV, "").strip()
        if not value:
            return usable_cpus()
        source = THREADS_ENV
        try:
            requested = int(value)
        except ValueError:
            raise InvalidParameterError(f"{THREADS_ENV}: expected a positive integer, got {value!r}") from None
    if requested < 1:
        raise InvalidParameterError(f"{source}: must be at least 1, got {requested}")
    return requested


def apply_threads(requested: int | None = None) -> int:
    """Set torch's intra-op threads as :func:`choose_threads` says; returns the count."""
    import torch

    threads = choose_threads(requested)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
