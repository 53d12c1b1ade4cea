"""Each GPU's memory, load, heat, power, clocks and Xid errors, and llama-server's own VRAM, from NVML
(`pynvml`, package nvidia-ml-py).

`NvmlReader.read()` returns an immutable `NvmlSnapshot`; `NvmlCollector` renders the last one. The
reader calls `nvmlInit` once and keeps the library initialised between reads. Every failure is a
value, never an exception: no library, no driver or no GPU give an empty snapshot with an `error`;
a GPU that is lost or a driver that is reloaded mid-run makes the reader shut NVML down and
initialise it again on the next read, so it recovers by itself once the GPU is back.

Memory is what every NVML gives. The other figures are optional: a GPU whose NVML refuses one (a
GeForce card under Windows' WDDM driver, a MIG instance, an old driver, no permission) gets None for it,
said once in the log, and the call is not tried again until NVML is initialised anew. Xid errors come from
NVML's event API: one event set per GPU, drained without waiting at each read.

The `pynvml` module is injected (`nvml=`), so tests drive the reader with a fake module object at
exactly this boundary; by default the real module is imported on first use.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.model.live import GpuReading, NvmlSnapshot

# NVML return codes after which handles are stale: shut NVML down and initialise it again next read.
_REINIT_CODES = frozenset(
    {
        1,  # NVML_ERROR_UNINITIALIZED
        9,  # NVML_ERROR_DRIVER_NOT_LOADED
        15,  # NVML_ERROR_GPU_IS_LOST
        16,  # NVML_ERROR_RESET_REQUIRED
        18,  # NVML_ERROR_LIB_RM_VERSION_MISMATCH (driver upgraded under us)
        28,  # NVML_ERROR_GPU_NOT_FOUND
        999,  # NVML_ERROR_UNKNOWN
    }
)
_FUNCTION_NOT_FOUND = 13
_TIMEOUT = 10  # NVML_ERROR_TIMEOUT: no event waiting
_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
#: Events taken from one GPU's set per read: a storm of Xids cannot hold a scrape.
MAX_EVENTS_PER_READ = 256

log = logging.getLogger(__name__)


class _NotGiven(Exception):
    """This GPU's NVML does not give the figure (not supported, no permission, not in this library)."""


@dataclass
class _XidWatch:
    """One GPU's Xid events: its event set while NVML is initialised, the count since the exporter started."""

    events: Any = None
    count: int = 0
    last: int | None = None


