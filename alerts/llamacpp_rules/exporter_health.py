"""The exporter's own alerts: a source it cannot read, a log it cannot follow or understand, the exporter
itself down or gone from Prometheus' targets."""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules.builder import BUSY, SEEN, Alerts, Rule, Rules


@dataclass(frozen=True)
class Settings:
    """The settings of these alerts: part of `Config` (`generate_rules.py --list`, `--set`)."""

    #: LlamaCppExporterSourceDown: a source (log, http, proc, nvml) unreadable for this long.
    source_down_for: str = "5m"
    #: LlamaCppExporterSourceDown for source="nvml" only when NVML worked within this window: a host without
    #: an NVIDIA GPU or driver reports nvml 0 forever and stays quiet; a GPU lost or a driver reloaded alerts
    #: (until it has been gone for this long, then it counts as a GPU-less host).
    nvml_seen_window: str = "1d"
    #: LlamaCppExporterLogStalled: no log line within this window while a slot is processing.
    log_stalled_window: str = "5m"
    log_stalled_for: str = "5m"
    #: LlamaCppExporterLogNotUnderstood: llamacpp_exporter_log_understood 0 for this long.
    log_not_understood_for: str = "5m"
    #: LlamaCppExporterDown: a target of a job that has had a llamacpp-exporter (within exporter_forget_after)
    #: fails its scrapes for this long: also a new target after a rollout that never answered. It fires
    #: until the target answers again or leaves service discovery (then LlamaCppExporterTargetGone).
    exporter_down_for: str = "5m"
    #: LlamaCppExporterTargetGone: a job that had a llamacpp-exporter has no target at all for this long...
    exporter_gone_for: str = "5m"
    #: ... and fires until a target is back, or until this long after the last scrape (a job removed for good).
    exporter_forget_after: str = "7d"


#: These alerts, in the rules file's order (`document.MODULES`).
ALERTS = Alerts()


@ALERTS.add
def source_down(r: Rules) -> Rule:
    """LlamaCppExporterSourceDown: a source (log, http, proc, nvml) cannot be read."""
    c, m = r.cfg, r.m
    nvml = m("llamacpp_exporter_source_up", 'source="nvml"')
    not_nvml = m("llamacpp_exporter_source_up", 'source!="nvml"')
    return r.alert(
        "LlamaCppExporterSourceDown",
        # NVML that never worked is a host without an NVIDIA GPU or driver (source_up 0 by design):
        # only NVML that worked within nvml_seen_window and then stopped is an outage.
        "\n".join(
            [
                f"{not_nvml} == 0",
                "or (",
                f"  {nvml} == 0",
                f"  and max_over_time({nvml}[{c.nvml_seen_window}]) == 1",
                ")",
            ]
        ),
        c.source_down_for,
        "warning",
        "llamacpp-exporter cannot read one of its sources<WHO>.",
        "llamacpp-exporter at {{ $labels.instance }}<WHO> has not been able to read its "
        "'{{ $labels.source }}' source for "
        f"{c.source_down_for}; the metrics from it are missing or stale and alerts built on them stay "
        "silent. log: check --log-file (path, permissions, llama-server started with --log-file); "
        "http: check --server-url; nvml: NVML worked within the last "
        f"{c.nvml_seen_window} and stopped (GPU lost, driver reloaded or upgraded, the container lost "
        "its GPU access): check nvidia-smi and the exporter's log (a host that never had NVML does not "
        "alert; --nvml off turns the source off); proc: the llama-server process (--pid, --proc-root).",
    )


@ALERTS.add
def log_stalled(r: Rules) -> Rule:
    """LlamaCppExporterLogStalled: no log line while a slot is processing."""
    c, m, busy = r.cfg, r.m, BUSY
    lines = f"increase({m('llamacpp_exporter_log_lines_total')}[{c.log_stalled_window}])"
    no_model, some_model = 'model=""', 'model!=""'
    router_lines = f"increase({m('llamacpp_exporter_log_lines_total', no_model)}[{c.log_stalled_window}])"
    return r.alert(
        "LlamaCppExporterLogStalled",
        # Matched per server and model. A router's log is one file for all its children: where its
        # line count carries no model label, any busy child of that router counts (second part).
        "\n".join(
            [
                f"({lines} == 0\n and {busy} > 0)",
                "or",
                f"({router_lines} == 0\n and ignoring (model) {busy}{{{some_model}}} > 0)",
            ]
        ),
        c.log_stalled_for,
        "warning",
        "llamacpp-exporter reads no log lines while llama-server<WHO> is serving requests.",
        "llamacpp-exporter at {{ $labels.instance }}<WHO> read no log line in "
        f"{c.log_stalled_window} although a slot is processing (a busy slot logs progress every 3 s), so "
        "its KV pool figures are frozen and the KV alerts cannot fire. Check that llama-server still "
        "writes the file named by --log-file (a new path after a restart, a full disk, a log rotated "
        "away) and the exporter's own log.",
    )


