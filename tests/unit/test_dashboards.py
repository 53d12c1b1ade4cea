"""The Grafana dashboard in dashboards/: generated file up to date, a structural round trip through
grafana-foundation-sdk (Grafana's own typed models), dashboard-linter's conventions, what the seed
incident needs to be visible at a glance, and the provisioning files.

That every query returns data from a real Prometheus scraping the real exporter is checked in
test_prometheus_e2e.py; that every metric it names is emitted, in test_alerts_metric_names.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import REPO
from prom_harness import collector_samples, dashboard_queries, load_script, metric_names_in

from exporter.guard.admission import Admission, Pool, Ticket
from exporter.guard.books import OUTCOMES, GuardBooks, GuardCollector

ROOT = REPO
DASHBOARD = ROOT / "dashboards" / "llamacpp.json"
PROVISIONING = ROOT / "dashboards" / "provisioning"
dashboard_generator = load_script(ROOT / "dashboards" / "generate_dashboard.py")

#: Series that are one per host or per exporter target, never per llama-server: never filtered by the
#: server and model variables (a GPU's free memory is the same whichever server is selected).
GLOBAL_METRICS = {
    "llamacpp_gpu_memory_total_bytes",
    "llamacpp_gpu_memory_used_bytes",
    "llamacpp_gpu_memory_free_bytes",
    "llamacpp_host_memory_available_bytes",
    "llamacpp_host_memory_total_bytes",
    "llamacpp_exporter_build_info",
    "up",
    "scrape_duration_seconds",
}
SERVER_FILTER = 'server=~"$server"'
MODEL_FILTER = 'model=~"$model"'
#: The router's own families: labelled `server` (when several), never `model`.
ROUTER_METRICS = {
    "llamacpp_router_children",
    "llamacpp_router_children_limit",
    "llamacpp_router_child_starts_total",
    "llamacpp_router_child_exits_total",
    "llamacpp_router_children_refused_total",
}
#: The guard's families (exporter/guard/books.py): it fronts one llama-server, so they are one per exporter
#: target, never labelled server or model, and filtered by job and instance only.
GUARD_METRICS = {
    "llamacpp_guard_requests_total",
    "llamacpp_guard_queue_requests",
    "llamacpp_guard_in_flight_requests",
    "llamacpp_guard_queue_wait_seconds_bucket",
    "llamacpp_guard_queue_wait_seconds_sum",
    "llamacpp_guard_queue_wait_seconds_count",
    "llamacpp_guard_admitted_demand_tokens",
    "llamacpp_guard_admitted_prompt_tokens",
    "llamacpp_guard_pool_limit_tokens",
}

#: Keys that Grafana's Prometheus plugin stores on annotations and query variables but that are not
#: part of the core dashboard schema the SDK models (so its round trip drops them).
PLUGIN_KEYS = {"builtIn", "step", "titleFormat", "tagKeys", "useValueForTime", "definition"}


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return doc


def _panels() -> list[dict[str, Any]]:
    return [p for p in _dashboard()["panels"] if p["type"] != "row"]


def _lost_in_round_trip(original: Any, back: Any, path: str = "$") -> list[str]:
    """Every key/value of ``original`` that ``back`` does not carry unchanged (``back`` may add defaults)."""
    if isinstance(original, dict):
        if not isinstance(back, dict):
            return [f"{path}: became {type(back).__name__}"]
        out: list[str] = []
        for key, value in original.items():
            if key not in back:
                if key not in PLUGIN_KEYS:
                    out.append(f"{path}.{key}: dropped")
                continue
            out += _lost_in_round_trip(value, back[key], f"{path}.{key}")
        return out
    if isinstance(original, list):
        if not isinstance(back, list) or len(original) != len(back):
            return [f"{path}: list changed"]
        return [
            d
            for i, (a, b) in enumerate(zip(original, back, strict=True))
            for d in _lost_in_round_trip(a, b, f"{path}[{i}]")
        ]
    return [] if original == back else [f"{path}: {original!r} -> {back!r}"]


def test_dashboard_is_the_generator_output() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == dashboard_generator.render(), (
        "run: python dashboards/generate_dashboard.py"
    )


@pytest.mark.skipif(sys.version_info < (3, 11), reason="grafana-foundation-sdk needs Python 3.11")
def test_dashboard_round_trips_through_grafana_foundation_sdk() -> None:
    """Decode with the SDK's typed models (every panel type's options and field config, every Prometheus
    target) and encode again: nothing may be lost or changed except the plugin-level keys above."""
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel
    from grafana_foundation_sdk.models.prometheus import Dataquery

    plugins.register_default_plugins()
    original = _dashboard()
    model = Dashboard.from_json(original)
    assert model.uid == "llamacpp-exporter"
    assert model.panels is not None and len(model.panels) == len(original["panels"])
    for panel in model.panels:
        if isinstance(panel, RowPanel):
            continue
        assert isinstance(panel, Panel)
        assert panel.targets and all(isinstance(t, Dataquery) for t in panel.targets), panel.title
        assert type(panel.options).__module__.endswith(panel.type_val.replace("-", "")), (panel.type_val, panel.options)
    back = json.loads(json.dumps(model, cls=JSONEncoder))
    assert _lost_in_round_trip(original, back) == []


def test_stable_uid_and_variables() -> None:
    d = _dashboard()
    assert d["uid"] == "llamacpp-exporter" and 8 <= len(d["uid"]) <= 40
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "instance", "server", "model"]
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus" and ds["label"] == "Data Source"
    for name in ("job", "instance", "server", "model"):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert v["multi"] and v["includeAll"] and v["refresh"] == 2
        # "All" for server and model is .*: it also matches the series of a lone server, which have no such label.
        assert v["allValue"] == (".+" if name in ("job", "instance") else ".*"), name
    assert '{job=~"$job"}' in variables["instance"]["query"]["query"]
    assert variables["server"]["query"]["query"] == (
        'label_values(llamacpp_slots{job=~"$job", instance=~"$instance"}, server)'
    )
    assert variables["model"]["query"]["query"] == (
        'label_values(llamacpp_slots{job=~"$job", instance=~"$instance", server=~"$server"}, model)'
    )


def test_every_panel_has_units_a_description_naming_its_metrics_and_filtered_queries() -> None:
    for panel in _panels():
        title = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        description = panel.get("description", "")
        assert len(description) > 30, f"{title}: no description"
        assert panel["targets"], title
        for target in panel["targets"]:
            expr = target["expr"]
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
            for name in metric_names_in(expr):
                base = re.sub(r"_(bucket|sum|count)$", "", name) if "_seconds_" in name else name
                assert base in description, f"{title}: the description does not name {base}"
            # dashboard-linter: every selector filters by job and instance; rates use $__rate_interval.
            selectors = re.findall(r"[a-zA-Z_:][\w:]*\{[^}]*\}", expr)
            assert selectors, f"{title}: {expr}"
            for selector in selectors:
                # ALERTS also lists the alerts about a host or a GPU, which carry no instance label.
                instance = 'instance=~"$instance|"' if selector.startswith("ALERTS{") else 'instance=~"$instance"'
                assert 'job=~"$job"' in selector and instance in selector, f"{title}: {selector}"
            _check_server_and_model(title, target)
            for window in re.findall(r"\[([^\]]+)\]", expr):
                assert window in ("$__rate_interval", "$__range"), f"{title}: fixed window [{window}]"


def _check_server_and_model(title: str, target: dict[str, Any]) -> None:
    """A per-server series is filtered by the server and model variables, keeps both labels through every
    aggregation and shows them in its legend; a series that is one per host or target (GPU memory) is not
    filtered by them; a router's own series only by server."""
    expr, legend = target["expr"], target["legendFormat"]
    per_server = False
    for selector in re.findall(r"[a-zA-Z_:][\w:]*\{[^}]*\}", expr):
        name = selector.split("{", 1)[0]
        if name in GLOBAL_METRICS | GUARD_METRICS:
            assert SERVER_FILTER not in selector and MODEL_FILTER not in selector, f"{title}: {selector}"
        elif name in ROUTER_METRICS:
            assert SERVER_FILTER in selector and MODEL_FILTER not in selector, f"{title}: {selector}"
            assert legend == "" or "{{server}}" in legend, f"{title}: legend {legend!r}"
        else:
            per_server = True
            assert SERVER_FILTER in selector and MODEL_FILTER in selector, f"{title}: {selector}"
    # Each `by (...)` with the first metric it aggregates: `sum by (instance) (increase(m{...}[...]))`.
    for grouping, name in re.findall(r"\bby \(([^)]*)\)\s*\((?:\s*\w+\()*\s*([a-zA-Z_:][\w:]*)\{", expr):
        kept = {label.strip() for label in grouping.split(",")}
        if name in ROUTER_METRICS:
            assert "server" in kept, f"{title}: by ({grouping}) ({name})"
        elif name not in GLOBAL_METRICS | GUARD_METRICS:
            assert {"server", "model"} <= kept, f"{title}: by ({grouping}) ({name})"
    if per_server:
        assert legend == "" or ("{{server}}" in legend and "{{model}}" in legend), f"{title}: legend {legend!r}"


