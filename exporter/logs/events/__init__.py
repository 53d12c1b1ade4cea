"""Events: what a llama-server log line means, as plain immutable values.

`logs.parse.parse_line` turns one line into at most one of these; `state.ServerState.apply` consumes
them. Field names follow llama-server's own wording. Slot ids are ints, task ids are ints (-1 = none).

One module per family: `lifecycle` (a process's start, loading, ready, exit, line format), `slot` (slots,
the pool's configuration, each task and its timings), `cache` (checkpoints and the prompt cache), `errors`
(retries, failed decodes, aborted requests, crash causes, rejected lines), `router` (a router and its
children). Everything is imported from here: `from exporter.logs import events as ev`.
"""

from __future__ import annotations

from typing import TypeAlias

from exporter.logs.event_class import carries_slot, traits
from exporter.logs.events.cache import (
    CheckpointConfig,
    CheckpointCreated,
    CheckpointRemoved,
    CheckpointRestored,
    CheckpointRestoreFailed,
    CheckpointSuperseded,
    FullReprocess,
    PromptCacheCandidate,
    PromptCacheLimit,
    PromptCacheRemoved,
    PromptCacheState,
    PromptLoaded,
    PromptSaved,
)
from exporter.logs.events.errors import (
    FATAL_REASONS,
    CrashCause,
    DecodeFailed,
    DecodeFatal,
    KVRetry,
    MemorySlotFailure,
    Rejected,
    RequestError,
)
from exporter.logs.events.lifecycle import (
    BANNERS,
    BuildInfo,
    LineFormat,
    MemoryProjection,
    ModelLoadFailed,
    ModelLoading,
    ServerExiting,
    ServerReady,
    ServerStarting,
    Verbosity,
    banner_line,
)
from exporter.logs.events.router import (
    ChildExited,
    ChildSpawned,
    ChildStopping,
    RouterMode,
)
from exporter.logs.events.slot import (
    AllSlotsIdle,
    CachedTokens,
    ContextParam,
    DraftAcceptance,
    GenerationProgress,
    GenerationStopped,
    GenerationTiming,
    IdleSlotPolicy,
    IdleSlotSaved,
    KVCacheSection,
    KVCacheSize,
    NewPrompt,
    PerSlotCap,
    PromptEvalTiming,
    PromptProgress,
    RecurrentMemory,
    SlotCleared,
    SlotCreated,
    SlotPurged,
    SlotReleased,
    SlotSelected,
    SlotsInitialized,
    TaskStarted,
    TimingsHead,
    TotalTiming,
)

__all__ = [
    "ABORT_TRAIL",
    "BANNERS",
    "DEMAND_GROWS",
    "DEMAND_SHRINKS",
    "FATAL_REASONS",
    "GENERIC",
    "KINDS",
    "PROGRESS",
    "SERIES_POINTS",
    "SLOT_KINDS",
    "TASK_LINES",
    "AllSlotsIdle",
    "BuildInfo",
    "CachedTokens",
    "CheckpointConfig",
    "CheckpointCreated",
    "CheckpointRemoved",
    "CheckpointRestoreFailed",
    "CheckpointRestored",
    "CheckpointSuperseded",
    "ChildExited",
    "ChildSpawned",
    "ChildStopping",
    "ContextParam",
    "CrashCause",
    "DecodeFailed",
    "DecodeFatal",
    "DraftAcceptance",
    "Event",
    "FullReprocess",
    "GenerationProgress",
    "GenerationStopped",
    "GenerationTiming",
    "IdleSlotPolicy",
    "IdleSlotSaved",
    "KVCacheSection",
    "KVCacheSize",
    "KVRetry",
    "LineFormat",
    "MemoryProjection",
    "MemorySlotFailure",
    "ModelLoadFailed",
    "ModelLoading",
    "NewPrompt",
    "PerSlotCap",
    "PromptCacheCandidate",
    "PromptCacheLimit",
    "PromptCacheRemoved",
    "PromptCacheState",
    "PromptEvalTiming",
    "PromptLoaded",
    "PromptProgress",
    "PromptSaved",
    "RecurrentMemory",
    "Rejected",
    "RequestError",
    "RouterMode",
    "ServerExiting",
    "ServerReady",
    "ServerStarting",
    "SlotCleared",
    "SlotCreated",
    "SlotPurged",
    "SlotReleased",
    "SlotSelected",
    "SlotsInitialized",
    "TaskStarted",
    "TimingsHead",
    "TotalTiming",
    "Verbosity",
    "banner_line",
]

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
    | TotalTiming
    | DraftAcceptance
    | GenerationStopped
    | TimingsHead
    | LineFormat
    | RouterMode
    | ChildSpawned
    | ChildStopping
    | ChildExited
    | CrashCause
)

#: Every event kind.
KINDS: frozenset[type] = frozenset(getattr(Event, "__args__", ()))

#: The sets the consumers test with `type(e) in …` (a set lookup: events are final classes), derived from
#: each kind's `TRAITS` (`exporter.logs.event_class.Traits`) and fields, never listed by hand.
SLOT_KINDS: frozenset[type] = frozenset(k for k in KINDS if carries_slot(k))
DEMAND_GROWS: frozenset[type] = frozenset(k for k in KINDS if traits(k).demand == "grows")
DEMAND_SHRINKS: frozenset[type] = frozenset(k for k in KINDS if traits(k).demand == "shrinks")
PROGRESS: frozenset[type] = frozenset(k for k in KINDS if traits(k).progress)
TASK_LINES: frozenset[type] = frozenset(k for k in KINDS if traits(k).task_line)
SERIES_POINTS: frozenset[type] = frozenset(k for k in KINDS if traits(k).series)
ABORT_TRAIL: frozenset[type] = frozenset(k for k in KINDS if traits(k).abort_trail)
