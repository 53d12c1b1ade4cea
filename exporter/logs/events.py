"""Events: what a llama-server log line means, as plain immutable values.

`logs.parse.parse_line` turns one line into at most one of these; `state.ServerState.apply` consumes
them. Field names follow llama-server's own wording. Slot ids are ints, task ids are ints (-1 = none).
"""

from __future__ import annotations

from dataclasses import field
from typing import TypeAlias

from exporter.logs.event_class import event


@event
class ServerStarting:
    """First lines of a server process (banner); a new process means every slot starts empty."""

    build: int | None = None


@event
class BuildInfo:
    """`build: 4747 (c392e509)`, `build_info: b8668-5d3a4a7da`, `common_params_print_info: build 11434 (…)`."""

    build: int
    commit: str
    # Which of the two lines: an in-process server (xllamacpp) prints both at one start (`build_info: b0-unknown`,
    # then `common_params_print_info: build 0 (unknown)` at -lv 4), so they are two banners, not one repeated.
    tag: bool = field(default=False, compare=False, repr=False)  # True: the `build_info: bN-commit` line


@event
class Verbosity:
    """`verbosity = 4 (adjust with the -lv N CLI arg)`: printed only at -lv 4 and above on b9151+."""

    level: int


#: The start-up banner lines: the first of them in a file, or one the start in progress already printed,
#: is a new server process.
BANNERS = frozenset({ServerStarting, BuildInfo, Verbosity})


def banner_line(e: ServerStarting | BuildInfo | Verbosity) -> object:
    """Which banner line `e` is: one start prints each of them at most once (two wordings of the build line)."""
    return (BuildInfo, e.tag) if type(e) is BuildInfo else type(e)


@event
class ModelLoading:
    """`loading model 'path'` (b4274+)."""

    model: str


@event
class ServerReady:
    """`listening on http://…` / `server is listening on …`: the model is loaded and /health answers 200."""

    address: str


@event
class ModelLoadFailed:
    """`load_model: failed to load model, '/models/x.gguf'`: the start fails; the server exits."""

    model: str


@event
class ServerExiting:
    """`cleaning up before exit...`: the server is shutting down on its own terms (a signal it handles,
    or the end of its main loop), not crashing."""


@event
class MemoryProjection:
    """`common_params_fit_impl: projected to use 9876 MiB of device memory vs. 10240 MiB of free device
    memory` (`… of host memory vs. N MiB of total host memory` without a GPU): the memory the model and
    its context will take at start, and what there is (b7xxx+, printed before the model loads)."""

    kind: str  # device | host
    used_mib: int
    available_mib: int


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

    slot: int
    task: int


@event
class NewPrompt:
    """`new prompt, n_ctx_slot = A, n_keep = B, task.n_tokens = C` (or `n_prompt_tokens = C`)."""

    slot: int
    task: int
    n_ctx_slot: int
    n_prompt_tokens: int


@event
class CachedTokens:
    """`cached n_tokens = N, memory_seq_rm [N, end)` and older `n_past = N …`/`kv cache rm [N, end)`: N tokens kept."""

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

    slot: int
    task: int
    n_decoded: int
    rate: float | None = None


@event
class SlotReleased:
    """`stop processing: n_tokens = N, truncated = 0`: idle, but the slot still holds N cells."""

    slot: int
    task: int
    n_tokens: int


@event
class SlotCleared:
    """`clearing prompt with N tokens` / `clearing slot with N tokens`: the slot holds nothing now."""

    slot: int
    n_tokens: int


@event
class SlotPurged:
    """`purging slot S with N tokens`: unified-KV pressure freed an idle slot (the retry may then succeed)."""

    slot: int
    n_tokens: int


@event
class IdleSlotSaved:
    """`saving idle slot to prompt cache`: followed by a clear of that slot."""

    slot: int


@event
class MemorySlotFailure:
    """Library warning `decode: failed to find a memory slot for batch of size N` (and older wordings)."""

    batch_size: int


@event
class KVRetry:
    """`failed to find free space in the KV cache, retrying with smaller batch size, off|i = O, n_batch = B`."""

    offset: int
    n_batch: int


@event
class DecodeFatal:
    """`Context size has been exceeded. off = 3, n_batch = 1, ret = 1` and its relatives: the batch is lost.

    `reason` is one of `context_exceeded`, `invalid_batch`, `compute_error`, `kv_cache_full` (pre-b5448).
    """

    reason: str


@event
class DecodeFailed:
    """`decode() failed: Context size has been exceeded.` (b9752+), after every in-flight slot was aborted."""

    message: str


@event
class RequestError:
    """`send_error: task id = N, error: MESSAGE`: one client request ended with a server error."""

    task: int
    reason: str


@event
class AllSlotsIdle:
    """`all slots are idle`."""


# --- context checkpoints (SWA / hybrid / recurrent models), host RAM -----------------------------


@event
class CheckpointConfig:
    """`context checkpoints enabled, max = 32, min spacing = 8192` / `context checkpoints disabled` (max 0)."""

    max_per_slot: int


@event
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


@event
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


@event
class CheckpointSuperseded:
    """`superseding context checkpoint at n_tokens = N`: replaced by the one being created at the same position."""

    slot: int
    n_tokens: int


@event
class CheckpointRestored:
    """`restored context checkpoint (pos_min = A, pos_max = B, …)` / `SWA checkpoint restore, …`."""

    slot: int


@event
class CheckpointRestoreFailed:
    """`failed to restore context checkpoint (…)`."""

    slot: int


