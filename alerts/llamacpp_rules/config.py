"""The rules' settings: every threshold, window, selector and link (``generate_rules.py --list``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit


def seconds(duration: str) -> int:
    """A Prometheus duration ('7d', '1h30m') in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w|y)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"{duration!r} is not a Prometheus duration")
    return int(sum(int(n) * units[u] for n, u in parts))


def absolute_url(name: str, url: str) -> str:
    """``url`` without a trailing slash, if it is an absolute http(s) URL; else a one-line ValueError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{name} must be an absolute http(s) URL that a pager can open (https://...), not {url!r}")
    return url.rstrip("/")


@dataclass(frozen=True)
class Config:
    """Every knob of the rules. Durations are Prometheus durations (``30s``, ``5m``)."""

    #: Label matchers added to every llamacpp_* selector, e.g. ``job="llamacpp"`` ('' = all jobs).
    selector: str = ""
    #: Where runbook.md is published (absolute); each alert links to ``<this>#<alert name in lower case>``.
    #: The default is a placeholder: set your own (--runbook-url), or the links lead nowhere.
    runbook_url: str = "https://git.example.com/ops/llamacpp-exporter/blob/main/alerts/runbook.md"
    #: Grafana's address (absolute); each alert links to the dashboard with its job, instance, server and
    #: model selected. The default is the Compose stack's Grafana (docker-compose.yml).
    grafana_url: str = "http://localhost:3000"
    #: LlamaCppKVPoolOverflowAhead: the prompts in flight need more than this share of the pool (pages). The
    #: abort can be seconds away, so the page waits only for the next evaluation to agree (1s: the condition at
    #: two evaluations in a row, whatever the interval; scrape at least as often as the rules are evaluated).
    kv_overflow_ahead_ratio: float = 1.0
    kv_overflow_ahead_for: str = "1s"
    #: LlamaCppKVPoolSaturated: KV pool usage ratio above this while the requests in flight hold that much
    #: (pages). Sustained: a pool that passes it for one sample and frees itself (requests ended) is no page.
    #: The pool moves in whole batches; a burst of prompts is OverflowAhead's, a fill by generation is
    #: slower (token by token) and this page's.
    kv_saturated_ratio: float = 0.9
    kv_saturated_for: str = "30s"
    #: LlamaCppKVPoolOverflowPossible: at the limits their clients set (the `limits` horizon: known
    #: generation budgets; a request without one counts its prompt) the requests in flight need more than
    #: this share of the pool, while at least this many run.
    kv_overflow_possible_ratio: float = 1.0
    kv_overflow_possible_min_processing: int = 2
    kv_overflow_possible_for: str = "1m"
    #: LlamaCppKVPoolFillingUp: predict_linear over this window says the pool is full within N minutes.
    kv_fill_window: str = "10m"
    kv_fill_minutes: int = 15
    #: ... and the pool is at least this full already (keeps an idle, nearly empty pool quiet).
    kv_fill_min_ratio: float = 0.5
    kv_fill_for: str = "2m"
    #: LlamaCppKVPoolOvercommitted (info): overcommit above this while at least this many requests run and
    #: they hold more than overcommit_min_usage_ratio of the pool. A default server (-np auto, -kvu) is 4x
    #: overcommitted by design; only a pool that concurrent requests really fill makes it worth a look.
    overcommit_ratio: float = 1.0
    overcommit_min_processing: int = 2
    overcommit_min_usage_ratio: float = 0.5
    overcommit_for: str = "10m"
    #: LlamaCppKVPoolUndersized: over this window, the p99 request size times the p99 number of requests in
    #: flight together exceeds the pool, for this long, with at least this many requests in the window.
    undersized_window: str = "1d"
    undersized_for: str = "2h"
    undersized_min_requests: int = 20
    #: LlamaCppKVPoolCapacityUnknown: slots known, pool size not, for this long.
    capacity_unknown_for: str = "10m"
    #: LlamaCppContextExceeded / LlamaCppKVRetryCascade: an event within this window.
    event_window: str = "15m"
    #: LlamaCppVRAMHeadroomLow: free memory of a GPU that llama-server uses below this many bytes (512 MiB).
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
    #: LlamaCppExporterLogNotUnderstood: llamacpp_exporter_log_understood 0 for this long.
    log_not_understood_for: str = "5m"
    #: LlamaCppExporterDown: a target that was a llamacpp-exporter fails its scrapes for this long. It
    #: fires until the target answers again or leaves service discovery (then LlamaCppExporterTargetGone).
    exporter_down_for: str = "5m"
    #: LlamaCppExporterTargetGone: a job that had a llamacpp-exporter has no target at all for this long...
    exporter_gone_for: str = "5m"
    #: ... and fires until a target is back, or until this long after the last scrape (a job removed for good).
    exporter_forget_after: str = "7d"
    #: LlamaCppRouterChildrenRefused / LlamaCppRouterChildCrashed: an event within this window.
    router_event_window: str = "15m"
    #: LlamaCppGuardQueueBacklog: the guard's queue has not been empty for this long.
    guard_backlog_for: str = "5m"
