"""What one server unit renders at one scrape: its log state merged with what the live sources read, as one
immutable `ServerView`. Pure: the view is made once before each scrape (`exporter.unit`), and every collector
of the unit renders that same view.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from exporter.model.bounds import MIB
from exporter.model.forecast import Measured
from exporter.model.incidents import Incident
from exporter.model.live import HttpSnapshot, NvmlSnapshot, ProcSnapshot
from exporter.model.router import RouterLog
from exporter.model.slot import SlotState
from exporter.model.state import ServerState


@dataclass(frozen=True)
class SourceReading:
    """One live source's health at the scrape: up, the last read's duration, failed reads, the last error."""

    up: bool
    duration_seconds: float | None = None
    failures: int = 0
    error: str | None = None


@dataclass(frozen=True)
class ServerView:
    """One unit (a server, or a router child) at one scrape.

    `state` is the log's state with `/slots`, `/props` and the command line merged in (`merge_view`: a copy
    made for this view; the log's state is untouched). The snapshots are the live sources' last reads (`nvml`
    may be another unit's: NVML is read once for all); `requests_deferred` is llama-server's own queue
    (`/metrics`), `requests_guard_queued` the guard's in front of it, `measured` the requests in flight whose
    prompts the guard counted; `router` the router's children, for a router's own unit; `active_tokens` the
    cells of the slots processing or idle for less than `active_window` seconds since their last turn.
    """

    state: ServerState
    nvml: NvmlSnapshot | None = None
    proc: ProcSnapshot | None = None
    http: HttpSnapshot | None = None
    requests_guard_queued: int | None = None
    measured: Sequence[Measured] = ()
    sources: Mapping[str, SourceReading] = field(default_factory=dict)  # by source: "http", "nvml", "proc"
    # Reads whose value of llama-server's /metrics was not understood, by metric (a fixed set): left out alone.
    http_rejected: Mapping[str, int] = field(default_factory=dict)
    router: RouterLog | None = None
    # Cells of the conversations in flight or coming back (`exporter.model.activity`), and its window in seconds.
    active_tokens: int | None = None
    active_window: float | None = None
    # The last incidents at this scrape (the state's record changes as lines come: a copy), oldest first.
    incidents: tuple[Incident, ...] = ()

    @property
    def pid(self) -> int | None:
        """llama-server's pid, from the process source's last read."""
        p = self.proc.process if self.proc is not None else None
        return p.pid if p is not None else None

    @property
    def requests_deferred(self) -> int | None:
        """llama-server's own queue (`/metrics`), while its endpoints answer."""
        return self.http.deferred if self.http is not None and self.http.up else None

    @property
    def slot_tokens_source(self) -> str:
        """`slots_endpoint` when `/slots` gave every slot's tokens in the last read, else `log`
        (one of model.live.SLOT_TOKEN_SOURCES)."""
        return "slots_endpoint" if self.http is not None and self.http.slot_tokens_live else "log"

    @property
    def verbosity(self) -> int | None:
        """llama-server's log verbosity: from its log, else its command line."""
        return effective_verbosity(self.state)


def effective_verbosity(state: ServerState) -> int | None:
    """llama-server's log verbosity: from the log, else from its command line (llama-server's default is 3)."""
    if state.run.verbosity is not None:
        return state.run.verbosity
    cfg = state.command_line
    if cfg is None:
        return None
    return cfg.verbosity if cfg.verbosity is not None else 3


_ATTRIBUTES: dict[type, tuple[str, ...]] = {}


def _attributes(cls: type) -> tuple[str, ...]:
    """The attributes an instance of `cls` gets from its constructor (read once, from a throwaway one)."""
    names = _ATTRIBUTES.get(cls)
    if names is None:
        names = _ATTRIBUTES[cls] = tuple(vars(cls()))
    return names


_T = TypeVar("_T")


def _shallow_copy(obj: _T) -> _T:
    """`copy.copy(obj)` without reading `obj.__dict__`: on CPython 3.11 that read turns the object's inline
    attribute values into a dict for good, and every later attribute access on it (the state's and the
    run's, on every log line) takes the slower generic path: about 3.5 % more instructions a line."""
    cls = type(obj)
    new = cls.__new__(cls)
    for name in _attributes(cls):
        object.__setattr__(new, name, getattr(obj, name))
    return new


def merge_view(state: ServerState, http: HttpSnapshot | None) -> ServerState:
    """A shallow copy of `state` with `/slots` and `/props` (and the command line) filling in. Pure.

    - `/slots` with `n_prompt_tokens` (b9276+) replaces each slot's token estimate, and its
      `is_processing` replaces the log's processing flag; the slot count becomes the live one.
    - Configuration the log did not give (default verbosity hides most of it) is taken from
      `/props` first, then from llama-server's command line.
    """
    view = _shallow_copy(state)
    view.run = run = _shallow_copy(state.run)  # the view fills in its own run, never the state's
    cfg = state.command_line
    live = http.slots if http is not None and http.up else None
    if live:
        slots: dict[int, SlotState] = {}
        for ls in live:
            s = state.run.slots.get(ls.id) or SlotState(n_ctx=state.run.n_ctx_slot)
            slots[ls.id] = dataclasses.replace(
                s,
                tokens=s.tokens if ls.tokens is None else ls.tokens,
                processing=s.processing if ls.processing is None else ls.processing,
                n_ctx=ls.n_ctx if ls.n_ctx is not None else s.n_ctx,
                generation_budget=ls.generation_budget,
                prompt_size=(ls.n_cached and s.size_with_cache(ls.n_cached)) or s.prompt_size,
            )
        run.slots = slots
        run.n_slots = max(ls.id for ls in live) + 1
    props = http if http is not None and http.up else None
    if run.build is None and props is not None:
        run.build = props.build
    if run.model is None and props is not None:
        run.model = props.model
    if run.n_slots is None:
        run.n_slots = (props.total_slots if props else None) or (cfg.slot_count() if cfg else None)
    if run.n_ctx_slot is None:
        run.n_ctx_slot = (props.n_ctx_slot if props else None) or (cfg.slot_context() if cfg else None)
    if cfg is not None:
        if run.kv_unified is None:
            run.kv_unified = cfg.unified()
        if run.type_k is None:
            run.type_k = cfg.type_k or "f16"  # llama-server's default cache type
        if run.type_v is None:
            run.type_v = cfg.type_v or "f16"
        if run.verbosity is None and cfg.verbosity is not None:
            run.verbosity = cfg.verbosity
        if run.checkpoint_limit is None and cfg.ctx_checkpoints is not None:
            run.checkpoint_limit = cfg.ctx_checkpoints
        if run.prompt_cache_limit_bytes is None and cfg.cache_ram_mib is not None:
            mib = cfg.cache_ram_mib
            run.prompt_cache_limit_bytes = float("inf") if mib < 0 else mib * MIB
    return view
