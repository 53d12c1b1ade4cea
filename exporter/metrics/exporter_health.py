"""The exporter's own health: its sources, its log tailer, its build."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.metrics.catalogue import live as c


class LogSourceStatus(Protocol):
    """What the exporter knows about its log source (implemented by `exporter.pipeline.LogPipeline`)."""

    @property
    def up(self) -> bool: ...
    @property
    def lines(self) -> int: ...
    @property
    def replayed_lines(self) -> int: ...
    @property
    def truncations(self) -> int: ...
    @property
    def rotations(self) -> int: ...
    @property
    def lost_bytes(self) -> int: ...
    @property
    def long_lines(self) -> int: ...
    @property
    def understood(self) -> bool | None: ...


class SourceHealth(Protocol):
    """Last result of one live source, for `llamacpp_exporter_source_up` (`model.view.SourceReading`)."""

    @property
    def up(self) -> bool: ...


class ExporterCollector(Collector):
    """The exporter's own health: sources, tailer counters, build info.

    # HELP llamacpp_exporter_source_up 1 when the last read of the source worked.
    # TYPE llamacpp_exporter_source_up gauge
    llamacpp_exporter_source_up{source="log"} 1.0
    # HELP llamacpp_exporter_log_lines_total Log lines read while running (not counting the start-up replay).
    # TYPE llamacpp_exporter_log_lines_total counter
    llamacpp_exporter_log_lines_total 412.0
    """

    def __init__(self, log: LogSourceStatus, sources: Callable[[], Mapping[str, SourceHealth]] | None = None) -> None:
        self._log = log
        self._sources = sources  # the live sources' health in the unit's view of this scrape

    def collect(self) -> Iterator[Metric]:
        """Yield the exporter's self-metrics."""
        yield source_up_family(self._log.up, self._sources() if self._sources is not None else {})
        log = self._log
        yield c.EXPORTER_LOG_LINES.counter(log.lines)
        yield c.EXPORTER_LOG_REPLAYED_LINES.gauge(log.replayed_lines)
        yield c.EXPORTER_LOG_TRUNCATIONS.counter(log.truncations)
        yield c.EXPORTER_LOG_ROTATIONS.counter(log.rotations)
        yield c.EXPORTER_LOG_LOST_BYTES.counter(log.lost_bytes)
        if log.understood is not None:
            yield c.EXPORTER_LOG_UNDERSTOOD.gauge(1 if log.understood else 0)
        yield c.EXPORTER_LOG_LONG_LINES.counter(log.long_lines)
        info = c.EXPORTER_BUILD_INFO.info()
        info.add_metric([], {"version": __version__})
        yield info


def source_up_family(log_up: bool | None, sources: Mapping[str, SourceHealth]) -> GaugeMetricFamily:
    """`llamacpp_exporter_source_up{source}`: the log's (unless None: a router child shares its router's log)
    and each live source's."""
    up = c.EXPORTER_SOURCE_UP.gauge()
    if log_up is not None:
        up.add_metric(["log"], 1 if log_up else 0)
    for name, health in sorted(sources.items()):
        up.add_metric([name], 1 if health.up else 0)
    return up


class SourcesUpCollector(Collector):
    """`llamacpp_exporter_source_up` of a router child's live sources (its log is the router's).

    # HELP llamacpp_exporter_source_up 1 when the last read of the source worked.
    # TYPE llamacpp_exporter_source_up gauge
    llamacpp_exporter_source_up{source="http"} 1.0
    """

    def __init__(self, sources: Callable[[], Mapping[str, SourceHealth]]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        """Yield the one family."""
        yield source_up_family(None, self._sources())
