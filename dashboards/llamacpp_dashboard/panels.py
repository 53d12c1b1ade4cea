"""The panel builders every row uses (time series, stat, state timeline, bar gauge, alert table) and the
colours, thresholds and value mappings they share."""

from __future__ import annotations

from typing import Any

from llamacpp_dashboard.query import DS, OF_MODEL, q

#: A panel as it goes into the dashboard's JSON.
Panel = dict[str, Any]
#: The alert thresholds drawn on the panels (defaults of alerts/generate_rules.py).
KV_SATURATED_RATIO = 0.9
VRAM_HEADROOM_BYTES = 512 * 1024 * 1024

RED, ORANGE, GREEN, BLUE = "red", "orange", "green", "blue"


def thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    """Absolute threshold steps from (value, colour) pairs, the base (None) first."""
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    *,
    unit: str,
    stack: bool = False,
    bars: bool = False,
    threshold_steps: dict[str, Any] | None = None,
    threshold_style: str = "off",
    min_: float | None = 0,
    max_: float | None = None,
    overrides: list[dict[str, Any]] | None = None,
    axis_label: str = "",
) -> dict[str, Any]:
    custom: dict[str, Any] = {
        "axisLabel": axis_label,
        "axisPlacement": "auto",
        "drawStyle": "bars" if bars else "line",
        "fillOpacity": 60 if bars else (35 if stack else 10),
        "gradientMode": "none",
        "lineInterpolation": "stepAfter" if not bars else "linear",
        "lineWidth": 1,
        "pointSize": 4,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"group": "A", "mode": "normal" if stack else "none"},
        "thresholdsStyle": {"mode": threshold_style},
    }
    defaults: dict[str, Any] = {
        "color": {"mode": "palette-classic"},
        "custom": custom,
        "unit": unit,
        "thresholds": threshold_steps or thresholds((None, GREEN)),
    }
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {
                "calcs": ["lastNotNull", "max"],
                "displayMode": "table",
                "placement": "bottom",
                "showLegend": True,
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(
    title: str,
    description: str,
    target: dict[str, Any],
    *,
    unit: str,
    steps: dict[str, Any],
    mappings: list[dict[str, Any]] | None = None,
    decimals: int | None = None,
    no_value: str | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "color": {"mode": "thresholds"},
        "unit": unit,
        "thresholds": steps,
        "mappings": mappings or [],
    }
    if decimals is not None:
        defaults["decimals"] = decimals
    if no_value is not None:
        defaults["noValue"] = no_value
    # A stat shows the last value and its trend (the sparkline): a range query only (with `instant` too,
    # Grafana runs both and shows each series twice).
    target = {**target, "range": True, "instant": False}
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "colorMode": "background",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": "auto",
        },
    }


def state_timeline(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    *,
    mappings: list[dict[str, Any]],
    steps: dict[str, Any],
) -> dict[str, Any]:
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "color": {"mode": "thresholds"},
                "custom": {"fillOpacity": 80, "lineWidth": 0},
                "mappings": mappings,
                "thresholds": steps,
                "unit": "none",
            },
            "overrides": [],
        },
        "options": {
            "alignValue": "left",
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": False},
            "mergeValues": True,
            "rowHeight": 0.9,
            "showValue": "never",
            "tooltip": {"mode": "single", "sort": "none"},
        },
    }


def bargauge(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    *,
    unit: str,
    overrides: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Horizontal bars, one per series (its last value), in the order Prometheus returns them (by labels)."""
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": targets,
        "fieldConfig": {
            "defaults": {
                "color": {"fixedColor": BLUE, "mode": "fixed"},
                "unit": unit,
                "min": 0,
                "thresholds": thresholds((None, GREEN)),
            },
            "overrides": overrides or [],
        },
        "options": {
            "displayMode": "basic",
            "orientation": "horizontal",
            "namePlacement": "left",
            "valueMode": "color",
            "showUnfilled": True,
            "sizing": "auto",
            "minVizWidth": 8,
            "minVizHeight": 16,
            "maxVizHeight": 300,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    }


def per_instance(panel: dict[str, Any]) -> dict[str, Any]:
    """``panel`` repeated once per selected instance (stacked series add up one exporter's servers only, never
    all instances under "All"); the title names the instance."""
    title = panel["title"]
    title = title.replace(OF_MODEL, " on $instance" + OF_MODEL) if title.endswith(OF_MODEL) else title + " on $instance"
    return {**panel, "title": title, "repeat": "instance", "repeatDirection": "v"}


def capacity_line(ref: str, *, unstacked: bool = False) -> dict[str, Any]:
    """Override: the query `ref` drawn as the red dashed limit line (outside the stack when `unstacked`)."""
    props: list[dict[str, Any]] = [
        {"id": "custom.stacking", "value": {"group": "capacity", "mode": "none"}},
        {"id": "custom.fillOpacity", "value": 0},
        {"id": "custom.lineWidth", "value": 2},
        {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}},
        {"id": "color", "value": {"fixedColor": RED, "mode": "fixed"}},
    ]
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": props if unstacked else props[1:]}


def value_map(*pairs: tuple[str, str, str]) -> list[dict[str, Any]]:
    """[(value, text, colour)] -> a Grafana value mapping."""
    return [
        {
            "type": "value",
            "options": {v: {"text": text, "color": color, "index": i} for i, (v, text, color) in enumerate(pairs)},
        }
    ]


BUSY_MAP = value_map(("0", "idle", "transparent"), ("1", "processing", BLUE))
UP_MAP = value_map(("0", "down", RED), ("1", "up", GREEN))
#: The llama-server tile: -1 the exporter is down (nothing is known), 0 down, 1 up, 2 (or 3) loading a model.
SERVER_MAP = value_map(
    ("-1", "exporter down", RED),
    ("0", "down", RED),
    ("1", "up", GREEN),
    ("2", "loading", ORANGE),
    ("3", "loading", ORANGE),
)
#: Alert severities, coloured in the firing-alerts table.
SEVERITY_MAP = value_map(("critical", "critical", RED), ("warning", "warning", ORANGE), ("info", "info", BLUE))


#: The severities by rank (1 worst), for sorting the firing alerts: a string sort would put info first.
SEVERITY_RANK = (("critical", 1), ("warning", 2), ("info", 3), ("none", 4))


def alert_table(title: str, description: str, expr: str) -> dict[str, Any]:
    """A table of the alerts firing now (Prometheus' ALERTS series), worst first: each series' value is its
    severity's rank (``expr`` must end with ``}``, where the severity matcher goes)."""
    expr = " or ".join(f'{expr[:-1]}, severity="{sev}"}} * 0 + {rank}' for sev, rank in SEVERITY_RANK)
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [q(expr, "", format="table", instant=True, range=False)],
        "fieldConfig": {
            "defaults": {"unit": "none", "custom": {"align": "auto"}, "noValue": "No alert firing"},
            "overrides": [
                {
                    "matcher": {"id": "byName", "options": "severity"},
                    "properties": [
                        {"id": "mappings", "value": SEVERITY_MAP},
                        {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                    ],
                }
            ],
        },
        "options": {"showHeader": True, "cellHeight": "sm", "sortBy": [{"displayName": "rank", "desc": False}]},
        "transformations": [
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "__name__": True, "alertstate": True, "job": True},
                    "indexByName": {"Value": 0, "severity": 1, "alertname": 2, "instance": 3, "server": 4, "model": 5},
                    "renameByName": {"Value": "rank"},
                },
            }
        ],
    }
