"""Every metric that a rule, recording rule or dashboard query names is one the exporter really emits.

The names are collected from real scrapes of the real exporter process in real scenarios: the seed
incident (`-c 512 -np 4 -kvu`, four requests aborted) and a context-checkpoint run (tiny gemma2 with
`-ctxcp`), with the live sources on (`--server-url`, /proc). There is no GPU here, so the exporter runs
with the tests' fake `pynvml` module on its PYTHONPATH (support/fake_nvml.py): the NVML source and
collector are the real code, fed by a fake library at the NVML boundary.

Allowed besides: the recording rules' own names, and the series Prometheus makes itself (`up`,
`scrape_duration_seconds`, `ALERTS`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from fake_nvml import pynvml_env, seed_incident_gpu
from llama_harness import ExporterProcess, LlamaServer, http_json, make_prompt, run_concurrent_completions, wait_for
from paths import REPO
from prom_harness import collector_samples, dashboard_queries, metric_names_in
from prometheus_client.parser import text_string_to_metric_families

from exporter.guard.accounting import Accounting
from exporter.guard.books import GuardBooks, GuardCollector
from exporter.guard.client_metrics import ClientCollector
from exporter.guard.clients import ClientNamer

pytestmark = pytest.mark.llama_server

ROOT = REPO
RULES = ROOT / "alerts" / "llamacpp-rules.yml"
DASHBOARD = ROOT / "dashboards" / "llamacpp.json"

#: Series that Prometheus itself writes for every target or alert.
PROMETHEUS_SERIES = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
        "ALERTS",
        "ALERTS_FOR_STATE",
    }
)

SEED_ARGS = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "-t", "2"]
CKPT_ARGS = ["-c", "4096", "-np", "2", "-kvu", "-ctxcp", "3", "-cms", "64", "-b", "128", "-ub", "128", "-t", "2"]


def _sample_names(scrape: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(scrape) for s in family.samples}


def _exporter(srv: LlamaServer) -> ExporterProcess:
    return ExporterProcess(
        srv.log_file,
        ["--server-url", srv.url, "--pid", str(srv.pid)],
        env=pynvml_env([seed_incident_gpu([srv.pid])]),
    )


@pytest.fixture(scope="module")
def emitted(
    llama_server_bin: Path, tiny_llama_model: Path, tiny_gemma2_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> set[str]:
    """Sample names from scrapes taken before, during and after the two scenarios."""
    tmp = tmp_path_factory.mktemp("names")
    names: set[str] = set()

    with (
        LlamaServer(llama_server_bin, tiny_llama_model, SEED_ARGS, log_file=tmp / "seed.log") as srv,
        _exporter(srv) as exporter,
    ):
        names |= _sample_names(exporter.scrape())
        results = run_concurrent_completions(srv.url, n=4)
        assert [status for status, _ in results] == [500] * 4, results
        wait_for(
            lambda: exporter.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 4,
            timeout=15,
            what="four aborted requests counted",
        )
        names |= _sample_names(exporter.scrape())

    with (
        LlamaServer(llama_server_bin, tiny_gemma2_model, [*CKPT_ARGS, "-lv", "4"], log_file=tmp / "ckpt.log") as srv,
        _exporter(srv) as exporter,
    ):
        base = make_prompt(300)
        for prompt in (base, base + "Another ten", base + "Another ten wor"):
            status, body = http_json(
                srv.url + "/completion",
                body={"prompt": prompt, "n_predict": 8, "cache_prompt": True, "id_slot": 0},
                timeout=60,
            )
            assert status == 200, body
        wait_for(lambda: srv.log_text().count("stop processing") == 3, timeout=15, what="three releases")
        wait_for(
            lambda: "llamacpp_exporter_log_lines_total" in exporter.scrape(), timeout=15, what="a scrape after them"
        )
        names |= _sample_names(exporter.scrape())
    return names


def _rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [(f"rule {r.get('alert') or r.get('record')}", str(r["expr"])) for g in doc["groups"] for r in g["rules"]]


def _recorded() -> set[str]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r}


def _queries() -> Iterator[tuple[str, str]]:
    yield from _rule_exprs()
    yield from dashboard_queries(json.loads(DASHBOARD.read_text(encoding="utf-8")))


def _unknown(known: set[str]) -> list[str]:
    return sorted(
        f"{where}: {name}" for where, expr in _queries() for name in metric_names_in(expr) if name not in known
    )


def test_the_scenarios_emit_what_the_incident_needs(emitted: set[str]) -> None:
    """The scrapes really covered the incident and the live sources (not an empty exporter)."""
    for name in (
        "llamacpp_slot_tokens",
        "llamacpp_kv_pool_usage_ratio",
        "llamacpp_kv_pool_capacity_tokens",
        "llamacpp_kv_pool_overcommit_ratio",
        "llamacpp_requests_aborted_total",
        "llamacpp_context_exceeded_total",
        "llamacpp_gpu_memory_free_bytes",
        "llamacpp_exporter_source_up",
    ):
        assert name in emitted, name


#: Emitted only in the middle of a pool fill, which these fast scenarios never scrape; test_forecast_e2e.py
#: scrapes it from a real fill (and fails if it is absent there).
ONLY_WHILE_FILLING = {"llamacpp_kv_pool_full_eta_seconds"}
#: A router's own families (children followed, their limit, starts, exits, children refused), emitted only
#: by an exporter that follows a llama-server in router mode; these scenarios run plain servers.
ONLY_IN_ROUTER_MODE = {
    "llamacpp_router_children",
    "llamacpp_router_children_limit",
    "llamacpp_router_child_starts_total",
    "llamacpp_router_child_exits_total",
    "llamacpp_router_children_refused_total",
}
#: The guard's families, emitted only with --guard.listen-address: what its collector puts on /metrics (a pool
#: limit known); test_guard_e2e.py scrapes them from a real guard.
ONLY_WITH_THE_GUARD = {s.name for s in collector_samples(GuardCollector(GuardBooks(), lambda: [], lambda: 1))}


def _client_samples() -> set[str]:
    """The guard's families by client (one client seen), also emitted only with the guard."""
    accounting = Accounting(ClientNamer())
    accounting.books("orchestrator")
    return {s.name for s in collector_samples(ClientCollector(accounting))}


