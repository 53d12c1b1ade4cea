"""What `diagnose` reports: plain dataclasses (the JSON schema is their fields)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from exporter.model.request_sizes import RequestSizes, RequestSummary

SCHEMA = "llamacpp-exporter/diagnose/v8"


@dataclass
class SlotAtAbort:
    """One aborted slot: what its `stop processing: n_tokens = N` release line said."""

    slot: int
    task: int
    tokens: int
    share_of_pool: float | None  # tokens / pool cells (0-1)
    # With --guard-log: the client the guard's access log names for this slot and task, and its request id.
    client: str | None = None
    guard_request: str | None = None


@dataclass
class Failure:
    """One fatal decode (`Context size has been exceeded` and relatives) and the requests it took down."""

    number: int  # 1 = the run's first failure
    line: int
    elapsed_s: float | None  # since the server started (the log's own timestamp), if the line has one
    reason: str
    # The retry cascade that ended here.
    retries: int
    memory_slot_failures: int
    idle_slots_purged: int
    smallest_batch: int | None  # n_batch the halving reached (1 = the pool was full)
    failed_offset: int | None
    failed_batch: int | None  # tokens of the batch (from `off`) that found no room
    # The abort.
    aborted_requests: int
    slots: list[SlotAtAbort]
    tokens_sum: int
    share_sum: float | None
    pool_cells: int | None
    overflow: int | None  # tokens_sum - pool_cells (unified pool only)
    overflow_is_failed_batch: bool | None
    heaviest_slot: int | None
    equal_share: int | None  # pool cells / slots: what a private pool per slot would hold
    victims: list[int]  # aborted slots that held no more than an equal share
    # When the overflow became certain from the prompts in flight (their prompt demand passed the pool,
    # as the exporter's LlamaCppKVPoolOverflowAhead sees it), and from which lines their sizes came.
    predictable_line: int | None = None
    predictable_elapsed_s: float | None = None
    predictable_lead_s: float | None = None  # seconds from that line to the failure line
    predictable_demand: int | None = None  # the prompt demand at that line (cells)
    predictable_from: list[str] = field(default_factory=list)  # new_prompt | progress (how the sizes were known)
    cause: str | None = None  # with --guard-log: whose request held the largest slot, in words


@dataclass
class InFlight:
    """A request a run was processing when its log ended."""

    slot: int
    task: int
    prompt_tokens: int | None  # the prompt's size, where the log gave it
    tokens: int  # KV cells the slot held


#: How a run ended, from its last lines (see `Ending`): (short label, description).
ENDINGS = {
    "clean": ("clean", "shut down cleanly (its exit line)"),
    "failed_start": ("failed start", "failed to start (never listening)"),
    "died_mid_request": (
        "died mid-request",
        "crashed or was killed mid-request (no exit line; the next start, or its router, saw it end)",
    ),
    "died_idle": (
        "died while idle",
        "crashed or was killed while idle (no exit line; the next start, or its router, saw it end)",
    ),
    "log_ends_mid_request": ("log ends mid-request", "the log ends mid-request (killed, crashed, or still running)"),
    "log_ends_idle": (
        "log ends while idle",
        "the log ends while idle (still running, or stopped without its exit line)",
    ),
    "log_ends_starting": (
        "log ends during start-up",
        "the log ends during start-up (still loading, or stopped before listening)",
    ),
}


#: A crash's cause, as its last lines named it (see `exporter.logs.rules`): in words.
CAUSES = {
    "cuda_out_of_memory": "out of GPU memory (CUDA)",
    "metal_out_of_memory": "out of GPU memory (Metal)",
    "vulkan_out_of_memory": "out of GPU memory (Vulkan)",
    "ggml_assert": "an assertion in ggml failed (GGML_ASSERT)",
    "ggml_abort": "ggml aborted (ggml_abort)",
}


@dataclass
class MemoryFigures:
    """What llama-server projected at start (`common_params_fit_impl: projected to use …`, logged at
    -lv 4 from b9151): the memory its model and context take, and what the device had free."""

    kind: str  # device (GPU) | host (no GPU)
    used_mib: int
    available_mib: int  # free device memory, or total host memory

    @property
    def headroom_mib(self) -> int:
        return self.available_mib - self.used_mib


@dataclass
class Ending:
    """How a run ended. A run whose next start follows without an exit line died; one at the end of
    the log may still be running."""

    how: str  # a key of ENDINGS
    reason: str | None  # why a start failed, where the log says
    in_flight: list[InFlight]
    pool_used_tokens: int
    pool_capacity_tokens: int | None
    memory: MemoryFigures | None = None  # the last memory figures the log gave
    cause: str | None = None  # the crash's cause as the log named it (a key of CAUSES), if it did
    cause_message: str | None = None  # the line that named it (at most 300 characters)


#: Endings of a run that stopped without its exit line while it was processing a request.
CRASHED_MID_REQUEST = frozenset({"died_mid_request", "log_ends_mid_request"})


@dataclass
class FailureSummary:
    """All failures of a run, including those not kept in detail."""

    total: int = 0
    shown: int = 0
    aborted_requests: int = 0
    victims: int = 0  # aborted requests that held no more than an equal share
    overflow_is_failed_batch: int = 0  # failures where the overflow was exactly the failed batch
    max_tokens_at_abort: int = 0
    # The most cells the aborted slots held together at one failure (of a pool shared by them), and where.
    max_held_together: int = 0
    max_held_failure: int | None = None  # its number in the run
    max_held_line: int | None = None
    max_held_pool: int | None = None  # the pool's cells at that failure


@dataclass
class Configuration:
    """The server's configuration as far as the log tells."""

    build: int | None
    model: str | None
    verbosity: int | None
    n_slots: int | None
    n_ctx_slot: int | None  # every slot's window (what each slot is promised)
    kv_unified: bool | None
    pool_cells: int | None  # KV cells in all (sum of streams)
    pool_source: str  # log_kv_cache | log_context | log_slots | unknown (as the exporter's metric)
    per_slot_cap: int | None  # --kv-unified-per-slot, when the capping line was logged
    overcommit: float | None  # slots x window / pool: 1 = every promise can be kept
    type_k: str | None
    type_v: str | None
    kv_bytes: int | None  # whole KV cache (all sub-caches) from the size line(s)
    kv_bytes_per_cell: float | None  # K+V bytes per cell of the full-attention cache, measured
    k_bytes_per_cell: float | None
    v_bytes_per_cell: float | None
    kv_bytes_rel_error: float | None  # the size line prints MiB with 2 decimals: relative uncertainty
    swa_kv_bytes: int | None  # sliding-window sub-cache (does not scale with the window)