def test_the_server_and_model_filters_catch_a_query_without_them() -> None:
    """Not vacuous: an unfiltered per-server query, a filtered GPU query and a legend without the model fail."""
    bad = [
        {"expr": 'llamacpp_kv_pool_usage_ratio{job=~"$job", instance=~"$instance"}', "legendFormat": "{{instance}}"},
        {
            "expr": 'llamacpp_gpu_memory_free_bytes{job=~"$job", instance=~"$instance", server=~"$server", '
            'model=~"$model"}',
            "legendFormat": "{{gpu}}",
        },
        {
            "expr": 'sum by (instance) (llamacpp_slot_tokens{job=~"$job", instance=~"$instance", server=~"$server", '
            'model=~"$model"})',
            "legendFormat": "{{instance}} {{server}} {{model}}",
        },
        {
            "expr": 'llamacpp_slot_tokens{job=~"$job", instance=~"$instance", server=~"$server", model=~"$model"}',
            "legendFormat": "{{instance}} {{server}} slot {{slot}}",
        },
    ]
    for target in bad:
        with pytest.raises(AssertionError):
            _check_server_and_model("bad", target)


def test_pool_panels_name_the_model_and_router_and_gpu_sharing_are_shown() -> None:
    """The KV pool panels' titles carry $model; one panel shows each server's VRAM per GPU next to the GPU's
    free memory (which servers share a GPU); the router's children, starts, exits and refusals are plotted."""
    pool = [p for p in _panels() if "llamacpp_kv_pool_capacity_tokens" in json.dumps(p["targets"])]
    assert len(pool) >= 2
    for panel in pool:
        assert panel["title"].endswith(" ($model)"), panel["title"]
    sharing = next(p for p in _panels() if p["title"] == "GPU memory by server")
    (target,) = sharing["targets"]
    assert metric_names_in(target["expr"]) == {"llamacpp_process_gpu_memory_bytes", "llamacpp_gpu_memory_free_bytes"}
    assert "by (instance, gpu, server, model)" in target["expr"]
    assert all(f"{{{{{label}}}}}" in target["legendFormat"] for label in ("gpu", "server", "model"))
    plotted = {
        n
        for p in _panels()
        if p["title"].startswith("Router")
        for t in p["targets"]
        for n in metric_names_in(t["expr"])
    }
    assert plotted == ROUTER_METRICS
    exits = _panel_with("llamacpp_router_child_exits_total")
    assert any("outcome" in t["expr"] and "{{outcome}}" in t["legendFormat"] for t in exits["targets"])


def _target(title: str, ref: str = "A") -> str:
    panel = next(p for p in _panels() if p["title"] == title)
    return str(next(t["expr"] for t in panel["targets"] if t["refId"] == ref))


def _substituted(expr: str, server: str = ".*", model: str = ".*") -> str:
    for var, value in (
        ("$__rate_interval", "5m"),
        ("$job", "llamacpp"),
        ("$instance", ".+"),
        ("$server", server),
        ("$model", model),
    ):
        expr = expr.replace(var, value)
    return expr


@pytest.mark.promtool
def test_queries_keep_servers_and_models_apart_in_prometheus(promtool_bin: Path, tmp_path: Path) -> None:
    """The real PromQL engine (promtool) runs the dashboard's queries over a router with two children and
    a lone server: the model variable selects one child, "All" also matches the lone server's unlabelled
    series, GPU memory by server lists each child's VRAM per GPU next to that GPU's free memory, and the
    router's panels read the router's own series."""
    job = 'job="llamacpp"'
    router, lone = f'{job}, instance="router-node:9778"', f'{job}, instance="single:9778"'
    series = {
        f'llamacpp_kv_pool_usage_ratio{{{router}, model="alpha"}}': "0.9",
        f'llamacpp_kv_pool_usage_ratio{{{router}, model="beta"}}': "0.1",
        f"llamacpp_kv_pool_usage_ratio{{{lone}}}": "0.5",
        f'llamacpp_process_gpu_memory_bytes{{{router}, model="alpha", gpu="0", uuid="GPU-a"}}': "6",
        f'llamacpp_process_gpu_memory_bytes{{{router}, model="beta", gpu="0", uuid="GPU-a"}}': "4",
        f'llamacpp_gpu_memory_free_bytes{{{router}, gpu="0", uuid="GPU-a", name="L4"}}': "2",
        f'llamacpp_gpu_memory_free_bytes{{{router}, gpu="1", uuid="GPU-b", name="L4"}}': "9",
        f"llamacpp_router_children{{{router}}}": "2",
        f'llamacpp_router_child_exits_total{{{router}, outcome="crashed"}}': "0+1x10",
        f'llamacpp_router_child_exits_total{{{router}, outcome="unloaded"}}': "0x10",
    }
    usage = _target("KV pool usage ($model)")
    gpu = _target("GPU memory by server")
    exits = _target("Router children: starts, exits, refused", "B")
    ratio = "llamacpp_kv_pool_usage_ratio"
    cases: list[tuple[str, dict[str, float]]] = [
        (_substituted(usage, model="alpha"), {f'{ratio}{{{router}, model="alpha"}}': 0.9}),
        (
            _substituted(usage),
            {
                f'{ratio}{{{router}, model="alpha"}}': 0.9,
                f'{ratio}{{{router}, model="beta"}}': 0.1,
                f"{ratio}{{{lone}}}": 0.5,
            },
        ),
        (
            _substituted(gpu),
            {
                '{gpu="0", instance="router-node:9778", model="alpha", what="llama-server"}': 6,
                '{gpu="0", instance="router-node:9778", model="beta", what="llama-server"}': 4,
                '{gpu="0", instance="router-node:9778", what="free"}': 2,
                '{gpu="1", instance="router-node:9778", what="free"}': 9,
            },
        ),
        (_substituted(_target("Router children")), {f"llamacpp_router_children{{{router}}}": 2}),
        (
            _substituted(exits),
            {
                '{instance="router-node:9778", outcome="crashed"}': 5,
                '{instance="router-node:9778", outcome="unloaded"}': 0,
            },
        ),
    ]
    _promtool_expressions(promtool_bin, tmp_path, series, cases)


