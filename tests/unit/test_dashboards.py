"""The Grafana dashboard in dashboards/: generated file up to date, a structural round trip through
grafana-foundation-sdk (Grafana's own typed models), dashboard-linter's conventions, what the seed
incident needs to be visible at a glance, and the provisioning files.

That every query returns data from a real Prometheus scraping the real exporter is checked in
test_prometheus_e2e.py; that every metric it names is emitted, in test_alerts_metric_names.py; its
queries run by promtool on given series, in test_dashboards_promtool.py (all in tests/real_server); that
every name and label value it gives is in the metric catalogue the collectors emit, in
tests/unit/test_metric_catalogue.py.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
import yaml
from dashboard_json import DASHBOARD, dashboard_json, guard_row_json, panels_json, rows_json
from expositions import guard_collector
from paths import REPO
from prom_harness import collector_samples, dashboard_queries, load_script, metric_names_in

from exporter.metrics.catalogue import CATALOGUE
from exporter.metrics.catalogue.family import CLIENT, GPU, GUARD, HOST, ROUTER

ROOT = REPO
PROVISIONING = ROOT / "dashboards" / "provisioning"
dashboard_generator = load_script(ROOT / "dashboards" / "generate_dashboard.py")


def _scoped(*scopes: str) -> set[str]:
    """The sample names of the catalogue's families of `scopes` (exporter.metrics.catalogue)."""
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    return {f.name + s for f in CATALOGUE if f.scope in scopes for s in ("", *suffixes.get(f.type, ()))}


#: Series that are one per host, GPU or exporter target, never per llama-server: never filtered by the server
#: and model variables (a GPU's free memory is the same whichever server is selected); Prometheus' own too.
PER_HOST = _scoped(HOST, GPU) | {"up", "scrape_duration_seconds"}
SERVER_FILTER = 'server=~"$server"'
MODEL_FILTER = 'model=~"$model"'
#: The router's own families: labelled `server` (when several), never `model`.
ROUTER_METRICS = _scoped(ROUTER)
#: The guard's families and its books by client: it fronts one llama-server, so they are one per exporter
#: target, never labelled server or model, and filtered by job and instance only.
PER_GUARD = _scoped(GUARD, CLIENT)
#: What the guard's row plots (exporter/guard/books.py).
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
#: The guard row's families by client: each plotted as its p95 by client.
GUARD_CLIENT_HISTOGRAMS = {
    "llamacpp_guard_client_time_to_first_byte_seconds_bucket",
    "llamacpp_guard_client_request_duration_seconds_bucket",
    "llamacpp_guard_client_queue_wait_seconds_bucket",
}

#: Keys that Grafana's Prometheus plugin stores on annotations and query variables but that are not
#: part of the core dashboard schema the SDK models (so its round trip drops them).
PLUGIN_KEYS = {"builtIn", "step", "titleFormat", "tagKeys", "useValueForTime", "definition"}


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
    original = dashboard_json()
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
    d = dashboard_json()
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
    for panel in panels_json():
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


def _per_host(name: str) -> bool:
    return name in PER_HOST


def _check_server_and_model(title: str, target: dict[str, Any]) -> None:
    """A per-server series is filtered by the server and model variables, keeps both labels through every
    aggregation and shows them in its legend; a series that is one per host or target (GPU memory) is not
    filtered by them; a router's own series only by server."""
    expr, legend = target["expr"], target["legendFormat"]
    per_server = False
    for selector in re.findall(r"[a-zA-Z_:][\w:]*\{[^}]*\}", expr):
        name = selector.split("{", 1)[0]
        if _per_host(name) or name in PER_GUARD:
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
        elif not _per_host(name) and name not in PER_GUARD:
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
    pool = [p for p in panels_json() if "llamacpp_kv_pool_capacity_tokens" in json.dumps(p["targets"])]
    assert len(pool) >= 2
    for panel in pool:
        assert panel["title"].endswith(" ($model)"), panel["title"]
    sharing = next(p for p in panels_json() if p["title"] == "GPU memory by server")
    (target,) = sharing["targets"]
    assert metric_names_in(target["expr"]) == {"llamacpp_process_gpu_memory_bytes", "llamacpp_gpu_memory_free_bytes"}
    assert "by (instance, gpu, server, model)" in target["expr"]
    assert all(f"{{{{{label}}}}}" in target["legendFormat"] for label in ("gpu", "server", "model"))
    plotted = {
        n
        for p in panels_json()
        if p["title"].startswith("Router")
        for t in p["targets"]
        for n in metric_names_in(t["expr"])
    }
    assert plotted == ROUTER_METRICS
    exits = _panel_with("llamacpp_router_child_exits_total")
    assert any("outcome" in t["expr"] and "{{outcome}}" in t["legendFormat"] for t in exits["targets"])


