"""A metric family of the catalogue: its name, type, scope, help, labels and bounded labels' values, and the
prometheus_client family it builds (`exporter.metrics.catalogue`)."""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    SummaryMetricFamily,
)

from exporter.model.histogram import Histogram

Type = Literal["counter", "gauge", "histogram", "summary", "info"]
#: Whose family it is. server: one server's (labelled `server`/`model` when there are several, or router
#: children); gpu: a GPU's, read by the server unit that reads NVML (labelled like it); host: the host's or
#: the exporter's, exported once and never labelled; router: a router's own (labelled `server` only);
#: guard: the guard's, one per exporter; client: the guard's by client (labelled `client`).
Scope = Literal["server", "gpu", "host", "router", "guard", "client"]
SERVER: Scope = "server"
GPU: Scope = "gpu"
HOST: Scope = "host"
ROUTER: Scope = "router"
GUARD: Scope = "guard"
CLIENT: Scope = "client"


@dataclass(frozen=True)
class Family:
    """One metric family: what a scrape shows of it and the values its bounded labels take."""

    name: str  # as exposed: counters end in `_total`, info families in `_info`
    type: Type
    scope: Scope
    help: str
    labels: tuple[str, ...] = ()
    values: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # a bounded label → its values
    #: A counter of events: the kind (one that declares `counted`) whose events it counts. Collected with the
    #: server's other counters from `ServerState.counted` (`EVENT_COUNTERS`), with no line of its own.
    event: builtins.type | None = None

    @cached_property
    def family(self) -> str:
        """The name prometheus_client's family takes (it adds `_total` to a counter's samples, `_info`
        to an info family's)."""
        if self.type == "counter":
            return self.name.removesuffix("_total")
        return self.name.removesuffix("_info") if self.type == "info" else self.name

    def gauge(self, value: float | None = None) -> GaugeMetricFamily:
        """A gauge family: one sample of `value` (no labels), or empty, for `add_metric` with its labels."""
        assert self.type == "gauge", self.name
        return GaugeMetricFamily(self.family, self.help, value=value, labels=None if value is not None else self.labels)

    def counter(self, value: float | None = None) -> CounterMetricFamily:
        """A counter family: one sample of `value` (no labels), or empty, for `add_metric` with its labels."""
        assert self.type == "counter", self.name
        return CounterMetricFamily(
            self.family, self.help, value=value, labels=None if value is not None else self.labels
        )

    def counts(self, values: Mapping[str, int]) -> CounterMetricFamily:
        """A counter with one bounded label, sorted by value; its allowed values are exported at 0 so that
        rate() and alerts work."""
        (label,) = self.labels
        family = self.counter()
        for key in sorted(set(self.values[label]) | set(values)):
            family.add_metric([key], values.get(key, 0))
        return family

    def histogram(self, h: Histogram) -> HistogramMetricFamily:
        """A histogram family from the one histogram type (`exporter.model.histogram`)."""
        assert self.type == "histogram", self.name
        return HistogramMetricFamily(self.family, self.help, buckets=h.buckets(), sum_value=h.sum)

    def histograms(self, by: Mapping[str, Histogram]) -> HistogramMetricFamily:
        """A histogram with one bounded label: one histogram per value, every allowed value exported (empty ones
        too, so that a quantile by that label has its series from the first scrape)."""
        assert self.type == "histogram", self.name
        (label,) = self.labels
        family = HistogramMetricFamily(self.family, self.help, labels=self.labels)
        for key in self.values[label]:
            h = by[key]
            family.add_metric([key], h.buckets(), h.sum)
        return family

    def histogram_family(self) -> HistogramMetricFamily:
        """An empty histogram family, for `add_metric` with its labels (an unbounded label's values: `client`)."""
        assert self.type == "histogram", self.name
        return HistogramMetricFamily(self.family, self.help, labels=self.labels)

    def summary(self) -> SummaryMetricFamily:
        """An empty summary family, for `add_metric` with its labels."""
        assert self.type == "summary", self.name
        return SummaryMetricFamily(self.family, self.help, labels=self.labels)

    def info(self) -> InfoMetricFamily:
        """An empty info family, for `add_metric` with its labels' values."""
        assert self.type == "info", self.name
        return InfoMetricFamily(self.family, self.help)
