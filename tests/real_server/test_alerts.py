"""The Prometheus rules in alerts/: generated file up to date, `promtool check rules`, `promtool test rules`,
and the conventions every alert follows (severity policy, for:, annotations that say what to do, absolute
runbook and dashboard links), and the docs' alert table rendered from them.

The behaviour of each alert (firing, not firing, the `for:` boundary, labels and expanded annotations)
is in alerts/tests/*.test.yml, run here by the real promtool: llamacpp-rules.test.yml for one server,
llamacpp-rules-many-servers.test.yml for several servers (label `server`) and a router's children (`model`),
llamacpp-rules-on-call.test.yml for a dead exporter, a target gone and a healthy default server,
llamacpp-rules-pages.test.yml for the pages of lost requests (one per incident), a rollout, the guard's
alerts, the Watchdog and a single sample at a 1 m scrape, llamacpp-rules-undersized.test.yml for the
capacity warning. test_alerts_oncall.py reads them all on a simulated three-day incident.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from paths import REPO
from prom_harness import load_script

ROOT = REPO
ALERTS = ROOT / "alerts"
RULES = ALERTS / "llamacpp-rules.yml"
RULE_TESTS = ALERTS / "tests" / "llamacpp-rules.test.yml"
#: Every promtool test file: the one above and the many-servers one.
RULE_TEST_FILES = sorted((ALERTS / "tests").glob("*.test.yml"))
RUNBOOK = ALERTS / "runbook.md"
ON_CALL_TESTS = ALERTS / "tests" / "llamacpp-rules-on-call.test.yml"
DOCS = ROOT / "docs" / "alerts-and-dashboards.md"
ANNOTATIONS = {"summary", "description"}
LINKS = {"runbook_url", "dashboard_url"}

rules_generator = load_script(ALERTS / "generate_rules.py")

#: The alert names of the metric contract (shared/DESIGN.md) and issue #5.
CONTRACT_ALERTS = {
    "LlamaCppKVPoolRequestsAborted",  # requests lost to the pool: the page, from the first abort
    "LlamaCppWatchdog",
    "LlamaCppKVPoolUndersized",
    "LlamaCppKVPoolCapacityUnknown",
    "LlamaCppExporterDown",
    "LlamaCppExporterLogNotUnderstood",
    "LlamaCppGuardQueueBacklog",
    "LlamaCppKVPoolOverflowAhead",  # the prompts in flight do not fit: the guard's signal, a warning
    "LlamaCppKVPoolSaturated",
    "LlamaCppKVPoolFillingUp",  # the predict_linear "pool full within N minutes" warning
    "LlamaCppKVPoolOvercommitted",
    "LlamaCppContextExceeded",
    "LlamaCppKVRetryCascade",
    "LlamaCppVRAMHeadroomLow",
    "LlamaCppHostMemoryLow",
    "LlamaCppServerDown",
    "LlamaCppServerRestarting",
    "LlamaCppExporterSourceDown",
    "LlamaCppExporterLogStalled",  # no log lines while requests are served
}

#: What each description must tell the operator to do (checked as substrings), after
#: nvidia_gpu_exporter's "every annotation names its corrective action".
REQUIRED_ACTIONS: dict[str, list[str]] = {
    "LlamaCppGuardQueueBacklog": ["max_tokens", "--guard.default-budget", "-c"],
    "LlamaCppGuardRefusing": ["--guard.queue-timeout", "-ctk/-ctv q8_0"],
    "LlamaCppGuardUpstreamFailing": ["--server-url", "llamacpp_up"],
    "LlamaCppWatchdog": ["dead man's switch"],
    "LlamaCppKVPoolRequestsAborted": [
        "In the next 15 minutes",
        "which clients hold the pool",
        "requests were aborted (lost)",
        " -c ",
        "--kv-unified-per-slot",
        "-ctk/-ctv q8_0",
        "or -np ",
        "the guard",
    ],
    "LlamaCppKVPoolOverflowAhead": [
        "the guard",
        "cancel the request that holds the most",
        "close that client's connection",
    ],
    "LlamaCppKVPoolOverflowPossible": ["max_tokens", "--kv-unified-per-slot", "--server-url"],
    "LlamaCppKVPoolSaturated": [
        "In the next 15 minutes",
        "which clients hold the pool",
        "Drain this instance",
        "No request has been lost yet",
        " -c ",
        "--kv-unified-per-slot",
        "-ctk/-ctv q8_0",
        "or -np ",
        "the guard",
    ],
    "LlamaCppKVPoolFillingUp": ["n_predict", "--kv-unified-per-slot"],
    "LlamaCppKVPoolOvercommitted": ["--kv-unified-per-slot", "-kvu", "-ctk/-ctv q8_0", "fewer slots"],
    "LlamaCppKVPoolUndersized": ["--kv-unified-per-slot", "or -np ", "-ctk/-ctv q8_0", " -c ", "reaches the pool in"],
    "LlamaCppContextExceeded": ["grep 'Context size has been exceeded'", "--kv-unified-per-slot", "-ctk/-ctv q8_0"],
    "LlamaCppKVRetryCascade": ["retrying with smaller batch size", "--kv-unified-per-slot"],
    "LlamaCppVRAMHeadroomLow": ["-ctk/-ctv q8_0", "smaller -c", "-ngl", "-b/-ub"],
    "LlamaCppHostMemoryLow": ["--ctx-checkpoints", "--cache-ram"],
    "LlamaCppSlowFirstTokenReprocessing": ["--ctx-checkpoints", "--cache-ram", "Request latency"],
    "LlamaCppServerDown": ["restart", "log"],
    "LlamaCppServerRestarting": ["log", "systemctl stop"],
    "LlamaCppExporterSourceDown": ["--log-file", "--server-url"],
    "LlamaCppExporterLogStalled": ["--log-file"],
    "LlamaCppExporterLogNotUnderstood": ["--log-file", "restart the exporter"],
    "LlamaCppKVPoolCapacityUnknown": ["--pid", "--kv-pool-capacity", "-lv 4"],
    "LlamaCppExporterDown": ["--listen-address", "restart it"],
    "LlamaCppExporterTargetGone": ["service discovery", "silence this alert"],
    "LlamaCppRouterChildrenRefused": ["llamacpp_router_children_limit", "--models-max"],
    "LlamaCppRouterChildCrashed": ["router's log", "--models-max"],
}

#: Alerts on series that are one per host, GPU, exporter target or job, never per llama-server (GPU memory,
#: host memory, Prometheus' `up`): they carry no `server`/`model` label, so their annotations do not name one,
#: and the label their description names instead of `instance`.
GLOBAL_ALERTS: dict[str, str | None] = {
    "LlamaCppWatchdog": None,  # no series at all
    "LlamaCppVRAMHeadroomLow": "host",
    "LlamaCppHostMemoryLow": "host",
    "LlamaCppExporterDown": "instance",
    "LlamaCppExporterTargetGone": "job",
}
#: Every `by (...)`/`on (...)` allowed, per rule: only the rules on per-target, per-host and per-job series
#: aggregate or match by a label list (per-server rules use `without` and `ignoring`).
#: The KV pages and the alerts they keep quiet join one server's series with ALERTS on the labels that name it.
SERVER_JOIN = {("on", "instance,job,model,server")}
GROUPINGS = {
    "job:llamacpp_exporter_last_scrape:timestamp": {("by", "job")},
    "LlamaCppKVPoolRequestsAborted": SERVER_JOIN,
    "LlamaCppKVPoolSaturated": SERVER_JOIN,
    "LlamaCppContextExceeded": SERVER_JOIN,
    "LlamaCppKVRetryCascade": SERVER_JOIN,
    "LlamaCppServerDown": SERVER_JOIN,
    "LlamaCppServerRestarting": SERVER_JOIN,
    "LlamaCppExporterDown": {("on", "job")},
    "LlamaCppExporterTargetGone": {("on", "job")},
    "LlamaCppVRAMHeadroomLow": {("by", "host,job,name,uuid"), ("on", "instance,uuid"), ("on", "instance")},
    "LlamaCppHostMemoryLow": {("by", "host,job")},
}
#: Who gets woken: a person who must act now and can (alerts/runbook.md, "Severity policy").
PAGES = {
    "LlamaCppKVPoolRequestsAborted",
    "LlamaCppKVPoolSaturated",
    "LlamaCppServerDown",
    "LlamaCppServerRestarting",
    "LlamaCppExporterDown",
    "LlamaCppExporterTargetGone",
}

#: The fixes the runbook must explain with their costs (issue #5).
RUNBOOK_FIXES = [
    "--kv-unified-per-slot",
    "-ctk",
    "-ctv q8_0",
    "-np",
    "-kvu",
    "-c",
    "--ctx-checkpoints",
    "--cache-ram",
    "--models-max",
]


def _rules_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return doc


def _alert_rules() -> list[dict[str, Any]]:
    return [r for g in _rules_doc()["groups"] for r in g["rules"] if "alert" in r]


def _duration_s(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    total = 0.0
    for value, unit in re.findall(r"(\d+)(ms|s|m|h|d)", text):
        total += int(value) * units[unit]
    return total


def _github_anchor(heading: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _without_who(text: str) -> str:
    return text.replace(rules_generator.WHO, "")


@pytest.mark.promtool
def test_promtool_check_rules(promtool_bin: Path) -> None:
    out = subprocess.run([str(promtool_bin), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    n_rules = sum(len(g["rules"]) for g in _rules_doc()["groups"])
    assert f"SUCCESS: {n_rules} rules found" in out.stdout, out.stdout


@pytest.mark.promtool
def test_promtool_test_rules(promtool_bin: Path) -> None:
    """Run the unit tests (firing, not firing, for: boundaries, labels and annotations) with the real promtool."""
    assert len(RULE_TEST_FILES) >= 2, RULE_TEST_FILES
    out = subprocess.run(
        [str(promtool_bin), "test", "rules", *(f.name for f in RULE_TEST_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULE_TESTS.parent,
    )
    assert out.returncode == 0 and out.stdout.count("SUCCESS") == len(RULE_TEST_FILES), out.stdout + out.stderr


@pytest.mark.promtool
def test_promtool_test_rules_catches_a_changed_threshold(promtool_bin: Path, tmp_path: Path) -> None:
    """The unit tests are not vacuous: the same tests against rules with another threshold fail."""
    (tmp_path / "tests").mkdir()
    cfg = rules_generator.Config(kv_saturated_ratio=0.97, vram_free_bytes=128 * 1024 * 1024)
    (tmp_path / "llamacpp-rules.yml").write_text(rules_generator.render(cfg), encoding="utf-8")
    for test_file in RULE_TEST_FILES:
        (tmp_path / "tests" / test_file.name).write_text(test_file.read_text(encoding="utf-8"), encoding="utf-8")
    out = subprocess.run(
        [str(promtool_bin), "test", "rules", *(f.name for f in RULE_TEST_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path / "tests",
    )
    assert out.returncode != 0
    report = out.stdout + out.stderr  # promtool writes the failures to stderr
    assert "alertname: LlamaCppKVPoolSaturated" in report and "alertname: LlamaCppVRAMHeadroomLow" in report


def test_every_alert_has_firing_non_firing_and_for_boundary_cases() -> None:
    """Per alert: a firing case, a non-firing case, and a not-yet-firing evaluation within one
    evaluation step of a firing one in the same test group (the `for:` boundary), over all test files."""
    firing: dict[str, int] = {}
    quiet: dict[str, int] = {}
    boundary: set[str] = set()
    groups = []
    for test_file in RULE_TEST_FILES:
        tests = yaml.safe_load(test_file.read_text(encoding="utf-8"))
        step = _duration_s(tests.get("evaluation_interval", "1m"))
        groups += [(step, group) for group in tests["tests"]]
    for step, group in groups:
        by_alert: dict[str, list[tuple[float, bool]]] = {}
        for case in group.get("alert_rule_test", []):
            fires = bool(case.get("exp_alerts"))
            (firing if fires else quiet)[case["alertname"]] = (firing if fires else quiet).get(case["alertname"], 0) + 1
            by_alert.setdefault(case["alertname"], []).append((_duration_s(str(case["eval_time"])), fires))
            for alert in case.get("exp_alerts") or []:
                assert set(alert["exp_annotations"]) == ANNOTATIONS, alert
                assert "severity" in alert["exp_labels"], alert
        for name, cases in by_alert.items():
            for t_quiet, fires_q in cases:
                if not fires_q and any(fires and 0 < t - t_quiet <= step for t, fires in cases):
                    boundary.add(name)
    names = {r["alert"] for r in _alert_rules()}
    assert names - set(firing) == set(), "alerts without a firing case"
    assert names - set(quiet) == {"LlamaCppWatchdog"}, "alerts without a non-firing case"
    assert names - boundary == {"LlamaCppWatchdog"}, "alerts without a for: boundary case"


def test_contract_alert_names_exist() -> None:
    names = [r["alert"] for r in _alert_rules()]
    assert len(names) == len(set(names))
    assert set(names) >= CONTRACT_ALERTS


def test_every_alert_has_for_severity_and_annotations() -> None:
    """Every alert: a for:, a severity, a one-line summary, a description that names what to do and the
    runbook's section (the committed rules carry no link: no placeholder address reaches a pager)."""
    runbook = RUNBOOK.read_text(encoding="utf-8")
    anchors = {_github_anchor(h) for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)}
    for rule in _alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"\d+(ms|s|m|h)", str(rule.get("for", ""))), f"{name}: needs a for:"
        assert rule["labels"]["severity"] in {"critical", "warning", "info"} or name == "LlamaCppWatchdog", name
        ann = rule["annotations"]
        assert set(ann) == ANNOTATIONS, name
        # One line without per-series values, except which server and model it is about.
        assert "{{" not in _without_who(ann["summary"]), f"{name}: the summary has per-series values"
        where = GLOBAL_ALERTS.get(name, "instance")
        if where:
            assert f"$labels.{where}" in ann["description"], f"{name}: the description names the {where}"
        names_server = rules_generator.WHO in ann["summary"] and rules_generator.WHO in ann["description"]
        assert names_server == (name not in GLOBAL_ALERTS), f"{name}: the annotations should name server and model"
        for action in REQUIRED_ACTIONS[name]:
            assert action in ann["description"], f"{name}: the description should tell to use {action!r}"
        assert ann["description"].endswith(f"Runbook: section {name} of alerts/runbook.md (llamacpp-exporter)."), name
        assert name.lower() in anchors, f"{name}: no section in alerts/runbook.md"
    assert "example.com" not in RULES.read_text(encoding="utf-8") and "localhost" not in RULES.read_text(
        encoding="utf-8"
    )


