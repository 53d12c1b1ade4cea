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
    assert "SUCCESS" in out.stdout and "3 inhibit rules" in out.stdout and "2 receivers" in out.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "alertname=LlamaCppKVPoolSaturated", "instance=gpu:9778"], "pager"),
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


def test_example_groups_by_server_and_inhibits_only_what_the_page_says() -> None:
    """Grouped per server; a KV page mutes that server's KV warnings and nothing else (memory, log and
    exporter warnings stay: LlamaCppExporterLogStalled says the page's figures are frozen); OverflowAhead
    mutes Saturated; a server down mutes its http source only."""
    cfg = yaml.safe_load(AM_EXAMPLE.read_text(encoding="utf-8"))
    assert cfg["route"]["group_by"] == ["instance", "server", "model"]
    assert all(r["equal"] == ["instance", "server", "model"] for r in cfg["inhibit_rules"])
    a = {"instance": "a:9778", "job": "llamacpp"}
    page = {**a, "alertname": "LlamaCppKVPoolSaturated", "severity": "critical"}
    for name in ("LlamaCppKVPoolOverflowPossible", "LlamaCppKVPoolFillingUp", "LlamaCppKVRetryCascade"):
        assert _muted_by(page, {**a, "alertname": name, "severity": "warning"}), name
        assert not _muted_by(page, {**a, "alertname": name, "severity": "warning", "model": "beta"}), name
    for name in ("LlamaCppExporterLogStalled", "LlamaCppExporterSourceDown", "LlamaCppServerDown"):
        assert not _muted_by(page, {**a, "alertname": name, "severity": "warning"}), name
    for name in ("LlamaCppVRAMHeadroomLow", "LlamaCppHostMemoryLow"):
        assert not _muted_by(page, {"host": "a", "job": "llamacpp", "alertname": name, "severity": "warning"}), name
    ahead = {**a, "alertname": "LlamaCppKVPoolOverflowAhead", "severity": "critical"}
    assert _muted_by(ahead, page) and not _muted_by(page, ahead)
    down = {**a, "alertname": "LlamaCppServerDown", "severity": "critical"}
    assert _muted_by(down, {**a, "alertname": "LlamaCppExporterSourceDown", "source": "http"})
    assert not _muted_by(down, {**a, "alertname": "LlamaCppExporterSourceDown", "source": "log"})


@pytest.mark.promtool
def test_promtool_check_prometheus_example(promtool_bin: Path) -> None:
    """The Prometheus example loads the rules file (paths relative to the config) and is valid."""
    out = subprocess.run(
        [str(promtool_bin), "check", "config", str(PROM_EXAMPLE)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 1 rule files found" in out.stdout


def _alert(name: str, severity: str, instance: str) -> dict[str, Any]:
    return {
        "labels": {"alertname": name, "severity": severity, "instance": instance, "job": "llamacpp"},
        "annotations": {"summary": f"{name} test", "description": "test", "runbook_url": "alerts/runbook.md"},
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
    assert page.body["groupLabels"] == {"instance": "a:9778"}
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
