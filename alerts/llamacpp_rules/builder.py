"""What every rule is built with: the configured selector, the alert's links and annotations."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llamacpp_rules.text import SEVERITIES, WHO, W
from llamacpp_rules.values import absolute_url, seconds

if TYPE_CHECKING:  # Config is made of the alert modules' settings, and they import this module
    from llamacpp_rules.config import Config

#: The Grafana dashboard's uid (dashboards/generate_dashboard.py).
DASHBOARD_UID = "llamacpp-exporter"
#: A rule as it goes into the YAML document.
Rule = dict[str, Any]
#: Recorded by recording.py: the slots processing now, per server.
BUSY = "instance:llamacpp_slots_processing:sum"
#: Recorded by recording.py: cells held by the requests in flight, each slot's at two samples in a row.
HELD = "instance:llamacpp_kv_pool_in_flight_tokens:two_samples"
#: Recorded by recording.py: cells the requests in flight hold or were promised (their prompts and the
#: generation budgets their clients set: the forecast's `limits` horizon), the lesser of its last two samples.
PROMISED = "instance:llamacpp_kv_pool_promised_tokens:two_samples"
#: Recorded by recording.py: cells the largest request in flight holds, at two samples in a row.
LARGEST = "instance:llamacpp_request_in_flight_tokens:two_samples_max"
#: Recorded by recording.py: the cells of the conversations in flight or coming back (llamacpp_kv_pool_active_tokens),
#: the lesser of its last two samples.
ACTIVE = "instance:llamacpp_kv_pool_active_tokens:two_samples"
#: Labels that name one llama-server (an absent label matches its absence): for joins with ALERTS.
SERVER = "job, instance, server, model"
#: Recorded by recording.py: when a job's llamacpp-exporter was last scraped.
SEEN = "job:llamacpp_exporter_last_scrape:timestamp"


def host(lines: list[str]) -> list[str]:
    """``lines`` (one vector expression) wrapped so that it carries ``host``: the target's ``node`` label where
    service discovery sets one, else its instance without the port."""
    return [
        "  label_replace(label_replace(",
        *(f"    {line}" for line in lines),
        '  , "host", "$1", "instance", "(.+?)(:[0-9]+)?"), "host", "$1", "node", "(.+)")',
    ]


class Rules:
    """The rules' builder for one configuration."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.runbook_base = absolute_url("runbook_url", cfg.runbook_url)
        self.grafana_base = absolute_url("grafana_url", cfg.grafana_url)
        self.forget_s = seconds(cfg.exporter_forget_after)

    def m(self, name: str, extra: str = "") -> str:
        """A selector for ``name`` with the configured matchers (and ``extra`` ones)."""
        matchers = ", ".join(x for x in (self.cfg.selector, extra) if x)
        return f"{name}{{{matchers}}}" if matchers else name

    def last_two(self, selector: str, op: str, threshold: str) -> str:
        """``selector op threshold`` at its last two samples (within two_samples_window): the sample before
        the last is the last one minus idelta. Scrape-interval proof: one sample never passes, however
        often the rules are evaluated."""
        prev = f"({selector} - idelta({selector}[{self.cfg.two_samples_window}]))"
        return f"{selector} {op} {threshold}\nand {prev} {op} {threshold}"

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_base}#{alert.lower()}"

    def dashboard(self) -> str:
        """The dashboard over the last 3 hours, with the alert's job, instance, server and model selected."""
        variables = "".join(
            f"{{{{ with $labels.{label} }}}}&var-{label}={{{{ . | urlquery }}}}{{{{ end }}}}"
            for label in ("job", "instance", "server", "model")
        )
        return f"{self.grafana_base}/d/{DASHBOARD_UID}?from=now-3h&to=now{variables}"

    def alert(
        self,
        name: str,
        expr: str,
        for_: str,
        severity: str,
        summary: str,
        description: str,
        keep_firing_for: str = "",
    ) -> Rule:
        """An alerting rule; ``<WHO>`` in the annotations names the server and model (see WHO). The links
        are there when their addresses are set; without a runbook address the description names the
        runbook's section."""
        assert severity in SEVERITIES, severity
        rule: Rule = {"alert": name, "expr": expr, "for": for_}
        if keep_firing_for:
            rule["keep_firing_for"] = keep_firing_for
        description = description.replace(W, WHO)
        if not self.runbook_base:
            description += f" Runbook: section {name} of alerts/runbook.md (llamacpp-exporter)."
        annotations = {"summary": summary.replace(W, WHO), "description": description}
        if self.runbook_base:
            annotations["runbook_url"] = self.runbook(name)
        if self.grafana_base:
            annotations["dashboard_url"] = self.dashboard()
        rule["labels"] = {"severity": severity}
        rule["annotations"] = annotations
        return rule


#: What an alert module defines for each alert: its rule, for one configuration.
AlertFn = Callable[[Rules], Rule]


class Alerts(list[AlertFn]):
    """A module's alerts in the order they are defined: each function says ``@ALERTS.add`` once, and the
    rules file takes them module by module (``document.MODULES``)."""

    def add(self, alert: AlertFn) -> AlertFn:
        self.append(alert)
        return alert
