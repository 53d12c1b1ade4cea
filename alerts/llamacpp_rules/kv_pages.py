"""The KV pool's pages: requests being lost to the pool, and the pool past 90 %. One page per incident.

"Past 90 %" counts the conversations in flight or coming back (llamacpp_kv_pool_active_ratio): an agent's slot
is idle while the agent runs its tools and its conversation returns within seconds, so the requests processing
at one instant say little; a pool full of slots idle for longer than the exporter's window is not at risk.

Both fire at once (no ``for:``: the pool goes from 90 % to an overflow in seconds) on conditions that need
two real samples (an increase between two samples; a gauge's last two samples), and keep firing for
``kv_page_keep_firing_for`` so that the page stays visible after the pool has emptied. They hold one
incident together: whichever fires first takes it (the other stays quiet while it fires, by reading
Prometheus' ALERTS series of the same group), and aborts keep a firing Saturated up as they would keep
RequestsAborted up. So a pool that passes 90 % and then aborts requests pages once, and aborts less than
``aborted_window`` + ``kv_page_keep_firing_for`` apart are one page.
"""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules.builder import BUSY, SERVER, Alerts, Rule, Rules
from llamacpp_rules.clients import LARGEST_HOLDER
from llamacpp_rules.kv_pool import choice_text, forecast_text
from llamacpp_rules.text import THIS, figure, num


@dataclass(frozen=True)
class Settings:
    """The settings of these alerts: part of `Config` (`generate_rules.py --list`, `--set`)."""

    #: LlamaCppKVPoolRequestsAborted (critical): requests aborted because the pool overflowed within this
    #: window; it fires at the first evaluation that sees the abort and keeps firing for keep_firing_for
    #: after the last one, so that aborts less than window + keep_firing_for apart are one page.
    aborted_window: str = "15m"
    kv_page_keep_firing_for: str = "15m"
    #: LlamaCppKVPoolSaturated (critical): the conversations in flight or coming back (llamacpp_kv_pool_active_ratio:
    #: slots processing, and idle slots whose last turn ended within the exporter's --kv-pool-active-window) hold
    #: more than this share of the pool at two samples in a row, and within two_samples_window either the pool's
    #: usage passed it or kv_saturated_min_processing slots processed at once; fires at once and keeps firing
    #: for kv_page_keep_firing_for.
    kv_saturated_ratio: float = 0.9
    kv_saturated_min_processing: int = 2
    kv_saturated_for: str = "0s"


#: These alerts, in the rules file's order (`document.MODULES`).
ALERTS = Alerts()

ABORTED = "LlamaCppKVPoolRequestsAborted"
SATURATED = "LlamaCppKVPoolSaturated"

#: What to do in 15 minutes, for both pages.
ACT_NOW = (
    "In the next 15 minutes: see which clients hold the pool (dashboard: tokens per slot; with the guard, "
    "llamacpp_guard_client_pool_tokens) and stop or pause the longest conversation (close that client's "
    "connection, or ask its user to compact it); or put the guard in front of llama-server "
    "(--guard.listen-address), which holds back the request that would overflow the pool instead of losing "
    "them all."
)
#: The selector of requests aborted because the pool overflowed.
ABORTED_SERIES = 'llamacpp_requests_aborted_total{%s, reason="context_exceeded"}'


def lost_text(window: str) -> str:
    """Whether requests were lost to the pool in the last ``window``, and how many (read back, not $value)."""
    return (
        THIS
        + f"{{{{ with printf `sum(increase({ABORTED_SERIES}[{window}])) > 0` $this | query }}}}"
        + '{{ . | first | value | printf "%.0f" }} requests were aborted (lost) in the last '
        + window
        + ". {{ else }}No request has been lost yet. {{ end }}"
    )


def _firing(alert: str) -> str:
    return f'ALERTS{{alertname="{alert}", alertstate="firing"}}'


def _aborts(r: Rules) -> str:
    aborted = r.m("llamacpp_requests_aborted_total", 'reason="context_exceeded"')
    return f"sum without (reason) (increase({aborted}[{r.cfg.aborted_window}])) > 0"


