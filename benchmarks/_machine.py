"""What machine a benchmark ran on, and how fast its matrix multiply is *in the same run*.

A throughput figure means little without the hardware next to it, and these machines are
shared and noisy, so the matmul peak is measured in the same process, right before or after
the figures it is compared with, rather than read from a spec sheet.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

__all__ = ["DTYPES", "MachineInfo", "MatmulPeak", "describe_machine", "measure_matmul_peak", "synchronize"]

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class MachineInfo:
    """The hardware and software a benchmark ran on."""

    # CPU model name as /proc/cpuinfo (or platform) reports it.
    cpu: str
    # Logical CPUs this process may run on (the affinity mask, not the host's total).
    cpus: int
    # Threads torch uses for intra-op parallelism.
    torch_threads: int
    # Total RAM in GiB (None where /proc/meminfo is missing).
    ram_gib: float | None
    # CUDA device name, or None without CUDA.
    gpu: str | None
    # Instruction set torch's CPU kernels were dispatched to (AVX2, AVX512, ...).
    cpu_capability: str
    # Interesting CPU flags (AMX, AVX512-BF16, ...) that decide the bf16 matmul path.
    cpu_flags: tuple[str, ...]
    python: str
    torch: str
    numpy: str
    platform: str

    def lines(self) -> list[str]:
        """Human-readable summary, a few lines."""
        ram = f"{self.ram_gib:.1f} GiB RAM" if self.ram_gib is not None else "RAM unknown"
        flags = " ".join(self.cpu_flags) or "-"
        out = [
            f"cpu      {self.cpu} ({self.cpus} cpus, torch threads {self.torch_threads}, {ram})",
            f"isa      torch dispatch {self.cpu_capability}; flags {flags}",
        ]
        if self.gpu:
            out.append(f"gpu      {self.gpu}")
        out.append(f"software python {self.python}, torch {self.torch}, numpy {self.numpy}, {self.platform}")
        return out


_FLAGS_OF_INTEREST = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile", "amx_int8")


def _cpuinfo() -> tuple[str, tuple[str, ...]]:
    path = Path("/proc/cpuinfo")
    name, flags = platform.processor() or platform.machine(), set()
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and value.strip():
                name = value.strip()
            elif key == "flags" and not flags:
                flags = set(value.split())
    return name, tuple(f for f in _FLAGS_OF_INTEREST if f in flags)


def _ram_gib() -> float | None:
    path = Path("/proc/meminfo")
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 2**20
    return None


def describe_machine(device: torch.device | str = "cpu") -> MachineInfo:
    """Describe this machine; the GPU is named only when ``device`` is a CUDA device."""
    device = torch.device(device)
    cpu, flags = _cpuinfo()
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    gpu = None
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        gpu = f"{props.name} ({props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda})"
    return MachineInfo(
        cpu=cpu,
        cpus=cpus,
        torch_threads=torch.get_num_threads(),
        ram_gib=_ram_gib(),
        gpu=gpu,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_flags=flags,
        python=platform.python_version(),
        torch=torch.__version__,
        numpy=np.__version__,
        platform=platform.platform(terse=True),
    )


def synchronize(device: torch.device) -> None:
    """Wait for queued work: CUDA launches are asynchronous, so timings must sync first."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class MatmulPeak:
    """Best measured FLOP/s of plain matmuls of one dtype on one device."""

    dtype: str
    device: str
    # "MxKxN" -> best GFLOP/s over the repeats.
    by_shape: dict[str, float] = field(default_factory=dict)

    @property
    def peak_gflops(self) -> float:
        """The best over all shapes: the ceiling utilisation is reported against."""
        return max(self.by_shape.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "peak_gflops": self.peak_gflops}


def _time_matmul(a: torch.Tensor, b: torch.Tensor, repeats: int, min_seconds: float) -> float:
    device = a.device
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=device)
    # Small shapes finish in microseconds: run several per timing so timer overhead vanishes.
    torch.matmul(a, b, out=out)
    synchronize(device)
    start = time.perf_counter()
    torch.matmul(a, b, out=out)
    synchronize(device)
    single = max(time.perf_counter() - start, 1e-7)
    inner = max(1, int(0.05 / single))
    best = float("inf")
    deadline = time.perf_counter() + min_seconds
    done = 0
    while done < repeats or time.perf_counter() < deadline:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(inner):
            torch.matmul(a, b, out=out)
        synchronize(device)
        best = min(best, (time.perf_counter() - start) / inner)
        done += 1
        if done >= 4 * repeats:
            break
    return best


def measure_matmul_peak(
    dtype: str,
    device: torch.device | str = "cpu",
    shapes: list[tuple[int, int, int]] | None = None,
    *,
    repeats: int = 3,
    min_seconds: float = 0.5,
) -> MatmulPeak:
    """Best-of-``repeats`` GFLOP/s of ``[M x K] @ [K x N]`` for each shape.

    The default shapes are a large square (4096^3) and the Original model's LSTM shapes with a
    batch of 256: ``[256 x 512] @ [512 x 16384]`` (the gate matmul) and
    ``[256 x 4096] @ [4096 x 512]`` (the cell projection).
    """
    device = torch.device(device)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {sorted(DTYPES)}")
    shapes = shapes or [(4096, 4096, 4096), (256, 512, 16384), (256, 4096, 512)]
    gen = torch.Generator().manual_seed(0)
    by_shape: dict[str, float] = {}
    for m, k, n in shapes:
        a = torch.randn(m, k, generator=gen).to(device=device, dtype=DTYPES[dtype])
        b = torch.randn(k, n, generator=gen).to(device=device, dtype=DTYPES[dtype])
        seconds = _time_matmul(a, b, repeats, min_seconds)
        by_shape[f"{m}x{k}x{n}"] = 2.0 * m * k * n / seconds / 1e9
        del a, b
    return MatmulPeak(dtype=dtype, device=str(device), by_shape=by_shape)


if __name__ == "__main__":  # quick look: python benchmarks/_machine.py
    import sys

    dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    for line in describe_machine(dev).lines():
        print(line)
    for name in ("fp32", "bf16") + (("fp16",) if dev.type == "cuda" else ()):
        peak = measure_matmul_peak(name, dev)
        shapes = ", ".join(f"{s} {g:.0f}" for s, g in peak.by_shape.items())
        print(f"matmul {name:5s} peak {peak.peak_gflops:8.1f} GFLOP/s  ({shapes})")
