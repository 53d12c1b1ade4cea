"""The KV pool's pages: requests being lost to the pool, and the pool past 90 %. One page per incident.

Both fire at once (no ``for:``: the pool goes from 90 % to an overflow in seconds) on conditions that need
two real samples (an increase between two samples; a gauge's last two samples), and keep firing for
``kv_page_keep_firing_for`` so that the page stays visible after the pool has emptied. They hold one
incident together: whichever fires first takes it (the other stays quiet while it fires, by reading
Prometheus' ALERTS series of the same group), and aborts keep a firing Saturated up as they would keep
RequestsAborted up. So a pool that passes 90 % and then aborts requests pages once, and aborts less than
``aborted_window`` + ``kv_page_keep_firing_for`` apart are one page.
"""

from __future__ import annotations

from llamacpp_rules.builder import BUSY, SERVER, Rule, Rules
from llamacpp_rules.clients import LARGEST_HOLDER
from llamacpp_rules.kv_pool import DEMAND, forecast_text
from llamacpp_rules.text import COUNT, THIS, figure, num

ABORTED = "LlamaCppKVPoolRequestsAborted"
SATURATED = "LlamaCppKVPoolSaturated"

#: What to do in 15 minutes, for both pages.
ACT_NOW = (
    "In the next 15 minutes: see which clients hold the pool (dashboard: tokens per slot; with the guard, "
    "llamacpp_guard_client_pool_tokens) and stop or pause the longest conversation (close that client's "
    "connection, or ask its user to compact it); if it keeps happening, restart llama-server with a pool "
    "that keeps every promise: --kv-unified-per-slot (each slot its own window), or -ctk/-ctv q8_0 and a "
    "larger -c, or fewer slots (-np); or put the guard in front of it (--guard.listen-address), which "
    "holds back the request that would overflow the pool instead of losing them all."
)


def _firing(alert: str) -> str:
    return f'ALERTS{{alertname="{alert}", alertstate="firing"}}'


def _aborts(r: Rules) -> str:
    aborted = r.m("llamacpp_requests_aborted_total", 'reason="context_exceeded"')
    return f"sum without (reason) (increase({aborted}[{r.cfg.aborted_window}])) > 0"


def requests_aborted(r: Rules) -> Rule:
    """LlamaCppKVPoolRequestsAborted (critical): llama-server aborted requests because the pool overflowed."""
    c = r.cfg
    return r.alert(
        ABORTED,
        f"{_aborts(r)}\nunless on ({SERVER}) {_firing(SATURATED)}",
        "0s",
        "critical",
        "llama-server<WHO> is losing requests: its shared KV pool overflowed and every request in flight was aborted.",
        "{{ $labels.instance }}<WHO> aborted "
        + COUNT
        + f" requests in the last {c.aborted_window} ('Context size has been exceeded', HTTP 500 to every "
        "client in flight, small requests included): the slots together needed more KV cells than the pool "
        "has. It happens again whenever the same long conversations run together. "
        + THIS
        + figure("llamacpp_kv_pool_capacity_tokens", 'printf "%.0f"', "?", before="The pool has ", after=" cells; ")
        + figure(
            f"instance:llamacpp_request_in_flight_tokens:max_{c.undersized_window}",
            'printf "%.0f"',
            "?",
            before=f"the largest request of the last {c.undersized_window} held ",
            after=". ",
        )
        + ACT_NOW
        + LARGEST_HOLDER,
        keep_firing_for=c.kv_page_keep_firing_for,
    )


def saturated(r: Rules) -> Rule:
    """LlamaCppKVPoolSaturated (critical): the pool is past 90 % while the requests in flight hold that much."""
    c, m = r.cfg, r.m
    ratio = num(c.kv_saturated_ratio)
    usage, prompt_demand = m("llamacpp_kv_pool_usage_ratio"), m(DEMAND, 'horizon="prompt"')
    full = "\n".join(
        [
            "(",
            f"  {r.last_two(usage, '>', ratio)}".replace("\n", "\n  "),
            f"  and ignoring (horizon) ({r.last_two(prompt_demand, '>', ratio)})".replace("\n", "\n  "),
            f"  and {BUSY} > 0",
            ")",
        ]
    )
    return r.alert(
        SATURATED,
        # Once it fires, the aborts that follow are its incident: they keep it up (and RequestsAborted quiet).
        f"(\n{full}\nor ({_aborts(r)} and on ({SERVER}) {_firing(SATURATED)})\n)\n"
        f"unless on ({SERVER}) {_firing(ABORTED)}",
        c.kv_saturated_for,
        "critical",
        f"llama-server's shared KV pool<WHO> is past {num(c.kv_saturated_ratio * 100)}% full while requests run: "
        "an overflow aborts every request in flight.",
        "The KV pool of {{ $labels.instance }}<WHO> is {{ $value | humanizePercentage }} full and the requests "
        "in flight hold that much (two samples in a row). When it is full, llama-server halves its batch down "
        "to 1 and then aborts EVERY in-flight request with 'Context size has been exceeded' (HTTP 500); this "
        "page stays up while that happens. "
        + forecast_text()
        + " "
        + ACT_NOW
        + " Drain this instance if you cannot stop a client."
        + LARGEST_HOLDER,
        keep_firing_for=c.kv_page_keep_firing_for,
    )
