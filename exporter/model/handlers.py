"""How each event changes a `ServerState`: one function per kind of event, and the table `apply` dispatches on. Pure.

`ServerState.apply` looks an event's kind up once (`DISPATCH`): its handler here, its bounds check
(`exporter.model.bounds`) and whether its provenance needs a look beyond its line format
(`exporter.model.provenance`). Handlers change the running server's `ServerRun` and count into the
state's counters only while `counting` is on (see `exporter.model.state`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exporter.logs import events as ev
from exporter.model.bounds import CHECKS, MAX_CHECKPOINTS, MAX_SLOTS, MAX_TOKENS, MIB
from exporter.model.latency import CACHE_OUTCOMES, cache_outcome
from exporter.model.provenance import CHECKED, FITS_ONLY, NotOwnLine, Provenance
from exporter.model.run import CRASH_CAUSES, ServerRun
from exporter.model.slot import Checkpoint, SlotState

if TYPE_CHECKING:  # (annotations only: state imports this module's table)
    from exporter.model.state import ServerState

# llama-server clears the slots of requests aborted by a failed decode from this build on (#17267).
_CLEARS_ABORTED_SLOTS_SINCE = 7078


def _end_cascade(st: ServerState, outcome: str) -> None:
    run = st.run
    if run.in_cascade:
        run.in_cascade = False
        if st.counting:
            st.cascades[outcome] += 1
            if outcome == "recovered":
                st.incidents.cascade_recovered(_held(run), st.pool_capacity()[0])


def _held(run: ServerRun) -> dict[int, int]:
    """Cells each slot holds now."""
    return {i: s.tokens for i, s in run.slots.items()}


def _progress(st: ServerState) -> None:
    """Work got done: the server is past start-up and any retry cascade has recovered."""
    run = st.run
    run.in_startup = False
    if run.in_cascade:
        _end_cascade(st, "recovered")


def _own_slot(
    st: ServerState, e: ev.GenerationProgress | ev.PromptProgress | ev.CachedTokens | ev.SlotReleased
) -> SlotState:
    """Work got done on the slot a line names, for the task it names (`NotOwnLine` if the run never started it)."""
    run = st.run
    s = run.slots.get(e.slot)
    if (s is None or s.task != e.task) and not st.provenance.knows(e.task):
        raise NotOwnLine  # checked here, where the slot is at hand, rather than before every such line
    _progress(st)
    return s if s is not None else run.slot(e.slot)


def _on_generation_progress(st: ServerState, e: ev.GenerationProgress) -> None:
    s = _own_slot(st, e)
    s.processing, s.task = True, e.task
    # With context shift a request may generate past its window; the slot never holds more than it.
    s.tokens = max(s.tokens, min(s.prompt_tokens + e.n_decoded, s.n_ctx or MAX_TOKENS))
    s.phase = "generation"
    s.generation_rate = e.rate


def _on_prompt_progress(st: ServerState, e: ev.PromptProgress) -> None:
    run = st.run
    s = _own_slot(st, e)
    if s.task != e.task:
        s.new_task()
        _request_started(st, s, e.task)
    s.processing, s.task = True, e.task
    n = e.n_tokens if e.absolute else (s.cache_base or 0) + e.n_tokens
    s.tokens = max(s.tokens, n)
    _prompt_turn(st, e.slot)
    measured = s.note_prompt_progress(e, n, run.prompt_throughput)
    if measured is not None:
        run.prompt_throughput = measured


def _prompt_turn(st: ServerState, slot_id: int) -> None:
    """A slot reads prompt tokens: every lower slot that was reading its prompt has finished it.

    llama-server fills each batch greedily in slot order (generated tokens first, then each slot's
    prompt until it ends or the batch is full), so concurrent prompts are read one after another.
    Neither level's lines say when a prompt's last batch was queued; the next slot's turn does.
    """
    run = st.run
    for other_id, other in run.slots.items():
        if other_id < slot_id and other.processing and other.phase == "prompt" and other.prompt_size is not None:
            other.tokens = max(other.tokens, other.prompt_size)
            other.phase, other.prompt_rate = "generation", None


def _on_cached_tokens(st: ServerState, e: ev.CachedTokens) -> None:
    s = _own_slot(st, e)
    s.processing, s.task = True, e.task
    if s.cache_base is None:
        s.cache_base = e.n_tokens
        s.tokens = e.n_tokens
    else:
        # Long prompts repeat this line per batch with the running total.
        s.tokens = max(s.tokens, e.n_tokens)


def _on_slot_released(st: ServerState, e: ev.SlotReleased) -> None:
    run = st.run
    s = _own_slot(st, e)
    if st.counting:
        st.request_tokens.observe(e.n_tokens)
        if st.request_values is not None:
            st.request_values.tokens[e.n_tokens] += 1
        if s.task == e.task and s.prompt_size is not None:
            st.request_prompt_tokens.observe(s.prompt_size)
    s.processing, s.task, s.cache_base = False, -1, None
    s.reuse, s.prompt_loaded = None, False
    # Its timings are the lines just before (`print_timing` then `release`, one slot after the other).
    s.turns, s.last_turn, s.last_processed, st.latency.processed = s.turns + 1, e.n_tokens, st.latency.processed, None
    s.new_task()
    aborted = e.task in run.aborted_tasks
    run.aborted_tasks.discard(e.task)
    if aborted and st.counting:  # the cells the aborted request held: the overflow's figures
        st.incidents.released(e.slot, e.n_tokens)
    if aborted and (run.build is None or run.build >= _CLEARS_ABORTED_SLOTS_SINCE):
        s.clear()
    else:
        s.tokens = e.n_tokens


def _on_slot_cleared(st: ServerState, e: ev.SlotCleared) -> None:
    st.run.slot(e.slot).clear()


def _on_slot_purged(st: ServerState, e: ev.SlotPurged) -> None:
    run = st.run
    run.slot(e.slot).clear()
    if st.counting:
        st.slots_purged += 1
    run.in_cascade = True  # a purge is the first step of a cascade on unified KV


def _request_started(st: ServerState, s: SlotState, task: int) -> None:
    """A slot takes a task it was not running: a request starts (sampled for the concurrency histogram)."""
    if st.counting and not (s.processing and s.task == task):
        others = sum([x.processing for x in st.run.slots.values() if x is not s])
        st.request_concurrency.observe(others + 1)
        if st.request_values is not None:
            st.request_values.concurrency[others + 1] += 1


def _on_task_started(st: ServerState, e: ev.TaskStarted) -> None:
    run = st.run
    _progress(st)
    st.incidents.settle()
    s = run.slot(e.slot)
    s.new_task()
    _request_started(st, s, e.task)
    s.processing, s.task, s.cache_base, s.reuse = True, e.task, None, None
    s.prompt_tokens, s.phase = 0, "prompt"
    if run.clears_idle_slots():
        for other_id, other in run.slots.items():
            if other_id != e.slot and not other.processing:
                other.clear()


def _on_new_prompt(st: ServerState, e: ev.NewPrompt) -> None:
    run = st.run
    _progress(st)
    st.incidents.settle()
    s = run.slot(e.slot)
    if s.task != e.task:
        s.new_task()
    _request_started(st, s, e.task)
    s.processing, s.task, s.cache_base, s.reuse = True, e.task, None, None
    s.prompt_tokens = e.n_prompt_tokens
    s.prompt_size, s.prompt_size_source, s.phase = e.n_prompt_tokens, "new_prompt", "prompt"
    s.prompt_rate = run.prompt_throughput  # its turn: it is read at the server's current prompt speed
    _prompt_turn(st, e.slot)
    s.n_ctx = e.n_ctx_slot
    if run.n_ctx_slot is None:
        run.n_ctx_slot = e.n_ctx_slot


def _on_kv_retry(st: ServerState, e: ev.KVRetry) -> None:
    st.run.in_cascade = True
    if st.counting:
        st.incidents.retry()


def _on_memory_slot_failure(st: ServerState, e: ev.MemorySlotFailure) -> None:
    st.run.in_cascade = True


def _on_decode_fatal(st: ServerState, e: ev.DecodeFatal) -> None:
    if st.counting:
        st.decode_failures[e.reason] += 1
        if e.reason == "context_exceeded":
            st.context_exceeded += 1
        st.incidents.overflow(e.reason, _held(st.run), st.pool_capacity()[0])
    st.run.in_cascade = True
    _end_cascade(st, "failed")


def _on_request_error(st: ServerState, e: ev.RequestError) -> None:
    run = st.run
    if st.counting:
        st.requests_aborted[e.reason] += 1
        st.latency.finish_reasons["cancelled" if e.reason == "cancelled" else "error"] += 1
        if e.reason in ev.FATAL_REASONS:
            st.incidents.aborted(e.reason, st.pool_capacity()[0])
    if e.reason in ev.FATAL_REASONS:
        if len(run.aborted_tasks) >= 4 * MAX_SLOTS:  # forged errors for tasks that never end
            run.aborted_tasks.clear()
        run.aborted_tasks.add(e.task)


def _on_decode_failed(st: ServerState, e: ev.DecodeFailed) -> None:
    # b9752+: every in-flight slot was aborted; nothing is processing any more.
    st.incidents.settle()
    for s in st.run.slots.values():
        s.processing = False
        s.new_task()


def _on_all_slots_idle(st: ServerState, e: ev.AllSlotsIdle) -> None:
    _progress(st)
    st.incidents.settle()
    for s in st.run.slots.values():
        s.processing, s.task = False, -1
        if s.phase is not None:  # (`new_task` has nothing to forget otherwise: the common idle case)
            s.new_task()


def _on_idle_slot_saved(st: ServerState, e: ev.IdleSlotSaved) -> None:
    pass  # the `clearing prompt` line that follows carries the change


def _on_timings_head(st: ServerState, e: ev.TimingsHead) -> None:
    st.latency.head_slot = e.slot  # the timings lines that follow carry the figures, without a slot tag


def _on_server_starting(st: ServerState, e: ev.ServerStarting) -> None:
    st.start_run(ev.ServerStarting)


def _on_build_info(st: ServerState, e: ev.BuildInfo) -> None:
    st.start_run(ev.banner_line(e))
    # Build 0 is a tree built without its build number (in-process servers, vendored copies): unknown.
    st.run.build, st.run.commit = e.build or None, e.commit  # (the run this line may have started)


def _on_verbosity(st: ServerState, e: ev.Verbosity) -> None:
    st.start_run(ev.Verbosity)
    st.run.verbosity = e.level  # (the run this line may have started)


def _on_model_loading(st: ServerState, e: ev.ModelLoading) -> None:
    run = st.run
    run.model = e.model


def _on_server_ready(st: ServerState, e: ev.ServerReady) -> None:
    run = st.run
    run.ready = True
    run.in_startup = False


def _on_server_exiting(st: ServerState, e: ev.ServerExiting) -> None:
    run = st.run
    run.exiting = True


#: When a crash's lines name several causes, the most specific counts: running out of device memory
#: ends in ggml_abort too (`CUDA error: out of memory`, then `ggml-cuda.cu:N: CUDA error`).
_CAUSE_RANK = {cause: rank for rank, cause in enumerate(reversed(CRASH_CAUSES))}


def _on_crash_cause(st: ServerState, e: ev.CrashCause) -> None:
    run = st.run
    if run.crash_cause is None or _CAUSE_RANK[e.cause] > _CAUSE_RANK[run.crash_cause.cause]:
        run.crash_cause = e


def _on_model_load_failed(st: ServerState, e: ev.ModelLoadFailed) -> None:
    run = st.run
    run.model = e.model
    run.start_error = f"failed to load model '{e.model}'"


def _on_memory_projection(st: ServerState, e: ev.MemoryProjection) -> None:
    run = st.run
    run.memory_projection = e


def _on_slots_initialized(st: ServerState, e: ev.SlotsInitialized) -> None:
    run = st.run
    run.n_slots = e.n_slots
    if e.n_ctx_slot is not None:
        run.n_ctx_slot = e.n_ctx_slot
    if e.kv_unified is not None:
        run.kv_unified = e.kv_unified
    for i in range(e.n_slots):
        run.slot(i).n_ctx = run.n_ctx_slot


def _on_slot_created(st: ServerState, e: ev.SlotCreated) -> None:
    run = st.run
    run.slot(e.slot).n_ctx = e.n_ctx
    if run.n_ctx_slot is None:
        run.n_ctx_slot = e.n_ctx


def _on_context_param(st: ServerState, e: ev.ContextParam) -> None:
    run = st.run
    run.context[e.name] = e.value
    if e.name == "kv_unified":
        run.kv_unified = bool(e.value)


def _on_kv_cache_section(st: ServerState, e: ev.KVCacheSection) -> None:
    run = st.run
    run.kv_section_swa = e.swa


def _on_kv_cache_size(st: ServerState, e: ev.KVCacheSize) -> None:
    run = st.run
    run.kv_k_bytes += e.k_mib * MIB
    run.kv_v_bytes += e.v_mib * MIB
    run.type_k, run.type_v = e.type_k, e.type_v
    if not run.kv_section_swa and e.cells is not None:
        run.kv_cells = e.cells
        run.kv_streams = e.streams
        if e.streams is not None and e.seqs is not None and run.kv_unified is None:
            run.kv_unified = e.streams == 1 and e.seqs > 1


def _on_recurrent_memory(st: ServerState, e: ev.RecurrentMemory) -> None:
    st.run.recurrent_cells = e.cells


def _on_per_slot_cap(st: ServerState, e: ev.PerSlotCap) -> None:
    run = st.run
    run.per_slot_cap = e
    run.n_ctx_slot = e.cap


def _on_idle_slot_policy(st: ServerState, e: ev.IdleSlotPolicy) -> None:
    run = st.run
    run.idle_slots_cleared_on_new_task = e.clear_on_new_task


def _on_prompt_eval_timing(st: ServerState, e: ev.PromptEvalTiming) -> None:
    if not st.counting:
        return
    st.prompt_eval_seconds.observe(e.ms / 1000.0)
    st.prompt_tokens += e.tokens
    s = st.run.slots.get(e.slot if e.slot >= 0 else st.latency.head_slot)
    if s is None:
        outcome, cached = "unknown", None
    else:
        outcome, cached = cache_outcome(s.reuse, s.cache_base, e.tokens, s.prompt_loaded), s.cache_base
    st.latency.prompt_evaluated(outcome, e.ms, e.tokens, cached)
    if st.request_values is not None:
        st.request_values.first_token(outcome, e.ms)


def _on_generation_timing(st: ServerState, e: ev.GenerationTiming) -> None:
    if st.counting:
        st.generated_tokens += e.tokens
        st.latency.generated(e.ms, e.tokens)


def _on_total_timing(st: ServerState, e: ev.TotalTiming) -> None:
    if st.counting:
        st.latency.finished(e.ms)
    st.latency.processed = e.tokens


def _on_draft_acceptance(st: ServerState, e: ev.DraftAcceptance) -> None:
    if st.counting:
        st.latency.draft_accepted += e.accepted
        st.latency.draft_generated += e.generated


def _on_generation_stopped(st: ServerState, e: ev.GenerationStopped) -> None:
    if not st.provenance.knows(e.task) and st.run.slot(e.slot).task != e.task:
        raise NotOwnLine
    if st.counting:
        st.latency.finish_reasons[e.reason] += 1


def _reused(s: SlotState, how: str) -> None:
    """A slot's line said how its prompt is reused; the first in `CACHE_OUTCOMES`' order stands."""
    if s.reuse is None or CACHE_OUTCOMES.index(how) < CACHE_OUTCOMES.index(s.reuse):
        s.reuse = how


def _count_checkpoint(st: ServerState, event: str) -> None:
    if st.counting:
        st.checkpoint_events[event] += 1


def _on_checkpoint_config(st: ServerState, e: ev.CheckpointConfig) -> None:
    st.run.checkpoint_limit = e.max_per_slot


# The checkpoint lines name a slot: the slot exists from then on (`ServerRun.slot`), whatever the line says.


def _on_checkpoint_created(st: ServerState, e: ev.CheckpointCreated) -> None:
    run = st.run
    checkpoints = run.slot(e.slot).checkpoints
    checkpoints.append(Checkpoint(e.pos_min, e.pos_max, e.size_mib * MIB))
    # "N of M" is the slot's count after the append: the log's own check on our bookkeeping.
    while len(checkpoints) > e.index > 0 or len(checkpoints) > MAX_CHECKPOINTS:
        checkpoints.pop(0)
    if e.max_per_slot:
        run.checkpoint_limit = e.max_per_slot
    _count_checkpoint(st, "created")


def _on_checkpoint_removed(st: ServerState, e: ev.CheckpointRemoved) -> None:
    _remove_checkpoint(st.run.slot(e.slot).checkpoints, e.pos_min, e.pos_max, e.size_mib * MIB)
    _count_checkpoint(st, e.reason)


def _on_checkpoint_superseded(st: ServerState, e: ev.CheckpointSuperseded) -> None:
    _remove_checkpoint(st.run.slot(e.slot).checkpoints, None, e.n_tokens - 1, None)


def _on_checkpoint_restored(st: ServerState, e: ev.CheckpointRestored) -> None:
    _reused(st.run.slot(e.slot), "checkpoint_restored")
    _count_checkpoint(st, "restored")


def _on_checkpoint_restore_failed(st: ServerState, e: ev.CheckpointRestoreFailed) -> None:
    st.run.slot(e.slot)
    _count_checkpoint(st, "failed_restore")


def _on_full_reprocess(st: ServerState, e: ev.FullReprocess) -> None:
    _reused(st.run.slot(e.slot), "full_reprocess")
    if st.counting:
        st.full_reprocess += 1


def _on_slot_selected(st: ServerState, e: ev.SlotSelected) -> None:
    run = st.run
    run.selected_slot = e.slot
    run.cache_candidates = []


def _on_prompt_cache_limit(st: ServerState, e: ev.PromptCacheLimit) -> None:
    run = st.run
    run.prompt_cache_limit_bytes = float("inf") if e.limit_mib is None else e.limit_mib * MIB
    if run.prompt_cache_bytes is None:  # announced at start-up: the cache starts empty
        run.prompt_cache_bytes, run.prompt_cache_prompts = 0.0, 0


def _on_prompt_cache_state(st: ServerState, e: ev.PromptCacheState) -> None:
    run = st.run
    run.prompt_cache_prompts = e.prompts
    run.prompt_cache_bytes = e.size_mib * MIB
    if run.prompt_cache_limit_bytes is None or run.prompt_cache_limit_bytes not in (0.0, float("inf")):
        run.prompt_cache_limit_bytes = e.limit_mib * MIB
    # Bounded by the cache's own entry count, even if removal lines were missed.
    entries = run.cache_entries
    while len(entries) > e.prompts:
        del entries[next(iter(entries))]


def _on_prompt_saved(st: ServerState, e: ev.PromptSaved) -> None:
    run = st.run
    if run.selected_slot is not None:
        # The cache gets a copy of the slot's prompt, checkpoints included; the slot keeps its own.
        if len(run.cache_entries) >= MAX_CHECKPOINTS:  # forged saves without a cache state line
            del run.cache_entries[next(iter(run.cache_entries))]
        run.cache_entries[e.length] = list(run.slot(run.selected_slot).checkpoints)


def _on_prompt_cache_candidate(st: ServerState, e: ev.PromptCacheCandidate) -> None:
    st.run.cache_candidates.append(e)


def _on_prompt_loaded(st: ServerState, e: ev.PromptLoaded) -> None:
    run = st.run
    chosen = next((c for c in run.cache_candidates if (c.f_keep, c.f_sim) == (e.f_keep, e.f_sim)), None)
    if chosen is not None and run.selected_slot is not None:
        # `prompt = std::move(entry.prompt)`: the entry's checkpoints replace the slot's.
        run.slot(run.selected_slot).checkpoints = run.cache_entries.pop(chosen.length, [])
    if run.selected_slot is not None:
        run.slot(run.selected_slot).prompt_loaded = True
    run.cache_candidates = []


def _on_prompt_cache_removed(st: ServerState, e: ev.PromptCacheRemoved) -> None:
    entries = st.run.cache_entries
    if e.length is not None:
        entries.pop(e.length, None)
    elif entries:
        del entries[next(iter(entries))]


HANDLERS: dict[type[Any], Callable[[ServerState, Any], None]] = {
    ev.GenerationProgress: _on_generation_progress,
    ev.PromptProgress: _on_prompt_progress,
    ev.CachedTokens: _on_cached_tokens,
    ev.SlotReleased: _on_slot_released,
    ev.SlotCleared: _on_slot_cleared,
    ev.SlotPurged: _on_slot_purged,
    ev.TaskStarted: _on_task_started,
    ev.NewPrompt: _on_new_prompt,
    ev.KVRetry: _on_kv_retry,
    ev.MemorySlotFailure: _on_memory_slot_failure,
    ev.DecodeFatal: _on_decode_fatal,
    ev.RequestError: _on_request_error,
    ev.DecodeFailed: _on_decode_failed,
    ev.AllSlotsIdle: _on_all_slots_idle,
    ev.TimingsHead: _on_timings_head,
    ev.PromptEvalTiming: _on_prompt_eval_timing,
    ev.GenerationTiming: _on_generation_timing,
    ev.TotalTiming: _on_total_timing,
    ev.DraftAcceptance: _on_draft_acceptance,
    ev.GenerationStopped: _on_generation_stopped,
    ev.CheckpointConfig: _on_checkpoint_config,
    ev.CheckpointCreated: _on_checkpoint_created,
    ev.CheckpointRemoved: _on_checkpoint_removed,
    ev.CheckpointSuperseded: _on_checkpoint_superseded,
    ev.CheckpointRestored: _on_checkpoint_restored,
    ev.CheckpointRestoreFailed: _on_checkpoint_restore_failed,
    ev.FullReprocess: _on_full_reprocess,
    ev.PromptCacheLimit: _on_prompt_cache_limit,
    ev.PromptCacheState: _on_prompt_cache_state,
    ev.PromptSaved: _on_prompt_saved,
    ev.PromptCacheCandidate: _on_prompt_cache_candidate,
    ev.PromptLoaded: _on_prompt_loaded,
    ev.PromptCacheRemoved: _on_prompt_cache_removed,
    ev.SlotSelected: _on_slot_selected,
    ev.IdleSlotSaved: _on_idle_slot_saved,
    ev.ServerStarting: _on_server_starting,
    ev.BuildInfo: _on_build_info,
    ev.Verbosity: _on_verbosity,
    ev.ModelLoading: _on_model_loading,
    ev.ServerReady: _on_server_ready,
    ev.ServerExiting: _on_server_exiting,
    ev.ModelLoadFailed: _on_model_load_failed,
    ev.MemoryProjection: _on_memory_projection,
    ev.SlotsInitialized: _on_slots_initialized,
    ev.SlotCreated: _on_slot_created,
    ev.ContextParam: _on_context_param,
    ev.KVCacheSection: _on_kv_cache_section,
    ev.RecurrentMemory: _on_recurrent_memory,
    ev.KVCacheSize: _on_kv_cache_size,
    ev.PerSlotCap: _on_per_slot_cap,
    ev.IdleSlotPolicy: _on_idle_slot_policy,
    ev.CrashCause: _on_crash_cause,
}


def _only_counted(st: ServerState, e: Any) -> None:
    """The handler of a kind that is only counted (`Traits.counted`: `ServerState.apply` counts it)."""


Handler = Callable[["ServerState", Any], None]
Check = Callable[["ServerRun", Any], bool]
Fits = Callable[[Provenance, "ServerRun", Any], bool]

# One lookup per event on the hot path: its handler, its bounds check, whether provenance looks at it (and its
# rule, when that is all `Provenance.admit` does with a line in its run's format: `FITS_ONLY`), and whether it is
# counted (`ServerState.counted`: in `apply`, not by a wrapper around the handler, which cost a call per event
# on a log full of retries).
DISPATCH: dict[type[Any], tuple[Handler, Check | None, bool, Fits | None, bool]] = {
    kind: (
        HANDLERS.get(kind, _only_counted),
        CHECKS.get(kind),
        kind in CHECKED,
        FITS_ONLY.get(kind),
        kind in ev.COUNTED,
    )
    for kind in [*HANDLERS, *sorted(ev.COUNTED - HANDLERS.keys(), key=lambda k: k.__name__)]
}


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
