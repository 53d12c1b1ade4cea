#!/usr/bin/env python3
"""Render dashboards/llamacpp.json, the Grafana dashboard for llamacpp-exporter.

The committed JSON is this script's output; a test checks that they agree, round-trips the JSON
through grafana-foundation-sdk, and runs every query against a real Prometheus after a real incident.

    python dashboards/generate_dashboard.py            # rewrite dashboards/llamacpp.json
    python dashboards/generate_dashboard.py --check    # exit 1 if the JSON is not up to date

Conventions (grafana/dashboard-linter): one ``datasource`` variable, multi-select ``job`` and
``instance`` variables, every query filtered by both, ``$__rate_interval`` for rates, units and a
description naming the metric on every panel, a stable ``uid``. Standard library only.

Many servers per exporter: the ``server`` and ``model`` variables (several servers on one exporter carry
``server``, a router's children ``model``; a lone server neither) filter every per-server query, and every
aggregation and legend keeps both; GPU and host memory are per host and stay unfiltered.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DASHBOARD_FILE = HERE / "llamacpp.json"

UID = "llamacpp-exporter"
DS = {"type": "prometheus", "uid": "${datasource}"}
#: Matchers every query carries (dashboard-linter target-job-rule / target-instance-rule): ``{G}``, for
#: the series that are one per host or exporter (GPU and host memory, Prometheus' up).
GLOBAL_SEL = '{job=~"$job", instance=~"$instance"}'
#: ``{R}``: a router's own series (children, starts, exits), labelled ``server`` when one exporter follows
#: several servers.
ROUTER_SEL = '{job=~"$job", instance=~"$instance", server=~"$server"}'
#: ``{S}``: everything about one llama-server (slots, pool, counters, up, sources). Several servers on one
#: exporter carry ``server``, a router's children ``model``; a series without the label matches ``.*`` (All).
SEL = '{job=~"$job", instance=~"$instance", server=~"$server", model=~"$model"}'
SELECTORS = {"S": SEL, "G": GLOBAL_SEL, "R": ROUTER_SEL}
#: ``{BY}``: what a per-server aggregation keeps, so that several servers and models stay apart.
BY = "instance, server, model"
#: ``{W}`` in a legend: which server a per-server series is (a label that is absent renders empty).
WHO = "{{instance}} {{server}} {{model}}"
#: The KV pool panels' titles name the model(s) selected ("All", "alpha", "alpha + beta").
OF_MODEL = " ($model)"
#: The alert thresholds drawn on the panels (defaults of alerts/generate_rules.py).
KV_SATURATED_RATIO = 0.9
VRAM_HEADROOM_BYTES = 512 * 1024 * 1024

RED, ORANGE, GREEN, BLUE = "red", "orange", "green", "blue"


def selectors(expr: str) -> str:
    """``{S}``/``{G}``/``{R}`` become the matchers above (``{S, x="y"}`` adds one), ``{BY}`` the grouping."""
    for key, sel in SELECTORS.items():
        expr = expr.replace("{" + key + "}", sel).replace("{" + key + ", ", sel[:-1] + ", ")
    return expr.replace("{BY}", BY)


def q(expr: str, legend: str = "__auto", ref: str = "A", **extra: Any) -> dict[str, Any]:
    """A Prometheus target; ``expr`` with the markers of :func:`selectors`, ``{W}`` in ``legend``."""
    target: dict[str, Any] = {
        "datasource": DS,
        "editorMode": "code",
        "expr": selectors(expr),
        "legendFormat": legend.replace("{W}", WHO),
        "range": True,
        "refId": ref,
    }
    target.update(extra)
    return target


def thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


class Layout:
    """Places panels left to right in 24-column rows and numbers them."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def _pos(self, w: int, h: int) -> dict[str, int]:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.panels.append(
            {
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "id": self.next_id,
                "panels": [],
                "title": title,
                "type": "row",
            }
        )
        self.next_id += 1
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int) -> None:
        panel = {"id": self.next_id, "gridPos": self._pos(w, h), **panel}
        self.next_id += 1
        self.panels.append(panel)


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
    # A stat shows the value now: an instant query only (with `range` too, Grafana runs both and shows each
    # series twice).
    target = {**target, "range": False, "instant": True}
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


