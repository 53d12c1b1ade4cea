"""Events: what a llama-server log line means, as plain immutable values.

`logs.parse.parse_line` turns one line into at most one of these; `state.ServerState.apply` consumes
them. Field names follow llama-server's own wording. Slot ids are ints, task ids are ints (-1 = none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True, slots=True)
class ServerStarting:
    """First lines of a server process (banner); a new process means every slot starts empty."""

    build: int | None = None


@dataclass(frozen=True, slots=True)
class BuildInfo:
    """`build: 4747 (c392e509)`, `build_info: b8668-5d3a4a7da`, `common_params_print_info: build 11434 (…)`."""

    build: int
    commit: str


@dataclass(frozen=True, slots=True)
class Verbosity:
    """`verbosity = 4 (adjust with the -lv N CLI arg)`: printed only at -lv 4 and above on b9151+."""

    level: int


@dataclass(frozen=True, slots=True)
class ModelLoading:
    """`loading model 'path'` (b4274+)."""

    model: str


@dataclass(frozen=True, slots=True)
class ServerReady:
    """`listening on http://…` / `server is listening on …`: the model is loaded and /health answers 200."""

    address: str


@dataclass(frozen=True, slots=True)
class SlotsInitialized:
    """`initializing, n_slots = 4, n_ctx_slot = 512, kv_unified = 'true'` (b9829+).

    Older builds: `initializing slots, n_slots = 4`.
    """

    n_slots: int
    n_ctx_slot: int | None = None
    kv_unified: bool | None = None


@dataclass(frozen=True, slots=True)
class SlotCreated:
    """`new slot, n_ctx = 512` / `new slot n_ctx_slot = 4096`, one per slot at start-up."""

    slot: int
    n_ctx: int


@dataclass(frozen=True, slots=True)
class ContextParam:
    """One `llama_context: name = value` start-up line (n_ctx, n_ctx_seq, n_seq_max, kv_unified, n_batch…)."""

    name: str
    value: int


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class KVCacheSection:
    """`llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells`: the next size line is that sub-cache."""

    swa: bool
    cells: int


@dataclass(frozen=True, slots=True)
class PerSlotCap:
    """`capping per-slot context (16384) to --kv-unified-per-slot (4096)`."""

    requested: int
    cap: int


@dataclass(frozen=True, slots=True)
class IdleSlotPolicy:
    """`idle slots will be saved to prompt cache and cleared upon starting a new task` (b8658+, unified KV)."""

    clear_on_new_task: bool


@dataclass(frozen=True, slots=True)
class TaskStarted:
    """`processing task` / `processing task, is_child = 0`: the slot now has a task."""

    slot: int
    task: int


@dataclass(frozen=True, slots=True)
class NewPrompt:
    """`new prompt, n_ctx_slot = A, n_keep = B, task.n_tokens = C` (or `n_prompt_tokens = C`)."""

    slot: int
    task: int
    n_ctx_slot: int
    n_prompt_tokens: int


@dataclass(frozen=True, slots=True)
class CachedTokens:
    """`cached n_tokens = N, memory_seq_rm [N, end)` and older `n_past = N …`/`kv cache rm [N, end)`: N tokens kept."""

    slot: int
    task: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class PromptProgress:
    """Prompt processing progress.

    `absolute` lines (b3761–b9150: `prompt processing progress, n_tokens|n_past = N`, `prompt done`) give
    the slot's total tokens; b9151+ `prompt processing, n_tokens = N` counts only newly evaluated ones.
    """

    slot: int
    task: int
    n_tokens: int
    absolute: bool


@dataclass(frozen=True, slots=True)
class GenerationProgress:
    """`n_gen = G, tg = …` / `n_decoded = G, tg = …` (every ≥3 s while generating, b9151+)."""

    slot: int
    task: int
    n_decoded: int


@dataclass(frozen=True, slots=True)
class SlotReleased:
    """`stop processing: n_tokens = N, truncated = 0`: idle, but the slot still holds N cells."""

    slot: int
    task: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class SlotCleared:
    """`clearing prompt with N tokens` / `clearing slot with N tokens`: the slot holds nothing now."""

    slot: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class SlotPurged:
    """`purging slot S with N tokens`: unified-KV pressure freed an idle slot (the retry may then succeed)."""

    slot: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class IdleSlotSaved:
    """`saving idle slot to prompt cache`: followed by a clear of that slot."""

    slot: int


@dataclass(frozen=True, slots=True)
class MemorySlotFailure:
    """Library warning `decode: failed to find a memory slot for batch of size N` (and older wordings)."""

    batch_size: int


@dataclass(frozen=True, slots=True)
class KVRetry:
    """`failed to find free space in the KV cache, retrying with smaller batch size, off|i = O, n_batch = B`."""

    offset: int
    n_batch: int


@dataclass(frozen=True, slots=True)
class DecodeFatal:
    """`Context size has been exceeded. off = 3, n_batch = 1, ret = 1` and its relatives: the batch is lost.

    `reason` is one of `context_exceeded`, `invalid_batch`, `compute_error`, `kv_cache_full` (pre-b5448).
    """

    reason: str


@dataclass(frozen=True, slots=True)
class DecodeFailed:
    """`decode() failed: Context size has been exceeded.` (b9752+), after every in-flight slot was aborted."""

    message: str


@dataclass(frozen=True, slots=True)
class RequestError:
    """`send_error: task id = N, error: MESSAGE`: one client request ended with a server error."""

    task: int
    reason: str


@dataclass(frozen=True, slots=True)
class AllSlotsIdle:
    """`all slots are idle`."""


# --- context checkpoints (SWA / hybrid / recurrent models), host RAM -----------------------------


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """`context checkpoints enabled, max = 32, min spacing = 8192` / `context checkpoints disabled` (max 0)."""

    max_per_slot: int


@dataclass(frozen=True, slots=True)
class CheckpointCreated:
    """`created context checkpoint N of M (pos_min = A, pos_max = B[, n_tokens = T], size = X MiB)`.

    Older wordings: `saved context checkpoint …` (b6685–b6722), `SWA checkpoint create, … total = N/M` (b6160+).
    `index` is the slot's checkpoint count after this one was added.
    """

    slot: int
    index: int
    max_per_slot: int
    pos_min: int
    pos_max: int
    size_mib: float


@dataclass(frozen=True, slots=True)
class CheckpointRemoved:
    """A checkpoint was dropped from a slot.

    `reason` is `evicted` (`erasing old context checkpoint`, `erasing context checkpoint too close to an
    earlier one`, `SWA checkpoint erase`) or `invalidated` (`erased invalidated context checkpoint`).
    """

    slot: int
    reason: str
    pos_min: int
    pos_max: int
    size_mib: float


@dataclass(frozen=True, slots=True)
class CheckpointSuperseded:
    """`superseding context checkpoint at n_tokens = N`: replaced by the one being created at the same position."""

    slot: int
    n_tokens: int


@dataclass(frozen=True, slots=True)
class CheckpointRestored:
    """`restored context checkpoint (pos_min = A, pos_max = B, …)` / `SWA checkpoint restore, …`."""

    slot: int


@dataclass(frozen=True, slots=True)
class CheckpointRestoreFailed:
    """`failed to restore context checkpoint (…)`."""

    slot: int


@dataclass(frozen=True, slots=True)
class FullReprocess:
    """`forcing full prompt re-processing due to lack of cache data`: the prompt is evaluated from scratch."""

    slot: int


# --- host-RAM prompt cache (--cache-ram, b6723+) --------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptCacheLimit:
    """`prompt cache is enabled, size limit: N MiB` (None = `no limit`), `… is disabled` (0), `limit reduced to`."""

    limit_mib: float | None


@dataclass(frozen=True, slots=True)
class PromptCacheState:
    """`cache state: N prompts, X MiB (limits: L MiB, …)`: printed after every cache update."""

    prompts: int
    size_mib: float
    limit_mib: float


@dataclass(frozen=True, slots=True)
class PromptSaved:
    """`saving prompt with length L, total state size = X MiB`: the selected slot's prompt is copied to the cache."""

    length: int
    size_mib: float