def test_links_are_absolute_real_addresses_when_set() -> None:
    """With --runbook-url and --grafana-url every alert links to its runbook section and the dashboard with
    its labels selected; without them no link is rendered (rather than a dead one)."""
    doc = rules_generator.build(
        rules_generator.Config(
            runbook_url="https://git.acme.corp/llm/llamacpp-exporter/runbook.md",
            grafana_url="https://grafana.acme.corp/",
        )
    )
    runbook = RUNBOOK.read_text(encoding="utf-8")
    anchors = {_github_anchor(h) for h in re.findall(r"^#+ (.+)$", runbook, flags=re.M)}
    for rule in (r for g in doc["groups"] for r in g["rules"] if "alert" in r):
        ann = rule["annotations"]
        assert set(ann) == ANNOTATIONS | LINKS, rule["alert"]
        base, _, anchor = ann["runbook_url"].partition("#")
        assert base == "https://git.acme.corp/llm/llamacpp-exporter/runbook.md" and anchor in anchors, rule["alert"]
        assert ann["dashboard_url"].startswith("https://grafana.acme.corp/d/llamacpp-exporter?from=now-3h&to=now")
        assert "Runbook: section" not in ann["description"]


def test_per_server_rules_keep_the_server_and_model_labels() -> None:
    """Several servers (`server`) and a router's children (`model`) share an instance: no aggregation or
    join may drop those labels, or one server's figures would be matched with another's (the promtool tests
    in llamacpp-rules-many-servers.test.yml show it per alert). `without (...)` keeps them; `by (...)` and
    `on (...)` only where the series are per target (Prometheus' `up`), and `ignoring (model)` only where a
    router's log line count (no model) is matched with its children."""
    for group in _rules_doc()["groups"]:
        for rule in group["rules"]:
            name = rule.get("alert") or rule["record"]
            expr = str(rule["expr"])
            for kind, labels in re.findall(r"\b(by|on|ignoring|without)\s*\(([^)]*)\)", expr):
                names = {x.strip() for x in labels.split(",") if x.strip()}
                if kind in ("by", "on"):
                    assert (kind, ",".join(sorted(names))) in GROUPINGS.get(name, set()), f"{name}: {kind} {names}"
                else:
                    assert "server" not in names, f"{name}: {kind} ({labels}) drops the server label"
                    if "model" in names:
                        assert name == "LlamaCppExporterLogStalled" and "model!=" in expr, f"{name}: drops model"


