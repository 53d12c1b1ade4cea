"""What every rule is built with: the configured selector, the alert's links and annotations."""

from __future__ import annotations

from typing import Any

from llamacpp_rules.config import Config, absolute_url, seconds
from llamacpp_rules.text import SEVERITIES, WHO, W

#: The Grafana dashboard's uid (dashboards/generate_dashboard.py).
DASHBOARD_UID = "llamacpp-exporter"
#: A rule as it goes into the YAML document.
Rule = dict[str, Any]
#: Recorded by recording.py: the slots processing now, per server.
BUSY = "instance:llamacpp_slots_processing:sum"
#: Recorded by recording.py: the targets that are llamacpp-exporters.
KNOWN = "job_instance:llamacpp_exporter_target:known"
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

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_base}#{alert.lower()}"

    def dashboard(self) -> str:
        """The dashboard over the last 3 hours, with the alert's job, instance, server and model selected."""
        variables = "".join(
            f"{{{{ with $labels.{label} }}}}&var-{label}={{{{ . | urlquery }}}}{{{{ end }}}}"
            for label in ("job", "instance", "server", "model")
        )
        return f"{self.grafana_base}/d/{DASHBOARD_UID}?from=now-3h&to=now{variables}"

    def alert(self, name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> Rule:
        """An alerting rule; ``<WHO>`` in the annotations names the server and model (see WHO)."""
        assert severity in SEVERITIES, severity
        return {
            "alert": name,
            "expr": expr,
            "for": for_,
            "labels": {"severity": severity},
            "annotations": {
                "summary": summary.replace(W, WHO),
                "description": description.replace(W, WHO),
                "runbook_url": self.runbook(name),
                "dashboard_url": self.dashboard(),
            },
        }
