"""End to end: real llama-server -> real exporter -> real Prometheus (rules loaded) -> real Alertmanager -> webhook.

The seed incident, slowed down so that it can be watched: `-c 49152 -np 4 -kvu` and four concurrent
requests, each with a ~10k-token prompt (together ~84% of the pool) and an unlimited generation. The
four slots grow the shared pool until llama-server runs the retry cascade and aborts all four with
`Context size has been exceeded`. With the tiny model on 2 cores the last 10% of the pool takes
several seconds (attention over the whole unified pool slows generation as it fills): that is the
window in which `LlamaCppKVPoolSaturated` must fire, and does, before the first abort line is written.

A second llama-server (tiny gemma2, `-ctxcp`) gives the checkpoint panels data, and both exporters
run with the tests' fake `pynvml` (support/fake_nvml.py: no GPU here) so that the GPU panels have data.

Test copy of the rules: the shipped rules rendered with a runbook and a Grafana address (the shipped file has
no links); Prometheus scrapes every 1 s and evaluates every 0.5 s; everything else is the shipped files.

The measured figures are printed (`pytest -s`). `LLAMACPP_E2E_EXPORTER_ARGS` adds exporter flags, e.g.
`--http off` to measure the lead time of the log-only slot estimate (progress lines every 3 s)
instead of the live `/slots` figures.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote_plus

import pytest
from fake_nvml import pynvml_env, seed_incident_gpu
from llama_harness import ExporterProcess, LlamaServer, http_json, make_prompt, run_concurrent_completions, wait_for
from paths import REPO
from prom_harness import (
    Alertmanager,
    Notification,
    Prometheus,
    WebhookReceiver,
    alertmanager_test_config,
    dashboard_queries,
    find_alertmanager,
    find_prometheus,
    load_script,
    prometheus_test_config,
)

pytestmark = [pytest.mark.llama_server, pytest.mark.promtool]

ROOT = REPO
AM_EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"
DASHBOARD = ROOT / "dashboards" / "llamacpp.json"
rules_generator = load_script(ROOT / "alerts" / "generate_rules.py")
#: The rules as a deployment renders them: with a runbook and a Grafana address.
LINKED = rules_generator.Config(
    runbook_url="https://git.acme.corp/llm/runbook.md", grafana_url="https://grafana.acme.corp"
)

POOL = 49152
#: ~0.83 tokens per character with the tiny model: 4 x ~10.3k tokens = ~84% of the pool before generation.
PROMPT_CHARS = 12400
INCIDENT_ARGS = ["-c", str(POOL), "-np", "4", "-kvu", "-lv", "4", "-t", "2"]
CKPT_ARGS = ["-c", "4096", "-np", "2", "-kvu", "-ctxcp", "3", "-cms", "64", "-b", "128", "-ub", "128", "-lv", "4"]
EXCEEDED = "Context size has been exceeded"
JOB = "llamacpp"
#: Generous bounds for a busy 2-core machine; the incident itself takes ~20 s idle and ~2 min loaded.
INCIDENT_TIMEOUT = 420.0


def _missing(what: str) -> NoReturn:
    hint = "run scripts/unpack-test-tools.sh"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{what} not found under CI: {hint}", pytrace=False)
    pytest.skip(f"{what} not found: {hint}")


@dataclass
class Incident:
    """What the scenario observed, in wall-clock seconds (time.time())."""

    prom: Prometheus
    hook: WebhookReceiver
    instance: str  # the incident exporter's instance label
    begin: float = 0.0  # the four requests were sent
    end: float = 0.0  # everything settled
    statuses: list[int] = field(default_factory=list)
    fired_seen: float | None = None  # our poll of /api/v1/alerts first saw LlamaCppKVPoolSaturated firing
    line_written_when_fired: bool | None = None  # was the exceeded line already in the log at that moment?
    active_at: float | None = None  # Prometheus' activeAt of that alert (= fired, with for: 0s)
    fired_value: float | None = None  # the usage ratio Prometheus saw when it fired
    line_seen: float | None = None  # our poll first saw the exceeded line in the log
    line_offset_s: float | None = None  # the line's own timestamp (seconds since llama-server started)
    server_started: float = 0.0
    page: Notification | None = None
    notes: dict[str, Any] = field(default_factory=dict)


def _exporter(srv: LlamaServer) -> ExporterProcess:
    return ExporterProcess(
        srv.log_file,
        # No --pid: the exporter finds each llama-server by the log file it writes.
        [
            "--server-url",
            srv.url,
            "--log-poll-interval",
            "0.2",
            *os.environ.get("LLAMACPP_E2E_EXPORTER_ARGS", "").split(),
        ],
        env=pynvml_env([seed_incident_gpu([srv.pid])]),
    )


def _parse_iso(ts: str) -> float:
    """Prometheus' RFC 3339 timestamps (nanoseconds, ``Z``) -> epoch seconds."""
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", ts)
    assert m, ts
    whole = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3]))
    return whole.timestamp() + float("0." + (m[2] or "0"))