@event
class FullReprocess:
    """`forcing full prompt re-processing due to lack of cache data`: the prompt is evaluated from scratch."""

    slot: int


# --- host-RAM prompt cache (--cache-ram, b6723+) --------------------------------------------------


@event
class PromptCacheLimit:
    """`prompt cache is enabled, size limit: N MiB` (None = `no limit`), `… is disabled` (0), `limit reduced to`."""

    limit_mib: float | None


@event
class PromptCacheState:
    """`cache state: N prompts, X MiB (limits: L MiB, …)`: printed after every cache update."""

    prompts: int
    size_mib: float
    limit_mib: float


@event
class PromptSaved:
    """`saving prompt with length L, total state size = X MiB`: the selected slot's prompt is copied to the cache."""

    length: int
    size_mib: float


@event
class PromptCacheCandidate:
    """`- prompt with length L, lcp = …, f_keep = K, f_sim = S`: one cache entry considered for loading."""

    length: int
    f_keep: str
    f_sim: str


@event
class PromptLoaded:
    """`found better prompt with f_keep = K, f_sim = S`: that entry moves from the cache into the slot."""

    f_keep: str
    f_sim: str


@event
class PromptCacheRemoved:
    """An entry left the cache: `removing obsolete cached prompt with length L`, or the oldest one made room."""

    length: int | None


@event
class SlotSelected:
    """`selected slot by LRU|LCP|id …`: the slot the next task (and prompt-cache update) is for."""

    slot: int


# --- per-request timings (one set per finished request) -------------------------------------------


@event
class PromptEvalTiming:
    """`prompt eval time = X ms / N tokens`: prompt evaluation of one request (cached tokens excluded).

    `continuation`: the line had no slot tag, so it is a continuation line of a `print_timing` entry
    (before b9230), believable only right after that entry's first line (`TimingsHead`).
    """

    ms: float
    tokens: int
    continuation: bool = field(default=False, compare=False)


@event
class GenerationTiming:
    """`eval time = X ms / N tokens`: token generation of one request (`continuation`: see `PromptEvalTiming`)."""

    ms: float
    tokens: int
    continuation: bool = field(default=False, compare=False)


@event
class TimingsHead:
    """`slot print_timing: id 0 | task 42 | ` and nothing more: the first line of a timings entry before b9230.

    Its continuation lines (`prompt eval time = …`, `eval time = …`) follow without slot tag or prefix.
    """

    slot: int
    task: int


@event
class LineFormat:
    """How the lines that follow are written (not a log line of its own): the parser emits it before an
    event whose line is written differently from the previous event's line.

    `code` is a bit set of what the line had: `LEVEL` (`I `), `TIMESTAMP` (`0.00.003.960 `), `JSONL` (a
    `--log-jsonl` object), `COLOURS` (a prefix in colour). A server start fixes its run's format; see
    `exporter.model.provenance`.
    """

    code: int

    LEVEL = 1
    TIMESTAMP = 2
    JSONL = 4
    COLOURS = 8

    def describe(self) -> str:
        """`timestamp+level`, `jsonl`, `plain`: the format in words, for messages."""
        names = ("level", "timestamp", "jsonl", "colours")
        parts = [name for bit, name in enumerate(names) if self.code >> bit & 1]
        return "+".join(reversed(parts)) if parts else "plain"


@event
class RouterMode:
    """`starting server in router mode` (b11434): this server is a router; its children follow."""


@event
class ChildSpawned:
    """Router mode (b7218+): `spawning server instance with name=NAME on port PORT`; the child's own lines
    follow in the router's log as `[PORT] line`."""

    name: str
    port: int


@event
class ChildStopping:
    """Router mode: `stopping model instance name=NAME` (an unload, or a model evicted by --models-max)."""

    name: str


@event
class ChildExited:
    """Router mode: `instance name=NAME exited with status N` (the child process ended)."""

    name: str
    status: int


@event
class CrashCause:
    """A crash's cause in ggml's words (`CUDA error: out of memory`, ggml_abort's `file:line: message` before
    abort(), see `rules`). `message`: the line, at most 300 characters, for `diagnose`; never a label."""

    cause: str
    message: str


@event
class Rejected:
    """A line that looked like a metric line but cannot be true: it is counted, never applied.

    `reason` is bounded: `malformed` (a number that cannot be read, e.g. `1.2.3` or thousands of
    digits) from the parser; the state adds `out_of_range` (a slot id, count or size that the running
    server cannot have written), `format` (a line not written the way its run writes lines) and
    `inconsistent` (a line that contradicts what the run said before; see `exporter.model.provenance`).
    """

    reason: str


#: `RequestError` reasons of a request aborted by a failed decode (its slot is cleared, its task was in flight).
FATAL_REASONS: frozenset[str] = frozenset({"context_exceeded", "invalid_batch", "compute_error"})

#: Events that do not show that a file is llama-server's log: lines other programs write too, lines that
#: could not be read, and the format of lines.
GENERIC: frozenset[type] = frozenset({ServerReady, ServerExiting, ModelLoading, Rejected, LineFormat, CrashCause})

Event: TypeAlias = (
    Rejected
    | ServerStarting
    | BuildInfo
    | Verbosity
    | ModelLoading
    | ServerReady
    | ServerExiting
    | ModelLoadFailed
    | MemoryProjection
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
    | TimingsHead
    | LineFormat
    | RouterMode
    | ChildSpawned
    | ChildStopping
    | ChildExited
    | CrashCause
)
