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

from exporter.metrics.catalogue.live import THROTTLE_REASONS
from exporter.metrics.gpu import NvmlCollector
from exporter.model.live import NvmlSnapshot
from exporter.sources.nvml import MAX_EVENTS_PER_READ, NvmlReader


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


# The figures beyond memory: each optional, each answered, refused or absent at the pynvml boundary.
OPTIONAL_CALLS = {
    "nvmlDeviceGetUtilizationRates": ["llamacpp_gpu_utilization_ratio", "llamacpp_gpu_memory_utilization_ratio"],
    "nvmlDeviceGetTemperature": ["llamacpp_gpu_temperature_celsius"],
    "nvmlDeviceGetPowerUsage": ["llamacpp_gpu_power_watts"],
    "nvmlDeviceGetEnforcedPowerLimit": ["llamacpp_gpu_power_limit_watts"],
    "nvmlDeviceGetClockInfo": ["llamacpp_gpu_sm_clock_hertz"],
    "nvmlDeviceGetCurrentClocksEventReasons": ["llamacpp_gpu_throttle_reason"],
    "nvmlDeviceRegisterEvents": ["llamacpp_gpu_xid_errors_total"],
}


def _families(reg: CollectorRegistry) -> dict[str, int]:
    """Sample count per family name (counters by their _total sample)."""
    out: dict[str, int] = {}
    for m in reg.collect():
        for s in m.samples:
            if not s.name.endswith("_created"):
                out[s.name] = out.get(s.name, 0) + 1
    return out


def test_load_heat_power_clock_and_throttle_in_base_units() -> None:
    gpu = h200(0, 100, [(SERVER_PID, 90 * GIB)])
    gpu.clock_reasons = 0x4 | 0x40 | 0x8000  # software power cap, hardware thermal slowdown, a bit not known
    fake = FakeNvml([gpu])
    reader = NvmlReader(fake)
    reg, snaps = _registry(reader)
    snaps.append(reader.read())
    labels = _gpu_labels(0, fake)
    assert reg.get_sample_value("llamacpp_gpu_utilization_ratio", labels) == 0.97
    assert reg.get_sample_value("llamacpp_gpu_memory_utilization_ratio", labels) == 0.64
    assert reg.get_sample_value("llamacpp_gpu_temperature_celsius", labels) == 61
    assert reg.get_sample_value("llamacpp_gpu_power_watts", labels) == 452.0
    assert reg.get_sample_value("llamacpp_gpu_power_limit_watts", labels) == 700.0
    assert reg.get_sample_value("llamacpp_gpu_sm_clock_hertz", labels) == 1.98e9
    active = {
        reason
        for reason in [r for _, r in THROTTLE_REASONS] + ["other"]
        if reg.get_sample_value("llamacpp_gpu_throttle_reason", {**labels, "reason": reason}) == 1
    }
    assert active == {"sw_power_cap", "hw_thermal_slowdown", "other"}
    assert reg.get_sample_value("llamacpp_gpu_xid_errors_total", labels) == 0
    assert reg.get_sample_value("llamacpp_gpu_last_xid", labels) is None  # none yet
    # The series per GPU: 3 memory, 1 llama-server's own, 6 gauges, 10 throttle reasons, the Xid counter.
    assert sum(_families(reg).values()) == 21 == 3 + 1 + 6 + len(THROTTLE_REASONS) + 1 + 1


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION])
@pytest.mark.parametrize("call", sorted(OPTIONAL_CALLS))
def test_a_refused_call_leaves_its_series_out_says_so_once_and_is_not_tried_again(
    call: str, code: int, caplog: pytest.LogCaptureFixture
) -> None:
    """WDDM GeForce cards, MIG instances and old drivers refuse some calls: those series are left out, said once
    in the log, every other series stays, the source stays up (never a failed scrape)."""
    gpu = h200(0, 10, [(SERVER_PID, 8 * GIB)])
    gpu.refuses[call] = code
    fake = FakeNvml([gpu, h200(1, 10)])
    live, reg = nvml_live(NvmlReader(fake))
    with caplog.at_level(logging.INFO, logger="exporter.sources.nvml"):
        for _ in range(3):
            asyncio.run(live.refresh())
    assert reg.get_sample_value("llamacpp_exporter_source_up", {"source": "nvml"}) == 1
    families = _families(reg)
    for name in OPTIONAL_CALLS[call]:
        per_gpu = len(THROTTLE_REASONS) + 1 if name == "llamacpp_gpu_throttle_reason" else 1
        assert families[name] == per_gpu  # GPU 1 still gives it; GPU 0 does not
        labels = {**_gpu_labels(0, fake), **({"reason": "gpu_idle"} if per_gpu > 1 else {})}
        assert reg.get_sample_value(name, labels) is None
    for other in {n for names in OPTIONAL_CALLS.values() for n in names} - set(OPTIONAL_CALLS[call]):
        assert reg.get_sample_value(other, _gpu_labels(0, fake)) is not None or other == "llamacpp_gpu_throttle_reason"
    assert reg.get_sample_value("llamacpp_gpu_memory_free_bytes", _gpu_labels(0, fake)) is not None
    said = [r.getMessage() for r in caplog.records if r.name == "exporter.sources.nvml"]
    assert len(said) == 1 and "GPU 0" in said[0] and "left out" in said[0], said
    assert "NotSupported" in said[0] or "NoPermission" in said[0]
    if call != "nvmlDeviceRegisterEvents":
        assert fake.calls[call] == 3 + 1  # GPU 1 three times, GPU 0 once: a refusal is not asked again


