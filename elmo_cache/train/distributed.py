"""Data-parallel training: this process's place in a torch.distributed group.

A run of N processes is one bilm-tf run with a global batch of ``batch_size * N`` rows.
Every rank tokenizes the whole corpus (the per-epoch shuffle and the vocabulary are
global), cuts the shuffled stream into the global rows, and reads only its own
``batch_size`` of them (rank r: rows ``r*batch_size .. (r+1)*batch_size``). The loss of a
step is the global one: each rank divides its rows' summed loss by the prediction count of
the *whole* batch (every rank can compute it: it has the stream) and DDP sums the ranks'
gradients. So a step of N processes moves the weights exactly as a single process with
``batch_size * N`` rows would (sampled softmax negatives included: every rank's sampler is
seeded alike and draws once per step), up to the order of float additions, with the same
learning rate. Dropout masks are each rank's own (seeded by seed and rank).

The group comes from the environment torchrun (or ``elmo-cache train --nproc``, which runs
torchrun's elastic launcher in process) sets: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` / ``MASTER_PORT``. NCCL on CUDA (one GPU per local
rank), gloo on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from elmo_cache.encoder.hardware import resolve_device
from elmo_cache.errors import InvalidParameterError

__all__ = ["Group", "join", "leave", "launched_by_torchrun", "rank_seed"]

# What torchrun exports to every worker; their presence means "you are one rank of a group".
_GROUP_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    """Whether this process runs under torchrun (or ``--nproc``) as a rank of a group of more than one."""
    return all(name in os.environ for name in _GROUP_ENV) and int(os.environ["WORLD_SIZE"]) > 1


def rank_seed(seed: int, rank: int) -> int:
    """A torch seed for ``rank``'s dropout masks, distinct per rank and reproducible from ``seed``."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, dtype=np.uint64)[0] >> 1)


_CPU = torch.device("cpu")


@dataclass(frozen=True)
class Group:
    """This process's rank in the training group; the default is a single process (no collectives)."""

    # Global rank (0 writes the checkpoint and the model files).
    rank: int = 0
    # Processes in the group, all nodes together.
    world_size: int = 1
    # Rank on this node: selects the GPU (cuda:LOCAL_RANK).
    local_rank: int = 0
    # Processes on this node: they share its CPU cores.
    local_world_size: int = 1
    # The device this rank computes on.
    device: torch.device = _CPU
    # Whether join() made the process group (and leave() ends it); a caller's own group is left alone.
    owned: bool = False

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def rows(self, batch_size: int) -> slice:
        """This rank's rows of a global batch of ``batch_size * world_size`` rows."""
        return slice(self.rank * batch_size, (self.rank + 1) * batch_size)

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the ranks, in place (itself when alone)."""
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (pickled; for setup, not for every step)."""
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order (pickled)."""
        if not self.distributed:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def gather_rows(self, tensor: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """The ranks' row blocks of ``tensor`` joined along ``dim`` in rank order: the global batch's."""
        if not self.distributed:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=dim)


def join(device: str | None) -> Group:
    """This process's :class:`Group`: the torchrun group it was started in (joined here, NCCL on
    CUDA, gloo on the CPU), one already initialised by the caller, or a single process."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        return Group(rank, world, local_rank, local_world, _rank_device(device, local_rank, local_world))
    if not launched_by_torchrun():
        return Group(device=resolve_device(device))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    resolved = _rank_device(device, local_rank, local_world)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    dist.init_process_group(
        "nccl" if resolved.type == "cuda" else "gloo", device_id=resolved if resolved.type == "cuda" else None
    )
    return Group(rank, world, local_rank, local_world, resolved, owned=True)


def leave(group: Group) -> None:
    """Take this process out of the group :func:`join` made (a no-op for a single process)."""
    if group.owned and dist.is_initialized():
        dist.destroy_process_group()


def check_device_count(device: str | None, local_world_size: int) -> None:
    """Refuse a CUDA run with more processes on a node than it has GPUs (each rank owns one)."""
    resolved = resolve_device(device)
    if resolved.type != "cuda":
        return
    if resolved.index is not None and local_world_size > 1:
        raise InvalidParameterError(
            f"device: {device!r} names one GPU, but each of the {local_world_size} processes takes its own "
            "(cuda:LOCAL_RANK); pass --device cuda"
        )
    if local_world_size > torch.cuda.device_count():
        raise InvalidParameterError(
            f"{local_world_size} processes on this node need as many GPUs (one each); it has "
            f"{torch.cuda.device_count()}: lower --nproc / --nproc-per-node, or train on the CPU (--device cpu)"
        )


def _rank_device(device: str | None, local_rank: int, local_world_size: int) -> torch.device:
    check_device_count(device, local_world_size)
    resolved = resolve_device(device)
    if resolved.type == "cuda":
        return torch.device("cuda", local_rank if resolved.index is None else resolved.index)
    return resolved
