"""The families of what a server's log says: slots, the KV pool and its forecast, retry cascades, aborts,
checkpoints and the prompt cache, request sizes (the log collectors: `server_log`, `forecast`, `checkpoints`,
`requests`)."""

from __future__ import annotations

from exporter.logs import events as ev
from exporter.metrics.catalogue.family import SERVER, Family
from exporter.model.forecast import HORIZONS, SIZE_SOURCES
from exporter.model.latency import CACHE_OUTCOMES, FINISH_REASONS
from exporter.model.run import CRASH_CAUSES

#: How a KV retry cascade ended.
CASCADE_OUTCOMES = ("recovered", "failed")
#: Why llama-server ended requests with an error (send_error).
ABORT_REASONS = ("context_exceeded",)
#: Fatal decode errors.
DECODE_FAILURE_REASONS = ("context_exceeded", "invalid_batch", "compute_error")
#: Why a log line was read but not applied.
REJECT_REASONS = ("malformed", "out_of_range", "format", "inconsistent", "unexpected", "unfollowed")
#: Context checkpoint events.
CHECKPOINT_EVENT_KINDS = ("created", "restored", "invalidated", "evicted", "failed_restore")


# ------------------------------- the log: slots, the pool, cascades, aborts (metrics/server_log.py)

SERVER_INFO = Family(
    "llamacpp_server_info",
    "info",
    SERVER,
    "What llama-server runs, from its start-up log lines.",
    labels=("build", "model", "kv_unified", "type_k", "type_v", "capacity_source"),
    values={"kv_unified": ("true", "false", "unknown")},
)

SLOTS = Family("llamacpp_slots", "gauge", SERVER, "Number of slots (parallel sequences, -np).")

SLOT_CONTEXT_TOKENS = Family(
    "llamacpp_slot_context_tokens", "gauge", SERVER, "The slot's context limit (n_ctx_slot).", labels=("slot",)
)

SLOT_TOKENS = Family(
    "llamacpp_slot_tokens",
    "gauge",
    SERVER,
    "KV cells the slot holds now (/slots n_prompt_tokens when available, else the log estimate; see "
    "llamacpp_slot_tokens_source).",
    labels=("slot",),
)

SLOT_PROCESSING = Family("llamacpp_slot_processing", "gauge", SERVER, "1 while the slot has a task.", labels=("slot",))

KV_POOL_USED_TOKENS = Family(
    "llamacpp_kv_pool_used_tokens", "gauge", SERVER, "KV cells held by all slots (sum of llamacpp_slot_tokens)."
)

KV_POOL_CAPACITY_TOKENS = Family(
    "llamacpp_kv_pool_capacity_tokens", "gauge", SERVER, "Cells in the KV pool (all streams)."
)

KV_POOL_USAGE_RATIO = Family(
    "llamacpp_kv_pool_usage_ratio",
    "gauge",
    SERVER,
    "KV cells held by all slots divided by the pool capacity (1 = full; above 1 if slots share cells).",
)

KV_POOL_OVERCOMMIT_RATIO = Family(
    "llamacpp_kv_pool_overcommit_ratio",
    "gauge",
    SERVER,
    "Slots x per-slot context / pool capacity; above 1 the slots were promised more than the pool holds.",
)

KV_CACHE_BYTES = Family(
    "llamacpp_kv_cache_bytes",
    "gauge",
    SERVER,
    "KV cache memory from the llama_kv_cache size line.",
    labels=("kind",),
    values={"kind": ("k", "v")},
)

KV_CASCADE_ACTIVE = Family(
    "llamacpp_kv_cascade_active", "gauge", SERVER, "1 while a KV retry cascade is in progress (batch halving)."
)

SERVER_STARTS = Family(
    "llamacpp_server_starts_total",
    "counter",
    SERVER,
    "llama-server starts seen (a new banner in the log or a new process in /proc, each start counted once).",
)

SERVER_CRASHES = Family(
    "llamacpp_server_crashes_total",
    "counter",
    SERVER,
    "llama-server runs that ended without their exit line (crashed, killed or failed to start), counted at the "
    "next start, by the cause the run's log named: cuda/metal/vulkan_out_of_memory, ggml_assert, ggml_abort (its "
    "message before abort()), unknown (none: killed, or a crash that wrote nothing).",
    labels=("cause",),
    values={"cause": CRASH_CAUSES},
)

