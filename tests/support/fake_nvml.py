"""The tests' one fake NVML: the part of the `pynvml` module (nvidia-ml-py) the exporter uses, with the
real module's error classes and codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

GIB = 1024**3


@dataclass
class FakeGpu:
    name: str
    uuid: str
    total: int
    used: int
    processes: list[tuple[int, int | None]] = field(default_factory=list)


class FakeNvml:
    """The part of pynvml the reader uses. `fail` maps a function name to the error code it raises next."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.initialized = False
        self.init_calls = 0
        self.shutdown_calls = 0
        self.fail: dict[str, int] = {}
        self.old_driver = False  # no *_v3 process API: the unversioned call raises NVMLLibraryMismatchError

    def _check(self, fn: str) -> None:
        code = self.fail.get(fn)
        if code is not None:
            raise pynvml.NVMLError(code)  # the real class picks the subclass, e.g. NVMLError_GpuIsLost
        if fn != "nvmlInit" and not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlInit(self) -> None:
        self.init_calls += 1
        self._check("nvmlInit")
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        self._check("nvmlDeviceGetName")
        return self.gpus[handle].name

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        self._check("nvmlDeviceGetUUID")
        return self.gpus[handle].uuid.encode()  # old pynvml releases return bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        self._check(f"nvmlDeviceGetMemoryInfo:{handle}")
        self._check("nvmlDeviceGetMemoryInfo")
        g = self.gpus[handle]
        return SimpleNamespace(total=g.total, used=g.used, free=g.total - g.used)

    def _procs(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.gpus[handle].processes]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        self._check("nvmlDeviceGetComputeRunningProcesses")
        if self.old_driver:
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called …")
        return self._procs(handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int) -> list[SimpleNamespace]:
        self._check("nvmlDeviceGetComputeRunningProcesses_v2")
        return self._procs(handle)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        self._check("nvmlDeviceGetGraphicsRunningProcesses")
        return []


def h200(i: int, used_gib: int, processes: list[tuple[int, int | None]] | None = None) -> FakeGpu:
    return FakeGpu(
        "NVIDIA H200", f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd", 143771 * 1024**2, used_gib * GIB, processes or []
    )
