"""The rules' settings: every threshold, window, selector and link (``generate_rules.py --list``).

Each alert module declares its own alerts' settings (its ``Settings``) beside them; ``Config`` is all of
them together with the settings every rule shares, one flat set of names for ``--set`` and ``--list``.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules import exporter_health, guard, kv_pages, kv_pool, latency, memory, router, server


@dataclass(frozen=True)
class Shared:
    """The settings every rule shares: the selector, the links, the scrape interval the rules stand."""

    #: Label matchers added to every llamacpp_* selector, e.g. ``job="llamacpp"`` ('' = all jobs).
    selector: str = ""
    #: Where runbook.md is published (absolute); each alert links to ``<this>#<alert name in lower case>``.
    #: Empty (the default): no runbook_url annotation, and the description names the runbook's section.
    #: A placeholder address (example.com/.org/.net, localhost) is refused: a pager cannot open it.
    runbook_url: str = ""
    #: Grafana's address (absolute); each alert links to the dashboard with its job, instance, server and
    #: model selected. Empty (the default): no dashboard_url annotation.
    grafana_url: str = ""
    #: The longest scrape interval the rules must stand: a condition on gauges needs its last two samples
    #: within this window (idelta), so that no alert fires on one sample, whatever the evaluation interval.
    two_samples_window: str = "5m"


@dataclass(frozen=True)
class Config(
    guard.Settings,
    router.Settings,
    exporter_health.Settings,
    server.Settings,
    memory.Settings,
    latency.Settings,
    kv_pool.Settings,
    kv_pages.Settings,
    Shared,
):
    """Every knob of the rules. Durations are Prometheus durations (``30s``, ``5m``). The bases are listed
    in reverse: a dataclass takes its bases' fields last base first, so ``--list`` reads Shared, then each
    module in the order of the rules file (``document.MODULES``)."""
