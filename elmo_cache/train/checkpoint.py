"""The training checkpoint: read with its settings checked, written whole (by rename).

A checkpoint holds everything a run needs to take the very steps it would have taken
uninterrupted: model, optimizer, LSTM state, data position and every random generator.
Its ``fingerprint`` (the fixed settings, the model, the corpus's sha256, the start model,
the number of processes) must match the resuming run's. In a data-parallel run rank 0
writes it; it holds the global batch's LSTM state (every rank's rows, in rank order) and
every rank's dropout generator.
"""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path
from typing import Any

import torch

from elmo_cache.errors import CacheExistsError

__all__ = ["CHECKPOINT_FILE", "load_checkpoint", "write_checkpoint", "cpu_name"]

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"


def load_checkpoint(
    path: Path, fingerprint: dict[str, Any], overwrite: bool, *, mmap: bool = False
) -> dict[str, Any] | None:
    """The checkpoint at ``path`` if it was made with ``fingerprint``; None if there is none (or
    ``overwrite`` discards it); :class:`CacheExistsError` naming what differs otherwise.
    ``mmap``: map the tensors instead of reading them (enough to check the fingerprint)."""
    if not path.is_file():
        return None
    # weights_only: unpickling may run code, and a checkpoint can come from anyone; it holds only
    # tensors, numbers, strings, lists and dicts, which the restricted loader reads.
    checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    if checkpoint.get("fingerprint") == fingerprint:
        return checkpoint
    if overwrite:
        log.warning("%s: made with other settings; starting over (--overwrite)", path)
        return None
    old = checkpoint.get("fingerprint", {})
    changed = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
    hint = ""
    if "world_size" in changed:
        # The global batch (batch_size x processes) and every rank's position are part of the run.
        hint = f" (it was trained by {old.get('world_size', 1)} process(es): run it with that many, --nproc)"
    raise CacheExistsError(
        f"{path.parent} holds a training run with other settings ({', '.join(changed)} differ){hint}; "
        "run with the same corpus and settings to resume, or pass --overwrite to start over"
    )


def write_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` by rename: a kill at any moment leaves the old one or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def cpu_name() -> str:
    """The CPU's model name (recorded in the checkpoint beside the rate it trained at)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