def _text(value: object) -> str:
    """NVML strings are `bytes` in old pynvml releases and `str` in new ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _code(exc: BaseException) -> int | None:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class NvmlReader:
    """Reads every GPU through NVML. Not thread-safe: one read at a time (the caller coalesces)."""

    def __init__(self, nvml: Any | None = None, *, loader: Callable[[], Any] | None = None) -> None:
        self._nvml = nvml
        self._loader = loader or (lambda: importlib.import_module("pynvml"))
        self._initialized = False
        self._not_given: set[tuple[str, str]] = set()  # (GPU uuid, figure): not tried again until a new init
        self._said: set[tuple[str, str]] = set()  # the same, said in the log (once for the exporter's life)
        self._xids: dict[str, _XidWatch] = {}  # by GPU uuid: counts survive a re-initialisation

    @property
    def initialized(self) -> bool:
        """True while NVML is initialised (between a successful nvmlInit and a shutdown)."""
        return self._initialized

    def _module(self) -> Any:
        if self._nvml is None:
            self._nvml = self._loader()  # ImportError when nvidia-ml-py is not installed
        return self._nvml

    def _init(self) -> None:
        nvml = self._module()
        nvml.nvmlInit()
        self._initialized = True

    def close(self) -> None:
        """nvmlShutdown, if initialised (errors ignored: the driver may already be gone)."""
        if self._initialized:
            self._initialized = False
            self._not_given.clear()  # a reloaded driver may give what the old one did not
            # Shutting down after a lost GPU or driver may fail; there is nothing to do about it.
            with contextlib.suppress(Exception):
                nvml = self._module()
                for watch in self._xids.values():
                    if watch.events is not None:
                        events, watch.events = watch.events, None
                        with contextlib.suppress(Exception):
                            nvml.nvmlEventSetFree(events)
                nvml.nvmlShutdown()

    def read(self) -> NvmlSnapshot:
        """Read all GPUs. Never raises."""
        try:
            if not self._initialized:
                self._init()
            nvml = self._module()
            count = int(nvml.nvmlDeviceGetCount())
        except ImportError as exc:
            return NvmlSnapshot(error=f"pynvml (nvidia-ml-py) is not installed: {exc}")
        except Exception as exc:
            self._after_error(exc)
            return NvmlSnapshot(error=f"NVML unavailable: {_describe(exc)}")
        if count == 0:
            return NvmlSnapshot(error="NVML reports no GPU")
        gpus: list[GpuReading] = []
        errors: list[str] = []
        for index in range(count):
            try:
                gpus.append(self._read_gpu(nvml, index))
            except Exception as exc:
                errors.append(f"GPU {index}: {_describe(exc)}")
                if self._after_error(exc):
                    break  # NVML is being re-initialised; the other handles are stale too
        return NvmlSnapshot(tuple(gpus), "; ".join(errors) or None)

    def _after_error(self, exc: BaseException) -> bool:
        """Shut NVML down after an error that makes its handles stale; True if it did."""
        if _code(exc) in _REINIT_CODES or not self._initialized:
            self.close()
            return True
        return False

    def _read_gpu(self, nvml: Any, index: int) -> GpuReading:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))

        def get(what: str, names: tuple[str, ...], *args: Any) -> Any:
            return self._optional(nvml, index, uuid, what, names, handle, *args)

        rates = get("utilization", ("nvmlDeviceGetUtilizationRates",))
        temperature = get("temperature", ("nvmlDeviceGetTemperature",), 0)  # NVML_TEMPERATURE_GPU
        power = get("power draw", ("nvmlDeviceGetPowerUsage",))  # mW
        limit = get("power limit", ("nvmlDeviceGetEnforcedPowerLimit",))  # mW
        clock = get("SM clock", ("nvmlDeviceGetClockInfo",), 1)  # NVML_CLOCK_SM, MHz
        reasons = get(
            "clock event reasons",
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        )
        xid = self._read_xids(nvml, index, uuid, handle)
        return GpuReading(
            index=index,
            uuid=uuid,
            name=_text(nvml.nvmlDeviceGetName(handle)),
            total_bytes=int(mem.total),
            used_bytes=int(mem.used),
            free_bytes=int(mem.free),
            processes=self._processes(nvml, handle),
            utilization_ratio=None if rates is None else int(rates.gpu) / 100,
            memory_utilization_ratio=None if rates is None else int(rates.memory) / 100,
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if power is None else int(power) / 1000,
            power_limit_watts=None if limit is None else int(limit) / 1000,
            sm_clock_hertz=None if clock is None else int(clock) * 1e6,
            clock_event_reasons=None if reasons is None else int(reasons),
            xid_errors=None if xid is None else xid.count,
            last_xid=None if xid is None else xid.last,
        )

    def _optional(self, nvml: Any, index: int, uuid: str, what: str, names: tuple[str, ...], *args: Any) -> Any:
        """The first of ``names`` that answers, or None where this GPU's NVML does not give ``what``.

        Errors that make handles stale propagate (the whole read starts again); any other refusal leaves the
        figure out, is said once, and the call is not made again until NVML is initialised anew."""
        if (uuid, what) in self._not_given:
            return None
        try:
            return _first_answer(nvml, names, *args)
        except _NotGiven as exc:
            self._not_given.add((uuid, what))
            if (uuid, what) not in self._said:
                self._said.add((uuid, what))
                log.info("NVML gives no %s for GPU %d (%s): its series is left out", what, index, exc)
            return None

    def _read_xids(self, nvml: Any, index: int, uuid: str, handle: Any) -> _XidWatch | None:
        """This GPU's Xid count, after taking the events waiting in its set; None where NVML gives no events."""
        watch = self._xids.get(uuid)
        if watch is None or watch.events is None:
            if (uuid, "Xid events") in self._not_given:
                return None
            events = self._optional(nvml, index, uuid, "Xid events", ("nvmlEventSetCreate",))
            if events is None:
                return None
            try:
                _first_answer(nvml, ("nvmlDeviceRegisterEvents",), handle, _XID_CRITICAL, events)
            except _NotGiven as exc:
                with contextlib.suppress(Exception):
                    nvml.nvmlEventSetFree(events)
                self._not_given.add((uuid, "Xid events"))
                if (uuid, "Xid events") not in self._said:
                    self._said.add((uuid, "Xid events"))
                    log.info("NVML gives no Xid events for GPU %d (%s): its series is left out", index, exc)
                return None
            watch = self._xids.setdefault(uuid, _XidWatch())
            watch.events = events
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                data = wait(watch.events, 0)
            except Exception as exc:
                if _code(exc) in _REINIT_CODES:
                    raise
                break  # NVML_ERROR_TIMEOUT: nothing (more) waiting
            if int(data.eventType) & _XID_CRITICAL:
                watch.count += 1
                watch.last = int(data.eventData)
        return watch

    def _processes(self, nvml: Any, handle: Any) -> dict[int, int | None] | None:
        """pid → used VRAM, from the compute list (CUDA) and the graphics list (e.g. Vulkan).

        The current API (`…_v3` behind the unversioned name) falls back to `…_v2` on drivers that
        lack it. A process in both lists ("C+G") is reported once. Errors that make handles stale
        propagate; "not supported" and the like just mean no process figures for this GPU.
        """
        result: dict[int, int | None] = {}
        readable = False
        for names in (
            ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses_v2"),
            ("nvmlDeviceGetGraphicsRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
        ):
            procs = self._call_with_fallback(nvml, handle, names)
            if procs is None:
                continue
            readable = True
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                pid = int(p.pid)
                value = int(used) if isinstance(used, int) else None
                previous = result.get(pid)
                result[pid] = value if previous is None else max(previous, value or 0)
        return result if readable else None

    @staticmethod
    def _call_with_fallback(nvml: Any, handle: Any, names: tuple[str, ...]) -> list[Any] | None:
        for name in names:
            fn = getattr(nvml, name, None)
            if fn is None:
                continue
            try:
                return list(fn(handle))
            except Exception as exc:
                if _code(exc) in _REINIT_CODES:
                    raise
                # FunctionNotFound / NVMLLibraryMismatchError: an older driver; try the older API.
                if _code(exc) == _FUNCTION_NOT_FOUND or type(exc).__name__ == "NVMLLibraryMismatchError":
                    continue
                return None
        return None


def _first_answer(nvml: Any, names: tuple[str, ...], *args: Any) -> Any:
    """Call the first of ``names`` this library has and the driver answers; _NotGiven when none does."""
    why = "not in this nvidia-ml-py"
    for name in names:
        fn = getattr(nvml, name, None)
        if fn is None:
            continue
        try:
            return fn(*args)
        except Exception as exc:
            if _code(exc) in _REINIT_CODES:
                raise
            why = _describe(exc)
            if _code(exc) == _FUNCTION_NOT_FOUND or type(exc).__name__ == "NVMLLibraryMismatchError":
                continue  # an older driver: the older name may answer
            break
    raise _NotGiven(why)
