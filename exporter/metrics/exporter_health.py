"""The exporter's own health: its sources, its log tailer, its build."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import (
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from exporter import __version__
from exporter.metrics.families import counter


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
        yield counter(
            "llamacpp_exporter_log_lines",
            "Log lines read while running (not counting the start-up replay).",
            log.lines,
        )
        yield GaugeMetricFamily(
            "llamacpp_exporter_log_replayed_lines",
            "Lines of the existing log replayed at start to rebuild gauges (not counted as events).",
            value=log.replayed_lines,
        )
        yield counter(
            "llamacpp_exporter_log_truncations",
            "Times the log file shrank or was rewritten in place.",
            log.truncations,
        )
        yield counter(
            "llamacpp_exporter_log_rotations",
            "Times the log path named a new file (rotation, re-creation).",
            log.rotations,
        )
        yield counter(
            "llamacpp_exporter_log_lost_bytes",
            "Bytes lost: written just before a copytruncate or a restart and never read (where no close event "
            "is seen, what was written after the last look is estimated).",
            log.lost_bytes,
        )
        if log.understood is not None:
            yield GaugeMetricFamily(
                "llamacpp_exporter_log_understood",
                "1 once a line that only llama-server writes was read; 0 when its first lines held none "
                "(not llama-server's log, or its format is not known) or it is binary data.",
                value=1 if log.understood else 0,
            )
        yield counter(
            "llamacpp_exporter_log_long_lines",
            "Lines cut because they exceeded the maximum line length.",
            log.long_lines,
        )
        info = InfoMetricFamily("llamacpp_exporter_build", "Version of llamacpp-exporter.")
        info.add_metric([], {"version": __version__})
        yield info


def source_up_family(log_up: bool | None, sources: Mapping[str, SourceHealth]) -> GaugeMetricFamily:
    """`llamacpp_exporter_source_up{source}`: the log's (unless None: a router child shares its router's log)
    and each live source's."""
    up = GaugeMetricFamily(
        "llamacpp_exporter_source_up", "1 when the last read of the source worked.", labels=["source"]
    )
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
