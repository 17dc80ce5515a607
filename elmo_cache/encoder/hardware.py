"""Which device and precision an encoder runs in, and whether this CPU runs them fast.

Reduced precision is refused where it would be emulated (bf16 on a CPU without AVX512-BF16 or
AMX, fp16 on any CPU): slower than fp32 and less exact, a trap for whoever copies a command
from a faster machine. Environment variables let a user who knows this run it anyway.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

from elmo_cache.encoder.names import PRECISION_NAMES, check_device_name
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.options import ModelOptions

__all__ = [
    "PRECISIONS",
    "ALLOW_SLOW_BF16_ENV",
    "ALLOW_SLOW_FP16_ENV",
    "FUSE_MIN_LSTM_DIM",
    "cpu_bf16_problem",
    "resolve_device",
    "check_precision",
    "default_fuse_cell",
]

PRECISIONS = dict(zip(PRECISION_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))
# Models with at least this many LSTM cells get the compiled (fused) cell by default: the
# one-off compile (seconds) pays back within the first batches; tiny models never recoup it.
FUSE_MIN_LSTM_DIM = 1024


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` (None: CUDA when available, else the CPU) as a torch device that exists here."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, str):
        check_device_name(device)
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidParameterError(f"device: {device!r} is not a device; choose 'cpu', 'cuda' or 'cuda:N'") from None
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise InvalidParameterError(f"device: {device!r} requested but CUDA is not available here; use 'cpu'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise InvalidParameterError(f"device: {device!r} does not exist ({torch.cuda.device_count()} CUDA devices)")
    elif resolved.type != "cpu":
        raise InvalidParameterError(f"device: {device!r} is not supported; choose 'cpu', 'cuda' or 'cuda:N'")
    return resolved


# Set to 1 to run bf16 on a CPU without native bf16 anyway (emulated: far slower than fp32).
ALLOW_SLOW_BF16_ENV = "ELMO_CACHE_ALLOW_SLOW_BF16"
# Set to "1" to run fp16 on a CPU anyway (torch has no fast CPU fp16 matmul: see check_precision).
ALLOW_SLOW_FP16_ENV = "ELMO_CACHE_ALLOW_SLOW_FP16"
# CPU flags (Linux /proc/cpuinfo) of native bf16 matmuls: x86 AVX512-BF16 or AMX, Arm BF16.
_BF16_FLAGS = {"x86": ("avx512_bf16", "amx_bf16"), "arm": ("bf16",)}
# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) that still include native bf16.
_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10", "ALL", "DEFAULT")


def _cpu_flags(path: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str]] | None:
    """``("x86" or "arm", feature flags)`` of the first processor in ``path`` (None where unreadable)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86 / Arm spelling
            return ("x86" if key.strip() == "flags" else "arm"), set(value.split())
    return None


def cpu_bf16_problem(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """None when bf16 matmuls run natively on this CPU, else why they would be emulated.

    Native means the hardware has AVX512-BF16 or AMX (Arm: BF16), *and* neither oneDNN nor
    torch's kernels are capped below it (``ONEDNN_MAX_CPU_ISA``, ``ATEN_CPU_CAPABILITY``).
    Hardware is read from ``/proc/cpuinfo``, else from torch's own cpuinfo queries; a CPU
    that neither can describe counts as not native (refused rather than silently slow).
    """
    found = _cpu_flags(cpuinfo)
    arch = found[0] if found is not None else "x86"
    if found is not None:
        wanted = _BF16_FLAGS[arch]
        if not found[1] & set(wanted):
            return f"this CPU has no native bf16 (no {' or '.join(wanted)} flag in {cpuinfo})"
    else:
        queries = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
        known = [query() for query in queries if query is not None]
        if not known:
            return f"cannot tell whether this CPU ({platform.machine() or 'unknown'}) has native bf16"
        if not any(known):
            return "this CPU has no native bf16 (torch reports neither AVX512-BF16 nor AMX)"
    return _torch_bf16_problem(arch)


def _onednn_bf16() -> bool:
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def _torch_bf16_problem(arch: str) -> str | None:
    """Why torch would not use the CPU's native bf16 (a capped oneDNN or kernel dispatch), or None."""
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        isa = os.environ.get(name, "").strip().upper()
        if isa and not isa.startswith(_BF16_ISAS):
            return f"{name}={isa} caps oneDNN below native bf16 (AVX512_CORE_BF16)"
    if not _onednn_bf16():
        return "torch's oneDNN cannot run bf16 matmuls here"
    capability = torch.backends.cpu.get_cpu_capability()
    if arch == "x86" and not capability.startswith("AVX512"):
        return f"torch's CPU kernels are dispatched to {capability} (ATEN_CPU_CAPABILITY), not AVX512"
    return None


def check_precision(precision: str, device: torch.device) -> torch.dtype:
    """The dtype of ``precision`` on ``device``; refuses a precision this device would only emulate."""
    if precision not in PRECISIONS:
        raise InvalidParameterError(f"precision: {precision!r} is not one of {list(PRECISIONS)}")
    if device.type == "cuda" and precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise InvalidParameterError("precision: this GPU has no bf16 support; use 'fp16' or 'fp32'")
    if device.type == "cpu" and precision == "bf16" and os.environ.get(ALLOW_SLOW_BF16_ENV) != "1":
        problem = cpu_bf16_problem()
        if problem is not None:
            raise InvalidParameterError(
                f"precision: 'bf16' on this CPU would be emulated, slower than fp32 (about 60x on the Original model "
                f"on an AVX2-only CPU) and without any gain: {problem}. "
                "Use 'fp32' (exact, and the fastest here); bf16 needs a CPU with AVX512-BF16 or AMX, or a "
                f"CUDA GPU with bf16. To run it anyway (e.g. to match a cache built in bf16 elsewhere), set "
                f"{ALLOW_SLOW_BF16_ENV}=1"
            )
    if device.type == "cpu" and precision == "fp16" and os.environ.get(ALLOW_SLOW_FP16_ENV) != "1":
        raise InvalidParameterError(
            "precision: 'fp16' on a CPU is emulated by torch, far slower than fp32 (66x on the small model on an "
            "AVX2-only CPU, 2.5x on an AVX-512 one; benchmarks/RESULTS.md) and less exact: it is meant for CUDA "
            "GPUs. Use 'fp32' on CPUs ('bf16' where the CPU has native bf16). To run it anyway (e.g. to match a "
            f"cache built in fp16 on a GPU), set {ALLOW_SLOW_FP16_ENV}=1"
        )
    return PRECISIONS[precision]


def default_fuse_cell(options: ModelOptions, device: torch.device) -> bool:
    """Whether the LSTM cell is compiled by default: for models with at least 1024 cells, except on a
    CPU whose torch kernels are capped by ``ATEN_CPU_CAPABILITY``, where the compiled cell was
    measured to return NaN (torch 2.13, AVX512 CPU capped to AVX2); the eager cell is exact there."""
    if device.type == "cpu" and os.environ.get("ATEN_CPU_CAPABILITY"):
        return False
    return options.lstm_dim >= FUSE_MIN_LSTM_DIM
