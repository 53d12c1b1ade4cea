#!/usr/bin/env python3
"""Render alerts/llamacpp-rules.yml: the Prometheus recording and alerting rules for llamacpp-exporter.

The committed rules file is this script's output with the defaults below; a test checks that they
agree. Thresholds, ``for:`` durations, the series selector and the runbook location are settings:

    python alerts/generate_rules.py           # rewrite alerts/llamacpp-rules.yml
    python alerts/generate_rules.py --set vram_free_bytes=1073741824 --set selector='job="llama"' -o my-rules.yml
    python alerts/generate_rules.py --list    # every setting with its default

Only the Python standard library and PyYAML are needed.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
RULES_FILE = HERE / "llamacpp-rules.yml"
#: A counter increase for a description: increase() extrapolates, so round it.
COUNT = '{{ printf "%.0f" $value }}'
#: Which llama-server an alert is about, when one exporter follows several: " (server gpu0, model alpha)",
#: " (server gpu0)", " (model alpha)" (a router's child) or nothing (one server: no such labels).
WHO = (
    "{{ if or $labels.server $labels.model }} ("
    "{{ with $labels.server }}server {{ . }}{{ if $labels.model }}, {{ end }}{{ end }}"
    "{{ with $labels.model }}model {{ . }}{{ end }}"
    "){{ end }}"
)
#: Where the label fragment goes in the summaries and descriptions below.
W = "<WHO>"


@dataclass(frozen=True)
class Config:
    """Every knob of the rules. Durations are Prometheus durations (``30s``, ``5m``)."""

    #: Label matchers added to every llamacpp_* selector, e.g. ``job="llamacpp"`` ('' = all jobs).
    selector: str = ""
    #: Where runbook.md is published; each alert links to ``<this>#<alert name in lower case>``.
    runbook_url: str = "alerts/runbook.md"
    #: LlamaCppKVPoolOverflowAhead: the prompts in flight need more than this share of the pool (pages).
    kv_overflow_ahead_ratio: float = 1.0
    kv_overflow_ahead_for: str = "0s"
    #: LlamaCppKVPoolSaturated: KV pool usage ratio above this while a request runs (pages). The pool
    #: moves in whole batches (6 % of a 32K pool at -b 2048): a `for:` longer than a batch or two pages
    #: after the abort, and the requests in flight must hold that much too (idle slots' cells are freed).
    kv_saturated_ratio: float = 0.9
    kv_saturated_for: str = "0s"
    #: LlamaCppKVPoolOverflowPossible: at most (prompt + generation budget) the requests in flight
    #: need more than this share of the pool, while at least this many run.
    kv_overflow_possible_ratio: float = 1.0
    kv_overflow_possible_min_processing: int = 2
    kv_overflow_possible_for: str = "1m"
    #: LlamaCppKVPoolFillingUp: predict_linear over this window says the pool is full within N minutes.
    kv_fill_window: str = "10m"
    kv_fill_minutes: int = 15
    #: ... and the pool is at least this full already (keeps an idle, nearly empty pool quiet).
    kv_fill_min_ratio: float = 0.5
    kv_fill_for: str = "2m"
    #: LlamaCppKVPoolOvercommitted: overcommit above this while at least this many requests run.
    overcommit_ratio: float = 1.0
    overcommit_min_processing: int = 2
    overcommit_for: str = "10m"
    #: LlamaCppContextExceeded / LlamaCppKVRetryCascade: an event within this window.
    event_window: str = "15m"
    #: LlamaCppVRAMHeadroomLow: free memory of a GPU below this many bytes (default 512 MiB).
    vram_free_bytes: int = 512 * 1024 * 1024
    vram_for: str = "5m"
    #: LlamaCppHostMemoryLow: MemAvailable below this fraction of MemTotal.
    host_available_ratio: float = 0.1
    host_for: str = "5m"
    server_down_for: str = "1m"
    #: LlamaCppServerRestarting: at least this many server starts within the window.
    restarts_count: int = 3
    restarts_window: str = "15m"
    restarts_for: str = "1m"
    source_down_for: str = "5m"
    #: LlamaCppExporterSourceDown for source="nvml" only when NVML worked within this window: a host without
    #: an NVIDIA GPU or driver reports nvml 0 forever and stays quiet; a GPU lost or a driver reloaded alerts
    #: (until it has been gone for this long, then it counts as a GPU-less host).
    nvml_seen_window: str = "1d"
    #: LlamaCppExporterLogStalled: no log line within this window while a slot is processing.
    log_stalled_window: str = "5m"
    log_stalled_for: str = "5m"
    exporter_down_for: str = "5m"
    #: LlamaCppExporterDown looks back this far for a target that used to be a llamacpp-exporter.
    exporter_down_lookback: str = "1h"
    #: LlamaCppRouterChildrenRefused / LlamaCppRouterChildCrashed: an event within this window.
    router_event_window: str = "15m"
    #: LlamaCppGuardQueueBacklog: the guard's queue has not been empty for this long.
    guard_backlog_for: str = "5m"


def _num(x: float) -> str:
    """0.9 -> '0.9', 1.0 -> '1', 536870912 -> '536870912' (PromQL number literals)."""
    return f"{x:g}" if isinstance(x, float) and not float(x).is_integer() else str(int(x))


class _Rules:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def m(self, name: str, extra: str = "") -> str:
        """A selector for ``name`` with the configured matchers (and ``extra`` ones)."""
        matchers = ", ".join(x for x in (self.cfg.selector, extra) if x)
        return f"{name}{{{matchers}}}" if matchers else name

    def runbook(self, alert: str) -> str:
        return f"{self.cfg.runbook_url}#{alert.lower()}"

    def alert(self, name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
        """An alerting rule; ``<WHO>`` in the annotations names the server and model (see WHO)."""
        return {
            "alert": name,
            "expr": expr,
            "for": for_,
            "labels": {"severity": severity},
            "annotations": {
                "summary": summary.replace(W, WHO),
                "description": description.replace(W, WHO),
                "runbook_url": self.runbook(name),
            },
        }

    def recording(self) -> list[dict[str, Any]]:
        m = self.m
        return [
            {
                "record": "instance:llamacpp_slots_processing:sum",
                "expr": f"sum without (slot) ({m('llamacpp_slot_processing')})",
            },
            {
                # Host RAM that llama-server holds for context checkpoints plus its prompt cache. A server
                # without checkpoint series (no slots yet) still gets its prompt cache counted.
                "record": "instance:llamacpp_host_cache_bytes:sum",
                "expr": (
                    f"(sum without (slot) ({m('llamacpp_checkpoint_bytes')})"
                    f" or {m('llamacpp_prompt_cache_bytes')} * 0)\n"
                    f"+ {m('llamacpp_prompt_cache_bytes')}"
                ),
            },
        ]

    def alerts(self) -> list[dict[str, Any]]:
        c, m = self.cfg, self.m
        busy = "instance:llamacpp_slots_processing:sum"
        out: list[dict[str, Any]] = []
        demand = "llamacpp_kv_pool_demand_ratio"
        prompt_demand = m(demand, 'horizon="prompt"')
        max_demand = m(demand, 'horizon="max"')
        usage = m("llamacpp_kv_pool_usage_ratio")
        out.append(
            self.alert(
                "LlamaCppKVPoolOverflowAhead",
                f"{prompt_demand} > {_num(c.kv_overflow_ahead_ratio)}\nand ignoring (horizon) {busy} > 0",
                c.kv_overflow_ahead_for,
                "critical",
                "The prompts in flight on llama-server<WHO> do not fit its KV pool: every request will be aborted.",
                "Once the prompts now being processed on {{ $labels.instance }}<WHO> are read, they need {{ $value | "
                "humanizePercentage }} of the shared KV pool. When it is full llama-server aborts EVERY in-flight "
                "request ('Context size has been exceeded', HTTP 500), small ones included, unless a request ends "
                "first. Act in the seconds left: cancel the request that holds the most (dashboard: demand per "
                "slot; close that client's connection), then hold back new long prompts.",
            )
        )
        out.append(
            self.alert(
                "LlamaCppKVPoolSaturated",
                f"{usage} > {_num(c.kv_saturated_ratio)}\n"
                f"and ignoring (horizon) {prompt_demand} > {_num(c.kv_saturated_ratio)}\nand {busy} > 0",
                c.kv_saturated_for,
                "critical",
                "llama-server's shared KV pool<WHO> is almost full while requests run.",
                "The KV pool of {{ $labels.instance }}<WHO> is {{ $value | humanizePercentage }} full and the requests "
                "in flight hold that much. When it is full, llama-server halves its batch down to 1 and then "
                "aborts EVERY in-flight request with 'Context size has been exceeded' (HTTP 500). Act now: cancel "
                "the request that holds the most, stop sending new long requests to this instance or drain it; "
                "then size the pool so every slot's promise can be kept: --kv-unified-per-slot, -ctk/-ctv q8_0, "
                "fewer slots (-np) or no -kvu, a smaller -c.",
            )
        )
        out.append(
            self.alert(
                "LlamaCppKVPoolOverflowPossible",
                f"{max_demand} > {_num(c.kv_overflow_possible_ratio)}\n"
                f"and ignoring (horizon) {busy} >= {c.kv_overflow_possible_min_processing}",
                c.kv_overflow_possible_for,
                "warning",
                "The requests in flight on llama-server<WHO> may together outgrow its KV pool.",
                "If the requests running on {{ $labels.instance }}<WHO> generate up to their limits (n_predict, or the "
                "slot's whole window where the limit is unknown: see llamacpp_kv_pool_demand_unknown_budget_slots; "
                "--server-url gives it), they need {{ $value | humanizePercentage }} of the shared KV pool, and "
                "an overflow aborts all of them. Cap generations (max_tokens / n_predict), keep long requests "
                "apart, or size the pool: --kv-unified-per-slot, -ctk/-ctv q8_0, fewer slots.",
            )
        )
        out.append(
            self.alert(
                "LlamaCppKVPoolFillingUp",
                f"predict_linear({m('llamacpp_kv_pool_usage_ratio')}[{c.kv_fill_window}], {c.kv_fill_minutes} * 60)"
                f" >= 1\nand {m('llamacpp_kv_pool_usage_ratio')} > {_num(c.kv_fill_min_ratio)}\nand {busy} > 0",
                c.kv_fill_for,
                "warning",
                f"llama-server's shared KV pool<WHO> is predicted to be full within {c.kv_fill_minutes} minutes.",
                f"At the trend of the last {c.kv_fill_window}, the KV pool of {{{{ $labels.instance }}}}<WHO> would "
                f"need {{{{ $value | humanizePercentage }}}} of its cells {c.kv_fill_minutes} minutes from now: it "
                "fills up before that, and then every in-flight request is aborted. Check which slots grow "
                "(dashboard: tokens per slot), cap long generations (n_predict) or move clients away; plan "
                "--kv-unified-per-slot or -ctk/-ctv q8_0.",
            )
        )
        out.append(
            self.alert(
                "LlamaCppKVPoolOvercommitted",
                f"{m('llamacpp_kv_pool_overcommit_ratio')} > {_num(c.overcommit_ratio)}\n"
                f"and {busy} >= {c.overcommit_min_processing}",
                c.overcommit_for,
                "warning",
                "llama-server's slots<WHO> are promised more KV cells than the pool holds, "
                "and requests run concurrently.",
                "{{ $labels.instance }}<WHO> promises its slots {{ $value | humanize }}x the KV pool (-kvu: every slot "
                "may use the whole -c window) and serves concurrent requests, so a few long ones can fill the pool "
                "and abort all others. Either keep every promise (--kv-unified-per-slot N, or no -kvu with "
                "-c = slots x per-slot context) or make the pool bigger for the same memory (-ctk/-ctv q8_0), "
                "or run fewer slots (-np).",
            )
        )
        out.append(
            self.alert(
                "LlamaCppContextExceeded",
                f"increase({m('llamacpp_context_exceeded_total')}[{c.event_window}]) > 0",
                "0m",
                "critical",
                "llama-server<WHO> ran out of KV cells and aborted every in-flight request.",
                "{{ $labels.instance }}<WHO> logged 'Context size has been exceeded' in the last "
                f"{c.event_window} (count: {COUNT}): the shared KV pool was full, and every request in flight at that "
                "moment was answered with HTTP 500, small ones included. Clients that retry will hit it again. "
                "Confirm with grep 'Context size has been exceeded' in the server log; fix the sizing: "
                "--kv-unified-per-slot, -ctk/-ctv q8_0, fewer slots or no -kvu, a smaller -c.",
            )
        )
        out.append(
            self.alert(
                "LlamaCppKVRetryCascade",
                f"sum without (outcome) (increase({m('llamacpp_kv_cascades_total')}[{c.event_window}])) > 0",
                "0m",
                "warning",
                "llama-server<WHO> found its KV pool full and retried with smaller batches.",
                f"{{{{ $labels.instance }}}}<WHO> ran KV retry cascades in the last {c.event_window} (count: {COUNT}; "
                "'failed to find free space in the KV cache, retrying with smaller batch "
                "size'). The pool was full; a cascade that ends in 'Context size has been exceeded' aborts every "
                "request. Look at the slots' tokens on the dashboard and plan the pool: --kv-unified-per-slot, "
                "-ctk/-ctv q8_0, fewer slots.",
            )
        )
        out.append(
            self.alert(
                "LlamaCppVRAMHeadroomLow",
                f"{m('llamacpp_gpu_memory_free_bytes')} < {_num(c.vram_free_bytes)}",
                c.vram_for,
                "warning",
                "A GPU that llama-server uses has almost no free memory.",
                "GPU {{ $labels.gpu }} ({{ $labels.name }}) on {{ $labels.instance }} has only "
                "{{ $value | humanize1024 }}B free; the next compute-buffer allocation (a long prompt, a bigger "
                "batch) can fail and abort requests or crash the server. Free VRAM: a smaller -c, -ctk/-ctv q8_0, "
                "fewer slots, fewer layers on the GPU (-ngl), or a smaller batch (-b/-ub).",
            )
        )
        out.append(
            self.alert(
                "LlamaCppHostMemoryLow",
                f"{m('llamacpp_host_memory_available_bytes')}\n/ {m('llamacpp_host_memory_total_bytes')}"
                f" < {_num(c.host_available_ratio)}",
                c.host_for,
                "warning",
                "The host that runs llama-server is running out of memory.",
                "Only {{ $value | humanizePercentage }} of host RAM is available on {{ $labels.instance }}. "
                "llama-server keeps context checkpoints and its prompt cache in host RAM (hundreds of MiB each; "
                "see llamacpp_checkpoint_bytes and llamacpp_prompt_cache_bytes); the OOM killer is next. Limit "
                "them: --ctx-checkpoints N (fewer per slot), --cache-ram MiB (0 disables the prompt cache).",
            )
        )
        out.append(
            self.alert(
                "LlamaCppServerDown",
                f"{m('llamacpp_up')} == 0\nunless {m('llamacpp_server_loading')} == 1",
                c.server_down_for,
                "critical",
                "llama-server<WHO> does not answer /health.",
                "llama-server behind {{ $labels.instance }}<WHO> has not answered /health with 200 for "
                f"{c.server_down_for} and is not loading a model. Check the service (systemctl status, "
                "kubectl describe pod) and the end of its log for the crash or the bind error; restart it.",
            )
        )
        out.append(
            self.alert(
                "LlamaCppServerRestarting",
                f"increase({m('llamacpp_server_starts_total')}[{c.restarts_window}]) >= {c.restarts_count}",
                c.restarts_for,
                "critical",
                "llama-server<WHO> is restarting over and over (crash or restart loop).",
                'llama-server behind {{ $labels.instance }}<WHO> started {{ printf "%.0f" $value }} times in the last '
                f"{c.restarts_window}. Every start drops all requests and the prompt cache. Read the last lines "
                "before each start in the log (out of memory, a failed allocation with a too large -c, an "
                "abort); stop the loop (systemctl stop) before it hides the cause, fix it, start again.",
            )
        )
        nvml = m("llamacpp_exporter_source_up", 'source="nvml"')
        not_nvml = m("llamacpp_exporter_source_up", 'source!="nvml"')
        out.append(
            self.alert(
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
        )
        lines = f"increase({m('llamacpp_exporter_log_lines_total')}[{c.log_stalled_window}])"
        no_model, some_model = 'model=""', 'model!=""'
        router_lines = f"increase({m('llamacpp_exporter_log_lines_total', no_model)}[{c.log_stalled_window}])"
        out.append(
            self.alert(
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
        )
        out.append(
            self.alert(
                "LlamaCppExporterDown",
                f"up == 0\nand on (job, instance) max_over_time({m('llamacpp_exporter_build_info')}"
                f"[{c.exporter_down_lookback}])",
                c.exporter_down_for,
                "warning",
                "Prometheus cannot scrape llamacpp-exporter.",
                "Prometheus has failed to scrape the llamacpp-exporter at {{ $labels.instance }} for "
                f"{c.exporter_down_for}; every llama-server alert for it is blind. Check the exporter process "
                "or container and its listen address (--listen-address, default :9778).",
            )
        )
        out.append(
            self.alert(
                "LlamaCppRouterChildrenRefused",
                f"increase({m('llamacpp_router_children_refused_total')}[{c.router_event_window}]) > 0",
                "0m",
                "warning",
                "The llama-server router<WHO> runs more children than llamacpp-exporter follows.",
                "The llama-server router behind {{ $labels.instance }}<WHO> started "
                f"{COUNT} child servers (one per loaded model) in the last {c.router_event_window} beyond the "
                "number llamacpp-exporter follows (llamacpp_router_children_limit): their slots, KV pools and "
                "crashes are not watched and no alert fires for them. Keep the models loaded at once within "
                "that limit with the router's --models-max (0 = unlimited), or split the models over more "
                "routers.",
            )
        )
        crashed = m("llamacpp_router_child_exits_total", 'outcome="crashed"')
        out.append(
            self.alert(
                "LlamaCppRouterChildCrashed",
                f"increase({crashed}[{c.router_event_window}]) > 0",
                "0m",
                "warning",
                "A child server of the llama-server router<WHO> crashed.",
                "A child server (one loaded model) of the llama-server router behind {{ $labels.instance }}<WHO> "
                f"exited without being unloaded in the last {c.router_event_window} (count: {COUNT}): the "
                "requests it served failed, and the router starts the model again at its next request. Read the "
                "child's last lines in the router's log (they carry its port, [PORT]) for the cause: out of "
                "memory (models that share a GPU: dashboard GPU memory by server), a failed allocation at load, "
                "an abort. Load fewer models at once (--models-max) or give them a smaller -c.",
            )
        )
        out.append(
            self.alert(
                "LlamaCppGuardQueueBacklog",
                f"{m('llamacpp_guard_queue_requests')} > 0",
                c.guard_backlog_for,
                "warning",
                "Requests keep waiting in the guard of llama-server<WHO> for room in the KV pool.",
                "The guard in front of {{ $labels.instance }}<WHO> has held requests in its queue for "
                f"{c.guard_backlog_for} without a break ({COUNT} waiting now): the requests sent together need "
                "more KV cells than the pool has. Nothing is aborted, but clients wait (llamacpp_guard_queue_wait_"
                "seconds) and past --guard.queue-timeout get 503. Ask clients to send max_tokens (a request "
                "without one counts --guard.default-budget), or give the pool more cells: a larger -c, "
                "-ctk/-ctv q8_0, or another server.",
            )
        )
        return out

    def document(self) -> dict[str, Any]:
        return {
            "groups": [
                {"name": "llamacpp.rules", "rules": self.recording()},
                {"name": "llamacpp.alerts", "rules": self.alerts()},
            ]
        }


def build(cfg: Config | None = None) -> dict[str, Any]:
    """The rules document (``{"groups": [...]}``) for ``cfg``."""
    return _Rules(cfg or Config()).document()


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)

HEADER = """\
# Prometheus rules for llamacpp-exporter (https://prometheus.io/docs/prometheus/latest/configuration/).
# GENERATED by alerts/generate_rules.py: change thresholds there (or with --set) and re-run it.
# Check: promtool check rules alerts/llamacpp-rules.yml
# Test:  promtool test rules alerts/tests/*.test.yml
# Every alert's runbook: alerts/runbook.md
"""


def render(cfg: Config | None = None) -> str:
    """The rules file text for ``cfg`` (with the header comment)."""
    body = yaml.dump(build(cfg), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


def _parse_set(cfg: Config, items: list[str]) -> Config:
    types = {f.name: f.type for f in fields(Config)}
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            raise SystemExit(
                f"generate_rules.py: error: --set {item!r}: expected KEY=VALUE with KEY one of {sorted(types)}"
            )
        kind = types[key]
        try:
            changes[key] = int(value) if kind == "int" else float(value) if kind == "float" else value
        except ValueError:
            raise SystemExit(f"generate_rules.py: error: --set {item!r}: {key} must be a {kind}") from None
    return dataclasses.replace(cfg, **changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the Prometheus rules for llamacpp-exporter.")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting")
    parser.add_argument("-o", "--output", type=Path, default=RULES_FILE, help=f"default {RULES_FILE}")
    parser.add_argument("--list", action="store_true", help="print every setting with its default and exit")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file differs from the rendering")
    args = parser.parse_args(argv)
    if args.list:
        for f in fields(Config):
            print(f"{f.name}={getattr(Config(), f.name)}")
        return 0
    text = render(_parse_set(Config(), args.set))
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is not up to date: run python alerts/generate_rules.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