def test_layout_has_unique_ids_and_no_overlaps() -> None:
    panels = _dashboard()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def _panel_with(*metrics: str) -> dict[str, Any]:
    """The one panel whose queries name all of ``metrics``."""
    found = [p for p in _panels() if set(metrics) <= {n for t in p["targets"] for n in metric_names_in(t["expr"])}]
    assert found, f"no panel plots {metrics}"
    return found[0]


def test_the_seed_incident_is_visible_at_a_glance() -> None:
    """Per-slot tokens stacked against the capacity line, usage with its 90% line, overcommit, events,
    VRAM with its headroom line, host RAM, prompt evaluation time, up/loading/restarts, exporter health."""
    slots = _panel_with("llamacpp_slot_tokens", "llamacpp_kv_pool_capacity_tokens")
    assert slots["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    (capacity_override,) = slots["fieldConfig"]["overrides"]
    props = {p["id"]: p["value"] for p in capacity_override["properties"]}
    assert props["custom.stacking"]["mode"] == "none" and props["custom.lineWidth"] == 2  # a line, not a band

    usage = next(p for p in _panels() if p["type"] == "timeseries" and p["title"] == "KV pool usage ($model)")
    defaults = usage["fieldConfig"]["defaults"]
    assert defaults["unit"] == "percentunit"
    assert defaults["custom"]["thresholdsStyle"]["mode"].startswith("line")
    assert {s["value"] for s in defaults["thresholds"]["steps"]} == {None, 0.9}

    _panel_with("llamacpp_kv_pool_overcommit_ratio")
    events = _panel_with(
        "llamacpp_kv_retries_total",
        "llamacpp_kv_cascades_total",
        "llamacpp_context_exceeded_total",
        "llamacpp_requests_aborted_total",
    )
    assert events["fieldConfig"]["defaults"]["custom"]["drawStyle"] == "bars"

    vram = next(p for p in _panels() if p["title"] == "Free VRAM per GPU")
    assert "{{gpu}}" in vram["targets"][0]["legendFormat"]
    assert 512 * 1024 * 1024 in {s["value"] for s in vram["fieldConfig"]["defaults"]["thresholds"]["steps"]}
    assert vram["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"].startswith("line")

    _panel_with("llamacpp_checkpoint_bytes", "llamacpp_prompt_cache_bytes", "llamacpp_host_memory_available_bytes")
    _panel_with("llamacpp_prompt_eval_seconds_bucket")
    _panel_with("llamacpp_up", "llamacpp_server_loading")
    _panel_with("llamacpp_server_starts_total")
    _panel_with("llamacpp_exporter_source_up")
    _panel_with("llamacpp_exporter_log_lines_total")
    annotations = {a["name"] for a in _dashboard()["annotations"]["list"]}
    assert {"Context size exceeded", "llama-server start", "Firing alerts"} <= annotations


def test_queries_are_all_found() -> None:
    assert len(dashboard_queries(_dashboard())) >= 45


def test_provisioning_loads_the_dashboard_with_no_clicks() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text(encoding="utf-8"))
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True and source["url"].startswith("http")
    prov = yaml.safe_load((PROVISIONING / "dashboards" / "llamacpp.yaml").read_text(encoding="utf-8"))
    assert prov["apiVersion"] == 1
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    # The datasource variable picks the default Prometheus: no uid has to match.
    assert _dashboard()["templating"]["list"][0]["current"] == {}


