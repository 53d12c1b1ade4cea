"""The guard's row: what it did with each request, its queue, how long requests waited, and the demand it
admitted against the pool (exporter/guard/books.py exports these families), and by client the time to first
byte, end to end and queue wait (exporter/guard/client_metrics.py).

The guard fronts one llama-server (a plain server or a router), so its series are one per exporter
target and carry no ``server`` or ``model`` label: every query here is filtered by job and instance
only (``{G}``), whichever server or model is selected. Empty unless the exporter runs with
``--guard.listen-address``.
"""

from __future__ import annotations

from llamacpp_dashboard.layout import Layout
from llamacpp_dashboard.panels import BLUE, GREEN, ORANGE, RED, Panel, capacity_line, timeseries
from llamacpp_dashboard.query import q

#: The colour of each outcome: red where a client got an error, orange where a request was stopped.
OUTCOME_COLOURS = {
    "admitted": GREEN,
    "queued": BLUE,
    "replayed": "purple",
    "preempted": ORANGE,
    "refused": RED,
    "failed": "dark-red",
}


def guard(lay: Layout) -> None:
    """The row "Guard: admitted, queued, refused, preempted"."""
    lay.row("Guard: admitted, queued, refused, preempted")
    lay.add(_outcomes(), 6, 8)
    lay.add(_queue(), 6, 8)
    lay.add(_queue_wait(), 6, 8)
    lay.add(_demand_vs_pool(), 6, 8)
    lay.add(
        _by_client(
            "Guard: time to first byte by client (p95)",
            "llamacpp_guard_client_time_to_first_byte_seconds",
            "from each request's arrival at the guard to the guard sending its answer's head (a stream's first token), "
            "queue included: the first token as the client waits for it. Only answers that came whole with a 2xx are "
            "timed (refusals and errors are in the outcomes)",
        ),
        8,
        8,
    )
    lay.add(
        _by_client(
            "Guard: end to end by client (p95)",
            "llamacpp_guard_client_request_duration_seconds",
            "from each request's arrival at the guard to the guard sending its answer's last byte, queue "
            "included. Only answers that came whole with a 2xx are timed (refusals and errors are in the outcomes)",
        ),
        8,
        8,
    )
    lay.add(
        _by_client(
            "Guard: queue wait by client (p95)",
            "llamacpp_guard_client_queue_wait_seconds",
            "how long each client's requests waited in the guard's queue before they were admitted, refused or "
            "abandoned",
        ),
        8,
        8,
    )


def _outcomes() -> Panel:
    return timeseries(
        "Guard: requests by outcome",
        "rate of llamacpp_guard_requests_total by outcome: admitted (sent to llama-server), queued (had to wait "
        "for room first; counted admitted too once sent), refused (429/503 from the guard: queue full or wait "
        "too long, or too large for a slot), preempted (stopped so that the others could finish), replayed "
        "(sent again after a preemption), retried (sent again after llama-server died before answering), failed "
        "(llama-server unreachable or broke the connection), unsized "
        "(passed on unsized: not JSON the guard could read).",
        [
            q(
                "sum by (instance, outcome) (rate(llamacpp_guard_requests_total{G}[$__rate_interval]))",
                "{{instance}} {{outcome}}",
            )
        ],
        unit="reqps",
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": f".* {outcome}$"},
                "properties": [{"id": "color", "value": {"fixedColor": colour, "mode": "fixed"}}],
            }
            for outcome, colour in OUTCOME_COLOURS.items()
        ],
    )


def _queue() -> Panel:
    return timeseries(
        "Guard: queue and requests in flight",
        "llamacpp_guard_queue_requests (requests the guard holds back until they fit the pool; past "
        "--guard.queue-size the next one gets 429) and llamacpp_guard_in_flight_requests (sent to llama-server "
        "and not yet ended). A queue that stays above 0 for 5 minutes is LlamaCppGuardQueueBacklog.",
        [
            q("llamacpp_guard_queue_requests{G}", "{{instance}} waiting", "A"),
            q("llamacpp_guard_in_flight_requests{G}", "{{instance}} in flight", "B"),
        ],
        unit="short",
        axis_label="requests",
    )


def _queue_wait() -> Panel:
    return timeseries(
        "Guard: queue wait",
        "Quantiles and mean of llamacpp_guard_queue_wait_seconds (histogram): how long requests waited in the "
        "guard's queue before they were admitted, refused or abandoned. Past --guard.queue-timeout a request "
        "gets 503.",
        [
            q(
                "histogram_quantile(0.5, sum by (instance, le) "
                "(rate(llamacpp_guard_queue_wait_seconds_bucket{G}[$__rate_interval])))",
                "{{instance}} p50",
                "A",
            ),
            q(
                "histogram_quantile(0.95, sum by (instance, le) "
                "(rate(llamacpp_guard_queue_wait_seconds_bucket{G}[$__rate_interval])))",
                "{{instance}} p95",
                "B",
            ),
            q(
                "sum by (instance) (rate(llamacpp_guard_queue_wait_seconds_sum{G}[$__rate_interval]))\n"
                "/ sum by (instance) (rate(llamacpp_guard_queue_wait_seconds_count{G}[$__rate_interval]))",
                "{{instance}} mean",
                "C",
            ),
        ],
        unit="s",
    )


def _demand_vs_pool() -> Panel:
    return timeseries(
        "Guard: demand admitted vs pool",
        "llamacpp_guard_admitted_demand_tokens (what the requests in flight through the guard may hold at most: "
        "prompt plus generation budget), llamacpp_guard_admitted_prompt_tokens (what they hold once their "
        "prompts are read, counted by the server's tokenizer) and llamacpp_guard_pool_limit_tokens (red line: "
        "the cells the guard admits against, the pool, or one slot's window while the pool is not known).",
        [
            q("llamacpp_guard_admitted_demand_tokens{G}", "{{instance}} admitted demand (at most)", "A"),
            q("llamacpp_guard_admitted_prompt_tokens{G}", "{{instance}} admitted prompts", "B"),
            q("llamacpp_guard_pool_limit_tokens{G}", "{{instance}} pool limit", "C"),
        ],
        unit="short",
        axis_label="tokens (KV cells)",
        overrides=[capacity_line("C")],
    )


def _by_client(title: str, family: str, what: str) -> Panel:
    """p95 of one of the guard's histograms by client, one line each."""
    return timeseries(
        title,
        f"p95 of {family} (histogram) by client: {what}. Clients are named by --guard.client-from, at most "
        "--guard.max-clients, the rest 'other'.",
        [
            q(
                "histogram_quantile(0.95, sum by (instance, client, le) "
                f"(rate({family}_bucket{{G}}[$__rate_interval])))",
                "{{instance}} {{client}}",
            )
        ],
        unit="s",
    )
