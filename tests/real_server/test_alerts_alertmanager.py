"""The example Alertmanager and Prometheus configs in alerts/: `amtool check-config`, `promtool check config`,
and the routing, grouping and inhibition of alerts/alertmanager.example.yml in a real Alertmanager.

The real Alertmanager runs a test copy of the example in which only the receivers' URLs point at a
webhook receiver run by the test (see prom_harness.alertmanager_test_config).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from paths import REPO
from prom_harness import (
    Alertmanager,
    Notification,
    WebhookReceiver,
    alertmanager_test_config,
    find_alertmanager,
    find_amtool,
)

ROOT = REPO
AM_EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"
PROM_EXAMPLE = ROOT / "alerts" / "prometheus.example.yml"


def _missing(what: str) -> NoReturn:
    hint = "run scripts/unpack-test-tools.sh"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{what} not found under CI: {hint}", pytrace=False)
    pytest.skip(f"{what} not found: {hint}")


@pytest.fixture(scope="module")
def amtool_bin() -> Path:
    return find_amtool() or _missing("amtool")


@pytest.fixture(scope="module")
def alertmanager_bin() -> Path:
    return find_alertmanager() or _missing("prometheus-alertmanager")


def test_amtool_check_config(amtool_bin: Path) -> None:
    out = subprocess.run([str(amtool_bin), "check-config", str(AM_EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout and "2 inhibit rules" in out.stdout and "3 receivers" in out.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "alertname=LlamaCppKVPoolSaturated", "instance=gpu:9778"], "pager"),
        (["severity=critical", "alertname=LlamaCppKVPoolRequestsAborted", "instance=gpu:9778"], "pager"),
        (["severity=none", "alertname=LlamaCppWatchdog"], "watchdog"),
        (["severity=warning", "alertname=LlamaCppVRAMHeadroomLow", "host=gpu", "uuid=GPU-1"], "chat"),
        (["severity=critical", "alertname=LlamaCppExporterDown", "instance=gpu:9778"], "pager"),
        (["severity=warning", "alertname=LlamaCppContextExceeded", "instance=gpu:9778"], "chat"),
        (["severity=info", "alertname=LlamaCppKVPoolOvercommitted", "instance=gpu:9778"], "chat"),
        (["severity=none", "alertname=Other"], "chat"),
    ],
)
def test_amtool_routes(amtool_bin: Path, labels: list[str], receiver: str) -> None:
    """Critical pages, warnings and information (and anything else) go to chat."""
    out = subprocess.run(
        [str(amtool_bin), "config", "routes", "test", f"--config.file={AM_EXAMPLE}", *labels],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == [receiver]


def _matches(matchers: list[str], labels: dict[str, str]) -> bool:
    """Alertmanager's `label = "v"` / `label =~ "re"` matchers (anchored, as Alertmanager anchors them)."""
    for matcher in matchers:
        m = re.fullmatch(r'(\w+) (=~|=) "(.*)"', matcher)
        assert m is not None, matcher
        name, op, value = m.groups()
        got = labels.get(name, "")
        if not (re.fullmatch(value, got) if op == "=~" else got == value):
            return False
    return True


def _muted_by(source: dict[str, str], target: dict[str, str]) -> bool:
    cfg = yaml.safe_load(AM_EXAMPLE.read_text(encoding="utf-8"))
    return any(
        _matches(r["source_matchers"], source)
        and _matches(r["target_matchers"], target)
        and all(source.get(k, "") == target.get(k, "") for k in r["equal"])
        for r in cfg["inhibit_rules"]
    )