def _rows() -> list[tuple[str, list[dict[str, Any]]]]:
    """(row title, its panels) in order."""
    rows: list[tuple[str, list[dict[str, Any]]]] = []
    for p in _dashboard()["panels"]:
        if p["type"] == "row":
            rows.append((p["title"], []))
        else:
            rows[-1][1].append(p)
    return rows


def test_stat_targets_are_instant_only() -> None:
    """A stat shows the value now: with both `range` and `instant` Grafana runs two queries and every tile
    shows each series twice."""
    stats = [p for p in _panels() if p["type"] == "stat"]
    assert len(stats) >= 8
    for panel in stats:
        for target in panel["targets"]:
            assert target.get("instant") is True and target.get("range") is False, panel["title"]


def test_the_top_row_says_what_is_wrong_now() -> None:
    """First row, first line: the firing alerts, the demand ratio, the time to full, the pool usage and the
    server's state; loading is orange (not down), an exporter that cannot be scraped is red."""
    title, top = _rows()[0]
    assert title == "At a glance"
    first_line = [p for p in top if p["gridPos"]["y"] == top[0]["gridPos"]["y"]]
    names = [n for p in first_line for t in p["targets"] for n in metric_names_in(t["expr"])]
    assert "ALERTS" in names and first_line[0]["type"] == "table"
    assert 'alertstate="firing"' in first_line[0]["targets"][0]["expr"]
    demand = next(p for p in first_line if "llamacpp_kv_pool_demand_ratio" in p["targets"][0]["expr"])
    assert 'horizon="prompt"' in demand["targets"][0]["expr"]
    assert 1.0 in {s["value"] for s in demand["fieldConfig"]["defaults"]["thresholds"]["steps"]}
    assert any("llamacpp_kv_pool_full_eta_seconds" in p["targets"][0]["expr"] for p in first_line)
    server = next(p for p in first_line if p["title"] == "llama-server")
    (mapping,) = server["fieldConfig"]["defaults"]["mappings"]
    shown = {value: (m["text"], m["color"]) for value, m in mapping["options"].items()}
    assert shown["2"] == ("loading", "orange") and shown["0"] == ("down", "red")
    assert shown["-1"] == ("exporter down", "red") and shown["1"] == ("up", "green")
    assert "(up{" in server["targets"][0]["expr"] and "== 0) * 0 - 1" in server["targets"][0]["expr"]


def test_stacked_panels_stack_one_instance_each() -> None:
    """Stacked series add up: under "All" they would add up every instance's slots into one pool. Every
    stacked panel is repeated per instance instead."""
    stacked = [
        p
        for p in _panels()
        if p["type"] == "timeseries" and p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] != "none"
    ]
    assert len(stacked) >= 4
    for panel in stacked:
        assert panel.get("repeat") == "instance" and "$instance" in panel["title"], panel["title"]