def alert_table(title: str, description: str, expr: str) -> dict[str, Any]:
    """A table of the alerts firing now (Prometheus' ALERTS series), worst first."""
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
        "options": {"showHeader": True, "cellHeight": "sm", "sortBy": [{"displayName": "severity", "desc": False}]},
        "transformations": [
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "Value": True, "__name__": True, "alertstate": True, "job": True},
                    "indexByName": {"severity": 0, "alertname": 1, "instance": 2, "server": 3, "model": 4},
                },
            }
        ],
    }


def panels() -> list[dict[str, Any]]:
    lay = Layout()

    # ------------------------------------------------------------------ at a glance
    lay.row("At a glance")
    top = [
        stat(
            "KV pool demand",
            'llamacpp_kv_pool_demand_ratio{horizon="prompt"}: what the requests in flight hold once their prompts '
            "are read, over the pool. Above 100% every request in flight will be aborted unless one ends first "
            "(LlamaCppKVPoolOverflowAhead pages); usage can still look low while it climbs.",
            q('llamacpp_kv_pool_demand_ratio{S, horizon="prompt"}', "{W}"),
            unit="percentunit",
            steps=thresholds((None, GREEN), (0.9, ORANGE), (1.0, RED)),
            decimals=0,
        ),
        stat(
            "Pool full in",
            "llamacpp_kv_pool_full_eta_seconds: at the current prompt-processing and generation speeds, the "
            "time until the requests in flight fill the KV pool. 'not filling' while the pool is not filling "
            "or the requests in flight cannot fill it (llamacpp_kv_pool_used_tokens shows the server is known).",
            q("llamacpp_kv_pool_full_eta_seconds{S}\nor llamacpp_kv_pool_used_tokens{S} * 0 - 1", "{W}"),
            unit="s",
            steps=thresholds((None, RED), (60, ORANGE), (600, GREEN)),
            mappings=value_map(("-1", "not filling", GREEN)),
            decimals=0,
        ),
        stat(
            "KV pool usage",
            "llamacpp_kv_pool_usage_ratio: KV cells held by all slots / pool capacity. At 100% llama-server "
            "aborts every in-flight request; LlamaCppKVPoolSaturated pages above 90% for 30 s while requests run.",
            q("llamacpp_kv_pool_usage_ratio{S}", "{W}"),
            unit="percentunit",
            steps=thresholds((None, GREEN), (0.75, ORANGE), (KV_SATURATED_RATIO, RED)),
            decimals=1,
        ),
        stat(
            "llama-server",
            "llamacpp_up (1 when llama-server answers /health with 200) and llamacpp_server_loading (1 while it "
            "loads a model: orange, not down); red 'exporter down' when Prometheus cannot scrape the exporter "
            "(up 0): then nothing is known about the server.",
            q(
                "llamacpp_up{S} + 2 * llamacpp_server_loading{S}\nor on (job, instance) (up{G} == 0) * 0 - 1",
                "{W}",
            ),
            unit="none",
            steps=thresholds((None, RED), (1, GREEN), (2, ORANGE)),
            mappings=SERVER_MAP,
            no_value="unknown",
        ),
        stat(
            "Slots busy",
            "instance:llamacpp_slots_processing:sum (recording rule: the sum of llamacpp_slot_processing): how "
            "many requests run now.",
            q("instance:llamacpp_slots_processing:sum{S}", "{W}"),
            unit="short",
            steps=thresholds((None, GREEN)),
        ),
        stat(
            "Aborted requests",
            "increase(llamacpp_requests_aborted_total[$__range]): requests llama-server answered with an error "
            "(send_error) in the time range; 'Context size has been exceeded' aborts every in-flight request.",
            q("sum by ({BY}) (increase(llamacpp_requests_aborted_total{S}[$__range]))", "{W}"),
            unit="short",
            steps=thresholds((None, GREEN), (1, RED)),
            decimals=0,
        ),
    ]
    lay.add(
        alert_table(
            "Firing alerts",
            'ALERTS{alertstate="firing"}: the llamacpp-exporter alerts firing now (Prometheus\' own series), '
            "worst first: critical pages, warning is work for the day, info is context. Alerts about a host or "
            "a GPU (no instance label) are listed whatever instance is selected.",
            'ALERTS{job=~"$job", instance=~"$instance|", server=~"$server", model=~"$model", '
            'alertname=~"LlamaCpp.*", alertstate="firing"}',
        ),
        6,
        5,
    )
    for panel in top:
        lay.add(panel, 3, 5)
    second = [
        stat(
            "Overcommit",
            "llamacpp_kv_pool_overcommit_ratio: slots x per-slot context / pool capacity. Above 1 the slots "
            "were promised more cells than the pool holds (-kvu; 4 on a default server): information, a risk "
            "once concurrent requests fill the pool (LlamaCppKVPoolOvercommitted).",
            q("llamacpp_kv_pool_overcommit_ratio{S}", "{W}"),
            unit="suffix:×",
            steps=thresholds((None, GREEN), (1.01, BLUE)),
            decimals=2,
        ),
        stat(
            "Least free VRAM",
            "min of llamacpp_gpu_memory_free_bytes over the GPUs (NVML); red below the 512 MiB headroom of "
            "LlamaCppVRAMHeadroomLow.",
            q("min by (instance) (llamacpp_gpu_memory_free_bytes{G})", "{{instance}}"),
            unit="bytes",
            steps=thresholds((None, RED), (VRAM_HEADROOM_BYTES, GREEN)),
        ),
        stat(
            "Host RAM in checkpoints + prompt cache",
            "instance:llamacpp_host_cache_bytes:sum (recording rule: llamacpp_checkpoint_bytes of all slots "
            "plus llamacpp_prompt_cache_bytes): host RAM llama-server holds beyond its model and KV cache.",
            q("instance:llamacpp_host_cache_bytes:sum{S}", "{W}"),
            unit="bytes",
            steps=thresholds((None, GREEN)),
        ),
        stat(
            "Server starts",
            "increase(llamacpp_server_starts_total[$__range]): llama-server starts seen in the log in the time "
            "range; several in a few minutes is a crash loop (LlamaCppServerRestarting).",
            q("sum by ({BY}) (increase(llamacpp_server_starts_total{S}[$__range]))", "{W}"),
            unit="short",
            steps=thresholds((None, GREEN), (1, ORANGE), (3, RED)),
            decimals=0,
        ),
    ]
    for panel in second:
        lay.add(panel, 6, 4)

    lay.row("KV pool forecast")
    lay.add(
        timeseries(
            "KV pool: used vs demand vs capacity" + OF_MODEL,
            'llamacpp_kv_pool_used_tokens (cells held now), llamacpp_kv_pool_demand_tokens{horizon="prompt"} '
            "(what the requests in flight hold once their prompts are read: above the capacity the abort is "
            "certain unless a request ends first, and LlamaCppKVPoolOverflowAhead pages), "
            'llamacpp_kv_pool_demand_tokens{horizon="limits"} (plus the generation budgets their clients set: '
            'LlamaCppKVPoolOverflowPossible), llamacpp_kv_pool_demand_tokens{horizon="max"} (at most: a request '
            "without a limit counts its whole window) and llamacpp_kv_pool_capacity_tokens (red line).",
            [
                q("llamacpp_kv_pool_used_tokens{S}", "{W} used", "A"),
                q('llamacpp_kv_pool_demand_tokens{S, horizon="prompt"}', "{W} demand (prompts)", "B"),
                q('llamacpp_kv_pool_demand_tokens{S, horizon="limits"}', "{W} demand (at their limits)", "E"),
                q('llamacpp_kv_pool_demand_tokens{S, horizon="max"}', "{W} demand (at most)", "C"),
                q("llamacpp_kv_pool_capacity_tokens{S}", "{W} capacity", "D"),
            ],
            unit="short",
            axis_label="tokens (KV cells)",
            overrides=[
                capacity_line("D"),
                {
                    "matcher": {"id": "byFrameRefID", "options": "C"},
                    "properties": [
                        {"id": "custom.fillOpacity", "value": 0},
                        {"id": "custom.lineStyle", "value": {"dash": [2, 4], "fill": "dot"}},
                    ],
                },
            ],
        ),
        14,
        8,
    )
    lay.add(
        per_instance(timeseries(
            "Demand per slot" + OF_MODEL,
            'llamacpp_slot_demand_tokens{horizon="prompt"}: the cells each request in flight will hold once its '
            "prompt is read (0 for an idle slot). The largest band is the request to cancel when the pool "
            "would overflow. llamacpp_kv_pool_demand_slots says how the sizes are known (new_prompt at -lv 4, "
            "progress lines, or held: not known yet).",
            [q('llamacpp_slot_demand_tokens{S, horizon="prompt"}', "{W} slot {{slot}}")],
            unit="short",
            stack=True,
            axis_label="tokens (KV cells)",
        )),
        10,
        8,
    )  # fmt: skip

    lay.row("KV pool")
    lay.add(
        per_instance(timeseries(
            "KV pool: tokens per slot vs capacity" + OF_MODEL,
            "llamacpp_slot_tokens (stacked, one band per slot: KV cells each slot holds, idle slots keep theirs "
            "until cleared) against llamacpp_kv_pool_capacity_tokens (red line). When the stack reaches the "
            "line, llama-server runs the retry cascade and aborts every in-flight request.",
            [
                q("llamacpp_slot_tokens{S}", "{W} slot {{slot}}", "A"),
                q("llamacpp_kv_pool_capacity_tokens{S}", "{W} pool capacity", "B"),
            ],
            unit="short",
            stack=True,
            axis_label="tokens (KV cells)",
            overrides=[capacity_line("B", unstacked=True)],
        )),
        16,
        9,
    )  # fmt: skip
    lay.add(
        timeseries(
            "KV pool usage" + OF_MODEL,
            "llamacpp_kv_pool_usage_ratio (used / capacity) with the 90% line at which LlamaCppKVPoolSaturated pages.",
            [q("llamacpp_kv_pool_usage_ratio{S}", "{W}")],
            unit="percentunit",
            max_=1,
            threshold_steps=thresholds((None, GREEN), (KV_SATURATED_RATIO, RED)),
            threshold_style="line+area",
        ),
        8,
        9,
    )
    lay.add(
        timeseries(
            "KV retries, cascades and aborted requests" + OF_MODEL,
            "Events per interval: increase of llamacpp_kv_retries_total ('retrying with smaller batch size' "
            "lines), llamacpp_kv_cascades_total by outcome (recovered/failed), llamacpp_context_exceeded_total "
            "and llamacpp_requests_aborted_total (requests answered with an error).",
            [
                q("sum by ({BY}) (increase(llamacpp_kv_retries_total{S}[$__rate_interval]))", "{W} retries", "A"),
                q(
                    "sum by ({BY}, outcome) (increase(llamacpp_kv_cascades_total{S}[$__rate_interval]))",
                    "{W} cascade {{outcome}}",
                    "B",
                ),
                q(
                    "sum by ({BY}) (increase(llamacpp_context_exceeded_total{S}[$__rate_interval]))",
                    "{W} context exceeded",
                    "C",
                ),
                q(
                    "sum by ({BY}, reason) (increase(llamacpp_requests_aborted_total{S}[$__rate_interval]))",
                    "{W} aborted ({{reason}})",
                    "D",
                ),
            ],
            unit="short",
            bars=True,
        ),
        12,
        8,
    )
    lay.add(
        timeseries(
            "Overcommit" + OF_MODEL,
            "llamacpp_kv_pool_overcommit_ratio: what the slots were promised (slots x n_ctx_slot) over what the "
            "pool holds. 1 = every promise can be kept (line); 4 = four slots share one window.",
            [q("llamacpp_kv_pool_overcommit_ratio{S}", "{W}")],
            unit="suffix:×",
            threshold_steps=thresholds((None, GREEN), (1.01, ORANGE)),
            threshold_style="line",
        ),
        6,
        8,
    )
    lay.add(
        state_timeline(
            "Slots processing" + OF_MODEL,
            "llamacpp_slot_processing: 1 while the slot has a task.",
            [q("llamacpp_slot_processing{S}", "{W} slot {{slot}}")],
            mappings=BUSY_MAP,
            steps=thresholds((None, "transparent"), (1, BLUE)),
        ),
        6,
        8,
    )

    # ------------------------------------------------------------------ memory
    lay.row("Memory")
    lay.add(
        timeseries(
            "Free VRAM per GPU",
            "llamacpp_gpu_memory_free_bytes per GPU (NVML) with the 512 MiB headroom line of "
            "LlamaCppVRAMHeadroomLow: below it the next compute-buffer allocation can fail.",
            [q("llamacpp_gpu_memory_free_bytes{G}", "{{instance}} GPU {{gpu}} {{name}}")],
            unit="bytes",
            threshold_steps=thresholds((None, RED), (VRAM_HEADROOM_BYTES, "transparent")),
            threshold_style="line+area",
        ),
        8,
        8,
    )
    lay.add(
        bargauge(
            "GPU memory by server",
            "Per GPU: each llama-server's own VRAM (llamacpp_process_gpu_memory_bytes, by server and model: a "
            "router's children are one bar each) next to the GPU's free memory (llamacpp_gpu_memory_free_bytes, "
            "red below the 512 MiB headroom of LlamaCppVRAMHeadroomLow). Servers listed under one GPU share it: "
            "a new model or a longer context on one of them takes the others' headroom.",
            [
                q(
                    "label_replace(sum by (instance, gpu, server, model) (llamacpp_process_gpu_memory_bytes{S}),"
                    ' "what", "llama-server", "", "")\n'
                    "or label_replace(sum by (instance, gpu) (llamacpp_gpu_memory_free_bytes{G}),"
                    ' "what", "free", "", "")',
                    "{{instance}} GPU {{gpu}} {{what}} {{server}} {{model}}",
                )
            ],
            unit="bytes",
            overrides=[
                {
                    "matcher": {"id": "byRegexp", "options": ".* free\\s*$"},
                    "properties": [
                        {"id": "color", "value": {"mode": "thresholds"}},
                        {"id": "thresholds", "value": thresholds((None, RED), (VRAM_HEADROOM_BYTES, GREEN))},
                    ],
                }
            ],
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "GPU memory: llama-server vs card",
            "llamacpp_process_gpu_memory_bytes (llama-server's own VRAM), llamacpp_gpu_memory_used_bytes and "
            "llamacpp_gpu_memory_total_bytes per GPU (NVML).",
            [
                q("llamacpp_process_gpu_memory_bytes{S}", "{W} GPU {{gpu}} llama-server", "A"),
                q("llamacpp_gpu_memory_used_bytes{G}", "{{instance}} GPU {{gpu}} used", "B"),
                q("llamacpp_gpu_memory_total_bytes{G}", "{{instance}} GPU {{gpu}} total", "C"),
            ],
            unit="bytes",
        ),
        8,
        8,
    )
    lay.add(
        per_instance(timeseries(
            "Host RAM: checkpoints + prompt cache vs available",
            "Stacked: llamacpp_checkpoint_bytes (all slots' context checkpoints) and llamacpp_prompt_cache_bytes "
            "(host-RAM prompt cache), against llamacpp_prompt_cache_limit_bytes (--cache-ram), "
            "llamacpp_host_memory_available_bytes (MemAvailable) and llamacpp_process_resident_memory_bytes "
            "(llama-server RSS).",
            [
                q("sum by ({BY}) (llamacpp_checkpoint_bytes{S})", "{W} checkpoints", "A"),
                q("llamacpp_prompt_cache_bytes{S}", "{W} prompt cache", "B"),
                q("llamacpp_prompt_cache_limit_bytes{S}", "{W} prompt cache limit", "C"),
                q("llamacpp_host_memory_available_bytes{G}", "{{instance}} available", "D"),
                q("llamacpp_process_resident_memory_bytes{S}", "{W} llama-server RSS", "E"),
            ],
            unit="bytes",
            stack=True,
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": ref},
                    "properties": [
                        {"id": "custom.stacking", "value": {"group": ref, "mode": "none"}},
                        {"id": "custom.fillOpacity", "value": 0},
                        {"id": "custom.lineWidth", "value": 2},
                    ],
                }
                for ref in ("C", "D", "E")
            ],
        )),
        8,
        8,
    )  # fmt: skip
    lay.add(
        timeseries(
            "Context checkpoints",
            "llamacpp_checkpoints per slot (live context checkpoints, SWA/hybrid models) and the rate of "
            "llamacpp_checkpoint_events_total by event (created, restored, invalidated, evicted).",
            [
                q("llamacpp_checkpoints{S}", "{W} slot {{slot}}", "A"),
                q(
                    "sum by ({BY}, event) (increase(llamacpp_checkpoint_events_total{S}[$__rate_interval]))",
                    "{W} {{event}}",
                    "B",
                ),
            ],
            unit="short",
        ),
        8,
        8,
    )
    lay.add(
        per_instance(timeseries(
            "KV cache memory",
            "llamacpp_kv_cache_bytes by kind (k, v): KV cache memory from llama-server's size line.",
            [q("llamacpp_kv_cache_bytes{S}", "{W} {{kind}}")],
            unit="bytes",
            stack=True,
        )),
        8,
        8,
    )  # fmt: skip

    # ------------------------------------------------------------------ requests
    lay.row("Requests")
    lay.add(
        timeseries(
            "Prompt evaluation time",
            "Quantiles and mean of llamacpp_prompt_eval_seconds (histogram): time llama-server spent evaluating "
            "each prompt. Jumps mean full re-processing (cache misses, invalidated checkpoints).",
            [
                q(
                    "histogram_quantile(0.5, sum by ({BY}, le) "
                    "(rate(llamacpp_prompt_eval_seconds_bucket{S}[$__rate_interval])))",
                    "{W} p50",
                    "A",
                ),
                q(
                    "histogram_quantile(0.95, sum by ({BY}, le) "
                    "(rate(llamacpp_prompt_eval_seconds_bucket{S}[$__rate_interval])))",
                    "{W} p95",
                    "B",
                ),
                q(
                    "sum by ({BY}) (rate(llamacpp_prompt_eval_seconds_sum{S}[$__rate_interval]))\n"
                    "/ sum by ({BY}) (rate(llamacpp_prompt_eval_seconds_count{S}[$__rate_interval]))",
                    "{W} mean",
                    "C",
                ),
            ],
            unit="s",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Tokens per second",
            "rate of llamacpp_prompt_tokens_total (prompt tokens evaluated) and llamacpp_generated_tokens_total "
            "(tokens generated).",
            [
                q("sum by ({BY}) (rate(llamacpp_prompt_tokens_total{S}[$__rate_interval]))", "{W} prompt", "A"),
                q("sum by ({BY}) (rate(llamacpp_generated_tokens_total{S}[$__rate_interval]))", "{W} generated", "B"),
            ],
            unit="short",
            axis_label="tokens/s",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Full prompt re-processing",
            "increase of llamacpp_full_reprocess_total ('forcing full prompt re-processing'): a request had to "
            "evaluate its whole prompt again, usually after its checkpoints or cache entry were lost.",
            [q("sum by ({BY}) (increase(llamacpp_full_reprocess_total{S}[$__rate_interval]))", "{W}")],
            unit="short",
            bars=True,
        ),
        8,
        8,
    )

    # ------------------------------------------------------------------ request sizes
    lay.row("Request sizes: is the pool big enough?")
    lay.add(
        per_instance(
            {
                "type": "heatmap",
                "title": "Request sizes",
                "description": "How many requests ended at each size: llamacpp_request_tokens_bucket (histogram), the "
                "KV cells each request held at its release line, aborted ones included. Long requests that run "
                "together are what overflows a shared pool.",
                "datasource": DS,
                "targets": [
                    q(
                        "sum by ({BY}, le) (increase(llamacpp_request_tokens_bucket{S}[$__rate_interval]))",
                        "",  # Format as heatmap: the buckets are the `le` label
                        "A",
                        format="heatmap",
                    )
                ],
                "fieldConfig": {"defaults": {"unit": "short"}, "overrides": []},
                "options": {
                    "calculate": False,
                    "cellGap": 1,
                    "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                    "yAxis": {"axisPlacement": "left", "unit": "short"},
                    "rowsFrame": {"layout": "auto"},
                    "tooltip": {"mode": "single", "yHistogram": False},
                    "legend": {"show": True},
                },
            }
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "Requests in flight together",
            "llamacpp_requests_in_flight (slots with a task, now) and the p99 over the last day of "
            "llamacpp_request_concurrency_bucket (histogram; recorded as "
            "instance:llamacpp_request_concurrency:p99_1d): how many requests ran at once, sampled at each start.",
            [
                q("sum by ({BY}) (llamacpp_requests_in_flight{S})", "{W} now", "A"),
                q("max by ({BY}) (instance:llamacpp_request_concurrency:p99_1d{S})", "{W} p99 (1d)", "B"),
            ],
            unit="short",
            axis_label="requests",
        ),
        8,
        8,
    )
    lay.add(
        timeseries(
            "The pool you need and the pool you have" + OF_MODEL,
            "The p99 request size times the p99 number of requests in flight together over the last day "
            "(instance:llamacpp_kv_pool_needed_tokens:p99_1d, recorded from llamacpp_request_tokens and "
            "llamacpp_request_concurrency), against llamacpp_kv_pool_capacity_tokens. Needed above capacity for "
            "hours: LlamaCppKVPoolUndersized (see its runbook for the fixes).",
            [
                q("max by ({BY}) (instance:llamacpp_kv_pool_needed_tokens:p99_1d{S})", "{W} needed (p99 x p99)", "A"),
                q("max by ({BY}) (llamacpp_kv_pool_capacity_tokens{S})", "{W} pool", "B"),
            ],
            unit="short",
            axis_label="KV cells",
        ),
        8,
        8,
    )

    # ------------------------------------------------------------------ server
    lay.row("Server")
    lay.add(
        state_timeline(
            "Up / loading",
            "llamacpp_up (1 = /health answers 200) and llamacpp_server_loading (1 = 503 Loading model).",
            [
                q("llamacpp_up{S}", "{W} up", "A"),
                q("llamacpp_server_loading{S}", "{W} loading", "B"),
            ],
            mappings=value_map(("0", "no", "transparent"), ("1", "yes", GREEN)),
            steps=thresholds((None, "transparent"), (1, GREEN)),
        ),
        8,
        7,
    )
    lay.add(
        timeseries(
            "Server starts",
            "increase of llamacpp_server_starts_total: llama-server starts seen in its log (truncated log file, "
            "new banner). Several in a few minutes is a crash loop.",
            [q("sum by ({BY}) (increase(llamacpp_server_starts_total{S}[$__rate_interval]))", "{W}")],
            unit="short",
            bars=True,
        ),
        8,
        7,
    )
    info = {
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
    lay.add(info, 8, 7)

    # ------------------------------------------------------------------ router
    lay.row("Router (llama-server router mode)")
    lay.add(
        timeseries(
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
        ),
        12,
        7,
    )
    lay.add(
        timeseries(
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
                    "sum by (instance, server, outcome) "
                    "(increase(llamacpp_router_child_exits_total{R}[$__rate_interval]))",
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
        ),
        12,
        7,
    )

    # ------------------------------------------------------------------ exporter
    lay.row("Exporter health")
    lay.add(
        state_timeline(
            "Exporter sources",
            "llamacpp_exporter_source_up by source (log, http, proc, nvml): 1 when the last read worked. Metrics "
            "from a source that is down are missing or stale (LlamaCppExporterSourceDown).",
            [q("llamacpp_exporter_source_up{S}", "{W} {{source}}")],
            mappings=UP_MAP,
            steps=thresholds((None, RED), (1, GREEN)),
        ),
        8,
        7,
    )
    lay.add(
        timeseries(
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
        ),
        8,
        7,
    )
    lay.add(
        timeseries(
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
        ),
        8,
        7,
    )
    return lay.panels


def templating() -> dict[str, Any]:
    def query_var(name: str, label: str, query: str, all_value: str = ".+") -> dict[str, Any]:
        return {
            "type": "query",
            "name": name,
            "label": label,
            "datasource": DS,
            "definition": query,
            "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,
            "regex": "",
            "sort": 1,
            "multi": True,
            "includeAll": True,
            "allValue": all_value,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "hide": 0,
            "options": [],
        }

    return {
        "list": [
            {
                "type": "datasource",
                "name": "datasource",
                "label": "Data Source",
                "query": "prometheus",
                "regex": "",
                "refresh": 1,
                "hide": 0,
                "current": {},
                "options": [],
            },
            query_var("job", "job", "label_values(llamacpp_exporter_build_info, job)"),
            query_var("instance", "instance", 'label_values(llamacpp_exporter_build_info{job=~"$job"}, instance)'),
            # One exporter, several servers (server="<name>") or a router's children (model="<model>"). With
            # one server the labels are absent: no values, and "All" (.*) matches the series without them.
            query_var(
                "server",
                "server",
                'label_values(llamacpp_slots{job=~"$job", instance=~"$instance"}, server)',
                all_value=".*",
            ),
            query_var(
                "model",
                "model",
                'label_values(llamacpp_slots{job=~"$job", instance=~"$instance", server=~"$server"}, model)',
                all_value=".*",
            ),
        ]
    }


def annotation_list() -> dict[str, Any]:
    def ann(name: str, expr: str, color: str, title: str) -> dict[str, Any]:
        return {
            "datasource": DS,
            "enable": True,
            "hide": False,
            "iconColor": color,
            "name": name,
            "expr": selectors(expr),
            "step": "15s",
            "titleFormat": title,
            "tagKeys": "instance,server,model",
            "useValueForTime": False,
        }

    return {
        "list": [
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            },
            ann(
                "Context size exceeded",
                "sum by ({BY}) (increase(llamacpp_context_exceeded_total{S}[$__rate_interval])) > 0",
                RED,
                "Context size exceeded: every in-flight request aborted",
            ),
            ann(
                "llama-server start",
                "sum by ({BY}) (increase(llamacpp_server_starts_total{S}[$__rate_interval])) > 0",
                BLUE,
                "llama-server started",
            ),
            ann(
                "Firing alerts",
                'ALERTS{S, alertname=~"LlamaCpp.*", alertstate="firing"}',
                ORANGE,
                "{{alertname}}",
            ),
        ]
    }


def build() -> dict[str, Any]:
    """The dashboard as a dict (what Grafana's JSON model expects)."""
    return {
        "uid": UID,
        "title": "llama.cpp server (llamacpp-exporter)",
        "description": "llama-server's slots, shared KV pool, retry cascades, VRAM and host RAM, from "
        "llamacpp-exporter. Rules and runbook: alerts/.",
        "tags": ["llama.cpp", "llamacpp-exporter", "llm"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [],
        "annotations": annotation_list(),
        "templating": templating(),
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the Grafana dashboard for llamacpp-exporter.")
    parser.add_argument("-o", "--output", type=Path, default=DASHBOARD_FILE, help=f"default {DASHBOARD_FILE}")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file differs from the rendering")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is not up to date: run python dashboards/generate_dashboard.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
