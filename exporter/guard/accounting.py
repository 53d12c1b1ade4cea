"""Who fills the pool: the guard's books by client, and each request's line in the access log.

Each generation request gets a `Record` when it arrives (its client named by `ClientNamer`) that lives
in a context variable for as long as its handler runs: the guard's counts (`GuardBooks.count`, its
queue waits) reach the record of the request being handled without the proxy passing it around. The
preemption monitor matches requests to slots (`exporter.guard.preempt.match`) and tells `placed` where
each runs and how many cells it holds; a scrape sums them by client (fresher, where the exporter's own
`/slots` read of the same slot and task is newer). When the handler ends, the record's line goes to the
access log and its tokens to its client's counters.
"""

from __future__ import annotations

import contextvars
import itertools
import os
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol

from aiohttp import web

from exporter.guard.access_log import AccessLog
from exporter.guard.admission import Ticket
from exporter.guard.books import WAIT_BUCKETS
from exporter.guard.clients import ClientNamer
from exporter.guard.preempt import SlotView
from exporter.guard.sizing import GENERATION_ROUTES
from exporter.metrics.catalogue.guard import Outcome
from exporter.model.histogram import Histogram
from exporter.model.latency import DURATION_BUCKETS, TTFT_BUCKETS


class _LiveSlot(Protocol):
    """A slot as the exporter's own `/slots` read saw it (`exporter.sources.server_http.LiveSlot`)."""

    @property
    def id(self) -> int: ...
    @property
    def processing(self) -> bool | None: ...
    @property
    def tokens(self) -> int | None: ...
    @property
    def task(self) -> int | None: ...


@dataclass
class Record:
    """One generation request, from arrival to its last byte."""

    id: str
    client: str
    route: str
    started: float  # wall clock (epoch seconds)
    t0: float  # monotonic, when the guard had read its head (the handler started)
    ticket: Ticket | None = None
    model: str | None = None
    budget: int | None = None
    outcomes: list[str] = field(default_factory=list)
    wait: float = 0.0
    slot: int | None = None
    task: int | None = None
    cells: int | None = None  # cells its slot held when last seen
    generated: int = 0  # tokens it had generated when last seen
    running: bool = False  # placed in a slot now
    first_byte: float | None = None  # monotonic, just before the guard sent the head of llama-server's answer
    last_byte: float | None = None  # monotonic, just before the guard sent the answer's end


@dataclass
class ClientBooks:
    """What one client's requests did since the guard started."""

    outcomes: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    in_flight: int = 0
    waits: Histogram = field(default_factory=lambda: Histogram(WAIT_BUCKETS))  # seconds in the queue
    # Requests llama-server answered with a 2xx: seconds from arrival to the first byte sent, and to the last.
    first_bytes: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    durations: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))


_current: contextvars.ContextVar[Record | None] = contextvars.ContextVar("guard_request", default=None)


def handling(record: Record | None) -> None:
    """Make `record` the request handled in the current context (as `Accounting.wrap` does for each request)."""
    _current.set(record)


