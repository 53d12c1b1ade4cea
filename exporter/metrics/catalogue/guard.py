"""The guard's families: its requests by outcome, its queue, the demand it admitted, and its books by client
and access log."""

from __future__ import annotations

from typing import Literal, get_args

from exporter.metrics.catalogue.family import CLIENT, GUARD, Family

#: Outcomes of a generation request through the guard (a request may count under more than one: queued,
#: then admitted).
#: A type: mypy rejects a count of any other outcome; `OUTCOMES`, the label values, is made from it.
Outcome = Literal["admitted", "queued", "refused", "preempted", "replayed", "retried", "failed", "unsized"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
#: Why the guard's access log dropped a line.
DROP_REASONS = ("queue_full", "write_error")


# ----------------------------------------------------------------------- the guard (guard/books.py)

GUARD_REQUESTS = Family(
    "llamacpp_guard_requests_total",
    "counter",
    GUARD,
    "Generation requests through the guard, by outcome: admitted (sent to llama-server), queued (had to wait for "
    "room first), refused (answered 429/503 by the guard, or too large for a slot), preempted (stopped so that "
    "the others could finish), replayed (sent again after a preemption), retried (sent again after llama-server "
    "died before answering), failed (llama-server could not be reached, broke the connection, or the retries were "
    "spent), unsized (passed on unsized: not JSON the guard could read).",
    labels=("outcome",),
    values={"outcome": OUTCOMES},
)

GUARD_SERVER_DOWN_WAIT_SECONDS = Family(
    "llamacpp_guard_server_down_wait_seconds_total",
    "counter",
    GUARD,
    "Seconds requests waited in the guard because llama-server was down or loading its model (summed over "
    "requests: two requests waiting 3 s add 6 s).",
)

GUARD_SERVER_DOWN_WAITING_REQUESTS = Family(
    "llamacpp_guard_server_down_waiting_requests",
    "gauge",
    GUARD,
    "Requests waiting in the guard now for llama-server to be ready again (down, restarting, or loading its model).",
)

GUARD_QUEUE_REQUESTS = Family(
    "llamacpp_guard_queue_requests", "gauge", GUARD, "Requests waiting in the guard's queue for room in the KV pool."
)

GUARD_IN_FLIGHT_REQUESTS = Family(
    "llamacpp_guard_in_flight_requests",
    "gauge",
    GUARD,
    "Generation requests the guard has sent to llama-server and not yet seen end.",
)

GUARD_QUEUE_WAIT_SECONDS = Family(
    "llamacpp_guard_queue_wait_seconds",
    "histogram",
    GUARD,
    "Time requests waited in the guard's queue before they were admitted, refused or abandoned.",
)

GUARD_ADMITTED_DEMAND_TOKENS = Family(
    "llamacpp_guard_admitted_demand_tokens",
    "gauge",
    GUARD,
    "KV cells the requests in flight through the guard may hold at most (prompt plus generation budget).",
)

GUARD_ADMITTED_PROMPT_TOKENS = Family(
    "llamacpp_guard_admitted_prompt_tokens",
    "gauge",
    GUARD,
    "KV cells the requests in flight through the guard will hold once their prompts are read, exact at arrival "
    "(the server's own tokenizer), whatever llama-server's log verbosity shows.",
)

GUARD_REQUEST_PROMPT_TOKENS = Family(
    "llamacpp_guard_request_prompt_tokens",
    "histogram",
    GUARD,
    "Prompt sizes the guard counted with llama-server's tokenizer (not those admitted on their byte length while "
    "less than half the pool was promised).",
)

GUARD_POOL_LIMIT_TOKENS = Family(
    "llamacpp_guard_pool_limit_tokens",
    "gauge",
    GUARD,
    "KV cells the guard admits requests against (the shared pool, else one slot's window).",
)


# ------------------------------------------ by client, and the access log (guard/client_metrics.py)

GUARD_CLIENT_REQUESTS = Family(
    "llamacpp_guard_client_requests_total",
    "counter",
    CLIENT,
    "Generation requests through the guard by client and outcome (the outcomes of llamacpp_guard_requests_total). "
    "Clients are named by --guard.client-from; at most --guard.max-clients names, the rest 'other'.",
    labels=("client", "outcome"),
    values={"outcome": OUTCOMES},
)

GUARD_CLIENT_POOL_TOKENS = Family(
    "llamacpp_guard_client_pool_tokens",
    "gauge",
    CLIENT,
    "KV cells each client's requests hold in the pool now: their slots' cells in /slots (requests matched to "
    "slots by prompt size and n_predict; a request not matched yet counts 0).",
    labels=("client",),
)

GUARD_CLIENT_IN_FLIGHT_REQUESTS = Family(
    "llamacpp_guard_client_in_flight_requests",
    "gauge",
    CLIENT,
    "Generation requests of each client the guard is handling now (waiting in its queue or running).",
    labels=("client",),
)

GUARD_CLIENT_PROMPT_TOKENS = Family(
    "llamacpp_guard_client_prompt_tokens_total",
    "counter",
    CLIENT,
    "Prompt tokens of each client's ended requests, counted with llama-server's tokenizer.",
    labels=("client",),
)

GUARD_CLIENT_GENERATED_TOKENS = Family(
    "llamacpp_guard_client_generated_tokens_total",
    "counter",
    CLIENT,
    "Tokens generated for each client's ended requests, as /slots last showed them while they ran.",
    labels=("client",),
)

GUARD_CLIENT_QUEUE_WAIT_SECONDS = Family(
    "llamacpp_guard_client_queue_wait_seconds",
    "histogram",
    CLIENT,
    "Time each client's requests waited in the guard's queue before they were admitted, refused or abandoned "
    "(count: requests that waited; the buckets of llamacpp_guard_queue_wait_seconds).",
    labels=("client",),
)

GUARD_CLIENT_TIME_TO_FIRST_BYTE_SECONDS = Family(
    "llamacpp_guard_client_time_to_first_byte_seconds",
    "histogram",
    CLIENT,
    "Time from a request's arrival at the guard (its head read) to the guard sending its client the head of "
    "llama-server's answer (a stream's head goes with its first event: the first token), queue and replays "
    "included; requests whose answer came whole with a 2xx status only (the buckets of "
    "llamacpp_time_to_first_token_seconds).",
    labels=("client",),
)

GUARD_CLIENT_REQUEST_DURATION_SECONDS = Family(
    "llamacpp_guard_client_request_duration_seconds",
    "histogram",
    CLIENT,
    "Time from a request's arrival at the guard to the guard sending the last byte of its answer, for the "
    "requests of llamacpp_guard_client_time_to_first_byte_seconds (the buckets of "
    "llamacpp_request_duration_seconds).",
    labels=("client",),
)

GUARD_CLIENTS_LIMIT = Family(
    "llamacpp_guard_clients_limit",
    "gauge",
    CLIENT,
    "Client names the guard keeps apart at most (--guard.max-clients); later ones count as 'other'.",
)

GUARD_ACCESS_LOG_LINES = Family(
    "llamacpp_guard_access_log_lines_total", "counter", GUARD, "Lines written to the guard's access log."
)

GUARD_ACCESS_LOG_DROPPED_LINES = Family(
    "llamacpp_guard_access_log_dropped_lines_total",
    "counter",
    GUARD,
    "Access log lines not written, by reason: queue_full (the writer fell behind), write_error.",
    labels=("reason",),
    values={"reason": DROP_REASONS},
)

GUARD_ACCESS_LOG_ROTATIONS = Family(
    "llamacpp_guard_access_log_rotations_total",
    "counter",
    GUARD,
    "Times the access log passed its size limit and was moved to PATH.1.",
)
