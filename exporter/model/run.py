"""What one llama-server process said about itself: its configuration, its slots, its start. Pure.

A server start forgets everything here at once: `ServerState` replaces its `ServerRun` with a fresh one
(`ServerState.start_run`), so a field added to this class is forgotten at the next start with no
further code, and the counters that outlive a start stay on `ServerState`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.logs import events as ev
from exporter.model.slot import Checkpoint, SlotState

#: Why a server crashed, where its log named it (`ev.CrashCause.cause`); `unknown`: it named nothing.
CRASH_CAUSES = (
    "cuda_out_of_memory",
    "metal_out_of_memory",
    "vulkan_out_of_memory",
    "ggml_assert",
    "ggml_abort",
    "unknown",
)


@dataclass
class ServerRun:
    """Configuration and slot occupancy of the running server process, from its log lines."""

    build: int | None = None
    commit: str | None = None
    verbosity: int | None = None
    model: str | None = None
    ready: bool = False
    exiting: bool = False  # the server said it is shutting down (`cleaning up before exit`)
    start_error: str | None = None  # why the start failed, where the log says
    crash_cause: ev.CrashCause | None = None  # what the log named as the cause of a crash (see handlers)
    # What the server projected at start (`common_params_fit_impl: projected to use …`, -lv 4), if logged.
    memory_projection: ev.MemoryProjection | None = None
    n_slots: int | None = None
    n_ctx_slot: int | None = None
    kv_unified: bool | None = None
    context: dict[str, int] = field(default_factory=dict)
    kv_cells: int | None = None
    kv_streams: int | None = None
    kv_k_bytes: float = 0.0
    kv_v_bytes: float = 0.0
    type_k: str | None = None
    type_v: str | None = None
    per_slot_cap: ev.PerSlotCap | None = None
    idle_slots_cleared_on_new_task: bool | None = None
    slots: dict[int, SlotState] = field(default_factory=dict)
    in_cascade: bool = False
    checkpoint_limit: int | None = None
    prompt_cache_bytes: float | None = None
    prompt_cache_prompts: int | None = None
    prompt_cache_limit_bytes: float | None = None  # inf = no limit, 0 = disabled

    # The start's own bookkeeping, and what the handlers (exporter.model.handlers) carry from line to line.
    in_startup: bool = False  # between the start banner and the first sign of work
    banners_seen: set[object] = field(default_factory=set)  # banner lines of this start (`ev.banner_line`)
    prompt_throughput: float | None = None  # the latest prompt speed measured between two progress lines
    kv_section_swa: bool = False  # the `llama_kv_cache` lines that follow describe the SWA cache
    recurrent_cells: int | None = None  # `llama_memory_recurrent: size = … (N cells, …)`: a recurrent state
    aborted_tasks: set[int] = field(default_factory=set)  # tasks a fatal decode error aborted, until released
    selected_slot: int | None = None  # the slot the last `selected slot by` line named
    # Prompt-cache entries by prompt length, with the checkpoints they carry (moved back into a slot on load).
    cache_entries: dict[int, list[Checkpoint]] = field(default_factory=dict)
    cache_candidates: list[ev.PromptCacheCandidate] = field(default_factory=list)

    @property
    def slot_count(self) -> int | None:
        """Number of slots: from the start-up lines, else the highest slot id seen."""
        if self.n_slots is not None:
            return self.n_slots
        return max(self.slots) + 1 if self.slots else None

    def slot_context(self, slot: int) -> int | None:
        """The slot's context limit (`n_ctx_slot`)."""
        s = self.slots.get(slot)
        if s is not None and s.n_ctx is not None:
            return s.n_ctx
        return self.n_ctx_slot

    def slot(self, slot: int) -> SlotState:
        """The slot with this id, created (with the run's `n_ctx_slot`) when the log names it first."""
        s = self.slots.get(slot)
        if s is None:
            s = self.slots[slot] = SlotState(n_ctx=self.n_ctx_slot)
        return s

    def pool_used(self) -> int:
        """Cells held by all slots (log estimate)."""
        return sum(s.tokens for s in self.slots.values())

    def processing(self) -> bool:
        """Some slot has a task (a loop, not `any` over a generator: asked at every retry that starts a cascade)."""
        for s in self.slots.values():  # noqa: SIM110  (see the docstring)
            if s.processing:
                return True
        return False

    def checkpoint_lines_visible(self) -> bool | None:
        """Whether the log shows checkpoint and prompt-cache lines (TRC on b9829+: only at -lv 4)."""
        if self.verbosity is None:
            return None
        return self.verbosity >= 4 or (self.build is not None and self.build < 9829)

    def clears_idle_slots(self) -> bool:
        """Whether starting a task clears the other idle slots (unified KV + `--cache-idle-slots`)."""
        if self.kv_unified is not True:
            return False
        if self.idle_slots_cleared_on_new_task is not None:
            return self.idle_slots_cleared_on_new_task
        # At -lv 3 on b9829+ the policy line is hidden; the feature is on by default since b8852.
        # At -lv 4 and above its absence means it is off (`--no-cache-idle-slots`).
        return self.verbosity is not None and self.verbosity <= 3 and (self.build or 9829) >= 8852
