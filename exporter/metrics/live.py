"""Where slot tokens came from, the log verbosity and the live sources' read health (`exporter.sources.live`)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.metrics.catalogue import live as c
from exporter.metrics.gpu import NvmlCollector
from exporter.metrics.process import ProcCollector
from exporter.metrics.server_http import ServerHttpCollector
from exporter.model.live import SLOT_TOKEN_SOURCES
from exporter.model.view import ServerView


class LiveCollector(Collector):
    """Where slot tokens came from, llama-server's log verbosity, and the live sources' read health.

    # HELP llamacpp_slot_tokens_source Where llamacpp_slot_tokens comes from: 1 for the source in use.
    # TYPE llamacpp_slot_tokens_source gauge
    llamacpp_slot_tokens_source{source="log"} 0.0
    llamacpp_slot_tokens_source{source="slots_endpoint"} 1.0
    # HELP llamacpp_log_verbosity llama-server's log verbosity (-lv); below 4 the KV pool size … are hidden.
    # TYPE llamacpp_log_verbosity gauge
    llamacpp_log_verbosity 3.0
    # HELP llamacpp_exporter_source_read_duration_seconds Duration of the last read of the live source (seconds).
    # TYPE llamacpp_exporter_source_read_duration_seconds gauge
    llamacpp_exporter_source_read_duration_seconds{source="http"} 0.0021
    # HELP llamacpp_exporter_source_read_failures_total Reads of the live source that failed.
    # TYPE llamacpp_exporter_source_read_failures_total counter
    llamacpp_exporter_source_read_failures_total{source="nvml"} 12.0
    """

    def __init__(self, view: Callable[[], ServerView]) -> None:
        self._view = view  # the unit's view of this scrape

    def collect(self) -> Iterator[Metric]:
        """Yield the families."""
        view = self._view()
        if view.state.run.slot_count is not None or (view.http is not None and view.http.slots):
            used = view.slot_tokens_source
            source = c.SLOT_TOKENS_SOURCE.gauge()
            for name in SLOT_TOKEN_SOURCES:
                source.add_metric([name], 1 if name == used else 0)
            yield source
        level = view.verbosity
        if level is not None:
            yield c.LOG_VERBOSITY.gauge(level)
        duration, failures = c.EXPORTER_SOURCE_READ_DURATION_SECONDS.gauge(), c.EXPORTER_SOURCE_READ_FAILURES.counter()
        for name, st in sorted(view.sources.items()):
            if st.duration_seconds is not None:
                duration.add_metric([name], st.duration_seconds)
            failures.add_metric([name], st.failures)
        if view.sources:
            yield duration
            yield failures


def live_collectors(view: Callable[[], ServerView], sources: Collection[str]) -> list[Collector]:
    """Collectors for a server's live sources (`sources`: those it reads, of "nvml", "proc", "http"), rendering
    the unit's view of each scrape; register them next to its log collectors."""
    out: list[Collector] = [LiveCollector(view)]
    if "nvml" in sources:
        out.append(NvmlCollector(lambda: view().nvml, lambda: view().pid))
    if "proc" in sources:
        out.append(ProcCollector(lambda: view().proc))
    if "http" in sources:
        out.append(ServerHttpCollector(lambda: view().http, lambda: view().http_rejected))
    return out
