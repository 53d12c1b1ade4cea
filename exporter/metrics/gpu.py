"""GPU memory per GPU and llama-server's own VRAM, from the last NVML read (`exporter.sources.nvml`)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.model.live import NvmlSnapshot

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
