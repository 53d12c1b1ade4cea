"""The one catalogue of the metric families the exporter and the guard expose: each family's name (as
exposed: a counter's with `_total`, an info family's with `_info`), type, help text, labels, the values its
bounded labels may take, and its scope (whose family it is, which decides the labels a scrape adds). The
families are kept by area: `server` (what a server's log says), `live` (the live sources, the exporter's
health, a router's children), `guard` (the guard and its books by client); `family` is their type.

Collectors build their families from these entries (`SLOT_TOKENS.gauge()`, `KV_CASCADES.counts(...)`), so
no collector writes a name or a help text of its own; tests/unit/test_metric_catalogue.py feeds every
collector and checks that they emit exactly this catalogue, and that the rules, the dashboard and the docs
name only families in it, and document each. A leaf: it imports the model's constants, the event kinds a
counter of events counts, and prometheus_client's family types, nothing else of the exporter.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.metrics.catalogue import guard, live, server
from exporter.metrics.catalogue.family import Family

#: Every family, by area, each in its module's order.
CATALOGUE: tuple[Family, ...] = tuple(
    f for module in (server, live, guard) for f in vars(module).values() if isinstance(f, Family)
)
#: Every family by its exposed name.
BY_NAME: Mapping[str, Family] = {f.name: f for f in CATALOGUE}
