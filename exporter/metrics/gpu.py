"""Each GPU's memory, load, heat, power, clocks and Xid errors, and llama-server's own VRAM, from the last
NVML read (`exporter.sources.nvml`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import live as c
from exporter.metrics.catalogue.live import THROTTLE_REASONS
from exporter.model.live import GpuReading, NvmlSnapshot

log = logging.getLogger(__name__)
#: The throttle reason bits that have a `reason` of their own; any other is `other`.
_KNOWN_REASON_BITS = sum(bit for bit, _ in THROTTLE_REASONS)


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
            "total": c.GPU_MEMORY_TOTAL_BYTES.gauge(),
            "used": c.GPU_MEMORY_USED_BYTES.gauge(),
            "free": c.GPU_MEMORY_FREE_BYTES.gauge(),
        }
        proc = c.PROCESS_GPU_MEMORY_BYTES.gauge()
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


#: One optional gauge per GPU and the reading's field that gives it (left out where that is None).
_GAUGES = (
    (c.GPU_UTILIZATION_RATIO, "utilization_ratio"),
    (c.GPU_MEMORY_UTILIZATION_RATIO, "memory_utilization_ratio"),
    (c.GPU_TEMPERATURE_CELSIUS, "temperature_celsius"),
    (c.GPU_POWER_WATTS, "power_watts"),
    (c.GPU_POWER_LIMIT_WATTS, "power_limit_watts"),
    (c.GPU_SM_CLOCK_HERTZ, "sm_clock_hertz"),
    (c.GPU_LAST_XID, "last_xid"),
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

    def ids(g: GpuReading) -> list[str]:
        return [str(g.index), g.uuid, g.name]

    for gauge, attr in _GAUGES:
        family = gauge.gauge()
        for g in snap.gpus:
            value = getattr(g, attr)
            if value is not None:
                family.add_metric(ids(g), value)
        if family.samples:
            yield family
    reasons, xids = c.GPU_THROTTLE_REASON.gauge(), c.GPU_XID_ERRORS.counter()
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
