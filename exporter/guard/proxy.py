"""The guard's reverse proxy: every request passed on to llama-server as it came, generation requests
sized and admitted first (see `exporter.guard.admission`). I/O only; the decisions are the pure modules'.

Transparency: the method, the path and query, every end-to-end header (`Authorization` included) and
the body go upstream unchanged; the status, headers and body come back unchanged, streamed chunk by
chunk as they arrive (an SSE stream is never buffered). Only hop-by-hop headers are dropped, as any
HTTP proxy must (`exporter.guard.relay` sends and streams). Bodies are never logged.

A generation request goes through four steps, one method each: size (`_size`), decide (`_decide`, which
matches every `DecisionKind`), wait (in `_decide`, `_wait`) and send (`_send_admitted`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

from exporter.guard.accounting import Accounting
from exporter.guard.admission import Admission, Pool, RetryBudget, Ticket, assert_never
from exporter.guard.books import GuardBooks
from exporter.guard.clients import ClientNamer
from exporter.guard.health import ServerWatch
from exporter.guard.pools import OnePool, Pools
from exporter.guard.preempting import Preemption, PreemptionHost, Preemptor, Run
from exporter.guard.relay import Preempted, Relay, Unanswered
from exporter.guard.sizing import GENERATION_ROUTES, MESSAGES_ROUTES, Plan, plan, server_path
from exporter.guard.upstream import (
    ServerNotReady,
    Sizer,
    error_response,
    read_body,
    sizing_headers,
)
from exporter.model.forecast import Measured
from exporter.settings import GuardArea

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GuardSettings:
    """The guard's settings. Those its flags set have no default here: theirs is the only one, in
    `exporter.settings.GuardArea`, whose `guard_settings` builds this."""

    upstream: str  # llama-server's base URL
    api_key: str | None = None  # for the guard's own sizing calls when the client sends no Authorization
    default_budget: int  # generation tokens assumed for a request that gives no limit
    max_queue: int
    max_wait: float
    max_body_bytes: int
    body_timeout: float  # the longest pause between two bytes of a request body
    connect_timeout: float
    #: Preemption: how often `/slots` is read while requests run, and how far ahead the slots are projected.
    #: llama-server notices a closed connection only after a whole second in which no result reached its
    #: results queue (any result restarts its wait, a `/slots` read included): the guard reads `/slots`
    #: less often than that, stays silent for `quiet` seconds after a stop, and projects over all of it.
    poll_interval: float = 1.25
    quiet: float = 2.0
    horizon: float = 3.5
    #: Past this lag of its `/slots` reads the guard cannot stop a request in time (llama-server's polling
    #: second alone takes that long): unknown budgets count as whole windows until the reads are timely.
    blind_after: float = 1.0
    #: A request whose upstream died before any byte of its answer reached its client is sent again once,
    #: within a budget: `retry_floor` plus `retry_ratio` of the requests sent in the last minute.
    retry_ratio: float = 0.2
    retry_floor: int = 3
    #: False (`--guard.admission off`): every request is sent at once (no queue, no preemption); the books
    #: by client and the access log still run, to see who fills the pool before the guard holds anyone.
    admission: bool

    @classmethod
    def of(cls, area: GuardArea, upstream: str, api_key: str | None = None, **more: Any) -> GuardSettings:
        """The settings the guard's flags (`area`) give, in front of `upstream`; `more` sets the other fields."""
        names = {f.name for f in fields(cls)}
        own = {f.name: getattr(area, f.name) for f in fields(area) if f.name in names}
        own["body_timeout"] = area.head_timeout  # one flag: the head's deadline, a body's longest pause
        return cls(**{**own, "upstream": upstream, "api_key": api_key, **more})


#: How often one request is sent again after llama-server died under it.
MAX_RETRIES = 1


@dataclass
class _Guarded:
    """One generation request on its way through the guard: what it asks, and its place in the books."""

    request: web.Request
    raw: bytes  # its body
    plan: Plan
    headers: Mapping[str, str]  # for the guard's own calls about it (sizing, /props)
    ticket: Ticket
    books: Admission  # its pool's
    bound: int | None  # its prompt's byte bound (`Plan.bound`)
    on_bound: bool = False  # admitted on its prompt's byte bound: its exact size is counted while it runs
    retried: int = 0  # times sent again after llama-server died under it

    @property
    def key(self) -> str | None:
        return self.ticket.key