def test_example_groups_by_the_labels_each_alert_carries_and_inhibits_only_what_the_page_says() -> None:
    """Grouped by what each alert carries: a server's alerts by job, instance, server and model, a host's and
    its GPUs' by job and host (they have no instance: grouped by instance they would all share one group),
    a job's by job. A KV page mutes that server's KV warnings and nothing else (memory, log and exporter
    warnings stay: LlamaCppExporterLogStalled says the page's figures are frozen); a server down mutes its
    http source and the guard's upstream failures only."""
    cfg = yaml.safe_load(AM_EXAMPLE.read_text(encoding="utf-8"))
    rules_doc = yaml.safe_load((ROOT / "alerts" / "llamacpp-rules.yml").read_text(encoding="utf-8"))
    group_by = set(cfg["route"]["group_by"])
    assert group_by == {"job", "instance", "host", "server", "model"}
    for rule in (r for g in rules_doc["groups"] for r in g["rules"] if "alert" in r):
        expr = str(rule["expr"])
        if "min by (job, host" in expr:  # host and GPU alerts: their own groups per host
            assert "host" in group_by and "instance" not in re.findall(r"by \(([^)]*)\)", expr)[0]
    assert all(r["equal"] == ["job", "instance", "server", "model"] for r in cfg["inhibit_rules"])
    a = {"instance": "a:9778", "job": "llamacpp"}
    for page_name in ("LlamaCppKVPoolSaturated", "LlamaCppKVPoolRequestsAborted"):
        page = {**a, "alertname": page_name, "severity": "critical"}
        for name in (
            "LlamaCppKVPoolOverflowAhead",
            "LlamaCppKVPoolOverflowPossible",
            "LlamaCppKVPoolFillingUp",
            "LlamaCppKVRetryCascade",
            "LlamaCppKVPoolUndersized",
        ):
            assert _muted_by(page, {**a, "alertname": name, "severity": "warning"}), name
            assert not _muted_by(page, {**a, "alertname": name, "severity": "warning", "model": "beta"}), name
        for name in ("LlamaCppExporterLogStalled", "LlamaCppExporterSourceDown", "LlamaCppServerDown"):
            assert not _muted_by(page, {**a, "alertname": name, "severity": "warning"}), name
        for name in ("LlamaCppVRAMHeadroomLow", "LlamaCppHostMemoryLow"):
            assert not _muted_by(page, {"host": "a", "job": "llamacpp", "alertname": name, "severity": "warning"})
    down = {**a, "alertname": "LlamaCppServerDown", "severity": "critical"}
    assert _muted_by(down, {**a, "alertname": "LlamaCppExporterSourceDown", "source": "http"})
    assert not _muted_by(down, {**a, "alertname": "LlamaCppExporterSourceDown", "source": "log"})
    assert _muted_by(down, {**a, "alertname": "LlamaCppGuardUpstreamFailing", "severity": "warning"})


