"""The slots and the KV pool: their configuration at start, each task from its prompt to its release, its timings."""

from __future__ import annotations

from dataclasses import field
from typing import TypeAlias

from exporter.logs.event_class import Traits, event


@event
class SlotsInitialized:
    """`initializing, n_slots = 4, n_ctx_slot = 512, kv_unified = 'true'` (b9829+).

    Older builds: `initializing slots, n_slots = 4`.
    """

    n_slots: int
    n_ctx_slot: int | None = None
    kv_unified: bool | None = None


@event
class SlotCreated:
    """`new slot, n_ctx = 512` / `new slot n_ctx_slot = 4096`, one per slot at start-up."""

    slot: int
    n_ctx: int


@event
class ContextParam:
    """One `llama_context: name = value` start-up line (n_ctx, n_ctx_seq, n_seq_max, kv_unified, n_batch…)."""

    name: str
    value: int


@event
class KVCacheSize:
    """`llama_kv_cache: size = 0.12 MiB (512 cells, 2 layers, 4/1 seqs), K (f16): 0.06 MiB, V (f16): 0.06 MiB`.

    `cells` is per stream; `streams` is 1 with unified KV and n_seq_max otherwise (None on old builds).
    SWA models print one such line per sub-cache, each after a `KVCacheSection` line.
    """

    size_mib: float
    cells: int | None
    seqs: int | None
    streams: int | None
    type_k: str
    k_mib: float
    type_v: str
    v_mib: float


@event
class KVCacheSection:
    """`llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells`: the next size line is that sub-cache."""

    swa: bool
    cells: int


@event
class RecurrentMemory:
    """`llama_memory_recurrent: size = 0.38 MiB (4 cells, 24 layers, 4 seqs), R (f32): …, S (f32): …` (b5856+).

    A recurrent model (Mamba, RWKV) prints only this; a hybrid one (attention and recurrent layers) prints a
    `llama_kv_cache: size` line as well. Its state cannot be rolled back to an earlier token.
    """

    cells: int


@event
class PerSlotCap:
    """`capping per-slot context (16384) to --kv-unified-per-slot (4096)`."""

    requested: int
    cap: int


@event
class IdleSlotPolicy:
    """`idle slots will be saved to prompt cache and cleared upon starting a new task` (b8658+, unified KV)."""

    clear_on_new_task: bool


@event
class TaskStarted:
    """`processing task` / `processing task, is_child = 0`: the slot now has a task."""

    TRAITS = Traits(demand="grows", progress=True)

    slot: int
    task: int


@event
class NewPrompt:
    """`new prompt, n_ctx_slot = A, n_keep = B, task.n_tokens = C` (or `n_prompt_tokens = C`)."""

    TRAITS = Traits(demand="grows", progress=True, series=True)

    slot: int
    task: int
    n_ctx_slot: int
    n_prompt_tokens: int


@event
class CachedTokens:
    """`cached n_tokens = N, memory_seq_rm [N, end)` and older `n_past = N …`/`kv cache rm [N, end)`: N tokens kept."""

    TRAITS = Traits(progress=True, task_line=True, series=True)

    slot: int
    task: int
    n_tokens: int


@event
class PromptProgress:
    """Prompt processing progress.

    `absolute` lines (b3761–b9150: `prompt processing progress, n_tokens|n_past = N`, `prompt done`) give
    the slot's total tokens; b9151+ `prompt processing, n_tokens = N` counts only newly evaluated ones.
    `progress` is the printed fraction of the prompt (None on `done` lines); `seconds` and `rate` are
    the b9151+ `t = T s / R tokens per second` (time since the prompt started, tokens / that time).
    """

    TRAITS = Traits(demand="grows", progress=True, task_line=True, series=True)

    slot: int
    task: int
    n_tokens: int
    absolute: bool
    progress: float | None = None
    seconds: float | None = None
    rate: float | None = None


@event
class GenerationProgress:
    """`n_gen = G, tg = R t/s[, tg_3s = R3 t/s]` / `n_decoded = G, …` (every ≥3 s while generating, b9151+).

    `rate` is the most recent speed the line gives (tg_3s, b9706+, else the average tg), tokens/s.
    """

    TRAITS = Traits(progress=True, task_line=True, series=True)

    slot: int
    task: int
    n_decoded: int
    rate: float | None = None


@event
class SlotReleased:
    """`stop processing: n_tokens = N, truncated = 0`: idle, but the slot still holds N cells."""

    TRAITS = Traits(demand="shrinks", progress=True, task_line=True, series=True, abort_trail=True)

    slot: int
    task: int
    n_tokens: int