class Guard:
    """The proxy and its books, one `Admission` per pool (per model behind a router).

    Preemption is an object of its own, a `Preemptor` that `preemption` makes for the guard (by default the
    `/slots` loop of `exporter.guard.preempting`); the guard is its `PreemptionHost`.
    """

    def __init__(
        self,
        settings: GuardSettings,
        pools: Pools | Callable[[], Pool],
        accounting: Accounting | None = None,
        preemption: Callable[[PreemptionHost], Preemptor] | None = None,
    ) -> None:
        self.settings = settings
        self.pools: Pools = pools if not callable(pools) else OnePool(pools)
        self.admissions: dict[str | None, Admission] = {}
        self.books = GuardBooks()
        # The books by client and the access log: every count above reaches the request's client.
        self.accounting = self.books.clients = accounting or Accounting(ClientNamer())
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[bool]] = {}  # queued request → admitted (True) or expired
        self._session: aiohttp.ClientSession | None = None
        self._props_window: dict[str | None, int] = {}
        self._background: set[asyncio.Task[None]] = set()
        # Requests admitted on their prompt's byte bound, not yet counted exactly: id → what counting needs.
        self._unsized: dict[int, tuple[Ticket, Plan, bytes, Mapping[str, str]]] = {}
        self.watch = ServerWatch(lambda: self.session, settings.upstream)
        self.relay = Relay(lambda: self.session, settings.upstream, self.books, self.watch)
        self.retries = RetryBudget(settings.retry_ratio, settings.retry_floor)
        make = preemption or (lambda host: Preemption(host, settings, self.books, self.accounting))
        self.preemption = make(self)

    # ------------------------------------------------------------------ pool

    def admission(self, key: str | None) -> Admission:
        """The books and queue of one pool."""
        a = self.admissions.get(key)
        if a is None:
            a = self.admissions[key] = Admission(max_queue=self.settings.max_queue, max_wait=self.settings.max_wait)
        return a

    def measured(self, key: str | None = None) -> list[Measured]:
        """The requests in flight to one pool whose prompts were counted with the server's tokenizer (for the
        exporter's forecast: exact from their arrival on, where the log says a prompt's size much later)."""
        return [
            Measured(t.prompt, t.budget if t.budget_known else None, t.tasks)
            for t in self.admission(key).in_flight.values()
            if t.exact
        ]

    def pool(self, key: str | None = None) -> Pool:
        """The exporter's view of a pool; a slot window from `/props` where the log has not said it yet."""
        p = self.pools.pool(key)
        window = self._props_window.get(key)
        if p.slot_window is None and window is not None:
            return Pool(p.capacity, window, p.unified)
        return p

    async def _learn_window(self, key: str | None, headers: Mapping[str, str]) -> None:
        """The slot window from `/props` (`default_generation_settings.n_ctx`), once, when the log has not given it."""
        if key in self._props_window or self.pools.pool(key).slot_window is not None:
            return
        query = "" if key is None else "?" + urlencode({"model": key})
        with contextlib.suppress(aiohttp.ClientError, ValueError, asyncio.TimeoutError):
            async with self.session.get(self.settings.upstream + "/props" + query, headers=headers) as resp:
                if resp.status == 200:
                    body = await resp.json(content_type=None)
                    n = body.get("default_generation_settings", {}).get("n_ctx") if isinstance(body, dict) else None
                    if isinstance(n, int) and n > 0:
                        self._props_window[key] = n

    # ------------------------------------------------------------------ lifecycle

    @property
    def session(self) -> aiohttp.ClientSession:
        """Connections to llama-server: a new one for each request, closed when its answer has come.

        llama-server serves each connection on one of its HTTP threads (`--threads-http`, by default the
        slots + 2) for as long as the connection stays open: connections kept open for reuse would hold those
        threads idle, and a burst of requests (sizing calls included) would wait for them. A fresh connection
        costs a local TCP handshake; closing it is also how a request is cancelled (a stop, a client that left).
        """
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            )
        return self._session

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self.accounting.wrap(self.handle))
        return app

    async def close(self) -> None:
        await self.watch.close()
        await self.preemption.close()
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------ requests

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One request: passed on as it came, or, a generation request, sized, decided, waited and sent."""
        raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout)
        if isinstance(raw, web.Response):
            return raw
        # Routed as llama-server routes it: the path as sent, escapes decoded, dot segments kept.
        path = server_path(request.raw_path)
        p = plan(path, raw) if request.method == "POST" else None
        if p is None:
            if request.method == "POST" and path in GENERATION_ROUTES:
                self.books.count("unsized")
            return await self.relay.forward(request, raw)
        g = await self._ticket(request, raw, p)
        answer = await self._size(g)
        if answer is None:
            answer = await self._decide(g)
        return answer if answer is not None else await self._send_admitted(g)

    async def _ticket(self, request: web.Request, raw: bytes, p: Plan) -> _Guarded:
        """A generation request's place in the books, its prompt counted at its byte bound for now."""
        headers = sizing_headers(request.headers, self.settings.api_key)
        budget = p.budget if p.budget is not None else self.settings.default_budget
        key = self.pools.key(p.model)
        await self._learn_window(key, headers)  # at once when the log has said it (nearly always)
        bound = p.bound()
        ticket = Ticket(
            next(self._ids), prompt=bound or 0, budget=budget * p.tasks, tasks=p.tasks, copies=p.copies, key=key
        )
        ticket.budget_known = p.budget is not None
        self.accounting.bind(ticket, p.model, budget)
        return _Guarded(request, raw, p, headers, ticket, self.admission(key), bound)

    async def _size(self, g: _Guarded) -> web.StreamResponse | None:
        """Step 1, size: the prompt counted with the server's tokenizer, unless the bound will do. None: sized;
        else the answer (a 503 after waiting for the server, or the server's own, for a body it cannot size)."""
        p, ticket, key, bound = g.plan, g.ticket, g.key, g.bound
        # A request that fits even at the most tokens its text can make is admitted without waiting for the
        # tokenizer (a load that always fits never waits for it); its exact size follows while it runs.
        quick = bound is not None and (p.exact or g.books.admits_now(ticket, self.pool(key)))
        quick = quick or not self.settings.admission  # admission off: nothing waits, not even for the tokenizer
        g.on_bound = quick and not p.exact
        while not quick:
            # While llama-server restarts or loads, the request waits for it (within its queue timeout).
            refused = await self._server_back(ticket)
            if refused is not None:
                return refused
            try:
                sizer = self._sizer(key, p.model if key is not None else None)
                ticket.prompt = await sizer.prompt_tokens(p, g.raw, g.headers)
                break
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError, TimeoutError, ServerNotReady) as exc:
                self.watch.down(f"sizing a request: {type(exc).__name__}")
                if g.books.timed_out(ticket, time.monotonic()):
                    return self._not_ready(g.books)
            except (aiohttp.ClientError, ValueError):
                self.books.count("unsized")  # the server refuses to size it, and will refuse it too, in its words
                return await self.relay.forward(g.request, g.raw)
        if not quick or p.exact:
            self.books.sized(ticket.prompt)
        return None

    async def _decide(self, g: _Guarded) -> web.StreamResponse | None:
        """Steps 2 and 3, decide and wait: None once the request is admitted (at once or after its wait in the
        queue); else its answer (refused, or passed on for llama-server to refuse)."""
        ticket, key = g.ticket, g.key
        if self.settings.admission:
            decision = g.books.offer(ticket, self.pool(key), time.monotonic(), self.preemption.speed(key))
        else:
            decision = g.books.take(ticket, self.pool(key), time.monotonic())
        kind = decision.kind
        if g.on_bound and kind == "admit":
            ticket.exact = False
            self._unsized[ticket.id] = (ticket, g.plan, g.raw, g.headers)
        self.refine_if_tight(key)
        match kind:
            case "admit":
                return None
            case "forward":
                self.books.count("refused")
                return await self.relay.forward(g.request, g.raw)
            case "refuse":
                self.books.count("refused")
                log.info("guard: refused a request to %s: %s", g.request.path, decision.reason)
                return error_response(decision.status, decision.reason, decision.error_type, decision.retry_after)
            case "queue":
                self.books.count("queued")
                return await self._wait(ticket)
            case _:
                return assert_never(kind)

    async def _send_admitted(self, g: _Guarded) -> web.StreamResponse:
        """Step 4, send: the admitted request upstream, sent again when llama-server died under it, replayed
        when the guard stopped it, until it is answered; its place in the books is given back at the end."""
        self.books.count("admitted")
        ticket = g.ticket
        ticket.n_predict = g.plan.budget if g.plan.budget is not None else -1
        self.retries.sent(time.monotonic())
        try:
            while True:
                answer = await self._attempt(g)
                if answer is not None:
                    return answer
        finally:
            self.preemption.end(ticket.id)
            self._release(g.key, ticket.id)

    async def _attempt(self, g: _Guarded) -> web.StreamResponse | None:
        """One send of an admitted request: its answer, or None to send it again."""
        refused = await self._server_back(g.ticket)
        if refused is not None:
            return refused
        run = Run(g.ticket, asyncio.Event(), anthropic=g.plan.route in MESSAGES_ROUTES)
        self.preemption.start(run)
        try:
            return await self.relay.forward(g.request, g.raw, run)
        except Unanswered as gone:
            self.preemption.end(g.ticket.id)
            return self._unanswered(g, gone)
        except Preempted:
            self.preemption.end(g.ticket.id)
            return await self._replay(g)

    def _unanswered(self, g: _Guarded, gone: Unanswered) -> web.Response | None:
        """llama-server did not answer a send: None to send it again, or the answer when it may not be."""
        ticket, books = g.ticket, g.books
        self.watch.down(gone.why)
        if not gone.sent:
            # llama-server never took it: sent again once it is ready, no retry.
            return self._not_ready(books) if books.timed_out(ticket, time.monotonic()) else None
        if g.retried >= MAX_RETRIES or not self.retries.allow(time.monotonic()):
            self.books.count("failed")
            return error_response(
                502,
                f"llama-server at {self.settings.upstream} failed before answering ({gone.why}); "
                "the guard's retries are spent",
                "unavailable_error",
            )
        g.retried += 1
        books.new_wait(ticket)  # its wait for the server starts now
        self.books.count("retried")
        log.warning("guard: sending request %d again: llama-server %s", ticket.id, gone.why)
        return None

    async def _replay(self, g: _Guarded) -> web.StreamResponse | None:
        """The guard stopped the request before its client had a byte: None once it may be sent again."""
        # It has shown it generates past its budget: replayed alone in its slot's window.
        ticket = g.ticket
        pool = self.pool(g.key)
        window = pool.slot_window or pool.limit or ticket.prompt + ticket.budget
        g.books.requeue(ticket, pool, window, time.monotonic())
        refused = await self._wait(ticket)
        if refused is not None:
            return refused
        self.books.count("replayed")
        return None

    def _sizer(self, key: str | None, model: str | None) -> Sizer:
        return Sizer(self.session, self.settings.upstream, model, self.pool(key).slot_window)

    def refine_if_tight(self, key: str | None, used: int | None = None) -> None:
        """Count exactly the prompts admitted on their bound, once the exact counts can matter: the books
        (or `used`, the slots' projection) pass half the pool, or a request waits. Below that the bound
        admits the same requests, and a load that always fits pays no tokenizer call."""
        books = self.admission(key)
        limit = self.pool(key).limit
        tight = bool(books.queue) or (limit is not None and 2 * max(books.demand, used or 0) >= limit)
        if tight:
            self.refine_all(key)

    def refine_all(self, key: str | None) -> None:
        """Count exactly, in the background, every prompt of pool `key` admitted on its bound."""
        for tid in [t for t, (ticket, *_) in self._unsized.items() if ticket.key == key]:
            ticket, p, raw, headers = self._unsized.pop(tid)
            self._refine(ticket, p, raw, headers)

    def _refine(self, ticket: Ticket, p: Plan, raw: bytes, headers: Mapping[str, str]) -> None:
        """Count the prompt of a request admitted on its bound exactly, in the background (the books and
        preemption's matching of requests to slots use the exact count)."""

        async def refine() -> None:
            unsized = (aiohttp.ClientError, ValueError, asyncio.TimeoutError, TimeoutError, ServerNotReady)
            with contextlib.suppress(*unsized):
                prompt = await self._sizer(ticket.key, ticket.key).prompt_tokens(p, raw, headers)
                self.books.sized(prompt)
                books = self.admission(ticket.key)
                if ticket.id in books.in_flight:
                    for admitted in books.resize(ticket, prompt, self.pool(ticket.key), time.monotonic()):
                        self.wake(admitted)
                    self.preemption.counted(ticket.key)

        task = asyncio.create_task(refine())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _server_back(self, ticket: Ticket) -> web.Response | None:
        """Wait while llama-server is down or loading, within the request's queue timeout: None once it is
        ready, a 503 with `Retry-After` when the wait runs out."""
        if self.watch.up:
            return None
        books = self.admission(ticket.key)
        start = time.monotonic()
        self.books.server_waiting += 1
        try:
            ready = await self.watch.wait_up(books.deadline(ticket, start))
        finally:
            self.books.server_waiting -= 1
            self.books.server_waited(time.monotonic() - start)
        return None if ready else self._not_ready(books)

    def _not_ready(self, books: Admission) -> web.Response:
        """The answer to a request that waited its whole queue timeout for llama-server to be ready."""
        self.books.count("refused")
        return error_response(
            503,
            f"llama-server at {self.settings.upstream} is not ready (down or loading its model) after "
            f"{self.settings.max_wait:g} s in the guard's queue; retry later",
            "unavailable_error",
            retry_after=books.retry_after(),
        )

    def wake(self, admitted: Ticket) -> None:
        fut = self._waiters.get(admitted.id)
        if fut is not None and not fut.done():
            fut.set_result(True)

    async def _wait(self, ticket: Ticket) -> web.Response | None:
        """Wait in the queue until admitted (None), or a 503 once `Admission.expired` takes it out (its
        `deadline`, the queue's one clock, has come)."""
        books = self.admission(ticket.key)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()  # True: admitted; False: expired
        self._waiters[ticket.id] = fut
        start = time.monotonic()
        self._release(ticket.key, -1)  # admits it at once if it fits now (a replay into an emptied pool)
        try:
            while not fut.done():
                now = time.monotonic()
                await asyncio.wait((fut,), timeout=max(0.0, books.deadline(ticket, now) - now))
                if not fut.done():
                    self._expire(ticket.key)  # a timer may fire a little early: then it waits on
        except BaseException:
            # The client went away while waiting: leave the queue (or give back a place just granted).
            self._waiters.pop(ticket.id, None)
            self.books.waited(time.monotonic() - start)
            self._release(ticket.key, ticket.id)
            raise
        finally:
            self._waiters.pop(ticket.id, None)
        self.books.waited(time.monotonic() - start)
        if fut.result():
            return None
        self.books.count("refused")
        return error_response(
            503,
            f"no room in the KV pool for this request after {self.settings.max_wait:g} s in the guard's queue; "
            "retry later",
            "unavailable_error",
            retry_after=books.retry_after(),
        )

    def _expire(self, key: str | None) -> None:
        """Answer every request of pool `key` whose wait has run out (`Admission.expired`); admit what fits then."""
        for gone in self.admission(key).expired(time.monotonic()):
            fut = self._waiters.get(gone.id)
            if fut is not None and not fut.done():
                fut.set_result(False)
        self._release(key, -1)

    def _release(self, key: str | None, ticket_id: int) -> None:
        self._unsized.pop(ticket_id, None)
        for admitted in self.admission(key).release(ticket_id, self.pool(key), time.monotonic()):
            self.wake(admitted)
