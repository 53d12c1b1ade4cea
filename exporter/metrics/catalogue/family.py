"""A metric family of the catalogue: its name, type, scope, help, labels and bounded labels' values, and the
prometheus_client family it builds (`exporter.metrics.catalogue`)."""

from __future__ import annotations

import builtins
import functools
from collections.abc import Mapping, Sequence
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
from prometheus_client.samples import Sample

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
        family = self.histogram_family()
        family.add((), h)
        return family

    def histograms(self, by: Mapping[str, Histogram]) -> HistogramMetricFamily:
        """A histogram with one bounded label: one histogram per value, every allowed value exported (empty ones
        too, so that a quantile by that label has its series from the first scrape)."""
        (label,) = self.labels
        family = self.histogram_family()
        for key in self.values[label]:
            family.add((key,), by[key])
        return family

    def histogram_family(self) -> Histograms:
        """An empty histogram family, for `add` with its labels' values (an unbounded label's: `client`)."""
        assert self.type == "histogram", self.name
        return Histograms(self.family, self.help, labels=self.labels)

    def summary(self) -> SummaryMetricFamily:
        """An empty summary family, for `add_metric` with its labels."""
        assert self.type == "summary", self.name
        return SummaryMetricFamily(self.family, self.help, labels=self.labels)

    def info(self) -> InfoMetricFamily:
        """An empty info family, for `add_metric` with its labels' values."""
        assert self.type == "info", self.name
        return InfoMetricFamily(self.family, self.help)


class Histograms(HistogramMetricFamily):
    """A histogram family that takes the model's histograms (`add`)."""

    def add(self, values: Sequence[str], h: Histogram) -> None:
        """The samples of `add_metric(values, h.buckets(), h.sum)`, equal to the last bit (a test holds them to
        it), without its per-bucket work: a scrape renders a dozen histograms of some twenty buckets each."""
        labels = dict(zip(self._labelnames, values, strict=True))
        bucket, samples, total = self.name + "_bucket", self.samples, 0
        for le, n in zip(_le_values(h.bounds), h.counts, strict=True):
            total += n
            samples.append(Sample(bucket, {**labels, "le": le}, float(total)))
        samples.append(Sample(self.name + "_count", labels, float(total)))
        samples.append(Sample(self.name + "_sum", dict(labels), h.sum))


@functools.cache
def _le_values(bounds: tuple[float, ...]) -> tuple[str, ...]:
    """Each bucket's `le` as `Histogram.buckets()` writes it, `+Inf` last (a few layouts: cached for good)."""
    assert not bounds or bounds[0] >= 0  # prometheus_client leaves out _count and _sum below a negative bound
    return tuple(bound for bound, _ in Histogram(bounds).buckets())