def _log_offset(line: str) -> float | None:
    """`0.24.677.317 E srv ...` (min.s.ms.us since the server started) -> seconds."""
    m = re.match(r"\s*(\d+)\.(\d+)\.(\d+)\.(\d+) ", line)
    return int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6 if m else None


def _saturated(prom: Prometheus, instance: str) -> dict[str, Any] | None:
    for a in prom.alerts():
        if a["labels"].get("alertname") == "LlamaCppKVPoolSaturated" and a["labels"].get("instance") == instance:
            return a
    return None


def _is_saturated_page(n: Notification) -> bool:
    return n.path == "/pager" and any(
        a["labels"]["alertname"] == "LlamaCppKVPoolSaturated" for a in n.body.get("alerts", [])
    )


def _checkpoint_requests(url: str) -> None:
    base = make_prompt(300)
    for prompt in (base, base + "Another ten", base + "Another ten wor"):
        status, body = http_json(
            url + "/completion", body={"prompt": prompt, "n_predict": 8, "cache_prompt": True, "id_slot": 0}, timeout=60
        )
        assert status == 200, body


@pytest.fixture(scope="module")
def incident(
    llama_server_bin: Path, tiny_llama_model: Path, tiny_gemma2_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Incident]:
    prom_bin = find_prometheus() or _missing("prometheus")
    am_bin = find_alertmanager() or _missing("prometheus-alertmanager")
    tmp = tmp_path_factory.mktemp("prom-e2e")
    rules = tmp / "llamacpp-rules.yml"
    rules.write_text(rules_generator.render(LINKED), encoding="utf-8")

    with ExitStack() as stack:
        hook = stack.enter_context(WebhookReceiver())
        am = stack.enter_context(
            Alertmanager(am_bin, alertmanager_test_config(AM_EXAMPLE.read_text(encoding="utf-8"), hook.url))
        )
        ckpt = stack.enter_context(
            LlamaServer(llama_server_bin, tiny_gemma2_model, CKPT_ARGS, log_file=tmp / "ckpt.log")
        )
        ckpt_exporter = stack.enter_context(_exporter(ckpt))
        srv = stack.enter_context(
            LlamaServer(llama_server_bin, tiny_llama_model, INCIDENT_ARGS, log_file=tmp / "incident.log")
        )
        server_started = time.time()
        exporter = stack.enter_context(_exporter(srv))
        instance = f"127.0.0.1:{exporter.port}"
        prom = stack.enter_context(
            Prometheus(
                prom_bin,
                prometheus_test_config(
                    {JOB: [instance, f"127.0.0.1:{ckpt_exporter.port}"]}, [rules], f"127.0.0.1:{am.port}"
                ),
            )
        )
        inc = Incident(prom=prom, hook=hook, instance=instance, server_started=server_started)
        wait_for(
            lambda: (
                len(prom.query(f'up{{job="{JOB}"}} == 1')) == 2
                and prom.query(f'instance:llamacpp_slots_processing:sum{{instance="{instance}"}}')
                and prom.query(f'llamacpp_kv_pool_capacity_tokens{{instance="{instance}"}} == {POOL}')
            ),
            timeout=60,
            what="Prometheus scraping both exporters, the pool size known and the rules evaluated",
        )
        _checkpoint_requests(ckpt.url)
        # A server restart (a new banner in a truncated log) for the restart panels and annotation.
        ckpt.restart()
        wait_for(
            lambda: (ckpt_exporter.sample("llamacpp_server_starts_total") or 0) >= 1,
            timeout=30,
            what="the checkpoint server's restart counted",
        )

        results: list[list[tuple[int, dict[str, Any]]]] = []
        sender = threading.Thread(
            target=lambda: results.append(
                run_concurrent_completions(
                    srv.url, n=4, prompt_chars=PROMPT_CHARS, n_predict=1_000_000, timeout=INCIDENT_TIMEOUT
                )
            ),
            daemon=True,
        )
        inc.begin = time.time()
        sender.start()
        deadline = time.monotonic() + INCIDENT_TIMEOUT + 30
        while (sender.is_alive() or inc.line_seen is None) and time.monotonic() < deadline:
            if inc.fired_seen is None:
                alert = _saturated(prom, instance)
                if alert is not None and alert["state"] == "firing":
                    inc.fired_seen = time.time()
                    # The order is proven here: the alert fired before this read of the log.
                    inc.line_written_when_fired = EXCEEDED in srv.log_text()
                    inc.active_at = _parse_iso(alert["activeAt"])
                    inc.fired_value = float(alert["value"])
            if inc.line_seen is None:
                lines = srv.log_lines(EXCEEDED)
                if lines:
                    inc.line_seen = time.time()
                    inc.line_offset_s = _log_offset(lines[0])
            time.sleep(0.05)
        sender.join(timeout=30)
        assert results, "the four requests did not finish"
        inc.statuses = [status for status, _ in results[0]]

        # Let Prometheus see the aborts, and Alertmanager deliver the page.
        wait_for(
            lambda: prom.query(f'llamacpp_context_exceeded_total{{instance="{instance}"}} >= 1'),
            timeout=60,
            what="Prometheus scraped the abort",
        )
        try:
            inc.page = hook.wait_for(_is_saturated_page, timeout=60, what="the LlamaCppKVPoolSaturated page")
        except TimeoutError:
            inc.notes["alertmanager"] = am.output()
        wait_for(
            lambda: prom.query(f'llamacpp_requests_aborted_total{{instance="{instance}"}} >= 1'),
            timeout=60,
            what="Prometheus scraped the aborted requests",
        )
        time.sleep(2.5)  # a few more scrapes, so that increase() over $__rate_interval sees the last counts
        inc.end = time.time()
        _report(inc)
        yield inc