def test_an_old_driver_gives_throttle_reasons_under_their_old_name() -> None:
    fake = FakeNvml([h200(0, 10)])
    fake.old_driver = True
    snap = NvmlReader(fake).read()
    assert snap.ok and snap.gpus[0].clock_event_reasons == 0x4
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1


def test_a_library_without_the_newer_functions_leaves_their_series_out() -> None:
    """An old nvidia-ml-py has no clocks-event name and no utilization call: absent attributes are figures left
    out, like a refusal."""

    class OldLibrary(FakeNvml):
        nvmlDeviceGetCurrentClocksEventReasons = None  # type: ignore[assignment]
        nvmlDeviceGetUtilizationRates = None  # type: ignore[assignment]

    snap = NvmlReader(OldLibrary([h200(0, 10)])).read()
    g = snap.gpus[0]
    assert snap.ok and g.utilization_ratio is None and g.clock_event_reasons == 0x4 and g.temperature_celsius == 61


def test_xid_errors_are_counted_across_reads_and_a_reinitialisation() -> None:
    fake = FakeNvml([h200(0, 10), h200(1, 10)])
    reader = NvmlReader(fake)
    reg, snaps = _registry(reader)
    snaps.append(reader.read())
    labels = _gpu_labels(1, fake)
    assert reg.get_sample_value("llamacpp_gpu_xid_errors_total", labels) == 0
    fake.gpus[1].xids += [79, 48]  # fallen off the bus, a double-bit ECC error
    snaps.append(reader.read())
    assert reg.get_sample_value("llamacpp_gpu_xid_errors_total", labels) == 2
    assert reg.get_sample_value("llamacpp_gpu_last_xid", labels) == 48
    assert reg.get_sample_value("llamacpp_gpu_xid_errors_total", _gpu_labels(0, fake)) == 0
    # The GPU is lost and NVML re-initialised: the event sets are made again, the count never goes back.
    fake.fail["nvmlDeviceGetMemoryInfo:1"] = pynvml.NVML_ERROR_GPU_IS_LOST
    assert not reader.read().ok and fake.freed_sets == 2 and not fake.event_sets
    del fake.fail["nvmlDeviceGetMemoryInfo:1"]
    fake.gpus[1].xids.append(31)
    snaps.append(reader.read())
    assert reg.get_sample_value("llamacpp_gpu_xid_errors_total", labels) == 3
    assert reg.get_sample_value("llamacpp_gpu_last_xid", labels) == 31
    assert len(fake.event_sets) == 2


def test_a_storm_of_xids_is_taken_a_bounded_number_per_read() -> None:
    fake = FakeNvml([h200(0, 10)])
    reader = NvmlReader(fake)
    reader.read()
    fake.gpus[0].xids += [13] * (MAX_EVENTS_PER_READ + 44)
    assert reader.read().gpus[0].xid_errors == MAX_EVENTS_PER_READ
    assert reader.read().gpus[0].xid_errors == MAX_EVENTS_PER_READ + 44


def test_a_gpu_lost_while_its_events_are_read_is_a_failed_read_that_recovers() -> None:
    fake = FakeNvml([h200(0, 10)])
    reader = NvmlReader(fake)
    assert reader.read().ok
    fake.fail["nvmlEventSetWait_v2"] = pynvml.NVML_ERROR_GPU_IS_LOST
    snap = reader.read()
    assert not snap.ok and snap.error == "GPU 0: NVMLError_GpuIsLost: GPU is lost" and not reader.initialized
    del fake.fail["nvmlEventSetWait_v2"]
    assert reader.read().gpus[0].xid_errors == 0