@ALERTS.add
def log_not_understood(r: Rules) -> Rule:
    """LlamaCppExporterLogNotUnderstood: the followed file is not llama-server's log."""
    c, m = r.cfg, r.m
    return r.alert(
        "LlamaCppExporterLogNotUnderstood",
        f"{m('llamacpp_exporter_log_understood')} == 0",
        c.log_not_understood_for,
        "warning",
        "llamacpp-exporter follows a file<WHO> that is not llama-server's log: every KV figure is missing.",
        "llamacpp-exporter at {{ $labels.instance }}<WHO> read the first lines of its log and not one of "
        "them was written by llama-server (or it is binary data), so it knows no slots, no pool and no "
        "request, and the KV alerts cannot fire. Check that --log-file names the file llama-server writes "
        "(its --log-file, or the journal / stdout the exporter reads) and that its lines are llama-server's "
        "plain text format; the exporter's own log says what it read. Then restart the exporter.",
    )


@ALERTS.add
def exporter_down(r: Rules) -> Rule:
    """LlamaCppExporterDown (critical): Prometheus cannot scrape a known exporter."""
    c = r.cfg
    return r.alert(
        "LlamaCppExporterDown",
        # Keyed on the job, not the instance: after a rollout the new target (a new pod address) that never
        # answered is as much a dead exporter as the old one.
        f"up == 0\nand on (job) {SEEN}",
        c.exporter_down_for,
        "critical",
        "Prometheus cannot scrape llamacpp-exporter: llama-server is not watched.",
        "Prometheus has failed to scrape the llamacpp-exporter target {{ $labels.instance }} of job "
        "{{ $labels.job }} (a job whose exporters were scraped within "
        f"{c.exporter_forget_after}; a new target after a rollout included) for "
        f"{c.exporter_down_for} or more; every llama-server alert for it is blind, LlamaCppServerDown "
        "included (llama-server may be down too). This fires until the exporter answers. Check the "
        "exporter process or container (systemctl status, kubectl describe pod, its log) and its listen "
        "address (--listen-address, default :9778); restart it.",
    )


@ALERTS.add
def target_gone(r: Rules) -> Rule:
    """LlamaCppExporterTargetGone (critical): a job's exporters left the targets."""
    c = r.cfg
    return r.alert(
        "LlamaCppExporterTargetGone",
        f"time() - {SEEN}\nunless on (job) up",
        c.exporter_gone_for,
        "critical",
        "A job's llamacpp-exporters have all left Prometheus' targets: llama-server is not watched.",
        "Service discovery lists no target for job {{ $labels.job }} any more; its last llamacpp-exporter "
        "was scraped {{ $value | humanizeDuration }} ago. Nothing watches those llama-servers, and no other "
        "alert can fire for them. Check the scrape configuration and service discovery (Prometheus' "
        "Targets page: a renamed job, a changed label selector, the pod or PodMonitor deleted). If the "
        "servers were removed on purpose, silence this alert: it ends by itself "
        f"{c.exporter_forget_after} after the last scrape.",
    )


def watchdog(r: Rules) -> Rule:
    """LlamaCppWatchdog: always firing, so that its absence says the rule pipeline is broken. Not in ``ALERTS``:
    the document puts it last, after every module's alerts."""
    return r.alert(
        "LlamaCppWatchdog",
        "vector(1)",
        "0m",
        "none",
        "Always firing: the pipeline from Prometheus' rules to Alertmanager works.",
        "This alert fires all the time on purpose. Route it to a dead man's switch (a service that pages when "
        "it stops hearing from it, e.g. a healthchecks or a pager's heartbeat webhook), never to a person: if "
        "it stops arriving, Prometheus no longer evaluates these rules or cannot reach Alertmanager, and no "
        "llama-server alert can reach you. Check Prometheus (its Rules and Alerts pages, the rule_files it "
        "loaded) and Alertmanager (its status page, the receiver's errors).",
    )
