"""Events: what a llama-server log line means, as plain immutable values.

`logs.parse.parse_line` turns one line into at most one of these; `state.ServerState.apply` consumes
them. Field names follow llama-server's own wording. Slot ids are ints, task ids are ints (-1 = none).

One module per family: `lifecycle` (a process's start, loading, ready, exit, line format), `slot` (slots,
the pool's configuration, each task and its timings), `cache` (checkpoints and the prompt cache), `errors`
(retries, failed decodes, aborted requests, crash causes, rejected lines), `router` (a router and its
children). Everything is imported from here: `from exporter.logs import events as ev`.

A kind is written in its family's module only: its class, its family's union and `__all__` there; this
module re-exports every family's names and makes `Event`, the union of the families, and the sets below.
"""

from __future__ import annotations

from typing import TypeAlias

from exporter.logs.event_class import carries_slot, traits
from exporter.logs.events import cache, errors, lifecycle, router, slot
from exporter.logs.events.cache import *  # noqa: F403  (each family's `__all__`)
from exporter.logs.events.cache import CacheEvent
from exporter.logs.events.errors import *  # noqa: F403
from exporter.logs.events.errors import CrashCause, ErrorEvent, Rejected
from exporter.logs.events.lifecycle import *  # noqa: F403
from exporter.logs.events.lifecycle import LifecycleEvent, LineFormat, ModelLoading, ServerExiting, ServerReady
from exporter.logs.events.router import *  # noqa: F403
from exporter.logs.events.router import RouterEvent
from exporter.logs.events.slot import *  # noqa: F403
from exporter.logs.events.slot import SlotEvent

__all__ = [
    "ABORT_TRAIL",
    "COUNTED",
    "DEMAND_GROWS",
    "DEMAND_SHRINKS",
    "GENERIC",
    "KINDS",
    "PROGRESS",
    "SERIES_POINTS",
    "SLOT_KINDS",
    "TASK_LINES",
    "Event",
]
__all__ += lifecycle.__all__
__all__ += slot.__all__
__all__ += cache.__all__
__all__ += errors.__all__
__all__ += router.__all__

#: Events that do not show that a file is llama-server's log: lines other programs write too, lines that
#: could not be read, and the format of lines.
GENERIC: frozenset[type] = frozenset({ServerReady, ServerExiting, ModelLoading, Rejected, LineFormat, CrashCause})

#: Every kind of line llama-server writes that the exporter reads: the union of the families' kinds.
Event: TypeAlias = LifecycleEvent | SlotEvent | CacheEvent | ErrorEvent | RouterEvent

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
COUNTED: frozenset[type] = frozenset(k for k in KINDS if traits(k).counted)