@dataclass
class Counts:
    """Line counts for the run (each equals the number of such lines in the log)."""

    requests_started: int  # `processing task`
    requests_finished: int  # `stop processing` (aborted ones included)
    retries: int  # `retrying with smaller batch size`
    memory_slot_failures: int  # `failed to find a memory slot for batch of size N`
    idle_slots_purged: int  # `purging slot S with N tokens`
    cascades_recovered: int
    cascades_failed: int
    cascade_unfinished: bool  # the log ends inside a cascade
    aborts: int  # `Context size has been exceeded.` decode lines
    decode_failures: dict[str, int]  # every fatal decode line, by reason
    aborted_requests: int  # `send_error` after a fatal decode (each an HTTP 500 at a client)
    request_errors: dict[str, int]  # every `send_error` line, by reason
    largest_request_tokens: int  # the most tokens a slot held (release lines, new prompts)
    requests_over_equal_share: int | None  # releases above pool / slots


@dataclass
class MemoryCost:
    """KV memory of a configuration at given cache types (from the measured bytes per cell)."""

    type_k: str
    type_v: str
    flags: str  # what to add to llama-server's command line for these types ('' = as now)
    kv_bytes: int
    delta_bytes: int  # versus the KV cache of this run


@dataclass
class Recommendation:
    """A change to llama-server's command line and what it costs."""

    kind: str  # kv_unified_per_slot | no_kv_unified
    flags: str
    pool_cells: int
    window_per_slot: int
    memory: list[MemoryCost]
    requests_over_window: int | None  # requests in this log that would not fit the window
    supported_by_log: bool
    summary: str