@pytest.mark.promtool
def test_promtool_check_prometheus_example(promtool_bin: Path) -> None:
    """The Prometheus example loads the rules file (paths relative to the config) and is valid."""
    out = subprocess.run(
        [str(promtool_bin), "check", "config", str(PROM_EXAMPLE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 1 rule files found" in out.stdout


def _alert(alertname: str, severity: str, instance: str = "", **labels: str) -> dict[str, Any]:
    where = {"instance": instance} if instance else {}
    return {
        "labels": {"alertname": alertname, "severity": severity, **where, "job": "llamacpp", **labels},
        "annotations": {"summary": f"{alertname} test", "description": "test", "runbook_url": "alerts/runbook.md"},
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@pytest.fixture(scope="module")
def routed(alertmanager_bin: Path) -> Iterator[tuple[WebhookReceiver, Alertmanager]]:
    with WebhookReceiver() as hook:
        config = alertmanager_test_config(AM_EXAMPLE.read_text(encoding="utf-8"), hook.url)
        with Alertmanager(alertmanager_bin, config) as am:
            # Instance a: the page fires together with two KV warnings, which it inhibits, and a log stall,
            # which it does not. Instance b: two warnings alone, grouped into one chat message.
            am.post_alerts(
                [
                    _alert("LlamaCppKVPoolSaturated", "critical", "a:9778"),
                    _alert("LlamaCppKVPoolOvercommitted", "info", "a:9778"),
                    _alert("LlamaCppKVRetryCascade", "warning", "a:9778"),
                    _alert("LlamaCppExporterLogStalled", "warning", "a:9778"),
                    _alert("LlamaCppKVPoolOverflowPossible", "warning", "b:9778"),
                    _alert("LlamaCppKVRetryCascade", "warning", "b:9778"),
                ]
            )
            yield hook, am


def _is_page(n: Notification) -> bool:
    return n.path == "/pager" and n.body.get("status") == "firing"


def test_alertmanager_pages_the_critical_alert(routed: tuple[WebhookReceiver, Alertmanager]) -> None:
    hook, _ = routed
    page = hook.wait_for(_is_page, timeout=30, what="a page at the pager webhook")
    assert page.body["receiver"] == "pager"
    assert page.body["groupLabels"] == {"job": "llamacpp", "instance": "a:9778"}
    assert [a["labels"]["alertname"] for a in page.body["alerts"]] == ["LlamaCppKVPoolSaturated"]


def test_alertmanager_sends_warnings_to_chat_grouped_by_instance(
    routed: tuple[WebhookReceiver, Alertmanager],
) -> None:
    hook, _ = routed
    chat = hook.wait_for(
        lambda n: n.path == "/chat" and "b:9778" in str(n.body), timeout=30, what="a chat message for b"
    )
    # Slack's incoming-webhook format: one message with the group's alerts in its attachment.
    (attachment,) = chat.body["attachments"]
    assert attachment["title"].startswith("[FIRING] llama-server b:9778: "), attachment
    names = {"LlamaCppKVPoolOverflowPossible", "LlamaCppKVRetryCascade"}
    assert names <= set(attachment["title"].split()), attachment
    assert all(name in attachment["text"] for name in names)


def test_alertmanager_inhibits_warnings_while_the_page_fires(routed: tuple[WebhookReceiver, Alertmanager]) -> None:
    hook, am = routed
    hook.wait_for(_is_page, timeout=30, what="the page")
    stall = hook.wait_for(
        lambda n: n.path == "/chat" and "a:9778" in str(n.body), timeout=30, what="instance a's chat message"
    )
    states = {(a["labels"]["alertname"], a["labels"]["instance"]): a["status"] for a in am.alerts()}
    for name in ("LlamaCppKVPoolOvercommitted", "LlamaCppKVRetryCascade"):
        status = states[(name, "a:9778")]
        assert status["state"] == "suppressed" and status["inhibitedBy"], (name, status)
    assert states[("LlamaCppExporterLogStalled", "a:9778")]["state"] == "active"
    assert states[("LlamaCppKVRetryCascade", "b:9778")]["state"] == "active"
    # For instance a, chat got the log stall (the page's figures are frozen) and none of the muted warnings.
    (attachment,) = stall.body["attachments"]
    assert "LlamaCppExporterLogStalled" in attachment["title"], attachment
    chats = [str(n.body) for n in hook.received() if n.path == "/chat" and "a:9778" in str(n.body)]
    assert all("LlamaCppKVRetryCascade" not in c and "LlamaCppKVPoolOvercommitted" not in c for c in chats), chats


def test_host_and_gpu_alerts_are_grouped_by_host(alertmanager_bin: Path) -> None:
    """Two hosts' GPU and memory alerts (labels job, host, uuid, name: no instance) make one chat message per
    host, not one for all hosts."""
    with WebhookReceiver() as hook:
        config = alertmanager_test_config(AM_EXAMPLE.read_text(encoding="utf-8"), hook.url)
        with Alertmanager(alertmanager_bin, config) as am:
            am.post_alerts(
                [
                    _alert("LlamaCppVRAMHeadroomLow", "warning", host="node-a", uuid="GPU-a0", name="RTX 4090"),
                    _alert("LlamaCppVRAMHeadroomLow", "warning", host="node-a", uuid="GPU-a1", name="RTX 4090"),
                    _alert("LlamaCppHostMemoryLow", "warning", host="node-a"),
                    _alert("LlamaCppVRAMHeadroomLow", "warning", host="node-b", uuid="GPU-b0", name="RTX 3090"),
                ]
            )
            for host, count in (("node-a", 3), ("node-b", 1)):

                def for_host(n: Notification, h: str = host) -> bool:
                    return n.path == "/chat" and f"llama-server {h}:" in str(n.body)

                message = hook.wait_for(for_host, timeout=30, what=f"the chat message for {host}")
                (attachment,) = message.body["attachments"]
                assert attachment["title"].count("LlamaCpp") == count, attachment
            time.sleep(2)  # a second group_interval (1 s in the test copy): nothing else arrives
            chats = [n for n in hook.received() if n.path == "/chat"]
            assert len(chats) == 2, [c.body for c in chats]


def test_one_incident_is_one_notification(alertmanager_bin: Path) -> None:
    """An incident as Prometheus sends it, every evaluation (1 s here, with group_interval 1 s): first the
    forecast warnings, then the page (LlamaCppKVPoolSaturated; the rules keep RequestsAborted quiet while it
    fires), with the sizing and retry warnings joining while it fires. One notification reaches a person:
    the page; the warnings that fire with it are muted, and the one sent before it (the forecast) is the
    only chat message."""
    with WebhookReceiver() as hook:
        config = alertmanager_test_config(AM_EXAMPLE.read_text(encoding="utf-8"), hook.url)
        with Alertmanager(alertmanager_bin, config) as am:
            ahead = _alert("LlamaCppKVPoolOverflowAhead", "warning", "a:9778")
            am.post_alerts([ahead])
            hook.wait_for(lambda n: n.path == "/chat", timeout=30, what="the forecast in chat")
            page = _alert("LlamaCppKVPoolSaturated", "critical", "a:9778")
            joining = [
                _alert("LlamaCppKVPoolOverflowPossible", "warning", "a:9778"),
                _alert("LlamaCppKVPoolUndersized", "warning", "a:9778"),
                _alert("LlamaCppKVRetryCascade", "warning", "a:9778"),
            ]
            for second in range(8):  # Prometheus re-sends the firing alerts at every evaluation
                am.post_alerts([ahead, page, *joining[: second // 2]])
                time.sleep(1)
            hook.wait_for(_is_page, timeout=30, what="the page")
            time.sleep(2)
            pages = [n for n in hook.received() if n.path == "/pager"]
            chats = [n for n in hook.received() if n.path == "/chat"]
            assert len(pages) == 1 and pages[0].body["status"] == "firing", [p.body for p in pages]
            assert len(chats) == 1, [c.body for c in chats]
            states = {a["labels"]["alertname"]: a["status"]["state"] for a in am.alerts()}
            assert states["LlamaCppKVPoolSaturated"] == "active"
            assert all(states[a["labels"]["alertname"]] == "suppressed" for a in joining), states