KV_RETRIES = Family(
    "llamacpp_kv_retries_total",
    "counter",
    SERVER,
    "'retrying with smaller batch size' lines: the KV pool had no room.",
    event=ev.KVRetry,
)

KV_MEMORY_SLOT_FAILURES = Family(
    "llamacpp_kv_memory_slot_failures_total",
    "counter",
    SERVER,
    "'failed to find a memory slot for batch' library warnings.",
    event=ev.MemorySlotFailure,
)

KV_CASCADES = Family(
    "llamacpp_kv_cascades_total",
    "counter",
    SERVER,
    "Retry cascades (batch halving after a full KV pool) by outcome.",
    labels=("outcome",),
    values={"outcome": CASCADE_OUTCOMES},
)

CONTEXT_EXCEEDED = Family(
    "llamacpp_context_exceeded_total",
    "counter",
    SERVER,
    "Decode failures 'Context size has been exceeded': every in-flight request was aborted.",
)

DECODE_FAILURES = Family(
    "llamacpp_decode_failures_total",
    "counter",
    SERVER,
    "Fatal decode errors by reason.",
    labels=("reason",),
    values={"reason": DECODE_FAILURE_REASONS},
)

REQUESTS_ABORTED = Family(
    "llamacpp_requests_aborted_total",
    "counter",
    SERVER,
    "Requests ended by a server error (send_error), by reason.",
    labels=("reason",),
    values={"reason": ABORT_REASONS},
)

SLOTS_PURGED = Family(
    "llamacpp_slots_purged_total", "counter", SERVER, "Idle slots purged to make room in the unified KV pool."
)

EXPORTER_LOG_LINES_REJECTED = Family(
    "llamacpp_exporter_log_lines_rejected_total",
    "counter",
    SERVER,
    "Log lines read but not applied: malformed (a number that cannot be read), out_of_range (a slot, count or "
    "size the running server cannot have written: forged or corrupt), format (not written the way its run writes "
    "lines: forged), inconsistent (contradicts what its run said before: forged), unexpected (an exporter bug), "
    "unfollowed (a router child's line the exporter does not follow: past the limit of children, or of a port no "
    "spawn line announced).",
    labels=("reason",),
    values={"reason": REJECT_REASONS},
)


# -------------------------------------------------- where the pool is heading (metrics/forecast.py)

KV_POOL_DEMAND_TOKENS = Family(
    "llamacpp_kv_pool_demand_tokens",
    "gauge",
    SERVER,
    'KV cells the requests in flight will hold: horizon="prompt" once their prompts are processed, horizon="max" '
    'at most (plus the generation budget left, from /slots; unknown = the slot\'s whole window), horizon="limits" '
    "as max but a request without a known budget counts its prompt; idle slots excluded (prompt sizes from 'new "
    "prompt' lines (-lv 4) or progress lines (X / progress), else the cells held).",
    labels=("horizon",),
    values={"horizon": HORIZONS},
)

KV_POOL_DEMAND_RATIO = Family(
    "llamacpp_kv_pool_demand_ratio",
    "gauge",
    SERVER,
    "llamacpp_kv_pool_demand_tokens / llamacpp_kv_pool_capacity_tokens; above 1 the pool overflows (and "
    "llama-server aborts every request in flight) unless a request ends first.",
    labels=("horizon",),
    values={"horizon": HORIZONS},
)

KV_POOL_ACTIVE_TOKENS = Family(
    "llamacpp_kv_pool_active_tokens",
    "gauge",
    SERVER,
    "KV cells of the conversations in flight or coming back: slots processing now, and idle slots whose last turn "
    "ended within llamacpp_kv_pool_active_window_seconds (an agent running its tools; the most the slot held in "
    "that turn, also if another task's start cleared it).",
)

KV_POOL_ACTIVE_RATIO = Family(
    "llamacpp_kv_pool_active_ratio",
    "gauge",
    SERVER,
    "llamacpp_kv_pool_active_tokens / llamacpp_kv_pool_capacity_tokens: above 0.9 the conversations coming back "
    "leave no room (LlamaCppKVPoolSaturated).",
)

KV_POOL_ACTIVE_WINDOW_SECONDS = Family(
    "llamacpp_kv_pool_active_window_seconds",
    "gauge",
    SERVER,
    "How long after its last turn an idle slot's conversation counts in llamacpp_kv_pool_active_tokens "
    "(--kv-pool-active-window).",
)

