"""elmo_cache.encoder.transfer: host-device copies that do not stall the device (CUDA half: where one is lent)."""

from __future__ import annotations

import numpy as np
import torch
from conftest import requires_cuda

from elmo_cache.encoder.transfer import HostCopy, to_device


def test_on_the_cpu_nothing_is_copied():
    array = np.arange(12, dtype=np.int64).reshape(3, 4)
    tensor = to_device(array, torch.device("cpu"))
    array[0, 0] = 99  # the tensor is the array's memory
    assert tensor[0, 0] == 99
    copy = HostCopy(tensor)
    result = copy.result()
    assert np.shares_memory(result, array)
    assert np.shares_memory(copy.result(own=True), array)  # nothing pinned, nothing to copy out of


@requires_cuda
def test_cuda_copies_arrive_whole_in_order_and_pinned():
    device = torch.device("cuda")
    arrays = [np.random.default_rng(seed).standard_normal((1000, 257)).astype(np.float32) for seed in range(4)]
    on_device = [to_device(a, device) for a in arrays]
    assert all(t.device.type == "cuda" for t in on_device)
    # Several copies in flight behind device work, read back in any order.
    copies = [HostCopy(t * 2) for t in on_device]
    for k in (3, 0, 2, 1):
        np.testing.assert_array_equal(copies[k].result(), arrays[k] * 2)
    assert HostCopy(on_device[0])._host.is_pinned()
    # A result a caller keeps lives in ordinary memory, apart from the pinned buffer the allocator reuses.
    last = HostCopy(on_device[1])
    owned = last.result(own=True)
    np.testing.assert_array_equal(owned, arrays[1])
    assert not np.shares_memory(owned, last._host.numpy())