ONLY_WITH_THE_GUARD |= _client_samples()


def test_every_queried_metric_is_emitted(emitted: set[str]) -> None:
    known = emitted | _recorded() | PROMETHEUS_SERIES | ONLY_WHILE_FILLING | ONLY_IN_ROUTER_MODE | ONLY_WITH_THE_GUARD
    assert _unknown(known) == []


def test_router_families_are_queried_and_only_they_are_exempt() -> None:
    """The router exemption covers exactly the router families, and the rules and dashboard use them all."""
    queried = {name for _, expr in _queries() for name in metric_names_in(expr)}
    assert queried >= ONLY_IN_ROUTER_MODE
    assert {n for n in queried if n.startswith("llamacpp_router_")} == ONLY_IN_ROUTER_MODE


def test_the_guard_exemption_is_only_the_guards_families() -> None:
    """The guard's exemption is its collector's own names, and the rules and dashboard query its main ones."""
    assert ONLY_WITH_THE_GUARD and all(n.startswith("llamacpp_guard_") for n in ONLY_WITH_THE_GUARD)
    queried = {name for _, expr in _queries() for name in metric_names_in(expr)}
    assert {
        "llamacpp_guard_requests_total",
        "llamacpp_guard_queue_requests",
        "llamacpp_guard_queue_wait_seconds_bucket",
        "llamacpp_guard_admitted_demand_tokens",
    } <= queried


def test_the_check_catches_a_name_that_is_not_emitted(emitted: set[str]) -> None:
    """Not vacuous: it parses names out of every rule and query, and one missing name fails it."""
    queried = {name for _, expr in _queries() for name in metric_names_in(expr)}
    assert len(queried) >= 30, sorted(queried)
    known = emitted | _recorded() | PROMETHEUS_SERIES
    assert [u for u in _unknown(known - {"llamacpp_kv_pool_usage_ratio"}) if "LlamaCppKVPoolSaturated" in u] == [
        "rule LlamaCppKVPoolSaturated: llamacpp_kv_pool_usage_ratio"
    ]
