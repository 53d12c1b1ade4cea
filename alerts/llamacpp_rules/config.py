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


#: Hosts that are placeholders or this machine only: a link to them is dead on a pager.
PLACEHOLDER_HOSTS = re.compile(r"(^|\.)(example\.(com|org|net)|localhost|invalid|test)$|^127\.|^\[?::1\]?$")


def absolute_url(name: str, url: str) -> str:
    """``url`` without a trailing slash, if it is an absolute http(s) URL that is not a placeholder; '' stays
    '' (no link); else a one-line ValueError."""
    if url == "":
        return ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{name} must be an absolute http(s) URL that a pager can open (https://...), not {url!r}")
    if PLACEHOLDER_HOSTS.search(parts.hostname or ""):
        raise ValueError(
            f"{name} {url!r} is a placeholder or this machine only: a pager cannot open it; give the real address"
        )
    return url.rstrip("/")


@dataclass(frozen=True)
class Config:
    """Every knob of the rules. Durations are Prometheus durations (``30s``, ``5m``)."""

    #: Label matchers added to every llamacpp_* selector, e.g. ``job="llamacpp"`` ('' = all jobs).
    selector: str = ""
    #: Where runbook.md is published (absolute); each alert links to ``<this>#<alert name in lower case>``.
    #: Empty (the default): no runbook_url annotation, and the description names the runbook's section.
    #: A placeholder address (example.com/.org/.net, localhost) is refused: a pager cannot open it.
    runbook_url: str = ""
    #: Grafana's address (absolute); each alert links to the dashboard with its job, instance, server and
    #: model selected. Empty (the default): no dashboard_url annotation.
    grafana_url: str = ""
    #: The longest scrape interval the rules must stand: a condition on gauges needs its last two samples
    #: within this window (idelta), so that no alert fires on one sample, whatever the evaluation interval.
    two_samples_window: str = "5m"
    #: LlamaCppKVPoolRequestsAborted (critical): requests aborted because the pool overflowed within this
    #: window; it fires at the first evaluation that sees the abort and keeps firing for keep_firing_for
    #: after the last one, so that aborts less than window + keep_firing_for apart are one page.
    aborted_window: str = "15m"
    kv_page_keep_firing_for: str = "15m"
    #: LlamaCppKVPoolOverflowAhead (warning, the guard's signal): the prompts in flight need more than this
    #: share of the pool, at two samples in a row.
    kv_overflow_ahead_ratio: float = 1.0
    kv_overflow_ahead_for: str = "0s"
    #: LlamaCppKVPoolSaturated (critical): the conversations in flight or coming back (llamacpp_kv_pool_active_ratio:
    #: slots processing, and idle slots whose last turn ended within the exporter's --kv-pool-active-window) hold
    #: more than this share of the pool at two samples in a row, and the pool's usage passed it within
    #: two_samples_window; fires at once and keeps firing for kv_page_keep_firing_for.
    kv_saturated_ratio: float = 0.9
    kv_saturated_for: str = "0s"
    #: LlamaCppKVPoolOverflowPossible: at the limits their clients set (the `limits` horizon: known
    #: generation budgets; a request without one counts its prompt) the requests in flight need more than
    #: this share of the pool, while at least this many run.
    kv_overflow_possible_ratio: float = 1.0
    kv_overflow_possible_min_processing: int = 2
    kv_overflow_possible_for: str = "1m"
    #: LlamaCppKVPoolFillingUp: predict_linear over this window says the conversations in flight or coming back
    #: (llamacpp_kv_pool_active_ratio) fill the pool within N minutes.
    kv_fill_window: str = "10m"
    kv_fill_minutes: int = 15
    #: ... and they held at least this share of the pool through the whole window (a fill, not one new prompt).
    kv_fill_min_ratio: float = 0.5
    kv_fill_for: str = "2m"
    #: ... and it stays up this long after the trend flattens: a fill that pauses and resumes is one warning.
    kv_fill_keep_firing_for: str = "15m"
    #: LlamaCppKVPoolOvercommitted (info): overcommit above this while at least this many requests run and
    #: they hold more than overcommit_min_usage_ratio of the pool (idle slots' cells do not count: llama-server
    #: purges them when it needs room). A default server (-np auto, -kvu) is 4x overcommitted by design; only a
    #: pool that concurrent requests really fill makes it worth a look.
    overcommit_ratio: float = 1.0
    overcommit_min_processing: int = 2
    overcommit_min_usage_ratio: float = 0.5
    overcommit_for: str = "10m"
    #: LlamaCppKVPoolUndersized (warning): over this window, the conversations in flight or coming back held more
    #: than undersized_peak_ratio of the pool together (at two samples in a row), or that peak reaches the pool
    #: within undersized_forecast_days at the day-over-day growth of the median of the busy samples (today's
    #: window against the one before, once the one before's peak held at least undersized_trend_min_ratio of
    #: the pool; the peak itself is a coincidence of long conversations, too noisy to extrapolate); with at least
    #: undersized_min_requests requests in the window. No `for:`: its inputs already span two samples and a day.
    undersized_window: str = "1d"
    undersized_peak_ratio: float = 0.9
    undersized_forecast_days: int = 3
    undersized_trend_min_ratio: float = 0.5
    undersized_min_requests: int = 20
    #: LlamaCppKVPoolCapacityUnknown: slots known, pool size not, for this long.
    capacity_unknown_for: str = "10m"
    #: LlamaCppKVRetryCascade: a cascade that recovered (nothing aborted) within this window.
    event_window: str = "15m"
    #: LlamaCppContextExceeded: overflows within this window, once the page is over (the daytime follow-up).
    context_exceeded_window: str = "1d"
    #: LlamaCppVRAMHeadroomLow: free memory of a GPU that llama-server uses below this many bytes (512 MiB).
    vram_free_bytes: int = 512 * 1024 * 1024
    vram_for: str = "5m"
    #: LlamaCppHostMemoryLow: MemAvailable below this fraction of MemTotal.
    host_available_ratio: float = 0.1
    host_for: str = "5m"
    server_down_for: str = "1m"
    #: LlamaCppServerRestarting: at least this many server starts within the window. It and LlamaCppServerDown
    #: are one page per crash loop: whichever fires first holds it (the other stays quiet while it fires), and
    #: both keep firing for restarts_window after their condition ends.
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
    #: LlamaCppExporterDown: a target of a job that has had a llamacpp-exporter (within exporter_forget_after)
    #: fails its scrapes for this long: also a new target after a rollout that never answered. It fires
    #: until the target answers again or leaves service discovery (then LlamaCppExporterTargetGone).
    exporter_down_for: str = "5m"
    #: LlamaCppExporterTargetGone: a job that had a llamacpp-exporter has no target at all for this long...
    exporter_gone_for: str = "5m"
    #: ... and fires until a target is back, or until this long after the last scrape (a job removed for good).
    exporter_forget_after: str = "7d"
    #: LlamaCppRouterChildrenRefused / LlamaCppRouterChildCrashed: an event within this window.
    router_event_window: str = "15m"
    #: LlamaCppSlowFirstTokenReprocessing: the p95 time to first token over the window above this many seconds
    #: (a bucket bound of llamacpp_time_to_first_token_seconds: 5, 10, 30, 60 …), while prompts re-processed
    #: whole (cache="full_reprocess") took more than this share of all the time spent on first tokens.
    slow_first_token_seconds: float = 10.0
    slow_first_token_reprocess_share: float = 0.5
    slow_first_token_window: str = "30m"
    slow_first_token_for: str = "15m"
    #: LlamaCppGuardQueueBacklog: the guard's queue has not been empty for this long.
    guard_backlog_for: str = "5m"
    #: LlamaCppGuardRefusing / LlamaCppGuardUpstreamFailing: at least this many requests refused (429/503) /
    #: failed (llama-server unreachable or the connection broken) within guard_event_window.
    guard_event_window: str = "15m"
    guard_refused_count: int = 3
    guard_failed_count: int = 1