def _report(inc: Incident) -> None:
    """Print the measured figures (shown with pytest -s; also in the assertion messages)."""
    figures = {
        "requests": inc.statuses,
        "alert_fired_seen_s_after_requests": inc.fired_seen and round(inc.fired_seen - inc.begin, 2),
        "exceeded_line_seen_s_after_requests": inc.line_seen and round(inc.line_seen - inc.begin, 2),
        "lead_time_s (line seen - alert activeAt)": lead_time(inc),
        "usage_when_fired": inc.fired_value,
        "page_delivered_s_after_activeAt": (
            round(inc.page.received - inc.active_at, 2) if inc.page and inc.active_at else None
        ),
    }
    print("\nprometheus e2e:", json.dumps(figures))


def lead_time(inc: Incident) -> float | None:
    if inc.line_seen is None or inc.active_at is None:
        return None
    return round(inc.line_seen - inc.active_at, 2)


def test_all_four_requests_were_aborted(incident: Incident) -> None:
    assert incident.statuses == [500] * 4


def test_kv_pool_saturated_fires_before_context_size_is_exceeded(incident: Incident) -> None:
    """The page comes before the abort: when our poll first saw the alert firing, the log did not yet
    contain the `Context size has been exceeded` line."""
    assert incident.fired_seen is not None, "LlamaCppKVPoolSaturated never fired"
    assert incident.line_written_when_fired is False, f"the abort was logged first (lead {lead_time(incident)} s)"
    assert incident.line_seen is not None and incident.active_at is not None
    assert incident.active_at < incident.line_seen
    assert incident.fired_value is not None and 0.9 < incident.fired_value <= 1.0


def test_alertmanager_delivers_the_page_to_the_webhook(incident: Incident) -> None:
    page = incident.page
    assert page is not None, incident.notes.get("alertmanager")
    assert page.body["receiver"] == "pager" and page.body["status"] == "firing"
    alert = next(a for a in page.body["alerts"] if a["labels"]["alertname"] == "LlamaCppKVPoolSaturated")
    assert alert["labels"]["severity"] == "critical"
    assert alert["labels"]["instance"] == incident.instance
    assert alert["annotations"]["runbook_url"] == LINKED.runbook_url + "#llamacppkvpoolsaturated"
    assert alert["annotations"]["dashboard_url"].endswith(
        f"&var-job={JOB}&var-instance={quote_plus(incident.instance)}"
    )
    assert alert["annotations"]["description"].startswith(
        f"On {incident.instance}, the conversations in flight or coming back hold 9"
    )


