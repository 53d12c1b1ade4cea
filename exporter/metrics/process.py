"""llama-server's memory and start time and the host's memory, from the last process read (/proc or psutil:
`exporter.sources.process`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.model.live import ProcSnapshot


class ProcCollector(Collector):
    """llama-server's resident memory and start time, and the host's available memory, from the last process read.

    # HELP llamacpp_process_resident_memory_bytes Resident memory (RSS) of the llama-server process.
    # TYPE llamacpp_process_resident_memory_bytes gauge
    llamacpp_process_resident_memory_bytes 2.147483648e+09
    # HELP llamacpp_host_memory_available_bytes MemAvailable of the host (/proc/meminfo; available … macOS): …
    # TYPE llamacpp_host_memory_available_bytes gauge
    llamacpp_host_memory_available_bytes 2.3923986432e+10
    """

    def __init__(self, snapshot: Callable[[], ProcSnapshot | None]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        """Yield the process and host memory families that the last read produced."""
        snap = self._snapshot()
        if snap is None:
            return
        p = snap.process
        if p is not None:
            found = GaugeMetricFamily(
                "llamacpp_process_found_by",
                "1 for how the llama-server process was found: pid, pid_file, log_file (it, or the wrapper that "
                "started it, names or writes the log), router (a router's child), unit (it runs in the journal "
                "unit's cgroup), or name (a guess: the only llama-server whose "
                "log cannot be told).",
                labels=["how"],
            )
            found.add_metric([p.found_by], 1)
            yield found
            yield GaugeMetricFamily(
                "llamacpp_process_resident_memory_bytes",
                "Resident memory (RSS) of the llama-server process.",
                value=p.rss_bytes,
            )
            if p.start_time_seconds is not None:
                yield GaugeMetricFamily(
                    "llamacpp_process_start_time_seconds",
                    "Start time of the llama-server process since the Unix epoch.",
                    value=p.start_time_seconds,
                )
        h = snap.host
        if h is not None and h.available_bytes is not None:
            yield GaugeMetricFamily(
                "llamacpp_host_memory_available_bytes",
                "MemAvailable of the host (/proc/meminfo; available physical memory on Windows and macOS): memory "
                "that can be used without swapping.",
                value=h.available_bytes,
            )
        if h is not None and h.total_bytes is not None:
            yield GaugeMetricFamily(
                "llamacpp_host_memory_total_bytes", "Physical memory of the host (MemTotal).", value=h.total_bytes
            )
