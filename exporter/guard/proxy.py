"""The guard's reverse proxy: every request passed on to llama-server as it came, generation requests
sized and admitted first (see `exporter.guard.admission`). I/O only; the decisions are the pure modules'.

Transparency: the method, the path and query, every end-to-end header (`Authorization` included) and
the body go upstream unchanged; the status, headers and body come back unchanged, streamed chunk by
chunk as they arrive (an SSE stream is never buffered). Only hop-by-hop headers are dropped, as any
HTTP proxy must. Bodies are never logged.
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
from yarl import URL

from exporter.guard.accounting import Accounting
from exporter.guard.admission import Admission, Pool, RetryBudget, Speed, Ticket
from exporter.guard.books import GuardBooks
from exporter.guard.clients import ClientNamer
from exporter.guard.health import ServerWatch
from exporter.guard.pools import OnePool, Pools
from exporter.guard.preempt import LastRead, Sight
from exporter.guard.preempting import Preempting, Run
from exporter.guard.sizing import GENERATION_ROUTES, MESSAGES_ROUTES, Plan, plan, server_path
from exporter.guard.upstream import (
    HOP_BY_HOP,
    ServerNotReady,
    Sizer,
    copy_answer,
    end_stream,
    end_to_end,
    error_response,
    read_body,
    sizing_headers,
    why_unreachable,
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


class _Unanswered(Exception):
    """llama-server could not take the request, or died before any byte of its answer reached the client."""

    def __init__(self, why: str, sent: bool) -> None:
        super().__init__(why)
        self.why = why
        self.sent = sent  # whether llama-server may have started on it (then a resend is a retry)


class _Preempted(Exception):
    """The guard stopped this request before any byte of its answer reached the client."""


class Guard(Preempting):
    """The proxy and its books, one `Admission` per pool (per model behind a router)."""

    def __init__(
        self, settings: GuardSettings, pools: Pools | Callable[[], Pool], accounting: Accounting | None = None
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
        self._runs: dict[int, Run] = {}
        # No second stop until the first one has taken effect (llama-server's polling second, then a batch).
        self._quiet_until = 0.0
        self._speeds: dict[str | None, dict[int, LastRead]] = {}
        self._monitor: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        # Requests admitted on their prompt's byte bound, not yet counted exactly: id → what counting needs.
        self._unsized: dict[int, tuple[Ticket, Plan, bytes, Mapping[str, str]]] = {}
        self._pending: dict[str | None, tuple[int, float]] = {}  # pool → (slots running, when) at its last stop
        self._slots_refused = False  # said once: /slots wants a key the guard does not have
        self.watch = ServerWatch(lambda: self.session, settings.upstream)
        self.retries = RetryBudget(settings.retry_ratio, settings.retry_floor)
        self.sight = Sight(settings.horizon, settings.blind_after)
        self._speed: dict[str | None, Speed] = {}  # pool → how fast its requests generate, last measured

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
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------ requests

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout)
        if isinstance(body, web.Response):
            return body
        raw = body
        # Routed as llama-server routes it: the path as sent, escapes decoded, dot segments kept.
        path = server_path(request.raw_path)
        p = plan(path, raw) if request.method == "POST" else None
        if p is None:
            if request.method == "POST" and path in GENERATION_ROUTES:
                self.books.count("unsized")
            return await self._forward(request, raw)
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
        books = self.admission(key)
        # A request that fits even at the most tokens its text can make is admitted without waiting for the
        # tokenizer (a load that always fits never waits for it); its exact size follows while it runs.
        quick = bound is not None and (p.exact or books.admits_now(ticket, self.pool(key)))
        quick = quick or not self.settings.admission  # admission off: nothing waits, not even for the tokenizer
        while not quick:
            # While llama-server restarts or loads, the request waits for it (within its queue timeout).
            refused = await self._server_back(ticket)
            if refused is not None:
                return refused
            try:
                ticket.prompt = await self._sizer(key, p.model if key is not None else None).prompt_tokens(
                    p, raw, headers
                )
                break
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError, TimeoutError, ServerNotReady) as exc:
                self.watch.down(f"sizing a request: {type(exc).__name__}")
                if books.timed_out(ticket, time.monotonic()):
                    return self._not_ready(books)
            except (aiohttp.ClientError, ValueError):
                self.books.count("unsized")  # the server refuses to size it, and will refuse it too, in its words
                return await self._forward(request, raw)
        if not quick or p.exact:
            self.books.sized(ticket.prompt)
        if self.settings.admission:
            decision = books.offer(ticket, self.pool(key), time.monotonic(), self._speed.get(key))
        else:
            decision = books.take(ticket, self.pool(key), time.monotonic())
        if quick and not p.exact and decision.kind == "admit":
            ticket.exact = False
            self._unsized[ticket.id] = (ticket, p, raw, headers)
        self._refine_if_tight(key)
        if decision.kind == "forward":
            self.books.count("refused")
            return await self._forward(request, raw)
        if decision.kind == "refuse":
            self.books.count("refused")
            log.info("guard: refused a request to %s: %s", request.path, decision.reason)
            return error_response(decision.status, decision.reason, decision.error_type, decision.retry_after)
        if decision.kind == "queue":
            self.books.count("queued")
            refused = await self._wait(ticket)
            if refused is not None:
                return refused
        self.books.count("admitted")
        ticket.n_predict = p.budget if p.budget is not None else -1
        self.retries.sent(time.monotonic())
        retried = 0
        try:
            while True:
                refused = await self._server_back(ticket)
                if refused is not None:
                    return refused
                run = Run(ticket, asyncio.Event(), anthropic=p.route in MESSAGES_ROUTES)
                self._runs[ticket.id] = run
                self._ensure_monitor()
                try:
                    return await self._forward(request, raw, run)
                except _Unanswered as gone:
                    self._runs.pop(ticket.id, None)
                    self.watch.down(gone.why)
                    if not gone.sent:
                        # llama-server never took it: sent again once it is ready, no retry.
                        if books.timed_out(ticket, time.monotonic()):
                            return self._not_ready(books)
                        continue
                    if retried >= MAX_RETRIES or not self.retries.allow(time.monotonic()):
                        self.books.count("failed")
                        return error_response(
                            502,
                            f"llama-server at {self.settings.upstream} failed before answering ({gone.why}); "
                            "the guard's retries are spent",
                            "unavailable_error",
                        )
                    retried += 1
                    books.new_wait(ticket)  # its wait for the server starts now
                    self.books.count("retried")
                    log.warning("guard: sending request %d again: llama-server %s", ticket.id, gone.why)
                except _Preempted:
                    self._runs.pop(ticket.id, None)
                    # It has shown it generates past its budget: replayed alone in its slot's window.
                    pool = self.pool(key)
                    window = pool.slot_window or pool.limit or ticket.prompt + ticket.budget
                    books.requeue(ticket, pool, window, time.monotonic())
                    refused = await self._wait(ticket)
                    if refused is not None:
                        return refused
                    self.books.count("replayed")
        finally:
            self._runs.pop(ticket.id, None)
            self._release(key, ticket.id)

    def _sizer(self, key: str | None, model: str | None) -> Sizer:
        return Sizer(self.session, self.settings.upstream, model, self.pool(key).slot_window)

    def _refine_if_tight(self, key: str | None, used: int | None = None) -> None:
        """Count exactly the prompts admitted on their bound, once the exact counts can matter: the books
        (or `used`, the slots' projection) pass half the pool, or a request waits. Below that the bound
        admits the same requests, and a load that always fits pays no tokenizer call."""
        books = self.admission(key)
        limit = self.pool(key).limit
        tight = bool(books.queue) or (limit is not None and 2 * max(books.demand, used or 0) >= limit)
        if tight:
            self._refine_all(key)

    def _refine_all(self, key: str | None) -> None:
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
                        self._wake(admitted)

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

    def _wake(self, admitted: Ticket) -> None:
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
            self._wake(admitted)

    async def _send(self, request: web.Request, raw: bytes, run: Run | None) -> aiohttp.ClientResponse:
        """The upstream request until its answer's headers arrive; `_Preempted` when the guard stops it first."""
        sending = self.session.request(
            request.method,
            # The path and query byte for byte, as the client sent them: never normalised, never re-encoded.
            URL(self.settings.upstream + request.raw_path, encoded=True),
            headers=end_to_end(request.headers),
            data=raw if raw else None,
            allow_redirects=False,
        )
        if run is None:
            return await sending
        # A task that a stop cancels (`_consider`): cancelling closes the connection, llama-server sees it and
        # cancels its task.
        task = run.sending = asyncio.ensure_future(sending)
        try:
            return await task
        except asyncio.CancelledError:
            if not run.stop.is_set() or _cancelling():
                raise  # the client went away
            log.debug("guard: closed the upstream connection of request %d", run.ticket.id)
            raise _Preempted from None
        finally:
            run.sending = None

    async def _forward(self, request: web.Request, raw: bytes, run: Run | None = None) -> web.StreamResponse:
        """Send the request upstream as it came; stream the answer back as it comes."""
        upstream_url = self.settings.upstream
        try:
            upstream = await self._send(request, raw, run)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            why = f"cannot be reached: {why_unreachable(exc)}"
            if run is not None:
                raise _Unanswered(why, sent=False) from None  # it never had the request: sent when it is back
            self.books.count("failed")
            return error_response(502, f"llama-server at {upstream_url} {why}", "unavailable_error")
        except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as exc:
            what = type(exc).__name__
            if run is not None:
                raise _Unanswered(f"broke the connection before answering: {what}", sent=True) from None
            self.books.count("failed")
            return error_response(
                502, f"llama-server at {upstream_url} failed before answering: {what}", "unavailable_error"
            )
        done = False
        try:
            if run is not None and upstream.status == 503:
                # llama-server loading its model answers every request so, before reading it: it waits here.
                data = await upstream.read()
                if b"Loading model" in data:
                    raise _Unanswered("is loading its model", sent=False)
                return copy_answer(upstream, data)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in HOP_BY_HOP or k.lower() == "content-length":
                    response.headers.add(k, v)
            if run is not None:
                # A complete answer (not a stream) is never stopped: it has already been generated.
                run.streaming = upstream.headers.get("Content-Type", "").startswith("text/event-stream")
                run.upstream = upstream
                if run.stop.is_set() and run.streaming:
                    raise _Preempted  # stopped before the client got a byte: replayed
            # llama-server sends a stream's head at once and its first event after the prompt is read: the
            # head waits for that event, so that until then the client has no byte and the request can be
            # sent again (or replayed) if llama-server dies (or the guard stops it) meanwhile.
            first = await self._first_event(upstream, run) if run is not None and run.streaming else b""
            await response.prepare(request)
            try:
                if first:
                    await response.write(first)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as exc:
                if run is not None and run.stop.is_set():
                    await self._end_stopped_stream(response, run)
                    return response
                self.books.count("failed")
                what = type(exc).__name__
                log.warning("guard: llama-server broke off its answer to %s: %s", request.path, what)
                self.watch.down(f"it broke off an answer: {what}")
                if response.headers.get("Content-Type", "").startswith("text/event-stream"):
                    # A stream that has begun: ended with an error event and a clean end of the body.
                    message = f"llama-server at {upstream_url} broke off this stream ({what}): it stopped or restarted"
                    await end_stream(response, message, request.path in MESSAGES_ROUTES)
                elif request.transport is not None:
                    # A whole answer cut short: all the client can still be told is that the connection ends here.
                    request.transport.close()
                return response
            except ConnectionError:
                return response  # the client left mid-answer: closing upstream (below) cancels the server's task
            if run is not None and run.stop.is_set() and run.streaming:
                await self._end_stopped_stream(response, run)
                return response
            await response.write_eof()
            done = True
            return response
        finally:
            if done:
                upstream.release()  # the connection is reused
            else:
                upstream.close()  # cancels the server's task: llama-server sees its connection close

    async def _first_event(self, upstream: aiohttp.ClientResponse, run: Run) -> bytes:
        """The first bytes of a stream's body; `_Preempted` or `_Unanswered` when it ends before them."""
        try:
            first = await upstream.content.readany()
        except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as exc:
            if run.stop.is_set():
                raise _Preempted from None
            raise _Unanswered(f"broke off a stream before its first event: {type(exc).__name__}", sent=True) from None
        if run.stop.is_set():
            raise _Preempted  # the guard closed it meanwhile: whatever came, the client has none of it
        return first

    async def _end_stopped_stream(self, response: web.StreamResponse, run: Run) -> None:
        """End a stream the guard stopped with an error event, in llama-server's own form, that says why."""
        message = (
            "stopped by the guard so that the other requests could finish: the KV pool was about to "
            "overflow; send it again, or with a smaller max_tokens"
        )
        await end_stream(response, message, run.anthropic)


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (Python 3.11+ can tell; 3.10 cannot: False)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return bool(cancelling()) if cancelling is not None else False
