"""The guard's alerts: requests waiting in its queue, refused, or failing to reach llama-server."""

from __future__ import annotations

from dataclasses import dataclass

from llamacpp_rules.builder import Alerts, Rule, Rules
from llamacpp_rules.text import COUNT


@dataclass(frozen=True)
class Settings:
    """The settings of these alerts: part of `Config` (`generate_rules.py --list`, `--set`)."""

    #: LlamaCppGuardQueueBacklog: the guard's queue has not been empty for this long.
    guard_backlog_for: str = "5m"
    #: LlamaCppGuardRefusing / LlamaCppGuardUpstreamFailing: at least this many requests refused (429/503) /
    #: failed (llama-server unreachable or the connection broken) within guard_event_window.
    guard_event_window: str = "15m"
    guard_refused_count: int = 3
    guard_failed_count: int = 1


#: These alerts, in the rules file's order (`document.MODULES`).
ALERTS = Alerts()


@ALERTS.add
def queue_backlog(r: Rules) -> Rule:
    """LlamaCppGuardQueueBacklog: the guard's queue has not been empty for a while."""
    c, m = r.cfg, r.m
    return r.alert(
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


@ALERTS.add
def refusing(r: Rules) -> Rule:
    """LlamaCppGuardRefusing: the guard answers requests with 429/503 instead of passing them on."""
    c, m = r.cfg, r.m
    refused = m("llamacpp_guard_requests_total", 'outcome="refused"')
    return r.alert(
        "LlamaCppGuardRefusing",
        f"sum without (outcome) (increase({refused}[{c.guard_event_window}])) >= {c.guard_refused_count}",
        "0m",
        "warning",
        "The guard in front of llama-server<WHO> refuses requests (429/503): clients get errors.",
        "The guard in front of {{ $labels.instance }}<WHO> refused "
        + COUNT
        + f" requests in the last {c.guard_event_window}: its queue was full (--guard.queue-size), a request "
        "waited past --guard.queue-timeout, or a request was larger than a slot's window. The pool was "
        "protected (no request was aborted), but those clients got 429/503. Look at the queue wait "
        "(llamacpp_guard_queue_wait_seconds) and who sends the long requests "
        "(llamacpp_guard_client_requests_total); give the pool more cells (-ctk/-ctv q8_0, a larger -c) or "
        "move a client to another server; raise --guard.queue-timeout if clients can wait longer.",
    )


@ALERTS.add
def upstream_failing(r: Rules) -> Rule:
    """LlamaCppGuardUpstreamFailing: requests through the guard failed at llama-server."""
    c, m = r.cfg, r.m
    failed = m("llamacpp_guard_requests_total", 'outcome="failed"')
    return r.alert(
        "LlamaCppGuardUpstreamFailing",
        f"sum without (outcome) (increase({failed}[{c.guard_event_window}])) >= {c.guard_failed_count}",
        "0m",
        "warning",
        "Requests through the guard of llama-server<WHO> fail: llama-server is unreachable or breaks connections.",
        "The guard in front of {{ $labels.instance }}<WHO> saw "
        + COUNT
        + f" requests fail in the last {c.guard_event_window}: llama-server could not be reached or closed "
        "the connection before the answer ended (a crash, a restart, an out-of-memory kill). Requests "
        "that had no byte yet were retried within the guard's budget; these were not. Check "
        "llamacpp_up and llamacpp_server_starts_total (LlamaCppServerDown or ServerRestarting page when "
        "it is down or looping), the end of llama-server's log, and --server-url (where the guard "
        "sends requests).",
    )