class Accounting:
    """The guard's books by client and its access log (`access_log` None: no log)."""

    def __init__(self, namer: ClientNamer, access_log: AccessLog | None = None) -> None:
        self.namer = namer
        self.access_log = access_log
        self.clients: dict[str, ClientBooks] = {}
        self.records: dict[int, Record] = {}  # ticket id → record, while its handler runs
        # Request ids unique across restarts of the exporter: this process' prefix and a counter.
        self._prefix = f"{os.getpid() & 0xFFFF:04x}{int(time.time()) & 0xFFFF:04x}"
        self._ids = itertools.count(1)

    def books(self, client: str) -> ClientBooks:
        b = self.clients.get(client)
        if b is None:
            b = self.clients[client] = ClientBooks()
        return b

    # ------------------------------------------------------------------ the handler's side

    def wrap(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """`handler` with a record for each generation request (others pass as they are)."""

        async def accounted(request: web.Request) -> web.StreamResponse:
            if request.method != "POST" or request.path not in GENERATION_ROUTES:
                return await handler(request)
            client = self.namer.name(request.headers, request.remote)
            record = Record(f"{self._prefix}-{next(self._ids)}", client, request.path, time.time(), time.monotonic())
            token = _current.set(record)
            books = self.books(client)
            books.in_flight += 1
            status: int | None = None
            try:
                response = await handler(request)
                status = response.status
                return response
            finally:
                _current.reset(token)
                books.in_flight -= 1
                self._finish(record, status)

        return accounted

    def bind(self, ticket: Ticket, model: str | None, budget: int | None) -> None:
        """The request being handled was sized: `ticket` is its place in the books."""
        record = _current.get()
        if record is not None:
            record.ticket, record.model, record.budget = ticket, model, budget
            self.records[ticket.id] = record

    def count(self, outcome: Outcome) -> None:
        """An outcome of the request being handled (from `GuardBooks.count`; none outside a handler)."""
        record = _current.get()
        if record is not None:
            self._count(record, outcome)

    def count_for(self, ticket_id: int, outcome: Outcome) -> None:
        """An outcome of a request the monitor acted on (its handler runs elsewhere)."""
        record = self.records.get(ticket_id)
        if record is not None:
            self._count(record, outcome)
            record.running = False

    def waited(self, seconds: float) -> None:
        """The request being handled left the queue after `seconds`."""
        record = _current.get()
        if record is not None:
            record.wait += seconds
            self.books(record.client).waits.observe(seconds)

    def answering(self) -> None:
        """The head of llama-server's answer to the request being handled goes to its client now (once: a
        request's answer is begun once, whatever was replayed or sent again before)."""
        record = _current.get()
        if record is not None and record.first_byte is None:
            record.first_byte = time.monotonic()

    def answered(self, status: int) -> None:
        """The end of llama-server's answer (`status`), come whole, goes to the client of the request being
        handled now: timed here, before its last byte goes, so that a scrape after the client has it shows it.

        Timed: the answers that came whole with a 2xx. The guard's refusals, the server's errors, a client gone
        and an answer broken off or stopped are counted by outcome, never timed (a fast refusal would make the
        latency look better)."""
        record = _current.get()
        if record is None or record.first_byte is None:
            return
        record.last_byte = time.monotonic()
        if 200 <= status < 300:
            b = self.books(record.client)
            b.first_bytes.observe(record.first_byte - record.t0)
            b.durations.observe(record.last_byte - record.t0)

    def _count(self, record: Record, outcome: Outcome) -> None:
        record.outcomes.append(outcome)
        self.books(record.client).outcomes[outcome] += 1

    # ------------------------------------------------------------------ the monitor's side

    def placed(self, ticket_ids: Iterable[int], matched: Mapping[int, SlotView]) -> None:
        """Where the requests `ticket_ids` run now, as one `/slots` read matched them (unmatched: not known)."""
        for tid in ticket_ids:
            record = self.records.get(tid)
            if record is None:
                continue
            slot = matched.get(tid)
            if slot is None:
                record.running = False
                continue
            record.slot, record.task, record.cells, record.running = slot.id, slot.task, slot.held, True
            if slot.prompt is not None:
                record.generated = max(record.generated, slot.held - slot.prompt)

    def known(self) -> dict[int, tuple[int, int]]:
        """Ticket id → the slot and task each running request was matched to (kept while the slot runs it)."""
        return {
            tid: (r.slot, r.task)
            for tid, r in self.records.items()
            if r.running and r.slot is not None and r.task is not None
        }

    def pool_tokens(self, live: Iterable[_LiveSlot] | None = None) -> dict[str, int]:
        """Cells each client's requests hold now: their slots' cells, from `live` (the exporter's newer read of
        `/slots`) where it shows the same slot running the same task, else as the monitor last saw them."""
        fresh = {s.id: s for s in live or () if s.processing and s.tokens is not None and s.task is not None}
        out = dict.fromkeys(self.clients, 0)
        for record in self.records.values():
            if not record.running or record.slot is None or record.cells is None:
                continue
            s = fresh.get(record.slot)
            cells = s.tokens if s is not None and s.task == record.task and s.tokens is not None else record.cells
            out[record.client] = out.get(record.client, 0) + cells
        return out

    # ------------------------------------------------------------------ the end of a request

    def _finish(self, record: Record, status: int | None) -> None:
        t = record.ticket
        if t is not None:
            self.records.pop(t.id, None)
        b = self.books(record.client)
        prompt = t.prompt if t is not None and t.exact and t.prompt else None
        if prompt is not None:
            b.prompt_tokens += prompt
        b.generated_tokens += record.generated
        if self.access_log is not None:
            self.access_log.write(line(record, status, prompt))


def line(record: Record, status: int | None, prompt: int | None) -> dict[str, Any]:
    """The access log's line for a request (status None: the client left before its answer ended)."""
    stamp = datetime.fromtimestamp(record.started, timezone.utc).isoformat(timespec="milliseconds")
    return {
        "time": stamp.replace("+00:00", "Z"),
        "id": record.id,
        "client": record.client,
        "route": record.route,
        "model": record.model,
        "prompt_tokens": prompt,
        "budget": record.budget,
        "slot": record.slot,
        "task": record.task,
        "cells": record.cells,
        "outcome": record.outcomes[-1] if record.outcomes else "gone",
        "outcomes": record.outcomes,
        "status": status,
        "queue_wait_s": round(record.wait, 6),
        "duration_s": round(time.monotonic() - record.t0, 6),
    }
