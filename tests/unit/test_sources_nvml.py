"""NVML source, tested at the `pynvml` boundary: a fake module object with the real pynvml error classes.

There is no GPU here. The fake behaves like nvidia-ml-py 13 (same function names, same exception
types and codes); the last test runs the REAL pynvml, whose nvmlInit fails without a driver.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pynvml
import pytest
from expositions import SERVER_PID, nvml_live
from fake_nvml import GIB, FakeNvml, h200
from prometheus_client import CollectorRegistry

from exporter.metrics.gpu import NvmlCollector
from exporter.model.live import NvmlSnapshot
from exporter.sources.nvml import NvmlReader


def _registry(reader: NvmlReader, pid: int | None = SERVER_PID) -> tuple[CollectorRegistry, list[NvmlSnapshot]]:
    snaps: list[NvmlSnapshot] = []
    reg = CollectorRegistry()
    reg.register(NvmlCollector(lambda: snaps[-1] if snaps else None, lambda: pid))
    return reg, snaps


def _gpu_labels(i: int, fake: FakeNvml) -> dict[str, str]:
    g = fake.gpus[i]
    return {"gpu": str(i), "uuid": g.uuid, "name": g.name}


def test_one_gpu_values_in_bytes_and_the_server_matched_by_pid() -> None:
    fake = FakeNvml([h200(0, 140, [(999, 2 * GIB), (SERVER_PID, 135 * GIB)])])
    reader = NvmlReader(fake)
    reg, snaps = _registry(reader)
    snaps.append(reader.read())
    assert snaps[-1].ok
    labels = _gpu_labels(0, fake)
    assert reg.get_sample_value("llamacpp_gpu_memory_total_bytes", labels) == 143771 * 1024**2
    assert reg.get_sample_value("llamacpp_gpu_memory_used_bytes", labels) == 140 * GIB
    assert reg.get_sample_value("llamacpp_gpu_memory_free_bytes", labels) == 143771 * 1024**2 - 140 * GIB
    proc_labels = {"gpu": "0", "uuid": fake.gpus[0].uuid}
    assert reg.get_sample_value("llamacpp_process_gpu_memory_bytes", proc_labels) == 135 * GIB
    assert fake.init_calls == 1
    reader.read()
    assert fake.init_calls == 1  # nvmlInit once, not per read


def test_several_gpus_and_a_server_that_uses_only_some() -> None:
    fake = FakeNvml([h200(0, 70, [(SERVER_PID, 60 * GIB)]), h200(1, 1), h200(2, 80, [(SERVER_PID, 70 * GIB)])])
    reader = NvmlReader(fake)
    reg, snaps = _registry(reader)
    snaps.append(reader.read())
    for i in range(3):
        assert reg.get_sample_value("llamacpp_gpu_memory_used_bytes", _gpu_labels(i, fake)) == fake.gpus[i].used
    by_gpu = [
        reg.get_sample_value("llamacpp_process_gpu_memory_bytes", {"gpu": str(i), "uuid": fake.gpus[i].uuid})
        for i in range(3)
    ]
    assert by_gpu == [60 * GIB, 0, 70 * GIB]  # not in GPU 1's list: it holds nothing there
    # On no GPU's list at all (another pid namespace, or CPU only): unknown, not 0 everywhere.
    reg_other, snaps_other = _registry(reader, pid=31337)
    snaps_other.append(snaps[-1])
    assert not [m for m in reg_other.collect() if m.name == "llamacpp_process_gpu_memory_bytes"]


def test_no_gpu_gives_no_series_and_source_down() -> None:
    reader = NvmlReader(FakeNvml([]))
    reg, snaps = _registry(reader)
    snaps.append(reader.read())
    assert not snaps[-1].ok and snaps[-1].error == "NVML reports no GPU"
    assert list(reg.collect()) == []


def test_unknown_pid_or_unavailable_process_memory_gives_no_process_series() -> None:
    fake = FakeNvml([h200(0, 10, [(SERVER_PID, None)])])  # WDDM / no pid namespace access: NVML cannot tell
    reader = NvmlReader(fake)
    reg, snaps = _registry(reader)
    snaps.append(reader.read())
    assert reg.get_sample_value("llamacpp_process_gpu_memory_bytes", {"gpu": "0", "uuid": fake.gpus[0].uuid}) is None
    reg2, snaps2 = _registry(reader, pid=None)
    snaps2.append(snaps[-1])
    assert reg2.get_sample_value("llamacpp_gpu_memory_used_bytes", _gpu_labels(0, fake)) == 10 * GIB
    assert not [m for m in reg2.collect() if m.name == "llamacpp_process_gpu_memory_bytes"]


def test_a_wddm_driver_lists_the_server_without_its_memory_and_the_exporter_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under a GeForce card's WDDM driver (Windows) NVML's process list has `usedGpuMemory` None: the GPU's
    figures stay, the process series is left out, and the exporter's log says why, once."""
    fake = FakeNvml([h200(0, 21, [(SERVER_PID, None), (SERVER_PID + 1, None)])])
    reader = NvmlReader(fake)
    reg, snaps = _registry(reader)
    with caplog.at_level(logging.WARNING, logger="exporter.metrics.gpu"):
        for _ in range(3):
            snaps.append(reader.read())
            assert snaps[-1].ok and snaps[-1].gpus[0].processes == {SERVER_PID: None, SERVER_PID + 1: None}
            assert (
                reg.get_sample_value("llamacpp_gpu_memory_free_bytes", _gpu_labels(0, fake))
                == 143771 * 1024**2 - 21 * GIB
            )
            assert (
                reg.get_sample_value("llamacpp_process_gpu_memory_bytes", {"gpu": "0", "uuid": fake.gpus[0].uuid})
                is None
            )
    said = [r.getMessage() for r in caplog.records if "without its memory" in r.getMessage()]
    assert len(said) == 1 and f"pid {SERVER_PID}" in said[0] and "WDDM" in said[0]