@dataclass
class FirstTokenOutcome:
    """The first tokens of one cache outcome (the exporter's `cache` label of its time to first token)."""

    cache: str  # a key of exporter.model.latency.CACHE_OUTCOMES
    requests: int  # `prompt eval time` lines with this outcome
    seconds: float  # their sum, as the exporter's histogram sums them
    p50_s: float  # nearest rank over the printed figures
    p95_s: float
    max_s: float  # exact
    # exact | 4_significant_digits (past 4,096 distinct times the quantiles' values are rounded, to bound memory)
    quantiles: str = "exact"


@dataclass
class FirstTokens:
    """Time to first token by cache outcome (`print_timing`'s `prompt eval time`), and why whole prompts were
    re-processed: the model's memory as the log names it, and what its checkpoints and prompt cache did."""

    outcomes: list[FirstTokenOutcome]  # the outcomes seen, in CACHE_OUTCOMES' order
    seconds: float  # all first tokens
    full_reprocess_share: float  # of `seconds`, the part prompts re-processed whole took (0-1)
    # sliding_window (`creating SWA KV cache`) | recurrent (`llama_memory_recurrent`, with a KV cache: hybrid)
    # | hybrid | None (the log names neither).
    model_memory: str | None
    swa_cells: int | None  # the sliding-window cache's cells (per stream), where the log gives them
    full_cells: int | None  # the full-attention cache's cells beside it
    full_reprocess_lines: int  # `forcing full prompt re-processing`
    checkpoints_invalidated: int  # `erased invalidated context checkpoint`
    checkpoints_evicted: int  # `erasing old context checkpoint`, `… too close to an earlier one`
    checkpoints_restored: int  # `restored context checkpoint`
    checkpoint_limit: int | None  # per slot (`context checkpoints enabled, max = N`; 0 = disabled)
    prompt_cache_enabled: bool | None  # the host-memory prompt cache (`--cache-ram`; None: the log does not say)
    prompt_cache_limit_mib: float | None  # its limit (None: no limit, or not said)
    advice: list[str] = field(default_factory=list)  # why prompts were re-processed, and what to change


@dataclass
class RunReport:
    """One server run (one process) in the log."""

    index: int
    source: str | None  # router child `[port]`, when the log came through `llama-server` router mode
    file: str  # the input it was read from (its line numbers are that file's)
    first_line: int
    last_line: int
    started: bool  # the run's start-up banner is in the log
    duration_s: float | None
    configuration: Configuration
    counts: Counts
    failures: list[Failure]
    failure_summary: FailureSummary
    recommendations: list[Recommendation]
    verdict: str | None
    cannot_know: list[str]
    ending: Ending
    model: str | None = None  # a router child's model (the router's spawn line names it)
    first_tokens: FirstTokens | None = None  # None: no `prompt eval time` line in the run


@dataclass
class FileSummary:
    """One input's runs, for the timeline of a history of files."""

    file: str
    modified: float | None = None  # its modification time (epoch seconds): about when its last run ended
    runs: int = 0
    failures: int = 0
    aborted_requests: int = 0
    endings: dict[str, int] = field(default_factory=dict)
    copies: int = 0  # runs that are another input's run read again (not counted in `runs`)


