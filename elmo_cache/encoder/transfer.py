"""Moving arrays between the host and the encoder's device without stalling the device.

On CUDA a blocking copy makes the host wait until everything queued on the device has run, so the host cannot
prepare the next batch while the device computes the current one. Copies to the device are queued without
waiting (the driver stages ordinary memory at once); copies to the host land in page-locked (pinned) buffers,
queued like kernels, and the host waits only where it reads a result. torch's caching host allocator hands
the same pinned blocks out again once nothing refers to them. On a CPU device these are plain conversions
without copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used: the build's modules import this one, and the CLI starts without torch
    import torch

__all__ = ["to_device", "HostCopy"]


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as a tensor on ``device``; on CUDA queued behind the device's work instead of waiting for it.

    From ordinary memory on purpose: an asynchronous copy from pageable memory is staged by the driver before
    it returns (the array may change right after) and waits for nothing queued on the device, whereas pinning
    each small array first cost ~3 ms apiece on an H200 (the encoder's on-device rate fell from 245k to 161k
    tokens/s at 8192-token batches; benchmarks/RESULTS.md)."""
    import torch

    tensor = torch.from_numpy(array)
    if device.type != "cuda":
        return tensor
    return tensor.to(device, non_blocking=True)


class HostCopy:
    """A device tensor on its way to host memory: queued now, read with :meth:`result`.

    On CUDA the copy lands in a pinned buffer and an event marks its end, so several batches can be in flight
    while the host prepares the next one; on a CPU device the tensor itself is the result.
    """

    def __init__(self, tensor: torch.Tensor):
        import torch

        self._event: torch.cuda.Event | None = None
        self._pinned = tensor.device.type == "cuda"
        if not self._pinned:
            self._host = tensor
            return
        self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._host.copy_(tensor, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record(torch.cuda.current_stream(tensor.device))

    def result(self, *, own: bool = False) -> np.ndarray:
        """The array on the host (waits for the copy on CUDA). By default it is the pinned buffer itself, which
        it keeps alive: for a caller that uses it and lets it go (a build). ``own=True``: an array in ordinary
        memory, for results a caller may keep: page-locked memory cannot be swapped out, and the caching
        allocator rounds its blocks up to a power of two, so it is no place for what a user holds (on CUDA that
        is one more copy on the host; on a CPU device, none)."""
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        array = self._host.numpy()
        return array.copy() if own and self._pinned else array
