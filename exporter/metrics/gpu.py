"""Each GPU's memory, load, heat, power, clocks and Xid errors, and llama-server's own VRAM, from the last
NVML read (`exporter.sources.nvml`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import NamedTuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.model.live import GpuReading, NvmlSnapshot

log = logging.getLogger(__name__)


class NvmlCollector(Collector):
    """GPU memory per GPU and llama-server's own VRAM, from the last NVML read.

    # HELP llamacpp_gpu_memory_free_bytes Free GPU memory (NVML).
    # TYPE llamacpp_gpu_memory_free_bytes gauge
    llamacpp_gpu_memory_free_bytes{gpu="0",name="NVIDIA H200",uuid="GPU-5f3c…"} 1.78257920e+08
    # HELP llamacpp_process_gpu_memory_bytes GPU memory used by llama-server on this GPU (NVML process list).
    # TYPE llamacpp_process_gpu_memory_bytes gauge
    llamacpp_process_gpu_memory_bytes{gpu="0",uuid="GPU-5f3c…"} 1.4495514624e+11
    """

    def __init__(self, snapshot: Callable[[], NvmlSnapshot | None], pid: Callable[[], int | None]) -> None:
        self._snapshot = snapshot
        self._pid = pid
        self._said_unknown: set[int] = set()  # pids said to be listed without their memory (once each)

    def collect(self) -> Iterator[Metric]:
        """Yield the GPU families (none when NVML gave nothing)."""
        snap = self._snapshot()
        if snap is None or not snap.gpus:
            return
        families = {
            kind: GaugeMetricFamily(
                f"llamacpp_gpu_memory_{kind}_bytes",
                f"{kind.capitalize()} GPU memory (NVML).",
                labels=["gpu", "uuid", "name"],
            )
            for kind in ("total", "used", "free")
        }
        proc = GaugeMetricFamily(
            "llamacpp_process_gpu_memory_bytes",
            "GPU memory used by llama-server on this GPU (NVML process list, matched by pid).",
            labels=["gpu", "uuid"],
        )
        pid = self._pid()
        # NVML lists host pids. If llama-server's pid is on no GPU's list at all, it may run in another pid
        # namespace (a container): leave the series out rather than claim 0 everywhere.
        seen = pid is not None and any(g.processes and pid in g.processes for g in snap.gpus)
        for g in snap.gpus:
            labels = [str(g.index), g.uuid, g.name]
            families["total"].add_metric(labels, g.total_bytes)
            families["used"].add_metric(labels, g.used_bytes)
            families["free"].add_metric(labels, g.free_bytes)
            if seen and pid is not None and g.processes is not None:
                used = g.processes.get(pid, 0)  # on another GPU's list, not this one's: it holds nothing here
                if used is not None:
                    proc.add_metric([str(g.index), g.uuid], used)
                elif pid not in self._said_unknown:
                    self._said_unknown.add(pid)
                    # Windows' WDDM driver (GeForce cards) lists processes without their memory.
                    log.warning(
                        "NVML lists llama-server (pid %d) on GPU %d without its memory (a WDDM driver on Windows "
                        "gives none per process): llamacpp_process_gpu_memory_bytes is left out; free and used "
                        "VRAM per GPU are exported",
                        pid,
                        g.index,
                    )
        yield from families.values()
        if proc.samples:
            yield proc
        yield from _load_families(snap)


#: NVML's clock event (throttle) reason bits and their `reason` label; a bit not listed is `other`.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
_KNOWN_REASON_BITS = sum(bit for bit, _ in THROTTLE_REASONS)


class _Gauge(NamedTuple):
    """One optional gauge per GPU: its name, help, and the reading's field (left out where that is None)."""

    name: str
    help: str
    field: str


_GAUGES = (
    _Gauge(
        "llamacpp_gpu_utilization_ratio",
        "Share of NVML's last sample period in which a kernel ran.",
        "utilization_ratio",
    ),
    _Gauge(
        "llamacpp_gpu_memory_utilization_ratio",
        "Share of NVML's last sample period in which device memory was read or written.",
        "memory_utilization_ratio",
    ),
    _Gauge("llamacpp_gpu_temperature_celsius", "GPU core temperature (NVML).", "temperature_celsius"),
    _Gauge("llamacpp_gpu_power_watts", "Power drawn by the board (NVML).", "power_watts"),
    _Gauge("llamacpp_gpu_power_limit_watts", "The power limit NVML enforces.", "power_limit_watts"),
    _Gauge("llamacpp_gpu_sm_clock_hertz", "Streaming multiprocessor clock (NVML).", "sm_clock_hertz"),
    _Gauge("llamacpp_gpu_last_xid", "Code of the last Xid critical error NVML reported for this GPU.", "last_xid"),
)


def _load_families(snap: NvmlSnapshot) -> Iterator[Metric]:
    """The optional figures: a family only where some GPU gives it, a GPU's sample only where it gives it.

    # HELP llamacpp_gpu_utilization_ratio Share of NVML's last sample period in which a kernel ran.
    # TYPE llamacpp_gpu_utilization_ratio gauge
    llamacpp_gpu_utilization_ratio{gpu="0",name="NVIDIA H200",uuid="GPU-5f3c…"} 0.97
    # HELP llamacpp_gpu_throttle_reason Why the GPU's clocks are held down now (NVML's clock event reasons), 1 or 0.
    # TYPE llamacpp_gpu_throttle_reason gauge
    llamacpp_gpu_throttle_reason{gpu="0",name="NVIDIA H200",reason="sw_power_cap",uuid="GPU-5f3c…"} 1.0
    # HELP llamacpp_gpu_xid_errors_total Xid critical errors NVML reported for this GPU since the exporter started.
    # TYPE llamacpp_gpu_xid_errors_total counter
    llamacpp_gpu_xid_errors_total{gpu="0",name="NVIDIA H200",uuid="GPU-5f3c…"} 0.0
    """
    labels = ["gpu", "uuid", "name"]

    def ids(g: GpuReading) -> list[str]:
        return [str(g.index), g.uuid, g.name]

    for gauge in _GAUGES:
        family = GaugeMetricFamily(gauge.name, gauge.help, labels=labels)
        for g in snap.gpus:
            value = getattr(g, gauge.field)
            if value is not None:
                family.add_metric(ids(g), value)
        if family.samples:
            yield family
    reasons = GaugeMetricFamily(
        "llamacpp_gpu_throttle_reason",
        "Why the GPU's clocks are held down now (NVML's clock event reasons), 1 or 0.",
        labels=[*labels, "reason"],
    )
    xids = CounterMetricFamily(
        "llamacpp_gpu_xid_errors",
        "Xid critical errors NVML reported for this GPU since the exporter started.",
        labels=labels,
    )
    for g in snap.gpus:
        if g.clock_event_reasons is not None:
            bits = g.clock_event_reasons
            for bit, reason in THROTTLE_REASONS:
                reasons.add_metric([*ids(g), reason], 1 if bits & bit else 0)
            reasons.add_metric([*ids(g), "other"], 1 if bits & ~_KNOWN_REASON_BITS else 0)
        if g.xid_errors is not None:
            xids.add_metric(ids(g), g.xid_errors)
    if reasons.samples:
        yield reasons
    if xids.samples:
        yield xids
