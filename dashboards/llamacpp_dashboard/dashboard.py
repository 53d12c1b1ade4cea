"""The dashboard: its rows in order, the variables, the annotations, and the JSON Grafana reads."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from llamacpp_dashboard import glance, gpu, guard, kv_pool, latency, memory, requests, server
from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import BLUE, ORANGE, RED
from llamacpp_dashboard.query import DS, selectors

UID = "llamacpp-exporter"
#: Every row, top to bottom.
ROWS: tuple[Callable[[Layout], None], ...] = (
    glance.at_a_glance,
    kv_pool.kv_pool_forecast,
    kv_pool.kv_pool,
    memory.memory,
    gpu.gpu,
    requests.requests,
    latency.latency,
    requests.request_sizes,
    server.server,
    server.router,
    guard.guard,
    server.exporter_health,
)


def panels() -> list[dict[str, Any]]:
    """Every row and panel, placed and numbered."""
    lay = Layout()
    for row in ROWS:
        row(lay)
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