KV_POOL_FULL_ETA_SECONDS = Family(
    "llamacpp_kv_pool_full_eta_seconds",
    "gauge",
    SERVER,
    "Seconds until the requests in flight fill the KV pool at their current speed (llama-server's own prompt and "
    "generation speeds); absent when the pool is not filling or cannot fill.",
)

KV_POOL_FILL_RATE_TOKENS_PER_SECOND = Family(
    "llamacpp_kv_pool_fill_rate_tokens_per_second",
    "gauge",
    SERVER,
    "Tokens per second the requests in flight add to the KV pool (latest prompt-processing and generation speeds "
    "in the log).",
)

KV_POOL_DEMAND_SLOTS = Family(
    "llamacpp_kv_pool_demand_slots",
    "gauge",
    SERVER,
    "Processing slots by how their prompt size is known: new_prompt (-lv 4 line), progress (progress lines, "
    "default verbosity), held (not known yet: counts the cells it holds).",
    labels=("source",),
    values={"source": SIZE_SOURCES},
)

KV_POOL_DEMAND_UNKNOWN_BUDGET_SLOTS = Family(
    "llamacpp_kv_pool_demand_unknown_budget_slots",
    "gauge",
    SERVER,
    "Processing slots whose generation budget is unknown or unlimited (counted at their whole window in the max "
    "horizon); /slots (--server-url) gives it.",
)

SLOT_DEMAND_TOKENS = Family(
    "llamacpp_slot_demand_tokens",
    "gauge",
    SERVER,
    "KV cells the slot's request will hold once its prompt is processed (horizon=prompt) and at most "
    "(horizon=max); 0 while the slot is idle.",
    labels=("slot", "horizon"),
    values={"horizon": ("prompt", "max")},
)


# ---------------------------------- checkpoints, the prompt cache, timings (metrics/checkpoints.py)

CHECKPOINT_LINES_VISIBLE = Family(
    "llamacpp_checkpoint_lines_visible",
    "gauge",
    SERVER,
    "1 when the log shows checkpoint and prompt-cache lines; 0 when its verbosity hides them (use -lv 4).",
)

CHECKPOINTS = Family("llamacpp_checkpoints", "gauge", SERVER, "Live context checkpoints of the slot.", labels=("slot",))

CHECKPOINT_BYTES = Family(
    "llamacpp_checkpoint_bytes",
    "gauge",
    SERVER,
    "Host RAM held by the slot's live context checkpoints.",
    labels=("slot",),
)

CHECKPOINT_EVENTS = Family(
    "llamacpp_checkpoint_events_total",
    "counter",
    SERVER,
    "Context checkpoint events: created, restored, invalidated, evicted, failed_restore.",
    labels=("event",),
    values={"event": CHECKPOINT_EVENT_KINDS},
)

FULL_REPROCESS = Family(
    "llamacpp_full_reprocess_total",
    "counter",
    SERVER,
    "'forcing full prompt re-processing': no usable checkpoint or cache, the prompt ran from scratch.",
)

PROMPT_CACHE_BYTES = Family(
    "llamacpp_prompt_cache_bytes", "gauge", SERVER, "Host RAM used by the prompt cache (last 'cache state' line)."
)

PROMPT_CACHE_PROMPTS = Family("llamacpp_prompt_cache_prompts", "gauge", SERVER, "Prompts held in the prompt cache.")

CHECKPOINT_LIMIT = Family(
    "llamacpp_checkpoint_limit",
    "gauge",
    SERVER,
    "Maximum context checkpoints per slot (--ctx-checkpoints; 0 = disabled).",
)

PROMPT_CACHE_LIMIT_BYTES = Family(
    "llamacpp_prompt_cache_limit_bytes",
    "gauge",
    SERVER,
    "Prompt cache size limit (--cache-ram); +Inf = no limit, 0 = disabled.",
)

PROMPT_EVAL_SECONDS = Family(
    "llamacpp_prompt_eval_seconds",
    "histogram",
    SERVER,
    "Prompt evaluation time per finished request ('prompt eval time' lines; cached tokens excluded).",
)

PROMPT_TOKENS = Family(
    "llamacpp_prompt_tokens_total", "counter", SERVER, "Prompt tokens evaluated (cached tokens excluded)."
)

GENERATED_TOKENS = Family("llamacpp_generated_tokens_total", "counter", SERVER, "Tokens generated ('eval time' lines).")


