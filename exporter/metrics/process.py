"""llama-server's memory and start time and the host's memory, from the last process read (/proc or psutil:
`exporter.sources.process`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import live as c
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
            found = c.PROCESS_FOUND_BY.gauge()
            found.add_metric([p.found_by], 1)
            yield found
            yield c.PROCESS_RESIDENT_MEMORY_BYTES.gauge(p.rss_bytes)
            if p.start_time_seconds is not None:
                yield c.PROCESS_START_TIME_SECONDS.gauge(p.start_time_seconds)
        h = snap.host
        if h is not None and h.available_bytes is not None:
            yield c.HOST_MEMORY_AVAILABLE_BYTES.gauge(h.available_bytes)
        if h is not None and h.total_bytes is not None:
            yield c.HOST_MEMORY_TOTAL_BYTES.gauge(h.total_bytes)
