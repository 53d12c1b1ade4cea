"""Free VRAM per GPU and llama-server's own VRAM, from NVML (`pynvml`, package nvidia-ml-py).

`NvmlReader.read()` returns an immutable `NvmlSnapshot`; `NvmlCollector` renders the last one. The
reader calls `nvmlInit` once and keeps the library initialised between reads. Every failure is a
value, never an exception: no library, no driver or no GPU give an empty snapshot with an `error`;
a GPU that is lost or a driver that is reloaded mid-run makes the reader shut NVML down and
initialise it again on the next read, so it recovers by itself once the GPU is back.

The `pynvml` module is injected (`nvml=`), so tests drive the reader with a fake module object at
exactly this boundary; by default the real module is imported on first use.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
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
            # Shutting down after a lost GPU or driver may fail; there is nothing to do about it.
            with contextlib.suppress(Exception):
                self._module().nvmlShutdown()

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
        return GpuReading(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            total_bytes=int(mem.total),
            used_bytes=int(mem.used),
            free_bytes=int(mem.free),
            processes=self._processes(nvml, handle),
        )

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
