"""Helpers that build metric families the same way in every collector."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from exporter.model.histogram import Histogram


def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def labelled_counter(
    name: str, doc: str, label: str, values: Mapping[str, int], always: Iterable[str]
) -> CounterMetricFamily:
    """A counter with one bounded label; the `always` values are exported at 0 so rate() and alerts work."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key in sorted(set(always) | set(values)):
        family.add_metric([key], values.get(key, 0))
    return family


def histogram(name: str, doc: str, h: Histogram) -> HistogramMetricFamily:
    """A histogram family from the one histogram type (`exporter.model.histogram`)."""
    return HistogramMetricFamily(name, doc, buckets=h.buckets(), sum_value=h.sum)