@pytest.mark.promtool
def test_the_top_row_queries_in_prometheus(promtool_bin: Path, tmp_path: Path) -> None:
    """The real PromQL engine runs the llama-server tile, the time to full and the alert list: up 1, loading
    2, exporter down -1; no ETA is 'not filling' (-1); an alert without an instance (a GPU's) is listed."""
    job = 'job="llamacpp"'
    series = {
        f'up{{{job}, instance="a:9778"}}': "1x10",
        f'llamacpp_up{{{job}, instance="a:9778"}}': "1x10",
        f'llamacpp_server_loading{{{job}, instance="a:9778"}}': "0x10",
        f'llamacpp_kv_pool_used_tokens{{{job}, instance="a:9778"}}': "100x10",
        f'up{{{job}, instance="b:9778"}}': "1x10",
        f'llamacpp_up{{{job}, instance="b:9778"}}': "0x10",
        f'llamacpp_server_loading{{{job}, instance="b:9778"}}': "1x10",
        f'llamacpp_kv_pool_used_tokens{{{job}, instance="b:9778"}}': "100x10",
        f'llamacpp_kv_pool_full_eta_seconds{{{job}, instance="b:9778"}}': "42x10",
        f'up{{{job}, instance="c:9778"}}': "0x10",
        f'ALERTS{{{job}, alertname="LlamaCppVRAMHeadroomLow", alertstate="firing", host="a", severity="warning"}}': "1x10",
        f'ALERTS{{{job}, alertname="LlamaCppKVPoolSaturated", alertstate="pending", instance="a:9778"}}': "1x10",
    }
    top = _rows()[0][1]
    server = next(p for p in top if p["title"] == "llama-server")["targets"][0]["expr"]
    eta = next(p for p in top if p["title"] == "Pool full in")["targets"][0]["expr"]
    alerts = next(p for p in top if p["title"] == "Firing alerts")["targets"][0]["expr"]
    cases: list[tuple[str, dict[str, float]]] = [
        (
            _substituted(server),
            {
                f'{{{job}, instance="a:9778"}}': 1,
                f'{{{job}, instance="b:9778"}}': 2,
                f'{{{job}, instance="c:9778"}}': -1,
            },
        ),
        (
            _substituted(eta),
            {
                f'{{{job}, instance="a:9778"}}': -1,
                f'llamacpp_kv_pool_full_eta_seconds{{{job}, instance="b:9778"}}': 42,
            },
        ),
        (
            _substituted(alerts),
            {
                f'ALERTS{{{job}, alertname="LlamaCppVRAMHeadroomLow", alertstate="firing", host="a", '
                'severity="warning"}': 1
            },
        ),
    ]
    _promtool_expressions(promtool_bin, tmp_path, series, cases)


