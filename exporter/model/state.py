"""What the log says about llama-server right now: configuration, slots, KV pool, and event counters.

`ServerState.apply(event)` is the only way in. No I/O, no clock, no prometheus_client: feed it the
events of a captured log and compare the result with what the log (or the server's own `/slots`)
says. Slot semantics (as the README explains them):

- `new prompt … task.n_tokens = C` then `cached n_tokens = N`: the slot keeps N and will grow to ~C;
  prompt and generation progress lines move the estimate; `stop processing: n_tokens = N` leaves the
  slot idle but still holding N cells; `clearing prompt` / `purging slot` empty it.
- A request aborted by a fatal decode error (`send_error` after `Context size has been exceeded`) has
  its slot cleared by llama-server (b7078+), even when `-lv 3` hides the `clearing prompt` line.
- With unified KV and `--cache-idle-slots` (default on since b8852), starting a task saves and clears
  every idle slot; at `-lv 3` that is hidden too, so it is inferred.

Counters live as long as the exporter. They are counted only while `counting` is True: the exporter
replays the existing log with counting off to rebuild gauges without re-counting the past, so a
restart of the exporter can never make a counter jump and fire an alert.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.logs import events as ev
from exporter.model.bounds import CHECKS, MAX_CHECKPOINTS, MAX_SLOTS, MAX_TOKENS, MIB
from exporter.model.provenance import CHECKED, NotOwnLine, Provenance
from exporter.model.request_sizes import CONCURRENCY_BUCKETS, REQUEST_TOKEN_BUCKETS, Histogram
from exporter.model.run import ServerRun
from exporter.model.server_cmdline import ServerCommandLine
from exporter.model.slot import Checkpoint, SlotState

# llama-server clears the slots of requests aborted by a failed decode from this build on (#17267).
_CLEARS_ABORTED_SLOTS_SINCE = 7078


# Seconds; from a cached few-token prompt (ms) to a full re-processing of a long context (minutes).
PROMPT_EVAL_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


@dataclass
class ServerState:
    """Server configuration, slot occupancy and event counters, built from log events."""

    counting: bool = True

    # What the running server process said about itself; replaced whole at every start (`start_run`).
    run: ServerRun = field(default_factory=ServerRun)

    # Counters (exporter lifetime; never reset by a server restart).
    rejected: Counter[str] = field(default_factory=Counter)  # lines not applied, by bounded reason
    provenance: Provenance = field(default_factory=Provenance)  # which lines are the server's own
    last_unexpected: str | None = None  # the last error of an `unexpected` rejection (for the exporter's log)
    server_starts: int = 0
    kv_retries: int = 0
    memory_slot_failures: int = 0
    cascades: Counter[str] = field(default_factory=Counter)
    context_exceeded: int = 0
    decode_failures: Counter[str] = field(default_factory=Counter)
    requests_aborted: Counter[str] = field(default_factory=Counter)
    slots_purged: int = 0
    checkpoint_events: Counter[str] = field(default_factory=Counter)
    full_reprocess: int = 0
    prompt_eval_buckets: list[int] = field(default_factory=lambda: [0] * len(PROMPT_EVAL_BUCKETS))
    prompt_eval_seconds_sum: float = 0.0
    prompt_eval_count: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    # What requests ask of the pool (exporter.model.request_sizes): at each release, and at each start.
    request_tokens: Histogram = field(default_factory=lambda: Histogram(REQUEST_TOKEN_BUCKETS))
    request_prompt_tokens: Histogram = field(default_factory=lambda: Histogram(REQUEST_TOKEN_BUCKETS))
    request_concurrency: Histogram = field(default_factory=lambda: Histogram(CONCURRENCY_BUCKETS))

    # Live sources (set at scrape time by exporter.sources; still no I/O here).
    command_line: ServerCommandLine | None = None
    capacity_override: int | None = None  # --kv-pool-capacity
    requests_deferred: int | None = None  # llama-server's /metrics: requests waiting for a slot
    requests_guard_queued: int | None = None  # the guard's queue in front of the server (when it runs)
    _process: tuple[int, int] | None = None  # (pid, start time in clock ticks) last seen
    _unmatched_log_starts: int = 0
    _unmatched_process_starts: int = 0

    # ------------------------------------------------------------------ derived values

    def pool_capacity(self) -> tuple[int | None, str]:
        """KV cells in the pool (all streams) and where the figure came from.

        The `llama_kv_cache: size` line is authoritative; `llama_context: n_ctx` is next; at `-lv 3`
        (both hidden on b9151+) the b9829+ `initializing … kv_unified` line still gives it, because with
        unified KV every slot is promised the whole pool, and the `--kv-unified-per-slot` capping line
        names the pool size it capped.
        """
        run = self.run
        if run.kv_cells is not None:
            return run.kv_cells * (run.kv_streams or 1), "log_kv_cache"
        n_ctx = run.context.get("n_ctx")
        if n_ctx is not None:
            unified = run.kv_unified if run.kv_unified is not None else bool(run.context.get("kv_unified", 1))
            seq, n_seq = run.context.get("n_ctx_seq"), run.context.get("n_seq_max")
            if not unified and seq and n_seq:
                return seq * n_seq, "log_context"
            return n_ctx, "log_context"
        # Below: no log line states the pool. The command line computes it exactly; the flag is the
        # operator's word; the n_ctx_slot inference is wrong when the slot was capped at n_ctx_train.
        cmdline = self.command_line.pool_capacity() if self.command_line is not None else None
        if cmdline is not None:
            return cmdline, "command_line"
        if self.capacity_override is not None:
            return self.capacity_override, "flag"
        if run.per_slot_cap is not None and run.kv_unified:
            return run.per_slot_cap.requested, "log_slots"
        if run.n_ctx_slot is not None and run.kv_unified is not None:
            if run.kv_unified:
                return run.n_ctx_slot, "log_slots"
            if run.n_slots:
                return run.n_ctx_slot * run.n_slots, "log_slots"
        return None, "unknown"

    def overcommit_ratio(self) -> float | None:
        """Slots × per-slot promise / pool capacity; 1.0 means every slot can get its full window."""
        capacity, _ = self.pool_capacity()
        n, per_slot = self.run.slot_count, self.run.n_ctx_slot
        if per_slot is None and self.run.slots:
            known = [s.n_ctx for s in self.run.slots.values() if s.n_ctx is not None]
            per_slot = max(known) if known else None
        if not capacity or n is None or per_slot is None:
            return None
        return n * per_slot / capacity

    # ------------------------------------------------------------------ applying events

    def start_run(self, banner: object | None = None) -> None:
        """A new server process: a fresh `ServerRun` replaces its predecessor's; counters stay.

        Several banner lines belong to one start; one that this start already printed, or the first
        one in a new file (llama-server truncates its log as it starts), is the next start: a server
        that died while it started and was started again.
        """
        run = self.run
        if (
            run.in_startup
            and banner is not None
            and banner not in run.banners_seen
            and not self.provenance.new_file  # the first start in a new file is a new run
        ):
            run.banners_seen.add(banner)
            return
        if self.counting:
            self._count_log_start()
        self.run = ServerRun(in_startup=True, banners_seen={banner} if banner is not None else set())
        self.provenance.start()

    def _end_cascade(self, outcome: str) -> None:
        if self.run.in_cascade:
            self.run.in_cascade = False
            if self.counting:
                self.cascades[outcome] += 1

    def _progress(self) -> None:
        """Work got done: the server is past start-up and any retry cascade has recovered."""
        self.run.in_startup = False
        self._end_cascade("recovered")

    def apply(self, e: ev.Event) -> bool:
        """Apply one event (a dict lookup by the event's type, not a chain of isinstance checks).

        Never raises: an event whose values the running server cannot have written is rejected and
        counted (`rejected`), and so is one that trips a bug here (`unexpected`), so that no line can
        stop the pipeline. Returns False for a rejected event.
        """
        kind = type(e)
        entry = _DISPATCH.get(kind)
        if entry is None:
            if isinstance(e, ev.LineFormat):
                self.provenance.line_format = e.code
            elif isinstance(e, ev.Rejected):
                self._reject(e.reason)
                return False
            return True
        handler, check, checked = entry
        if check is not None and not check(self.run, e):
            self._reject("out_of_range")
            return False
        provenance = self.provenance
        if checked or provenance.line_format != provenance.run_format:
            reason = provenance.admit(self, kind, e)
            if reason is not None:
                self._reject(reason)
                return False
        try:
            handler(self, e)
        except NotOwnLine:
            self._reject("inconsistent")
            return False
        except Exception as exc:  # a bug must cost one line, not the pipeline
            self.last_unexpected = f"{kind.__name__}: {type(exc).__name__}: {exc}"[:200]
            self._reject("unexpected")
            return False
        return True

    def accepts(self, e: ev.Event) -> bool:
        """Whether `apply` would apply `e` rather than reject it (for readers that act on events themselves)."""
        kind = type(e)
        if kind not in _DISPATCH:
            return kind is not ev.Rejected
        check = _DISPATCH[kind][1]
        return (check is None or check(self.run, e)) and self.provenance.check(self, kind, e) is None

    def _reject(self, reason: str) -> None:
        if self.counting:
            self.rejected[reason] += 1

    def _own_slot(self, e: ev.GenerationProgress | ev.PromptProgress | ev.CachedTokens | ev.SlotReleased) -> SlotState:
        """Work got done on the slot a line names, for the task it names (`NotOwnLine` if the run never started it)."""
        s = self.run.slots.get(e.slot)
        if (s is None or s.task != e.task) and not self.provenance.knows(e.task):
            raise NotOwnLine  # checked here, where the slot is at hand, rather than before every such line
        self._progress()
        return s if s is not None else self.run.slot(e.slot)

    def _on_generation_progress(self, e: ev.GenerationProgress) -> None:
        s = self._own_slot(e)
        s.processing, s.task = True, e.task
        # With context shift a request may generate past its window; the slot never holds more than it.
        s.tokens = max(s.tokens, min(s.prompt_tokens + e.n_decoded, s.n_ctx or MAX_TOKENS))
        s.phase = "generation"
        s.generation_rate = e.rate

    def _on_prompt_progress(self, e: ev.PromptProgress) -> None:
        s = self._own_slot(e)
        if s.task != e.task:
            s.new_task()
            self._request_started(s, e.task)
        s.processing, s.task = True, e.task
        n = e.n_tokens if e.absolute else (s.cache_base or 0) + e.n_tokens
        s.tokens = max(s.tokens, n)
        self._prompt_turn(e.slot)
        measured = s.note_prompt_progress(e, n, self.run.prompt_throughput)
        if measured is not None:
            self.run.prompt_throughput = measured

    def _prompt_turn(self, slot_id: int) -> None:
        """A slot reads prompt tokens: every lower slot that was reading its prompt has finished it.

        llama-server fills each batch greedily in slot order (generated tokens first, then each slot's
        prompt until it ends or the batch is full), so concurrent prompts are read one after another.
        Neither level's lines say when a prompt's last batch was queued; the next slot's turn does.
        """
        for other_id, other in self.run.slots.items():
            if other_id < slot_id and other.processing and other.phase == "prompt" and other.prompt_size is not None:
                other.tokens = max(other.tokens, other.prompt_size)
                other.phase, other.prompt_rate = "generation", None

    def _on_cached_tokens(self, e: ev.CachedTokens) -> None:
        s = self._own_slot(e)
        s.processing, s.task = True, e.task
        if s.cache_base is None:
            s.cache_base = e.n_tokens
            s.tokens = e.n_tokens
        else:
            # Long prompts repeat this line per batch with the running total.
            s.tokens = max(s.tokens, e.n_tokens)

    def _on_slot_released(self, e: ev.SlotReleased) -> None:
        s = self._own_slot(e)
        if self.counting:
            self.request_tokens.observe(e.n_tokens)
            if s.task == e.task and s.prompt_size is not None:
                self.request_prompt_tokens.observe(s.prompt_size)
        s.processing, s.task, s.cache_base = False, -1, None
        s.new_task()
        aborted = e.task in self.run.aborted_tasks
        self.run.aborted_tasks.discard(e.task)
        if aborted and (self.run.build is None or self.run.build >= _CLEARS_ABORTED_SLOTS_SINCE):
            s.clear()
        else:
            s.tokens = e.n_tokens

    def _on_slot_cleared_or_purged(self, e: ev.SlotCleared | ev.SlotPurged) -> None:
        s = self.run.slot(e.slot)
        s.clear()
        if isinstance(e, ev.SlotPurged) and self.counting:
            self.slots_purged += 1
        if isinstance(e, ev.SlotPurged) and not self.run.in_cascade:
            self.run.in_cascade = True  # a purge is the first step of a cascade on unified KV

    def _request_started(self, s: SlotState, task: int) -> None:
        """A slot takes a task it was not running: a request starts (sampled for the concurrency histogram)."""
        if self.counting and not (s.processing and s.task == task):
            others = sum(1 for x in self.run.slots.values() if x.processing and x is not s)
            self.request_concurrency.observe(others + 1)

    def _on_task_started(self, e: ev.TaskStarted) -> None:
        self._progress()
        s = self.run.slot(e.slot)
        s.new_task()
        self._request_started(s, e.task)
        s.processing, s.task, s.cache_base = True, e.task, None
        s.prompt_tokens, s.phase = 0, "prompt"
        if self.run.clears_idle_slots():
            for other_id, other in self.run.slots.items():
                if other_id != e.slot and not other.processing:
                    other.clear()

    def _on_new_prompt(self, e: ev.NewPrompt) -> None:
        self._progress()
        s = self.run.slot(e.slot)
        if s.task != e.task:
            s.new_task()
        self._request_started(s, e.task)
        s.processing, s.task, s.cache_base = True, e.task, None
        s.prompt_tokens = e.n_prompt_tokens
        s.prompt_size, s.prompt_size_source, s.phase = e.n_prompt_tokens, "new_prompt", "prompt"
        s.prompt_rate = self.run.prompt_throughput  # its turn: it is read at the server's current prompt speed
        self._prompt_turn(e.slot)
        s.n_ctx = e.n_ctx_slot
        if self.run.n_ctx_slot is None:
            self.run.n_ctx_slot = e.n_ctx_slot

    def _on_kv_retry_or_memory_slot_failure(self, e: ev.KVRetry | ev.MemorySlotFailure) -> None:
        self.run.in_cascade = True
        if self.counting:
            if isinstance(e, ev.KVRetry):
                self.kv_retries += 1
            else:
                self.memory_slot_failures += 1

    def _on_decode_fatal(self, e: ev.DecodeFatal) -> None:
        if self.counting:
            self.decode_failures[e.reason] += 1
            if e.reason == "context_exceeded":
                self.context_exceeded += 1
        self.run.in_cascade = True
        self._end_cascade("failed")

    def _on_request_error(self, e: ev.RequestError) -> None:
        if self.counting:
            self.requests_aborted[e.reason] += 1
        if e.reason in ev.FATAL_REASONS:
            if len(self.run.aborted_tasks) >= 4 * MAX_SLOTS:  # forged errors for tasks that never end
                self.run.aborted_tasks.clear()
            self.run.aborted_tasks.add(e.task)

    def _on_decode_failed(self, e: ev.DecodeFailed) -> None:
        # b9752+: every in-flight slot was aborted; nothing is processing any more.
        for s in self.run.slots.values():
            s.processing = False
            s.new_task()

    def _on_all_slots_idle(self, e: ev.AllSlotsIdle) -> None:
        self._progress()
        for s in self.run.slots.values():
            s.processing, s.task = False, -1
            s.new_task()

    def _on_idle_slot_saved(self, e: ev.IdleSlotSaved) -> None:
        pass  # the `clearing prompt` line that follows carries the change

    def _on_timings_head(self, e: ev.TimingsHead) -> None:
        pass  # the timings lines that follow carry the figures (and `provenance` believes them)

    def _on_server_starting(self, e: ev.ServerStarting) -> None:
        self.start_run(ev.ServerStarting)

    def _on_build_info(self, e: ev.BuildInfo) -> None:
        self.start_run(ev.banner_line(e))
        # Build 0 is a tree built without its build number (in-process servers, vendored copies): unknown.
        self.run.build, self.run.commit = e.build or None, e.commit

    def _on_verbosity(self, e: ev.Verbosity) -> None:
        self.start_run(ev.Verbosity)
        self.run.verbosity = e.level

    def _on_model_loading(self, e: ev.ModelLoading) -> None:
        self.run.model = e.model

    def _on_server_ready(self, e: ev.ServerReady) -> None:
        self.run.ready = True
        self.run.in_startup = False

    def _on_server_exiting(self, e: ev.ServerExiting) -> None:
        self.run.exiting = True

    def _on_model_load_failed(self, e: ev.ModelLoadFailed) -> None:
        self.run.model = e.model
        self.run.start_error = f"failed to load model '{e.model}'"

    def _on_memory_projection(self, e: ev.MemoryProjection) -> None:
        self.run.memory_projection = e

    def _on_slots_initialized(self, e: ev.SlotsInitialized) -> None:
        self.run.n_slots = e.n_slots
        if e.n_ctx_slot is not None:
            self.run.n_ctx_slot = e.n_ctx_slot
        if e.kv_unified is not None:
            self.run.kv_unified = e.kv_unified
        for i in range(e.n_slots):
            self.run.slot(i).n_ctx = self.run.n_ctx_slot

    def _on_slot_created(self, e: ev.SlotCreated) -> None:
        self.run.slot(e.slot).n_ctx = e.n_ctx
        if self.run.n_ctx_slot is None:
            self.run.n_ctx_slot = e.n_ctx

    def _on_context_param(self, e: ev.ContextParam) -> None:
        self.run.context[e.name] = e.value
        if e.name == "kv_unified":
            self.run.kv_unified = bool(e.value)

    def _on_kv_cache_section(self, e: ev.KVCacheSection) -> None:
        self.run.kv_section_swa = e.swa

    def _on_kv_cache_size(self, e: ev.KVCacheSize) -> None:
        self.run.kv_k_bytes += e.k_mib * MIB
        self.run.kv_v_bytes += e.v_mib * MIB
        self.run.type_k, self.run.type_v = e.type_k, e.type_v
        if not self.run.kv_section_swa and e.cells is not None:
            self.run.kv_cells = e.cells
            self.run.kv_streams = e.streams
            if e.streams is not None and e.seqs is not None and self.run.kv_unified is None:
                self.run.kv_unified = e.streams == 1 and e.seqs > 1

    def _on_per_slot_cap(self, e: ev.PerSlotCap) -> None:
        self.run.per_slot_cap = e
        self.run.n_ctx_slot = e.cap

    def _on_idle_slot_policy(self, e: ev.IdleSlotPolicy) -> None:
        self.run.idle_slots_cleared_on_new_task = e.clear_on_new_task

    def _apply_timing(self, e: ev.PromptEvalTiming | ev.GenerationTiming) -> None:
        if not self.counting:
            return
        if isinstance(e, ev.GenerationTiming):
            self.generated_tokens += e.tokens
            return
        seconds = e.ms / 1000.0
        self.prompt_eval_count += 1
        self.prompt_eval_seconds_sum += seconds
        self.prompt_tokens += e.tokens
        for i, bound in enumerate(PROMPT_EVAL_BUCKETS):
            if seconds <= bound:
                self.prompt_eval_buckets[i] += 1
                break

    def _count_checkpoint(self, event: str) -> None:
        if self.counting:
            self.checkpoint_events[event] += 1

    def _apply_checkpoint(
        self,
        e: ev.CheckpointConfig
        | ev.CheckpointCreated
        | ev.CheckpointRemoved
        | ev.CheckpointSuperseded
        | ev.CheckpointRestored
        | ev.CheckpointRestoreFailed
        | ev.FullReprocess,
    ) -> None:
        if isinstance(e, ev.CheckpointConfig):
            self.run.checkpoint_limit = e.max_per_slot
            return
        s = self.run.slot(e.slot)
        if isinstance(e, ev.CheckpointCreated):
            s.checkpoints.append(Checkpoint(e.pos_min, e.pos_max, e.size_mib * MIB))
            # "N of M" is the slot's count after the append: the log's own check on our bookkeeping.
            while len(s.checkpoints) > e.index > 0 or len(s.checkpoints) > MAX_CHECKPOINTS:
                s.checkpoints.pop(0)
            if e.max_per_slot:
                self.run.checkpoint_limit = e.max_per_slot
            self._count_checkpoint("created")
        elif isinstance(e, ev.CheckpointRemoved):
            _remove_checkpoint(s.checkpoints, e.pos_min, e.pos_max, e.size_mib * MIB)
            self._count_checkpoint(e.reason)
        elif isinstance(e, ev.CheckpointSuperseded):
            _remove_checkpoint(s.checkpoints, None, e.n_tokens - 1, None)
        elif isinstance(e, ev.CheckpointRestored):
            self._count_checkpoint("restored")
        elif isinstance(e, ev.CheckpointRestoreFailed):
            self._count_checkpoint("failed_restore")
        elif isinstance(e, ev.FullReprocess) and self.counting:
            self.full_reprocess += 1

    def _apply_prompt_cache(
        self,
        e: ev.PromptCacheLimit
        | ev.PromptCacheState
        | ev.PromptSaved
        | ev.PromptCacheCandidate
        | ev.PromptLoaded
        | ev.PromptCacheRemoved
        | ev.SlotSelected,
    ) -> None:
        if isinstance(e, ev.SlotSelected):
            self.run.selected_slot = e.slot
            self.run.cache_candidates = []
        elif isinstance(e, ev.PromptCacheLimit):
            self.run.prompt_cache_limit_bytes = float("inf") if e.limit_mib is None else e.limit_mib * MIB
            if self.run.prompt_cache_bytes is None:  # announced at start-up: the cache starts empty
                self.run.prompt_cache_bytes, self.run.prompt_cache_prompts = 0.0, 0
        elif isinstance(e, ev.PromptCacheState):
            self.run.prompt_cache_prompts = e.prompts
            self.run.prompt_cache_bytes = e.size_mib * MIB
            if self.run.prompt_cache_limit_bytes not in (0.0, float("inf")):  # (None too)
                self.run.prompt_cache_limit_bytes = e.limit_mib * MIB
            # Bounded by the cache's own entry count, even if removal lines were missed.
            while len(self.run.cache_entries) > e.prompts:
                del self.run.cache_entries[next(iter(self.run.cache_entries))]
        elif isinstance(e, ev.PromptSaved):
            if self.run.selected_slot is not None:
                # The cache gets a copy of the slot's prompt, checkpoints included; the slot keeps its own.
                if len(self.run.cache_entries) >= MAX_CHECKPOINTS:  # forged saves without a cache state line
                    del self.run.cache_entries[next(iter(self.run.cache_entries))]
                self.run.cache_entries[e.length] = list(self.run.slot(self.run.selected_slot).checkpoints)
        elif isinstance(e, ev.PromptCacheCandidate):
            self.run.cache_candidates.append(e)
        elif isinstance(e, ev.PromptLoaded):
            chosen = next((c for c in self.run.cache_candidates if (c.f_keep, c.f_sim) == (e.f_keep, e.f_sim)), None)
            if chosen is not None and self.run.selected_slot is not None:
                # `prompt = std::move(entry.prompt)`: the entry's checkpoints replace the slot's.
                self.run.slot(self.run.selected_slot).checkpoints = self.run.cache_entries.pop(chosen.length, [])
            self.run.cache_candidates = []
        elif isinstance(e, ev.PromptCacheRemoved):
            if e.length is not None:
                self.run.cache_entries.pop(e.length, None)
            elif self.run.cache_entries:
                del self.run.cache_entries[next(iter(self.run.cache_entries))]

    # ------------------------------------------------------------------ live sources (exporter.sources)

    def apply_command_line(self, cfg: ServerCommandLine | None) -> None:
        """The running server's argv/environment (from /proc): a pool-capacity fallback when the log hides it."""
        self.command_line = cfg

    def observe_process(self, pid: int, start_ticks: int) -> None:
        """llama-server's process as /proc shows it now; a new process is a server start.

        The log reports the same start with its banner, in either order. Each start is counted once:
        a new process that the log already announced (or the other way round) matches it instead of
        counting again, so the counter follows whichever source sees a start first. The first process
        seen is the one already running when the exporter started: remembered, not counted.
        """
        ident = (pid, start_ticks)
        if ident == self._process:
            return
        first, self._process = self._process is None, ident
        if first:
            self._unmatched_log_starts = 0  # the banner(s) seen so far belong to this process or older ones
            return
        if self._unmatched_log_starts:
            self._unmatched_log_starts -= 1
            return
        if self.counting:
            self.server_starts += 1
            self._unmatched_process_starts += 1
        # The new process has empty slots; its banner (when it comes) resets again and matches this start.
        counting, self.counting = self.counting, False
        self.run.in_startup = False
        try:
            self.start_run()
            self.provenance.from_start = False  # the log has not shown this start yet: nothing to check against
        finally:
            self.counting = counting
            self.run.in_startup = False

    def _count_log_start(self) -> None:
        """A start banner in the log: count it unless a new process already counted this start."""
        if self._unmatched_process_starts:
            self._unmatched_process_starts -= 1
            return
        self.server_starts += 1
        if self._process is not None:
            self._unmatched_log_starts += 1


# Which method of ServerState applies which event.
_HANDLERS: dict[type[Any], Callable[[ServerState, Any], None]] = {
    ev.GenerationProgress: ServerState._on_generation_progress,
    ev.PromptProgress: ServerState._on_prompt_progress,
    ev.CachedTokens: ServerState._on_cached_tokens,
    ev.SlotReleased: ServerState._on_slot_released,
    ev.SlotCleared: ServerState._on_slot_cleared_or_purged,
    ev.SlotPurged: ServerState._on_slot_cleared_or_purged,
    ev.TaskStarted: ServerState._on_task_started,
    ev.NewPrompt: ServerState._on_new_prompt,
    ev.KVRetry: ServerState._on_kv_retry_or_memory_slot_failure,
    ev.MemorySlotFailure: ServerState._on_kv_retry_or_memory_slot_failure,
    ev.DecodeFatal: ServerState._on_decode_fatal,
    ev.RequestError: ServerState._on_request_error,
    ev.DecodeFailed: ServerState._on_decode_failed,
    ev.AllSlotsIdle: ServerState._on_all_slots_idle,
    ev.TimingsHead: ServerState._on_timings_head,
    ev.PromptEvalTiming: ServerState._apply_timing,
    ev.GenerationTiming: ServerState._apply_timing,
    ev.CheckpointConfig: ServerState._apply_checkpoint,
    ev.CheckpointCreated: ServerState._apply_checkpoint,
    ev.CheckpointRemoved: ServerState._apply_checkpoint,
    ev.CheckpointSuperseded: ServerState._apply_checkpoint,
    ev.CheckpointRestored: ServerState._apply_checkpoint,
    ev.CheckpointRestoreFailed: ServerState._apply_checkpoint,
    ev.FullReprocess: ServerState._apply_checkpoint,
    ev.PromptCacheLimit: ServerState._apply_prompt_cache,
    ev.PromptCacheState: ServerState._apply_prompt_cache,
    ev.PromptSaved: ServerState._apply_prompt_cache,
    ev.PromptCacheCandidate: ServerState._apply_prompt_cache,
    ev.PromptLoaded: ServerState._apply_prompt_cache,
    ev.PromptCacheRemoved: ServerState._apply_prompt_cache,
    ev.SlotSelected: ServerState._apply_prompt_cache,
    ev.IdleSlotSaved: ServerState._on_idle_slot_saved,
    ev.ServerStarting: ServerState._on_server_starting,
    ev.BuildInfo: ServerState._on_build_info,
    ev.Verbosity: ServerState._on_verbosity,
    ev.ModelLoading: ServerState._on_model_loading,
    ev.ServerReady: ServerState._on_server_ready,
    ev.ServerExiting: ServerState._on_server_exiting,
    ev.ModelLoadFailed: ServerState._on_model_load_failed,
    ev.MemoryProjection: ServerState._on_memory_projection,
    ev.SlotsInitialized: ServerState._on_slots_initialized,
    ev.SlotCreated: ServerState._on_slot_created,
    ev.ContextParam: ServerState._on_context_param,
    ev.KVCacheSection: ServerState._on_kv_cache_section,
    ev.KVCacheSize: ServerState._on_kv_cache_size,
    ev.PerSlotCap: ServerState._on_per_slot_cap,
    ev.IdleSlotPolicy: ServerState._on_idle_slot_policy,
}


# One lookup per event on the hot path: its handler, its bounds check, and whether provenance looks at it.
_DISPATCH: dict[
    type[Any], tuple[Callable[[ServerState, Any], None], Callable[[ServerRun, Any], bool] | None, bool]
] = {kind: (handler, CHECKS.get(kind), kind in CHECKED) for kind, handler in _HANDLERS.items()}


def _remove_checkpoint(
    checkpoints: list[Checkpoint], pos_min: int | None, pos_max: int, size_bytes: float | None
) -> None:
    """Remove the checkpoint the log line names; fall back to the oldest if we never saw it created."""
    for i, c in enumerate(checkpoints):
        if c.pos_max == pos_max and (pos_min is None or c.pos_min == pos_min):
            del checkpoints[i]
            return
    if size_bytes is not None and checkpoints:
        checkpoints.pop(0)