def test_the_aborts_are_the_pages_incident_not_a_second_page(incident: Incident) -> None:
    """The aborts that follow the pool-past-90% page are its incident: LlamaCppKVPoolRequestsAborted stays
    quiet while LlamaCppKVPoolSaturated fires (kept up after the pool emptied), and the overflow's
    follow-up (LlamaCppContextExceeded) waits until the page is over."""
    firing = {
        a["labels"]["alertname"]
        for a in incident.prom.alerts()
        if a["state"] == "firing" and a["labels"].get("instance") == incident.instance
    }
    assert "LlamaCppKVPoolSaturated" in firing, firing
    assert not firing & {"LlamaCppKVPoolRequestsAborted", "LlamaCppContextExceeded"}, firing


def test_every_rule_evaluates_without_error(incident: Incident) -> None:
    rules = incident.prom.rules()
    assert len(rules) >= 14
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []


def _substitute(expr: str, inc: Incident) -> str:
    rng = max(60, math.ceil(inc.end - inc.begin) + 30)
    for var, value in (
        ("$__rate_interval", "4s"),  # Grafana: max(4 x scrape interval, interval + scrape interval)
        ("$__interval", "1s"),
        ("$__range", f"{rng}s"),
        ("$datasource", "prometheus"),
        ("$instance", ".+"),  # the "All" value
        ("$job", JOB),
        ("$server", ".*"),  # "All": also the series of a lone server, which have no server label
        ("$model", ".*"),
    ):
        expr = expr.replace(var, value)
    return expr


def test_dashboard_variables_find_the_exporters(incident: Incident) -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    jobs = incident.prom.get_json("/api/v1/label/job/values", [("match[]", "llamacpp_exporter_build_info")])["data"]
    assert variables["job"]["query"]["query"] == "label_values(llamacpp_exporter_build_info, job)"
    assert jobs == [JOB]
    instances = incident.prom.get_json(
        "/api/v1/label/instance/values", [("match[]", f'llamacpp_exporter_build_info{{job=~"{JOB}"}}')]
    )["data"]
    assert incident.instance in instances and len(instances) == 2


def test_every_dashboard_query_returns_data(incident: Incident) -> None:
    """Every panel target and annotation, variables substituted, over the scenario's time range."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    empty: list[str] = []
    checked = 0
    for where, expr in dashboard_queries(dashboard):
        if where.startswith("variable"):
            continue  # label_values() is not PromQL; see test_dashboard_variables_find_the_exporters
        checked += 1
        query = _substitute(expr, incident)
        assert "$" not in query, query
        series = incident.prom.query_range(query, incident.begin - 20, incident.end, 1)
        if "llamacpp_router_" in query or "llamacpp_guard_" in query:
            # A router's own series and the guard's: these servers are not routers and run no guard (the query
            # still had to run; test_dashboards.py runs the guard row's over the guard's real collector).
            continue
        values = [float(v) for s in series for _, v in s["values"]]
        if not any(math.isfinite(v) for v in values):
            empty.append(f"{where}: {query}")
    assert checked >= 40
    assert empty == []


def test_the_incident_is_visible_on_the_dashboard_queries(incident: Incident) -> None:
    """The seed incident at a glance: the stacked slots reached the capacity line, and the retries,
    the failed cascade and the four aborts are there as events."""
    inst = f'instance="{incident.instance}"'
    prom, t0, t1 = incident.prom, incident.begin - 5, incident.end
    peak = prom.query_range(f"sum(llamacpp_slot_tokens{{{inst}}})", t0, t1, 1)
    capacity = prom.query(f"llamacpp_kv_pool_capacity_tokens{{{inst}}}")
    assert float(capacity[0]["value"][1]) == POOL
    assert max(float(v) for _, v in peak[0]["values"]) > 0.9 * POOL
    window = f"{math.ceil(t1 - t0) + 10}s"
    aborted = prom.query(
        f'sum(increase(llamacpp_requests_aborted_total{{{inst}, reason="context_exceeded"}}[{window}]))'
    )
    failed = prom.query(f'sum(increase(llamacpp_kv_cascades_total{{{inst}, outcome="failed"}}[{window}]))')
    assert round(float(aborted[0]["value"][1])) >= 4
    assert round(float(failed[0]["value"][1])) >= 1
