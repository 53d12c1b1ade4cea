"""The `/metrics` encoder (exporter/web/exposition.py) writes what prometheus_client writes, byte for byte: for the
Accept headers Prometheus 2 and 3, curl and a browser send, on every capture's production registry (the goldens'
assembly), and on families built to reach every branch (hostile label values, odd floats, `_created` samples,
families the fast path leaves to prometheus_client). Only the content negotiation is prometheus_client's own."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from pathlib import Path

import pytest
from assembly import followed
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    StateSetMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar, Sample

from exporter.web import exposition

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = sorted(FIXTURES.glob("*/*/llama-server.log"))

ACCEPT = {
    "none (curl, the tests)": "",
    "Prometheus 2": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Prometheus 3": "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
    "Prometheus 3, text only": "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text, underscores": "text/plain;version=1.0.0;escaping=underscores",
    "OpenMetrics, no version": "application/openmetrics-text",
    "OpenMetrics 2.0": "application/openmetrics-text;version=2.0.0",
    "OpenMetrics, dots": "application/openmetrics-text;version=1.0.0;escaping=dots",
    "a browser": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
}

# The process collector reads /proc at each collect: two renders differ there, so it is left out of equality.
_PROCESS = re.compile(rb"^(?:# (?:HELP|TYPE) )?process_\S*[^\n]*\n", re.M)


class Families:
    """A collector that yields the same families at every collect."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def both(registry: Families | CollectorRegistry, accept: str) -> tuple[bytes, bytes]:
    """(prometheus_client's body, ours) for one Accept header, with the same content type."""
    theirs, their_type = choose_encoder(accept)
    ours, our_type = exposition.choose(accept)
    assert our_type == their_type
    return _PROCESS.sub(b"", theirs(registry)), _PROCESS.sub(b"", ours(registry))


@pytest.mark.parametrize("log", CAPTURES, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_every_captures_exposition_is_prometheus_clients_byte_for_byte(log: Path, tmp_path: Path) -> None:
    with followed([log.read_bytes()], tmp_path) as exporter:
        exporter.refresh()
        for accept in ACCEPT.values():
            theirs, ours = both(exporter.registry, accept)
            assert ours == theirs, accept
            assert b"llamacpp_" in ours


def _odd_families() -> list[Metric]:
    hostile = ['a"b', "back\\slash", "new\nline", "ünïcødé ✓", "", "}{,=", "x" * 300]
    counter = CounterMetricFamily("odd_requests", 'Help with "quotes", a \\ and a\nnewline.', labels=["client"])
    for i, value in enumerate(hostile):
        counter.add_metric([value], float(i), created=1_700_000_000.5 if i == 0 else None)
    gauge = GaugeMetricFamily("odd_values", "Floats Go writes its own way.", labels=["case"])
    values = [0.0, -0.0, 1.0, -1.5, 1e-9, 123456789.0, 1234567.0, 12345678.9, 1e21, math.inf, -math.inf, math.nan, 7]
    for i, number in enumerate(values):
        gauge.add_metric([str(i)], number)
    gauge.add_metric(["zero again"], 0)
    gauge_hist = GaugeHistogramMetricFamily(
        "odd_pool", "A gauge histogram.", buckets=[("1", 2.0), ("+Inf", 3.0)], gsum_value=4.0
    )
    summary = SummaryMetricFamily("odd_summary", "A summary.", labels=["a"])
    summary.add_metric(["x"], count_value=3, sum_value=1.5)
    states = StateSetMetricFamily("odd_state", "A state set.", value={"on": True, "off": False})
    timestamped = GaugeMetricFamily("odd_timestamped", "A sample with a time stamp: prometheus_client writes it.")
    timestamped.add_metric([], 1.0, timestamp=1_700_000_000.25)
    exemplar = CounterMetricFamily("odd_exemplar", "A counter with an exemplar: prometheus_client writes it.")
    exemplar.samples.append(Sample("odd_exemplar_total", {}, 2.0, None, Exemplar({"trace_id": "abc"}, 1.0)))
    utf8 = GaugeMetricFamily("odd.dotted", "A name outside the legacy character set: prometheus_client writes it.")
    utf8.add_metric([], 1.0)
    utf8_label = GaugeMetricFamily("odd_label", "A label name outside the legacy set.", labels=["la.bel"])
    utf8_label.add_metric(["v"], 1.0)
    unit = GaugeMetricFamily("odd_seconds", "A family with a unit.", unit="seconds")
    unit.add_metric([], 2.5)
    # The same label set written in two orders (a cache keyed by the dict's order must still sort), and sets
    # that differ only in one value.
    orders = GaugeMetricFamily("odd_orders", "Label sets in two orders.")
    for labels in ({"b": "1", "a": "2"}, {"a": "2", "b": "1"}, {"b": "1", "a": "3"}, {"a": "2"}, {"a": "2", "le": "x"}):
        orders.samples.append(Sample("odd_orders", labels, 1.0))
    return [counter, gauge, gauge_hist, summary, states, timestamped, exemplar, utf8, utf8_label, unit, orders]


def test_every_branch_the_fast_path_takes_or_leaves_is_prometheus_clients_byte_for_byte() -> None:
    registry = CollectorRegistry()
    Counter("lib_lines", "A client library counter (it has _created).", ["kind"], registry=registry).labels("a").inc()
    Histogram("lib_seconds", "A client library histogram.", registry=registry).observe(0.3)
    Gauge("lib_gauge", "A gauge.", registry=registry).set(3)
    Info("lib_build", "An info.", registry=registry).info({"version": '1"2'})
    families = Families(_odd_families())
    for accept in ACCEPT.values():
        for source in (registry, families):
            theirs, ours = both(source, accept)
            assert ours == theirs, accept
    # Rendered twice, from the caches the first render filled: the same bytes.
    for accept in ACCEPT.values():
        assert both(families, accept)[1] == both(families, accept)[0]


def test_the_caches_are_bounded_whatever_the_label_values() -> None:
    for i in range(3):
        family = GaugeMetricFamily("many_values", "A label value per sample.", labels=["v"])
        for j in range(exposition.CACHE_ENTRIES):
            family.add_metric([f"{i}-{j}"], float(j))
        body = exposition.text(Families([family]))
        assert body.count(b"\n") == exposition.CACHE_ENTRIES + 2
    assert 0 < exposition.cached() <= exposition.CACHE_ENTRIES