def test_layout_has_unique_ids_and_no_overlaps() -> None:
    panels = dashboard_json()["panels"]
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
    found = [p for p in panels_json() if set(metrics) <= {n for t in p["targets"] for n in metric_names_in(t["expr"])}]
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

    usage = next(p for p in panels_json() if p["type"] == "timeseries" and p["title"] == "KV pool usage ($model)")
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

    vram = next(p for p in panels_json() if p["title"] == "Free VRAM per GPU")
    assert "{{gpu}}" in vram["targets"][0]["legendFormat"]
    assert 512 * 1024 * 1024 in {s["value"] for s in vram["fieldConfig"]["defaults"]["thresholds"]["steps"]}
    assert vram["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"].startswith("line")

    _panel_with("llamacpp_checkpoint_bytes", "llamacpp_prompt_cache_bytes", "llamacpp_host_memory_available_bytes")
    _panel_with("llamacpp_prompt_eval_seconds_bucket")
    _panel_with("llamacpp_up", "llamacpp_server_loading")
    _panel_with("llamacpp_server_starts_total")
    _panel_with("llamacpp_exporter_source_up")
    _panel_with("llamacpp_exporter_log_lines_total")
    annotations = {a["name"] for a in dashboard_json()["annotations"]["list"]}
    assert {"Context size exceeded", "llama-server start", "Firing alerts"} <= annotations


def test_queries_are_all_found() -> None:
    assert len(dashboard_queries(dashboard_json())) >= 45


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
    assert dashboard_json()["templating"]["list"][0]["current"] == {}


def test_stat_targets_are_range_only_with_a_sparkline() -> None:
    """A stat shows the last value and its trend (a sparkline): a range query only (with both `range` and
    `instant` Grafana runs two queries and every tile shows each series twice)."""
    stats = [p for p in panels_json() if p["type"] == "stat"]
    assert len(stats) >= 8
    for panel in stats:
        assert panel["options"]["graphMode"] == "area", panel["title"]
        assert panel["options"]["reduceOptions"]["calcs"] == ["lastNotNull"], panel["title"]
        for target in panel["targets"]:
            assert target.get("instant") is False and target.get("range") is True, panel["title"]


def test_the_top_row_sizes_the_pool_and_sorts_alerts_by_rank() -> None:
    """The top row has the sizing tile (what LlamaCppKVPoolUndersized reads, red at its threshold), the firing
    alerts sorted by the severity's rank (not its name: "info" < "warning" as strings), and the least free VRAM
    of the GPUs that llama-server uses only."""
    top = rows_json()[0][1]
    sizing = next(p for p in top if p["title"].startswith("Held together / pool"))
    rules = yaml.safe_load((REPO / "alerts" / "llamacpp-rules.yml").read_text(encoding="utf-8"))
    undersized = next(
        str(r["expr"]) for g in rules["groups"] for r in g["rules"] if r.get("alert") == "LlamaCppKVPoolUndersized"
    )
    peak = "instance:llamacpp_kv_pool_active_tokens:max_1d"
    assert peak in sizing["targets"][0]["expr"]
    red = [st["value"] for st in sizing["fieldConfig"]["defaults"]["thresholds"]["steps"] if st["color"] == "red"]
    assert f"{peak} > {red[0]:g} * llamacpp_kv_pool_capacity_tokens" in undersized
    alerts = next(p for p in top if p["title"] == "Firing alerts")
    assert alerts["options"]["sortBy"] == [{"displayName": "rank", "desc": False}]
    expr = alerts["targets"][0]["expr"]
    assert expr.index('severity="critical"} * 0 + 1') < expr.index('severity="warning"} * 0 + 2')
    vram = next(p for p in top if p["title"] == "Least free VRAM")["targets"][0]["expr"]
    assert "llamacpp_process_gpu_memory_bytes" in vram


