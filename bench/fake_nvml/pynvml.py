"""A stand-in for `pynvml` with 8 GPUs, for bench/run.py's scrape benchmark on machines without them.

Put this directory first on PYTHONPATH and start the exporter with `--nvml on`: the exporter's real
NVML reader and collector then export 8 GPUs' worth of series (memory total/used/free per GPU and
llama-server's VRAM on each), which is what a scrape of a big inference box costs. Nothing else
about the exporter changes.
"""

from __future__ import annotations

from dataclasses import dataclass

GPUS = 8
GIB = 1 << 30


@dataclass(frozen=True)
class _Memory:
    total: int
    used: int
    free: int


@dataclass(frozen=True)
class _Process:
    pid: int
    usedGpuMemory: int


def nvmlInit() -> None:
    pass


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return GPUS


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    return index


def nvmlDeviceGetMemoryInfo(handle: int) -> _Memory:
    used = (100 + 3 * handle) * GIB
    return _Memory(total=141 * GIB, used=used, free=141 * GIB - used)


def nvmlDeviceGetUUID(handle: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{handle:012d}"


def nvmlDeviceGetName(handle: int) -> str:
    return "NVIDIA H200 (bench stand-in)"


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list[_Process]:
    return [_Process(pid=1000 + handle, usedGpuMemory=90 * GIB), _Process(pid=4242, usedGpuMemory=2 * GIB)]


def nvmlDeviceGetGraphicsRunningProcesses(handle: int) -> list[_Process]:
    return []