@event
class SlotCleared:
    """`clearing prompt with N tokens` / `clearing slot with N tokens`: the slot holds nothing now."""

    TRAITS = Traits(series=True, abort_trail=True)

    slot: int
    n_tokens: int


@event
class SlotPurged:
    """`purging slot S with N tokens`: unified-KV pressure freed an idle slot (the retry may then succeed)."""

    TRAITS = Traits(series=True)

    slot: int
    n_tokens: int


@event
class IdleSlotSaved:
    """`saving idle slot to prompt cache`: followed by a clear of that slot."""

    slot: int


@event
class AllSlotsIdle:
    """`all slots are idle`."""

    TRAITS = Traits(demand="shrinks", progress=True, series=True)


@event
class SlotSelected:
    """`selected slot by LRU|LCP|id …`: the slot the next task (and prompt-cache update) is for."""

    slot: int


@event
class PromptEvalTiming:
    """`prompt eval time = X ms / N tokens`: prompt evaluation of one request (cached tokens excluded).

    `continuation`: the line had no slot tag, so it is a continuation line of a `print_timing` entry
    (before b9230), believable only right after that entry's first line (`TimingsHead`).
    """

    ms: float
    tokens: int
    continuation: bool = field(default=False, compare=False)
    # The slot the line names (b9230+); -1 on a continuation line: the `TimingsHead` before it names it.
    slot: int = field(default=-1, compare=False, repr=False)


@event
class GenerationTiming:
    """`eval time = X ms / N tokens`: generation of one request (`continuation`, `slot`: as `PromptEvalTiming`)."""

    ms: float
    tokens: int
    continuation: bool = field(default=False, compare=False)
    slot: int = field(default=-1, compare=False, repr=False)


@event
class TotalTiming:
    """`total time = X ms / N tokens`: prompt evaluation plus generation of one request, the last timings line
    (`continuation`, `slot`: see `PromptEvalTiming`)."""

    ms: float
    tokens: int
    continuation: bool = field(default=False, compare=False)
    slot: int = field(default=-1, compare=False, repr=False)


@event
class DraftAcceptance:
    """Speculative decoding of one request, printed with its timings: `draft acceptance = R (A accepted / G
    generated), mean len = L` (b11434, slot-tagged); before, `draft acceptance rate = R (A accepted / G
    generated)` on a line of its own after the timings (`continuation`, `slot`: as `PromptEvalTiming`)."""

    accepted: int
    generated: int
    continuation: bool = field(default=False, compare=False)
    slot: int = field(default=-1, compare=False, repr=False)


@event
class GenerationStopped:
    """Why a request stopped generating, at debug verbosity: `stopped by EOS`, `stopped by limit, …`, `stopped by
    time limit, …`, `stopped by indentation limit, …`, `stopped due to running out of context capacity, …`."""

    slot: int
    task: int
    reason: str  # eos | limit | time_limit | indentation_limit | context_capacity


@event
class TimingsHead:
    """`slot print_timing: id 0 | task 42 | ` and nothing more: the first line of a timings entry before b9230.

    Its continuation lines (`prompt eval time = …`, `eval time = …`, `total time = …`) follow without slot tag
    or prefix.
    """

    slot: int
    task: int


#: The kinds of this family (`exporter.logs.events.Event` is the union of the families').
SlotEvent: TypeAlias = (
    SlotsInitialized
    | SlotCreated
    | ContextParam
    | KVCacheSize
    | KVCacheSection
    | RecurrentMemory
    | PerSlotCap
    | IdleSlotPolicy
    | TaskStarted
    | NewPrompt
    | CachedTokens
    | PromptProgress
    | GenerationProgress
    | SlotReleased
    | SlotCleared
    | SlotPurged
    | IdleSlotSaved
    | AllSlotsIdle
    | SlotSelected
    | PromptEvalTiming
    | GenerationTiming
    | TotalTiming
    | DraftAcceptance
    | GenerationStopped
    | TimingsHead
)

__all__ = [
    "AllSlotsIdle",
    "CachedTokens",
    "ContextParam",
    "DraftAcceptance",
    "GenerationProgress",
    "GenerationStopped",
    "GenerationTiming",
    "IdleSlotPolicy",
    "IdleSlotSaved",
    "KVCacheSection",
    "KVCacheSize",
    "NewPrompt",
    "PerSlotCap",
    "PromptEvalTiming",
    "PromptProgress",
    "RecurrentMemory",
    "SlotCleared",
    "SlotCreated",
    "SlotEvent",
    "SlotPurged",
    "SlotReleased",
    "SlotSelected",
    "SlotsInitialized",
    "TaskStarted",
    "TimingsHead",
    "TotalTiming",
]