@ALERTS.add
def requests_aborted(r: Rules) -> Rule:
    """LlamaCppKVPoolRequestsAborted (critical): llama-server aborted requests because the pool overflowed."""
    c = r.cfg
    return r.alert(
        ABORTED,
        f"{_aborts(r)}\nunless on ({SERVER}) {_firing(SATURATED)}",
        "0s",
        "critical",
        "llama-server<WHO> is losing requests: its shared KV pool overflowed and every request in flight was aborted.",
        "{{ $labels.instance }}<WHO> lost requests: its slots together needed more KV cells than the pool has, "
        "and llama-server aborted every request in flight ('Context size has been exceeded', HTTP 500 to every "
        "client, small requests included). "
        + lost_text(c.aborted_window)
        + "It happens again whenever the same long conversations run together. "
        + figure("llamacpp_kv_pool_capacity_tokens", 'printf "%.0f"', "", before="The pool has ", after=" cells. ")
        + ACT_NOW
        + choice_text(c.undersized_window)
        + LARGEST_HOLDER,
        keep_firing_for=c.kv_page_keep_firing_for,
    )


@ALERTS.add
def saturated(r: Rules) -> Rule:
    """LlamaCppKVPoolSaturated (critical): the conversations in flight or coming back fill 90 % of the pool."""
    c, m = r.cfg, r.m
    ratio = num(c.kv_saturated_ratio)
    active, usage = m("llamacpp_kv_pool_active_ratio"), m("llamacpp_kv_pool_usage_ratio")
    # Conversations that together outgrow the pool overflow it when their turns overlap: the pool itself passed
    # the threshold within the window, or turns did run at once. One conversation at a time swapped through the
    # prompt cache, the pool never full, cannot overflow it: that is the capacity warning's.
    w = c.two_samples_window
    overlap = f"max_over_time({usage}[{w}]) > {ratio}\nor max_over_time({BUSY}[{w}]) >= {c.kv_saturated_min_processing}"
    full = f"{r.last_two(active, '>', ratio)}\nand (\n{overlap}\n)"
    return r.alert(
        SATURATED,
        # Once it fires, the aborts that follow are its incident: they keep it up (and RequestsAborted quiet).
        f"(\n{full}\nor ({_aborts(r)} and on ({SERVER}) {_firing(SATURATED)})\n)\n"
        f"unless on ({SERVER}) {_firing(ABORTED)}",
        c.kv_saturated_for,
        "critical",
        f"llama-server's shared KV pool<WHO> is past {num(c.kv_saturated_ratio * 100)}% with conversations that "
        "are running or coming back: an overflow aborts every request in flight.",
        THIS
        + "On {{ $labels.instance }}<WHO>, the conversations in flight or coming back hold "
        + figure("llamacpp_kv_pool_active_ratio", "humanizePercentage", "?")
        + " of the shared KV pool at two samples in a row (slots processing, and idle slots whose last turn ended "
        "within "
        + figure("llamacpp_kv_pool_active_window_seconds", "humanizeDuration", "the exporter's window")
        + "); it is "
        + figure("llamacpp_kv_pool_usage_ratio", "humanizePercentage", "?")
        + " full now"
        + f"{{{{ with printf `max_over_time(llamacpp_kv_pool_usage_ratio{{%s}}[{w}]) > {ratio}` $this | query }}}}"
        + f", and was past {num(c.kv_saturated_ratio * 100)}% within the last {w}{{{{ else }}}}"
        + f"{{{{ with printf `max_over_time({BUSY}{{%s}}[{w}]) >= {c.kv_saturated_min_processing}` $this | query }}}}"
        + ', and {{ . | first | value | printf "%.0f" }} turns ran at once within the last '
        + f"{w}{{{{ end }}}}{{{{ end }}}}. "
        + lost_text(c.aborted_window)
        + "When the returning conversations need more than the pool, llama-server halves its batch down to 1 and "
        "then aborts EVERY in-flight request with 'Context size has been exceeded' (HTTP 500); this page stays "
        "up while that happens. "
        + forecast_text()
        + " "
        + ACT_NOW
        + choice_text(c.undersized_window)
        + " Drain this instance if you cannot stop a client."
        + LARGEST_HOLDER,
        keep_firing_for=c.kv_page_keep_firing_for,
    )
