"""The example Alertmanager and Prometheus configs in alerts/: `amtool check-config`, `promtool check config`,
and the routing, grouping and inhibition of alerts/alertmanager.example.yml in a real Alertmanager.

The real Alertmanager runs a test copy of the example in which only the receivers' URLs point at a
webhook receiver run by the test (see prom_harness.alertmanager_test_config).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml
from prom_harness import (
    Alertmanager,
    Notification,
    WebhookReceiver,
    alertmanager_test_config,
    find_alertmanager,
    find_amtool,
)

ROOT = Path(__file__).resolve().parent.parent
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
    assert "SUCCESS" in out.stdout and "1 inhibit rules" in out.stdout and "2 receivers" in out.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (["severity=critical", "alertname=LlamaCppKVPoolSaturated", "instance=gpu:9778"], "pager"),
        (["severity=warning", "alertname=LlamaCppKVPoolOvercommitted", "instance=gpu:9778"], "chat"),
        (["severity=info", "alertname=Other"], "chat"),
    ],
)
def test_amtool_routes(amtool_bin: Path, labels: list[str], receiver: str) -> None:
    """Critical pages, warnings (and anything else) go to chat."""
    out = subprocess.run(
        [str(amtool_bin), "config", "routes", "test", f"--config.file={AM_EXAMPLE}", *labels],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == [receiver]


def test_example_groups_by_instance_and_inhibits_warnings() -> None:
    cfg = yaml.safe_load(AM_EXAMPLE.read_text(encoding="utf-8"))
    assert cfg["route"]["group_by"] == ["instance", "server", "model"]
    (rule,) = cfg["inhibit_rules"]
    assert rule["source_matchers"] == ['severity = "critical"']
    assert rule["target_matchers"] == ['severity = "warning"']
    assert rule["equal"] == ["instance", "server", "model"]


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
            # Instance a: the page fires together with two warnings, which it inhibits.
            # Instance b: two warnings alone, grouped into one chat message.
            am.post_alerts(
                [
                    _alert("LlamaCppKVPoolSaturated", "critical", "a:9778"),
                    _alert("LlamaCppKVPoolOvercommitted", "warning", "a:9778"),
                    _alert("LlamaCppKVRetryCascade", "warning", "a:9778"),
                    _alert("LlamaCppKVPoolOvercommitted", "warning", "b:9778"),
                    _alert("LlamaCppVRAMHeadroomLow", "warning", "b:9778"),
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
    chat = hook.wait_for(lambda n: n.path == "/chat", timeout=30, what="a chat message")
    # Slack's incoming-webhook format: one message with the group's alerts in its attachment.
    (attachment,) = chat.body["attachments"]
    assert attachment["title"].startswith("[FIRING] llama-server b:9778: "), attachment
    assert {"LlamaCppKVPoolOvercommitted", "LlamaCppVRAMHeadroomLow"} <= set(attachment["title"].split()), attachment
    assert "LlamaCppKVPoolOvercommitted" in attachment["text"] and "LlamaCppVRAMHeadroomLow" in attachment["text"]


def test_alertmanager_inhibits_warnings_while_the_page_fires(routed: tuple[WebhookReceiver, Alertmanager]) -> None:
    hook, am = routed
    hook.wait_for(_is_page, timeout=30, what="the page")
    hook.wait_for(lambda n: n.path == "/chat", timeout=30, what="the chat message")
    states = {(a["labels"]["alertname"], a["labels"]["instance"]): a["status"] for a in am.alerts()}
    for name in ("LlamaCppKVPoolOvercommitted", "LlamaCppKVRetryCascade"):
        status = states[(name, "a:9778")]
        assert status["state"] == "suppressed" and status["inhibitedBy"], (name, status)
    assert states[("LlamaCppKVPoolOvercommitted", "b:9778")]["state"] == "active"
    # Nothing about instance a ever reached the chat receiver.
    chats = [n for n in hook.received() if n.path == "/chat"]
    assert chats and all("a:9778" not in str(n.body) for n in chats), [n.body for n in chats]
