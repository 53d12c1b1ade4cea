"""The server's rows: llama-server up and starting, a router's children, the exporter's own health."""

from __future__ import annotations

from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import (
    GREEN,
    RED,
    UP_MAP,
    Panel,
    capacity_line,
    state_timeline,
    thresholds,
    timeseries,
    value_map,
)
from llamacpp_dashboard.query import DS, q


def server(lay: Layout) -> None:
    """The row "Server"."""
    lay.row("Server")
    lay.add(_up_loading(), 8, 7)
    lay.add(_starts(), 8, 7)
    lay.add(_server_info(), 8, 7)


def router(lay: Layout) -> None:
    """The row "Router (llama-server router mode)"."""
    lay.row("Router (llama-server router mode)")
    lay.add(_router_children(), 12, 7)
    lay.add(_router_child_events(), 12, 7)


def exporter_health(lay: Layout) -> None:
    """The row "Exporter health"."""
    lay.row("Exporter health")
    lay.add(_sources(), 8, 7)
    lay.add(_log_lines(), 8, 7)
    lay.add(_scrapes(), 8, 7)


def _up_loading() -> Panel:
    return state_timeline(
        "Up / loading",
        "llamacpp_up (1 = /health answers 200) and llamacpp_server_loading (1 = 503 Loading model).",
        [
            q("llamacpp_up{S}", "{W} up", "A"),
            q("llamacpp_server_loading{S}", "{W} loading", "B"),
        ],
        mappings=value_map(("0", "no", "transparent"), ("1", "yes", GREEN)),
        steps=thresholds((None, "transparent"), (1, GREEN)),
    )


def _starts() -> Panel:
    return timeseries(
        "Server starts",
        "increase of llamacpp_server_starts_total: llama-server starts seen in its log (truncated log file, "
        "new banner). Several in a few minutes is a crash loop.",
        [q("sum by ({BY}) (increase(llamacpp_server_starts_total{S}[$__rate_interval]))", "{W}")],
        unit="short",
        bars=True,
    )


def _server_info() -> Panel:
    return {
        "type": "table",
        "title": "What llama-server runs",
        "description": "llamacpp_server_info: build, model, kv_unified, K/V cache types and where the pool size "
        "came from (capacity_source).",
        "datasource": DS,
        "targets": [q("llamacpp_server_info{S}", "", format="table", instant=True, range=False)],
        "fieldConfig": {"defaults": {"unit": "none", "custom": {"align": "auto"}}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
        "transformations": [
            {
                "id": "organize",
                "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True}},
            }
        ],
    }


def _router_children() -> Panel:
    return timeseries(
        "Router children",
        "llamacpp_router_children: the router's child servers (one per loaded model) the exporter follows, "
        "against llamacpp_router_children_limit (red line), the most it follows. Empty unless llama-server "
        "runs in router mode.",
        [
            q("llamacpp_router_children{R}", "{{instance}} {{server}} children", "A"),
            q("llamacpp_router_children_limit{R}", "{{instance}} {{server}} limit", "B"),
        ],
        unit="short",
        overrides=[capacity_line("B")],
    )


def _router_child_events() -> Panel:
    return timeseries(
        "Router children: starts, exits, refused",
        "Per interval: increase of llamacpp_router_child_starts_total (children started: a model loaded), "
        "llamacpp_router_child_exits_total by outcome (unloaded, or crashed: LlamaCppRouterChildCrashed) "
        "and llamacpp_router_children_refused_total (children past the limit, not followed: "
        "LlamaCppRouterChildrenRefused).",
        [
            q(
                "sum by (instance, server) (increase(llamacpp_router_child_starts_total{R}[$__rate_interval]))",
                "{{instance}} {{server}} starts",
                "A",
            ),
            q(
                "sum by (instance, server, outcome) (increase(llamacpp_router_child_exits_total{R}[$__rate_interval]))",
                "{{instance}} {{server}} exits ({{outcome}})",
                "B",
            ),
            q(
                "sum by (instance, server) (increase(llamacpp_router_children_refused_total{R}[$__rate_interval]))",
                "{{instance}} {{server}} refused",
                "C",
            ),
        ],
        unit="short",
        bars=True,
    )


def _sources() -> Panel:
    return state_timeline(
        "Exporter sources",
        "llamacpp_exporter_source_up by source (log, http, proc, nvml): 1 when the last read worked. Metrics "
        "from a source that is down are missing or stale (LlamaCppExporterSourceDown).",
        [q("llamacpp_exporter_source_up{S}", "{W} {{source}}")],
        mappings=UP_MAP,
        steps=thresholds((None, RED), (1, GREEN)),
    )


def _log_lines() -> Panel:
    return timeseries(
        "Log lines read",
        "rate of llamacpp_exporter_log_lines_total; increases of llamacpp_exporter_log_truncations_total "
        "(the server restarted and truncated its log) and llamacpp_exporter_log_rotations_total.",
        [
            q("sum by ({BY}) (rate(llamacpp_exporter_log_lines_total{S}[$__rate_interval]))", "{W} lines/s", "A"),
            q(
                "sum by ({BY}) (increase(llamacpp_exporter_log_truncations_total{S}[$__rate_interval]))",
                "{W} truncations",
                "B",
            ),
            q(
                "sum by ({BY}) (increase(llamacpp_exporter_log_rotations_total{S}[$__rate_interval]))",
                "{W} rotations",
                "C",
            ),
        ],
        unit="short",
    )


def _scrapes() -> Panel:
    return timeseries(
        "Scrapes",
        "up (Prometheus could scrape the exporter) and scrape_duration_seconds (how long a scrape took, "
        "live reads included).",
        [
            q("up{G}", "{{instance}} up", "A"),
            q("scrape_duration_seconds{G}", "{{instance}} scrape duration", "B"),
        ],
        unit="s",
        overrides=[
            {
                "matcher": {"id": "byFrameRefID", "options": "A"},
                "properties": [{"id": "unit", "value": "none"}, {"id": "max", "value": 1}],
            }
        ],
    )
