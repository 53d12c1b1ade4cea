"""Context checkpoints and the host-RAM prompt cache."""

from __future__ import annotations

from typing import TypeAlias

from exporter.logs.event_class import event


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


#: The kinds of this family (`exporter.logs.events.Event` is the union of the families').
CacheEvent: TypeAlias = (
    CheckpointConfig
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
)

__all__ = [
    "CacheEvent",
    "CheckpointConfig",
    "CheckpointCreated",
    "CheckpointRemoved",
    "CheckpointRestoreFailed",
    "CheckpointRestored",
    "CheckpointSuperseded",
    "FullReprocess",
    "PromptCacheCandidate",
    "PromptCacheLimit",
    "PromptCacheRemoved",
    "PromptCacheState",
    "PromptLoaded",
    "PromptSaved",
]