@dataclass
class RunSummary:
    """Every run of the whole history in one line: the timeline, the totals and the advice over all of
    them (runs beyond --max-runs are not kept in detail, but each has one of these)."""

    index: int
    file: str
    source: str | None
    first_line: int
    last_line: int
    ending: str  # a key of ENDINGS
    failures: int
    aborted_requests: int
    retries: int
    largest_request_tokens: int
    duration_s: float | None
    # Wall-clock time (epoch seconds) of its first and last line. `clock` says where it comes from:
    # "log" (the journal's time stamps), "file" (its file's modification time, for the last run of a
    # file: llama-server stamps lines with the time since its start only), or None (unknown).
    started_at: float | None = None
    ended_at: float | None = None
    clock: str | None = None
    in_flight_prompt_tokens: int | None = None  # the longest prompt in flight when it stopped
    n_ctx_slot: int | None = None
    memory: MemoryFigures | None = None
    same_as: int | None = None  # this run is run N read again from another file (counted once)
    model: str | None = None  # a router child's model (the router's spawn line names it)
    pool_cells: int | None = None  # its KV pool's cells, as far as the log tells
    # Its failures' largest sum held together (FailureSummary.max_held_together), and where.
    held_at_failure: int | None = None
    held_at_failure_line: int | None = None
    # Its request sizes (not in the JSON: the history's sum is `Report.requests`) and configuration
    # (not in the JSON: the run's own report has it), for the history's sizing.
    request_sizes: RequestSizes | None = field(default=None, repr=False, compare=False)
    configuration: Configuration | None = field(default=None, repr=False, compare=False)


@dataclass
class PoolSizing:
    """Was the pool big enough, over the whole history, and the one size to give it (`sizing.size_pool`).

    A failure's sum held together is a floor: a smaller pool would have failed there too."""

    verdict: str  # too_small (it overflowed, or p99 x p99 exceeds it) | enough | unknown
    pool_cells: int | None  # the pool of the run that held the most at a failure (else the largest pool)
    overflowed: bool  # some run failed
    held_at_failure: int | None  # the most cells held together at one failure (the floor)
    held_run: int | None  # where: the run and its line
    held_line: int | None
    overflow: int | None  # held_at_failure - that run's pool
    p99_x_p99: int | None  # RequestSummary.pool_needed
    promised: int | None  # slots x each slot's window: the pool where no request can abort another
    recommended: int | None  # one size: the floor, p99 x p99 and the failed pool + 1, whichever is largest
    recommended_from: str | None  # floor | p99_x_p99 | pool_plus_one
    type_k: str | None  # the cache type in use, and the bytes per cell measured from the size line
    type_v: str | None
    kv_bytes_per_cell: float | None
    recommended_kv_bytes: int | None  # the recommended pool's KV cache at the types in use
    kv_bytes_now: int | None


@dataclass
class LargeRequest:
    """One of the largest requests of the whole history."""

    tokens: int
    run: int
    file: str


@dataclass
class OmittedRuns:
    """Runs not kept in detail (all but the last --max-runs)."""

    runs: int = 0
    failures: int = 0
    aborted_requests: int = 0
    retries: int = 0


@dataclass
class Report:
    """Everything `diagnose` found in one log."""

    schema: str
    file: str
    files: list[str]  # every input read, in the order read
    files_order: str | None  # how several inputs were ordered
    skipped: list[str]  # inputs not read, each with why (a copy of one read before, not a log)
    lines: int
    long_lines: int
    runs_total: int
    failures_total: int
    aborted_requests_total: int
    runs: list[RunReport]
    omitted_runs: OmittedRuns
    endings: dict[str, int]  # every run (shown or not) by how it ended (keys of ENDINGS)
    failed_starts_in_a_row: int  # the longest streak of consecutive failed starts
    by_file: list[FileSummary]  # per input, in the order read
    largest_requests: list[LargeRequest]  # the 3 largest of the whole history, largest first
    history: list[RunSummary] = field(default_factory=list)  # every run, in order, copies included
    overlaps: list[str] = field(default_factory=list)  # runs read twice (counted once), each with where
    history_advice: list[str] = field(default_factory=list)  # what the whole history points at
    # What the requests asked of the pool over the whole history, and the pool that would have held them.
    requests: RequestSummary | None = None
    sizing: PoolSizing | None = None
    # With --guard-log: what the guard's access log said of the aborted slots' clients
    # (exporter.diagnose.guard_log.GuardLogSummary).
    guard: Any = None
    # Each shown run's pool series (exporter.diagnose.run.PoolSeries) by run index, for --html; not JSON.
    series: dict[int, Any] = field(default_factory=dict, repr=False)

    @property
    def exit_status(self) -> int:
        """0 when no failure was found, 1 when one was."""
        return 1 if self.failures_total else 0