def test_the_top_row_says_what_is_wrong_now() -> None:
    """First row, first line: the firing alerts, the demand ratio, the time to full, the pool usage and the
    server's state; loading is orange (not down), an exporter that cannot be scraped is red."""
    title, top = rows_json()[0]
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
        for p in panels_json()
        if p["type"] == "timeseries" and p["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] != "none"
    ]
    assert len(stacked) >= 4
    for panel in stacked:
        assert panel.get("repeat") == "instance" and "$instance" in panel["title"], panel["title"]


def test_the_guard_row_plots_what_the_guard_exports() -> None:
    """One row for the guard: its requests by outcome (a rate), its queue, the queue wait's quantiles, the
    demand it admitted against its pool limit, and by client the p95 of its time to first byte, end to end and
    queue wait; every name it queries is one the guard's collectors export."""
    from exporter.guard.accounting import Accounting
    from exporter.guard.client_metrics import ClientCollector
    from exporter.guard.clients import ClientNamer

    panels = guard_row_json()
    accounting = Accounting(ClientNamer())
    accounting.books("orchestrator")
    exported = {sample.name for sample in collector_samples(guard_collector())}
    exported |= {sample.name for sample in collector_samples(ClientCollector(accounting))}
    queried = {n for p in panels for t in p["targets"] for n in metric_names_in(t["expr"])}
    wanted = GUARD_METRICS | GUARD_CLIENT_HISTOGRAMS
    assert queried == wanted and exported >= wanted, (queried ^ wanted, wanted - exported)
    for family in GUARD_CLIENT_HISTOGRAMS:
        (target,) = _panel_with(family)["targets"]
        assert "histogram_quantile(0.95, sum by (instance, client, le)" in target["expr"]
        assert "{{client}}" in target["legendFormat"]
    outcomes = _panel_with("llamacpp_guard_requests_total")
    assert "rate(" in outcomes["targets"][0]["expr"] and "{{outcome}}" in outcomes["targets"][0]["legendFormat"]
    wait = _panel_with("llamacpp_guard_queue_wait_seconds_bucket")
    assert sum("histogram_quantile(" in t["expr"] for t in wait["targets"]) == 2
    pool = _panel_with("llamacpp_guard_admitted_demand_tokens", "llamacpp_guard_pool_limit_tokens")
    (limit,) = pool["fieldConfig"]["overrides"]
    assert limit["matcher"]["options"] == next(
        t["refId"] for t in pool["targets"] if "llamacpp_guard_pool_limit_tokens" in t["expr"]
    )


def test_who_holds_the_pool_stacks_the_clients_cells_beside_the_slots() -> None:
    """The "KV pool" row shows, beside the slots' stack, the cells by client stacked against the guard's pool limit;
    both names are ones the guard exports."""
    panels = dashboard_json()["panels"]
    slots = next(p for p in panels if p["title"].startswith("KV pool: tokens per slot"))
    who = next(p for p in panels if p["title"].startswith("Who holds the pool"))
    assert (
        who["gridPos"]["y"] == slots["gridPos"]["y"]
        and who["gridPos"]["x"] == slots["gridPos"]["x"] + slots["gridPos"]["w"]
    )
    assert who["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] != "none"
    cells, limit = who["targets"]
    assert (
        metric_names_in(cells["expr"]) == {"llamacpp_guard_client_pool_tokens"}
        and "{{client}}" in cells["legendFormat"]
    )
    (line,) = who["fieldConfig"]["overrides"]
    assert line["matcher"]["options"] == limit["refId"]
    from exporter.guard.accounting import Accounting
    from exporter.guard.client_metrics import ClientCollector
    from exporter.guard.clients import ClientNamer

    accounting = Accounting(ClientNamer())
    accounting.books("orchestrator")
    assert "llamacpp_guard_client_pool_tokens" in {s.name for s in collector_samples(ClientCollector(accounting))}