# ------------------------------------------- request latency, print_timing lines (metrics/latency.py)

TIME_TO_FIRST_TOKEN = Family(
    "llamacpp_time_to_first_token_seconds",
    "histogram",
    SERVER,
    "Time to first token of each finished request as the log shows it: its prompt evaluation ('prompt eval "
    "time'; the wait for a slot is not in it), by the cache outcome of its prompt.",
    labels=("cache",),
    values={"cache": CACHE_OUTCOMES},
)

TIME_PER_OUTPUT_TOKEN = Family(
    "llamacpp_time_per_output_token_seconds",
    "histogram",
    SERVER,
    "Mean time per generated token of each finished request ('eval time' ms / tokens; none without tokens).",
)

REQUEST_DURATION = Family(
    "llamacpp_request_duration_seconds",
    "histogram",
    SERVER,
    "End-to-end time of each finished request in llama-server ('total time': prompt evaluation and generation).",
)

REQUEST_PROMPT_EVAL_TOKENS = Family(
    "llamacpp_request_prompt_eval_tokens",
    "histogram",
    SERVER,
    "Prompt tokens each finished request evaluated ('prompt eval time' lines; tokens from a cache excluded).",
)

REQUEST_GENERATION_TOKENS = Family(
    "llamacpp_request_generation_tokens",
    "histogram",
    SERVER,
    "Tokens each finished request generated ('eval time' lines).",
)

PROMPT_CACHED_TOKENS = Family(
    "llamacpp_prompt_cached_tokens_total",
    "counter",
    SERVER,
    "Prompt tokens of finished requests served from a cache (the slot's, a prompt-cache entry, a checkpoint; "
    "'cached n_tokens' lines, -lv 4).",
)

PROMPT_REPROCESSED_TOKENS = Family(
    "llamacpp_prompt_reprocessed_tokens_total",
    "counter",
    SERVER,
    "Prompt tokens evaluated again from scratch by a 'forcing full prompt re-processing'.",
)

REQUEST_FINISH_REASONS = Family(
    "llamacpp_request_finish_reasons_total",
    "counter",
    SERVER,
    "Requests by why they ended: how they stopped generating (llama-server's 'stopped by …' debug lines: eos, "
    "limit, time_limit, indentation_limit, context_capacity), or the error they ended with (cancelled, error).",
    labels=("reason",),
    values={"reason": FINISH_REASONS},
)

SPEC_DECODE_DRAFT_TOKENS = Family(
    "llamacpp_spec_decode_draft_tokens_total",
    "counter",
    SERVER,
    "Speculative decoding: draft tokens generated for finished requests ('draft acceptance' lines).",
)

SPEC_DECODE_ACCEPTED_TOKENS = Family(
    "llamacpp_spec_decode_accepted_tokens_total",
    "counter",
    SERVER,
    "Speculative decoding: draft tokens the model accepted, of finished requests ('draft acceptance' lines).",
)


# -------------------------------------------------------------- request sizes (metrics/requests.py)

REQUEST_TOKENS = Family(
    "llamacpp_request_tokens",
    "histogram",
    SERVER,
    "KV cells each request held when it ended (its 'stop processing' line; aborted requests included).",
)

REQUEST_PROMPT_TOKENS = Family(
    "llamacpp_request_prompt_tokens",
    "histogram",
    SERVER,
    "Prompt tokens of each request, where the log gives them ('new prompt' at -lv 4, or progress lines).",
)

REQUEST_CONCURRENCY = Family(
    "llamacpp_request_concurrency",
    "histogram",
    SERVER,
    "Requests in flight together, sampled at each request's start (itself included).",
)

REQUESTS_IN_FLIGHT = Family(
    "llamacpp_requests_in_flight", "gauge", SERVER, "Requests llama-server is processing now (slots with a task)."
)

REQUESTS_QUEUED = Family(
    "llamacpp_requests_queued",
    "gauge",
    SERVER,
    "Requests waiting: for a slot in llama-server (its own /metrics: requests_deferred; needs its --metrics) and "
    "in the guard's queue for room in the KV pool.",
)

#: The counters of events with the kind each counts (`Family.event`), in this module's order: the server's collector
#: yields them together.
EVENT_COUNTERS: tuple[tuple[Family, type], ...] = tuple(
    (f, f.event) for f in list(globals().values()) if isinstance(f, Family) and f.event is not None
)
