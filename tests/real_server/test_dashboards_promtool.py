"""The dashboard's queries run by the real PromQL engine (`promtool test rules`) on given series: the top
row's, and the server and model variables keeping servers and models apart."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from dashboard_json import guard_row_json, panels_json, rows_json
from expositions import guard_collector
from prom_harness import collector_samples

from exporter.metrics.catalogue.guard import OUTCOMES


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
    top = rows_json()[0][1]
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
            {f'{{{job}, alertname="LlamaCppVRAMHeadroomLow", alertstate="firing", host="a", severity="warning"}}': 2},
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


def _target(title: str, ref: str = "A") -> str:
    panel = next(p for p in panels_json() if p["title"] == title)
    return str(next(t["expr"] for t in panel["targets"] if t["refId"] == ref))


@pytest.mark.promtool
def test_the_guard_row_queries_in_prometheus(promtool_bin: Path, tmp_path: Path) -> None:
    """The real PromQL engine runs the guard row's queries over the series the guard's real collector exports,
    its counters growing by their value every minute: a query that names a metric, a label or a bucket the
    guard does not export finds nothing and fails."""
    job, instance = 'job="llamacpp"', 'instance="a:9778"'
    series: dict[str, str] = {}
    for sample in collector_samples(guard_collector()):
        labels = ", ".join([job, instance, *(f'{k}="{v}"' for k, v in sample.labels.items())])
        growing = sample.name.endswith(("_total", "_bucket", "_sum", "_count"))
        series[f"{sample.name}{{{labels}}}"] = f"0+{sample.value}x10" if growing else f"{sample.value}x10"
    panels = {p["title"]: p for p in guard_row_json()}

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


@pytest.mark.promtool
def test_the_guard_rows_panels_by_client_query_in_prometheus(promtool_bin: Path, tmp_path: Path) -> None:
    """The p95 by client of the guard's time to first byte, end to end and queue wait, over the series the real
    client collector exports for two clients whose every observation falls in one bucket (so the p95 is that
    bucket's lower bound plus 95 % of its width)."""
    from exporter.guard.accounting import Accounting
    from exporter.guard.client_metrics import ClientCollector
    from exporter.guard.clients import ClientNamer

    accounting = Accounting(ClientNamer())
    observed = {"orchestrator": (0.2, 3.0, 0.5), "chat": (0.02, 0.3, 0.02)}
    for name, (first, end, wait) in observed.items():
        b = accounting.books(name)
        for _ in range(60):
            b.first_bytes.observe(first)
            b.durations.observe(end)
            b.waits.observe(wait)
    job, instance = 'job="llamacpp"', 'instance="a:9778"'
    series: dict[str, str] = {}
    for sample in collector_samples(ClientCollector(accounting)):
        labels = ", ".join([job, instance, *(f'{k}="{v}"' for k, v in sample.labels.items())])
        growing = sample.name.endswith(("_total", "_bucket", "_sum", "_count"))
        series[f"{sample.name}{{{labels}}}"] = f"0+{sample.value}x10" if growing else f"{sample.value}x10"
    panels = {p["title"]: p for p in guard_row_json()}

    def target(title: str) -> str:
        return _substituted(panels[title]["targets"][0]["expr"])

    def p95(low: float, high: float) -> float:
        return low + 0.95 * (high - low)

    by = {"orchestrator": f'{{client="orchestrator", {instance}}}', "chat": f'{{client="chat", {instance}}}'}
    cases: list[tuple[str, dict[str, float]]] = [
        (
            target("Guard: time to first byte by client (p95)"),
            {by["orchestrator"]: p95(0.1, 0.25), by["chat"]: p95(0.01, 0.025)},
        ),
        (target("Guard: end to end by client (p95)"), {by["orchestrator"]: p95(2.5, 5.0), by["chat"]: p95(0.25, 0.5)}),
        (
            target("Guard: queue wait by client (p95)"),
            {by["orchestrator"]: p95(0.25, 0.5), by["chat"]: p95(0.01, 0.05)},
        ),
    ]
    _promtool_expressions(promtool_bin, tmp_path, series, cases)
