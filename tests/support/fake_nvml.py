"""The tests' one fake NVML: the part of the `pynvml` module (nvidia-ml-py) the exporter uses, at the
library boundary, raising the real module's error classes with its codes. The exporter's own NVML reader
and collector run unchanged on it, so they are what the tests check.

In process, a test hands a ``FakeNvml`` to ``NvmlReader``. An exporter *process* imports it as
``pynvml`` from ``fake_pynvml/`` (``pynvml_env`` gives the environment), with the GPUs the test
describes.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml

GIB = 1024**3
MIB = 1024**2

#: The folder whose ``pynvml`` module is this fake, for an exporter process (see ``pynvml_env``).
PROCESS_MODULE_DIR = Path(__file__).resolve().parent / "fake_pynvml"
#: The environment variable that carries the process's GPUs (JSON, a list of ``FakeGpu`` fields).
GPUS_ENV = "FAKE_PYNVML_GPUS"


@dataclass
class FakeGpu:
    """One GPU: memory in bytes, and (pid, bytes or None when NVML cannot tell) for each process on it."""

    name: str
    uuid: str
    total: int
    used: int
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    utilization: tuple[int, int] = (97, 64)  # percent: kernels, memory
    temperature: int = 61  # °C
    power_mw: int = 452_000
    power_limit_mw: int = 700_000
    sm_clock_mhz: int = 1980
    clock_reasons: int = 0x4  # software power cap
    xids: list[int] = field(default_factory=list)  # Xid events waiting, oldest first
    #: function name → the NVML error code this GPU answers it with, always (not supported, no permission …)
    refuses: dict[str, int] = field(default_factory=dict)


class FakeNvml:
    """The part of pynvml the reader uses. `fail` maps a function name to the error code it raises next."""

    NVMLError = pynvml.NVMLError

    @classmethod
    def from_json(cls, text: str) -> FakeNvml:
        """The GPUs ``pynvml_env`` wrote, initialised as a fresh library is."""
        return cls(
            [
                FakeGpu(
                    **{**g, "processes": [tuple(p) for p in g["processes"]], "utilization": tuple(g["utilization"])}
                )
                for g in json.loads(text)
            ]
        )

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.initialized = False
        self.init_calls = 0
        self.shutdown_calls = 0
        self.fail: dict[str, int] = {}
        self.old_driver = False  # no *_v3 process API: the unversioned call raises NVMLLibraryMismatchError
        self.calls: dict[str, int] = {}  # how often each optional function was called
        self.event_sets: dict[int, int | None] = {}  # set id → the GPU registered in it
        self.freed_sets = 0

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

    def _gpu(self, fn: str, handle: int) -> FakeGpu:
        """GPU ``handle``, after the checks every call makes and the GPU's own refusal of ``fn``."""
        self.calls[fn] = self.calls.get(fn, 0) + 1
        self._check(fn)
        g = self.gpus[handle]
        if fn in g.refuses:
            raise pynvml.NVMLError(g.refuses[fn])
        return g

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        g = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=g.utilization[0], memory=g.utilization[1])

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu("nvmlDeviceGetTemperature", handle).temperature

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._gpu("nvmlDeviceGetClockInfo", handle).sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        g = self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if self.old_driver:  # a driver before the rename has only the throttle-reasons name
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return g.clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_reasons

    def nvmlEventSetCreate(self) -> int:
        self.calls["nvmlEventSetCreate"] = self.calls.get("nvmlEventSetCreate", 0) + 1
        self._check("nvmlEventSetCreate")
        set_id = len(self.event_sets) + 1
        self.event_sets[set_id] = None
        return set_id

    def nvmlDeviceRegisterEvents(self, handle: int, types: int, event_set: int) -> None:
        self._gpu("nvmlDeviceRegisterEvents", handle)
        assert types == pynvml.nvmlEventTypeXidCriticalError
        self.event_sets[event_set] = handle

    def nvmlEventSetWait_v2(self, event_set: int, timeout_ms: int) -> SimpleNamespace:
        self._check("nvmlEventSetWait_v2")
        handle = self.event_sets[event_set]
        if handle is None or not self.gpus[handle].xids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        xid = self.gpus[handle].xids.pop(0)
        return SimpleNamespace(
            device=handle, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid, gpuInstanceId=0
        )

    def nvmlEventSetFree(self, event_set: int) -> None:
        self.freed_sets += 1
        del self.event_sets[event_set]


def h200(i: int, used_gib: int, processes: list[tuple[int, int | None]] | None = None) -> FakeGpu:
    """GPU ``i``: an H200 (143,771 MiB) with ``used_gib`` GiB used."""
    return FakeGpu(
        "NVIDIA H200", f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd", 143771 * 1024**2, used_gib * GIB, processes or []
    )


def seed_incident_gpu(pids: list[int]) -> FakeGpu:
    """A 22 GiB card with 170 MiB free, as in the seed incident; each of ``pids`` uses 20 GiB of it."""
    total = 22 * GIB
    return FakeGpu(
        "NVIDIA GeForce RTX 2080 Ti (fake)",
        "GPU-00000000-fake-0000-0000-000000000000",
        total,
        total - 170 * MIB,
        [(pid, 20 * GIB) for pid in pids],
    )


def pynvml_env(gpus: list[FakeGpu]) -> dict[str, str]:
    """The environment under which an exporter process imports this fake as ``pynvml``, with ``gpus``."""
    return {
        "PYTHONPATH": os.pathsep.join([str(PROCESS_MODULE_DIR), os.environ.get("PYTHONPATH", "")]),
        GPUS_ENV: json.dumps([asdict(g) for g in gpus]),
    }