def _promtool_expressions(
    promtool_bin: Path, tmp_path: Path, series: dict[str, str], cases: list[tuple[str, dict[str, float]]]
) -> None:
    """Evaluate each query at 5m over `series` (one sample a minute) with promtool; each gives its samples."""
    tests = {
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": name, "values": values} for name, values in series.items()],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "5m",
                        "exp_samples": [{"labels": labels, "value": value} for labels, value in expected.items()],
                    }
                    for expr, expected in cases
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [str(promtool_bin), "test", "rules", "tests.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def _guard_collector() -> GuardCollector:
    """The guard's real collector over real books and admission: per minute, 120 requests admitted, 60 queued,
    6 refused, 3 preempted and replayed; waits of 0.5 s (240), 2.5 s (120) and 20.75 s (240); now one request of
    400 + 100 tokens in flight and one waiting, on a pool of 1000 cells."""
    books = GuardBooks()
    for outcome, n in (("admitted", 120), ("queued", 60), ("refused", 6), ("preempted", 3), ("replayed", 3)):
        for _ in range(n):
            books.count(outcome)
    for seconds, n in ((0.5, 240), (2.5, 120), (20.75, 240)):
        for _ in range(n):
            books.waited(seconds)
    admission, pool = Admission(max_queue=2, max_wait=60.0), Pool(capacity=1000, slot_window=1000, unified=True)
    assert admission.offer(Ticket(1, prompt=400, budget=100), pool, now=0.0).kind == "admit"
    assert admission.offer(Ticket(2, prompt=450, budget=100), pool, now=0.0).kind == "queue"
    return GuardCollector(books, lambda: [admission], lambda: pool.limit)


def _guard_row() -> list[dict[str, Any]]:
    (panels,) = [panels for title, panels in _rows() if title.startswith("Guard")]
    return panels


def test_the_guard_row_plots_what_the_guard_exports() -> None:
    """One row for the guard: its requests by outcome (a rate), its queue, the queue wait's quantiles and the
    demand it admitted against its pool limit; every name it queries is one the guard's collector exports."""
    panels = _guard_row()
    exported = {sample.name for sample in collector_samples(_guard_collector())}
    queried = {n for p in panels for t in p["targets"] for n in metric_names_in(t["expr"])}
    assert queried == GUARD_METRICS and exported >= GUARD_METRICS, (queried ^ GUARD_METRICS, GUARD_METRICS - exported)
    outcomes = _panel_with("llamacpp_guard_requests_total")
    assert "rate(" in outcomes["targets"][0]["expr"] and "{{outcome}}" in outcomes["targets"][0]["legendFormat"]
    wait = _panel_with("llamacpp_guard_queue_wait_seconds_bucket")
    assert sum("histogram_quantile(" in t["expr"] for t in wait["targets"]) == 2
    pool = _panel_with("llamacpp_guard_admitted_demand_tokens", "llamacpp_guard_pool_limit_tokens")
    (limit,) = pool["fieldConfig"]["overrides"]
    assert limit["matcher"]["options"] == next(
        t["refId"] for t in pool["targets"] if "llamacpp_guard_pool_limit_tokens" in t["expr"]
    )


@pytest.mark.promtool
def test_the_guard_row_queries_in_prometheus(promtool_bin: Path, tmp_path: Path) -> None:
    """The real PromQL engine runs the guard row's queries over the series the guard's real collector exports,
    its counters growing by their value every minute: a query that names a metric, a label or a bucket the
    guard does not export finds nothing and fails."""
    job, instance = 'job="llamacpp"', 'instance="a:9778"'
    series: dict[str, str] = {}
    for sample in collector_samples(_guard_collector()):
        labels = ", ".join([job, instance, *(f'{k}="{v}"' for k, v in sample.labels.items())])
        growing = sample.name.endswith(("_total", "_bucket", "_sum", "_count"))
        series[f"{sample.name}{{{labels}}}"] = f"0+{sample.value}x10" if growing else f"{sample.value}x10"
    panels = {p["title"]: p for p in _guard_row()}

    def target(title: str, ref: str = "A") -> str:
        return _substituted(next(t["expr"] for t in panels[title]["targets"] if t["refId"] == ref))

    per_minute = {"admitted": 120, "queued": 60, "refused": 6, "preempted": 3, "replayed": 3}
    gauge = f"{{{instance}, {job}}}"
    cases: list[tuple[str, dict[str, float]]] = [
        (
            target("Guard: requests by outcome"),
            {f'{{{instance}, outcome="{o}"}}': per_minute.get(o, 0) / 60 for o in OUTCOMES},
        ),
        (target("Guard: queue and requests in flight"), {f"llamacpp_guard_queue_requests{gauge}": 1}),
        (target("Guard: queue and requests in flight", "B"), {f"llamacpp_guard_in_flight_requests{gauge}": 1}),
        # Buckets 0.5, 1, 2.5, 20, 30: half the waits end by 1.75 s and 95 % by 28.75 s (linear within a bucket).
        (target("Guard: queue wait"), {f"{{{instance}}}": 1.75}),
        (target("Guard: queue wait", "B"), {f"{{{instance}}}": 28.75}),
        (target("Guard: queue wait", "C"), {f"{{{instance}}}": (240 * 0.5 + 120 * 2.5 + 240 * 20.75) / 600}),
        (target("Guard: demand admitted vs pool"), {f"llamacpp_guard_admitted_demand_tokens{gauge}": 500}),
        (target("Guard: demand admitted vs pool", "B"), {f"llamacpp_guard_admitted_prompt_tokens{gauge}": 400}),
        (target("Guard: demand admitted vs pool", "C"), {f"llamacpp_guard_pool_limit_tokens{gauge}": 1000}),
    ]
    _promtool_expressions(promtool_bin, tmp_path, series, cases)