def test_process_list_falls_back_to_the_older_api_and_tolerates_not_supported() -> None:
    fake = FakeNvml([h200(0, 10, [(SERVER_PID, 8 * GIB)])])
    fake.old_driver = True
    snap = NvmlReader(fake).read()
    assert snap.ok and snap.gpus[0].processes == {SERVER_PID: 8 * GIB}
    fake = FakeNvml([h200(0, 10, [(SERVER_PID, 8 * GIB)])])
    fake.fail["nvmlDeviceGetComputeRunningProcesses"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.fail["nvmlDeviceGetGraphicsRunningProcesses"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    snap = NvmlReader(fake).read()
    assert snap.ok and snap.gpus[0].processes is None  # memory is still reported; process figures are not


def test_library_missing() -> None:
    def no_module() -> Any:
        raise ImportError("No module named 'pynvml'")

    snap = NvmlReader(loader=no_module).read()
    assert not snap.ok and snap.error is not None and "nvidia-ml-py" in snap.error
    fake = FakeNvml([h200(0, 1)])
    fake.fail["nvmlInit"] = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    snap = NvmlReader(fake).read()
    assert snap.error == "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"


def test_gpu_lost_mid_run_is_reported_once_then_recovers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="exporter.sources.live")
    fake = FakeNvml([h200(0, 10), h200(1, 20), h200(2, 30)])
    live, reg = nvml_live(NvmlReader(fake))
    up = {"source": "nvml"}

    asyncio.run(live.refresh())
    assert reg.get_sample_value("llamacpp_exporter_source_up", up) == 1
    assert reg.get_sample_value("llamacpp_gpu_memory_used_bytes", _gpu_labels(1, fake)) == 20 * GIB

    fake.fail["nvmlDeviceGetMemoryInfo:1"] = pynvml.NVML_ERROR_GPU_IS_LOST
    for _ in range(3):
        asyncio.run(live.refresh())  # never raises
        assert reg.get_sample_value("llamacpp_exporter_source_up", up) == 0
        assert reg.get_sample_value("llamacpp_gpu_memory_used_bytes", _gpu_labels(1, fake)) is None
    assert fake.shutdown_calls == 3 and fake.init_calls == 3  # stale handles: shut down, initialised next read
    assert reg.get_sample_value("llamacpp_exporter_source_read_failures_total", up) == 3
    assert live.statuses["nvml"].error == "GPU 1: NVMLError_GpuIsLost: GPU is lost"

    del fake.fail["nvmlDeviceGetMemoryInfo:1"]  # the GPU is back (reset, driver reloaded)
    asyncio.run(live.refresh())
    assert reg.get_sample_value("llamacpp_exporter_source_up", up) == 1
    assert reg.get_sample_value("llamacpp_gpu_memory_used_bytes", _gpu_labels(1, fake)) == 20 * GIB
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["source nvml down: GPU 1: NVMLError_GpuIsLost: GPU is lost", "source nvml is up again"]


def test_driver_unloaded_mid_run_is_retried() -> None:
    fake = FakeNvml([h200(0, 10)])
    reader = NvmlReader(fake)
    assert reader.read().ok
    fake.fail["nvmlDeviceGetCount"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    assert not reader.read().ok and not reader.initialized
    fake.fail = {"nvmlInit": pynvml.NVML_ERROR_DRIVER_NOT_LOADED}
    assert reader.read().error == "NVML unavailable: NVMLError_DriverNotLoaded: Driver Not Loaded"
    fake.fail = {}
    assert reader.read().ok and fake.init_calls == 3


def test_real_pynvml_without_a_driver(caplog: pytest.LogCaptureFixture) -> None:
    """The REAL pynvml here: nvmlInit raises NVMLError_LibraryNotFound → source_up 0, one log line."""
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        pynvml.nvmlInit()
    caplog.set_level(logging.INFO)
    live, reg = nvml_live(NvmlReader())
    for _ in range(3):
        asyncio.run(live.refresh())
    assert reg.get_sample_value("llamacpp_exporter_source_up", {"source": "nvml"}) == 0
    assert reg.get_sample_value("llamacpp_exporter_source_read_failures_total", {"source": "nvml"}) == 3
    assert not [m for m in reg.collect() if m.name.startswith("llamacpp_gpu_")]
    lines = [r.getMessage() for r in caplog.records if "nvml" in r.getMessage().lower()]
    assert lines == ["source nvml down: NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"]
    asyncio.run(live.close())