@pytest.mark.promtool
def test_label_fragment_expands_for_every_combination(promtool_bin: Path, tmp_path: Path) -> None:
    """WHO reads well with no label (one server: nothing), `server`, `model` or both."""
    rule = {"alert": "Who", "expr": "x > 0", "annotations": {"summary": "llama-server" + rules_generator.WHO + "."}}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
    cases = [
        ('x{instance="a"}', {"instance": "a"}, "llama-server."),
        ('x{instance="b", server="gpu0"}', {"instance": "b", "server": "gpu0"}, "llama-server (server gpu0)."),
        ('x{instance="c", model="alpha"}', {"instance": "c", "model": "alpha"}, "llama-server (model alpha)."),
        (
            'x{instance="d", server="r1", model="beta"}',
            {"instance": "d", "server": "r1", "model": "beta"},
            "llama-server (server r1, model beta).",
        ),
    ]
    tests = {
        "rule_files": ["rules.yml"],
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": series, "values": "1"} for series, _, _ in cases],
                "alert_rule_test": [
                    {
                        "eval_time": "0m",
                        "alertname": "Who",
                        "exp_alerts": [
                            {"exp_labels": labels, "exp_annotations": {"summary": summary}}
                            for _, labels, summary in cases
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [str(promtool_bin), "test", "rules", "tests.yml"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_pages_are_few_and_no_single_sample_trips_one() -> None:
    """Only what a person must act on now pages; the KV pages fire at once and stay up, the forecast is a
    warning. No alert fires on one sample whatever the intervals: it reads two samples (an increase, a
    gauge's previous one through idelta) or a for: of two 1m scrapes (llamacpp-rules-pages.test.yml)."""
    rules = {r["alert"]: r for r in _alert_rules()}
    assert {n for n, r in rules.items() if r["labels"]["severity"] == "critical"} == PAGES
    for name in ("LlamaCppKVPoolRequestsAborted", "LlamaCppKVPoolSaturated"):
        assert _duration_s(str(rules[name]["for"])) == 0, f"{name}: fires at once"
        assert _duration_s(str(rules[name].get("keep_firing_for", "0s"))) >= 600, f"{name}: stays up"
    for name, rule in rules.items():
        expr = str(rule["expr"])
        two_samples = "increase(" in expr or "idelta(" in expr or _duration_s(str(rule["for"])) >= 120
        assert two_samples or name == "LlamaCppWatchdog", f"{name}: one sample could fire it"
    assert rules["LlamaCppKVPoolOverflowAhead"]["labels"]["severity"] == "warning"
    assert rules["LlamaCppContextExceeded"]["labels"]["severity"] == "warning"
    assert rules["LlamaCppKVPoolOvercommitted"]["labels"]["severity"] == "info"
    assert rules["LlamaCppWatchdog"]["expr"] == "vector(1)"
    text = RUNBOOK.read_text(encoding="utf-8")
    policy = text[text.index("## Severity policy") :].split("\n## ", 1)[0]
    for words in ("15 minutes", "keep_firing_for", "one page per incident", "two samples", "LlamaCppWatchdog"):
        assert words in policy, f"the runbook's severity policy should say {words!r}"


def test_a_healthy_default_server_is_checked_against_every_alert() -> None:
    """The on-call tests' healthy default server (-np auto, -kvu, two chat requests without max_tokens)
    asserts that no alert fires, for every alert there is."""
    tests = yaml.safe_load(ON_CALL_TESTS.read_text(encoding="utf-8"))
    (group,) = [g for g in tests["tests"] if g["name"].startswith("A healthy default server")]
    checked = {c["alertname"] for c in group["alert_rule_test"] if c["exp_alerts"] == []}
    assert checked == {r["alert"] for r in _alert_rules()} - {"LlamaCppWatchdog"}
    series = " ".join(s["series"] for s in group["input_series"])
    assert 'llamacpp_kv_pool_overcommit_ratio{job="llamacpp", instance="gpu-node:9778"}' in series
    assert 'horizon="max"' in series and 'slot="1"' in series


def test_docs_alert_table_is_rendered_from_the_rules() -> None:
    """docs/alerts-and-dashboards.md's alert table is what the rules say (generate_rules.py rewrites it)."""
    text = DOCS.read_text(encoding="utf-8")
    assert rules_generator.docs_with_table(text) == text, "run: python alerts/generate_rules.py"
    table = text[text.index(rules_generator.TABLE_BEGIN) : text.index(rules_generator.TABLE_END)]
    for rule in _alert_rules():
        assert f"[`{rule['alert']}`]" in table and f"| {rule['labels']['severity']} |" in table
    changed = text.replace("| LlamaCpp", "| X").replace("| warning |", "| critical |", 1)
    assert rules_generator.docs_with_table(changed) != changed  # not vacuous


def test_links_must_be_absolute() -> None:
    """A relative runbook or Grafana address is refused with one line naming the setting, and so is a
    placeholder or this machine's address (a pager opens neither)."""
    for argv, setting in (
        (["--runbook-url", "alerts/runbook.md"], "runbook_url"),
        (["--grafana-url", "grafana:3000"], "grafana_url"),
        (["--set", "runbook_url=/runbook.md"], "runbook_url"),
    ):
        with pytest.raises(SystemExit, match=f"{setting} must be an absolute http\\(s\\) URL"):
            rules_generator.main(["-o", "/dev/null", *argv])
    for argv, setting in (
        (["--runbook-url", "https://git.example.com/ops/runbook.md"], "runbook_url"),
        (["--grafana-url", "http://localhost:3000"], "grafana_url"),
        (["--grafana-url", "http://127.0.0.1:3000"], "grafana_url"),
    ):
        with pytest.raises(SystemExit, match=f"{setting} .* is a placeholder or this machine only"):
            rules_generator.main(["-o", "/dev/null", *argv])


def test_runbook_explains_every_alert_and_the_fixes_with_costs() -> None:
    text = RUNBOOK.read_text(encoding="utf-8")
    sections = re.split(r"^## ", text, flags=re.M)
    by_title = {s.split("\n", 1)[0].strip(): s for s in sections[1:]}
    for rule in _alert_rules():
        body = by_title.get(rule["alert"])
        assert body is not None, f"runbook has no section for {rule['alert']}"
        for part in ("**Meaning.**", "**Confirm.**"):
            assert part in body, f"{rule['alert']}: runbook section lacks {part}"
        assert "**Fix.**" in body or "**Act now.**" in body, rule["alert"]
    fixes = by_title["Fixes and their costs"]
    assert "| fix | what it does | what it costs |" in fixes
    for flag in RUNBOOK_FIXES:
        assert flag in fixes, f"the fixes table lacks {flag}"


@pytest.mark.promtool
def test_thresholds_are_configurable(promtool_bin: Path, tmp_path: Path) -> None:
    """`generate_rules.py --set` changes thresholds, windows and the selector; the result is valid."""
    out_file = tmp_path / "rules.yml"
    rc = rules_generator.main(
        [
            "-o",
            str(out_file),
            "--set",
            "vram_free_bytes=1073741824",
            "--set",
            "kv_fill_minutes=30",
            "--set",
            "kv_saturated_ratio=0.85",
            "--set",
            'selector=job="llama"',
            "--runbook-url",
            "https://runbooks.acme.corp/llamacpp.md",
            "--grafana-url",
            "https://grafana.acme.corp/",
        ]
    )
    assert rc == 0
    text = out_file.read_text(encoding="utf-8")
    assert 'llamacpp_gpu_memory_free_bytes{job="llama"}\n' in text and ") < 1073741824" in text
    assert 'predict_linear(llamacpp_kv_pool_active_ratio{job="llama"}[10m], 30 * 60) >= 1' in text
    assert 'llamacpp_kv_pool_active_ratio{job="llama"} > 0.85' in text
    assert "runbook_url: https://runbooks.acme.corp/llamacpp.md#llamacppkvpoolsaturated" in text
    assert "dashboard_url: https://grafana.acme.corp/d/llamacpp-exporter?from=now-3h&to=now" in text
    check = subprocess.run([str(promtool_bin), "check", "rules", str(out_file)], capture_output=True, timeout=60)
    assert check.returncode == 0, check
    with pytest.raises(SystemExit, match="vram_free_bytes must be a int"):
        rules_generator.main(["-o", str(out_file), "--set", "vram_free_bytes=lots"])
    with pytest.raises(SystemExit, match="expected KEY=VALUE"):
        rules_generator.main(["-o", str(out_file), "--set", "no_such_knob=1"])


@pytest.mark.promtool
def test_nvml_source_alerts_only_within_the_configured_window(promtool_bin: Path, tmp_path: Path) -> None:
    """`nvml_seen_window` (1d by default) is how long after NVML last worked its failure still alerts: a GPU
    that stays gone for longer, like a host that never had one, goes quiet. Tested with a 1h window so the
    run stays short; the selector applies to every part of the expression."""
    cfg = rules_generator.Config(nvml_seen_window="1h", selector='job="llamacpp"')
    doc = rules_generator.build(cfg)
    source_down = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == "LlamaCppExporterSourceDown")
    assert source_down["expr"] == (
        'llamacpp_exporter_source_up{job="llamacpp", source!="nvml"} == 0\nor (\n'
        '  llamacpp_exporter_source_up{job="llamacpp", source="nvml"} == 0\n'
        '  and max_over_time(llamacpp_exporter_source_up{job="llamacpp", source="nvml"}[1h]) == 1\n)'
    )
    for group in doc["groups"]:  # the annotations are checked in the main unit tests; here only the expression
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    firing = [{"exp_labels": {"severity": "warning", "job": "llamacpp", "instance": "gpu-node:9778", "source": "nvml"}}]
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # NVML worked until 10m, then fails for good.
                    {
                        "series": 'llamacpp_exporter_source_up{job="llamacpp", instance="gpu-node:9778", source="nvml"}',
                        "values": "1x10 0x80",
                    },
                    # Another job's exporter is not selected, whatever its sources do.
                    {
                        "series": 'llamacpp_exporter_source_up{job="other", instance="gpu-node:9779", source="nvml"}',
                        "values": "1x10 0x80",
                    },
                    {
                        "series": 'llamacpp_exporter_source_up{job="other", instance="gpu-node:9779", source="log"}',
                        "values": "0x90",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "15m", "alertname": "LlamaCppExporterSourceDown", "exp_alerts": []},
                    {"eval_time": "16m", "alertname": "LlamaCppExporterSourceDown", "exp_alerts": firing},
                    # The last 1 (at 10m) is still within the 1h window.
                    {"eval_time": "1h5m", "alertname": "LlamaCppExporterSourceDown", "exp_alerts": firing},
                    # Past it: the same as a host without a GPU.
                    {"eval_time": "1h15m", "alertname": "LlamaCppExporterSourceDown", "exp_alerts": []},
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [str(promtool_bin), "test", "rules", "tests.yml"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


@pytest.mark.promtool
def test_a_gone_target_pages_until_it_is_back_or_forgotten(promtool_bin: Path, tmp_path: Path) -> None:
    """`exporter_forget_after` (7d by default) ends LlamaCppExporterTargetGone for a job removed for good; a
    target that comes back ends it at once. Tested with 1h so the run stays short."""
    cfg = rules_generator.Config(exporter_forget_after="1h")
    doc = rules_generator.build(cfg)
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    firing = [{"exp_labels": {"severity": "critical", "job": job}} for job in ("gone", "back")]
    build_info = "llamacpp_exporter_build_info{job=%r, instance=%r}"
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "group_eval_order": ["llamacpp.rules", "llamacpp.alerts"],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # Both jobs' only targets leave service discovery at 10m; "back" returns at 40m.
                    {"series": 'up{job="gone", instance="a:9778"}', "values": "1x9 stale"},
                    {"series": build_info.replace("'", '"') % ("gone", "a:9778"), "values": "1x9 stale"},
                    {"series": 'up{job="back", instance="b:9778"}', "values": "1x9 stale " + "_ " * 29 + "1x60"},
                    {
                        "series": build_info.replace("'", '"') % ("back", "b:9778"),
                        "values": "1x9 stale " + "_ " * 29 + "1x60",
                    },
                ],
                "alert_rule_test": [
                    {"eval_time": "14m", "alertname": "LlamaCppExporterTargetGone", "exp_alerts": []},
                    {"eval_time": "15m", "alertname": "LlamaCppExporterTargetGone", "exp_alerts": firing},
                    {"eval_time": "39m", "alertname": "LlamaCppExporterTargetGone", "exp_alerts": firing},
                    {"eval_time": "41m", "alertname": "LlamaCppExporterTargetGone", "exp_alerts": firing[:1]},
                    # The last scrape of "gone" was at 9m: forgotten one hour later.
                    {"eval_time": "1h8m", "alertname": "LlamaCppExporterTargetGone", "exp_alerts": firing[:1]},
                    {"eval_time": "1h10m", "alertname": "LlamaCppExporterTargetGone", "exp_alerts": []},
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [str(promtool_bin), "test", "rules", "tests.yml"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr
