"""The guard's alert: requests keep waiting in its queue for room in the KV pool."""

from __future__ import annotations

from llamacpp_rules.builder import Rule, Rules
from llamacpp_rules.text import COUNT


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