@dataclass(frozen=True, slots=True)
class PromptCacheCandidate:
    """`- prompt with length L, lcp = …, f_keep = K, f_sim = S`: one cache entry considered for loading."""

    length: int
    f_keep: str
    f_sim: str


@dataclass(frozen=True, slots=True)
class PromptLoaded:
    """`found better prompt with f_keep = K, f_sim = S`: that entry moves from the cache into the slot."""

    f_keep: str
    f_sim: str


@dataclass(frozen=True, slots=True)
class PromptCacheRemoved:
    """An entry left the cache: `removing obsolete cached prompt with length L`, or the oldest one made room."""

    length: int | None


@dataclass(frozen=True, slots=True)
class SlotSelected:
    """`selected slot by LRU|LCP|id …`: the slot the next task (and prompt-cache update) is for."""

    slot: int


# --- per-request timings (one set per finished request) -------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptEvalTiming:
    """`prompt eval time = X ms / N tokens`: prompt evaluation of one request (cached tokens excluded)."""

    ms: float
    tokens: int


@dataclass(frozen=True, slots=True)
class GenerationTiming:
    """`eval time = X ms / N tokens`: token generation of one request."""

    ms: float
    tokens: int


Event: TypeAlias = (
    ServerStarting
    | BuildInfo
    | Verbosity
    | ModelLoading
    | ServerReady
    | SlotsInitialized
    | SlotCreated
    | ContextParam
    | KVCacheSize
    | KVCacheSection
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
    | MemorySlotFailure
    | KVRetry
    | DecodeFatal
    | DecodeFailed
    | RequestError
    | AllSlotsIdle
    | CheckpointConfig
    | CheckpointCreated
    | CheckpointRemoved
    | CheckpointSuperseded
    | CheckpointRestored
    | CheckpointRestoreFailed
    | FullReprocess
    | PromptCacheLimit
    | PromptCacheState
    | PromptSaved
    | PromptCacheCandidate
    | PromptLoaded
    | PromptCacheRemoved
    | SlotSelected
    | PromptEvalTiming
    | GenerationTiming
)
