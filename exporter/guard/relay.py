"""The guard's relay: a request sent to llama-server as it came, its answer streamed back as it comes (an SSE
stream is never buffered; only hop-by-hop headers are dropped). I/O.

A request the guard admitted travels with its `Run`: the relay tells the guard when llama-server did not
answer it (`Unanswered`: it may be sent again) or when the guard stopped it before its client had a byte
(`Preempted`: it is replayed); past the first byte, a broken or stopped answer is ended as cleanly as the
client can still be told.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
from aiohttp import web
from yarl import URL

from exporter.guard.books import GuardBooks
from exporter.guard.health import ServerWatch
from exporter.guard.preempting import Run
from exporter.guard.sizing import MESSAGES_ROUTES
from exporter.guard.upstream import HOP_BY_HOP, copy_answer, end_stream, end_to_end, error_response, why_unreachable

log = logging.getLogger("exporter.guard.proxy")


class Unanswered(Exception):
    """llama-server could not take the request, or died before any byte of its answer reached the client."""

    def __init__(self, why: str, sent: bool) -> None:
        super().__init__(why)
        self.why = why
        self.sent = sent  # whether llama-server may have started on it (then a resend is a retry)


class Preempted(Exception):
    """The guard stopped this request before any byte of its answer reached the client."""


class Relay:
    """Sends requests to llama-server at `upstream` through `session()`; counts what failed in `books` and
    tells `watch` when llama-server broke off."""

    def __init__(
        self, session: Callable[[], aiohttp.ClientSession], upstream: str, books: GuardBooks, watch: ServerWatch
    ) -> None:
        self.session = session
        self.upstream = upstream
        self.books = books
        self.watch = watch

    async def _send(self, request: web.Request, raw: bytes, run: Run | None) -> aiohttp.ClientResponse:
        """The upstream request until its answer's headers arrive; `Preempted` when the guard stops it first."""
        sending = self.session().request(
            request.method,
            # The path and query byte for byte, as the client sent them: never normalised, never re-encoded.
            URL(self.upstream + request.raw_path, encoded=True),
            headers=end_to_end(request.headers),
            data=raw if raw else None,
            allow_redirects=False,
        )
        if run is None:
            return await sending
        # A task that a stop cancels (`Preemption._consider`): cancelling closes the connection, llama-server
        # sees it and cancels its task.
        task = run.sending = asyncio.ensure_future(sending)
        try:
            return await task
        except asyncio.CancelledError:
            if not run.stop.is_set() or _cancelling():
                raise  # the client went away
            log.debug("guard: closed the upstream connection of request %d", run.ticket.id)
            raise Preempted from None
        finally:
            run.sending = None

    async def forward(self, request: web.Request, raw: bytes, run: Run | None = None) -> web.StreamResponse:
        """Send the request upstream as it came; stream the answer back as it comes."""
        upstream = await self._open(request, raw, run)
        if isinstance(upstream, web.Response):
            return upstream
        done = False
        try:
            if run is not None and upstream.status == 503:
                # llama-server loading its model answers every request so, before reading it: it waits here.
                data = await upstream.read()
                if b"Loading model" in data:
                    raise Unanswered("is loading its model", sent=False)
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
                    raise Preempted  # stopped before the client got a byte: replayed
            # llama-server sends a stream's head at once and its first event after the prompt is read: the
            # head waits for that event, so that until then the client has no byte and the request can be
            # sent again (or replayed) if llama-server dies (or the guard stops it) meanwhile.
            first = await self._first_event(upstream, run) if run is not None and run.streaming else b""
            # The client's time to first byte ends here, once per request, never per chunk (with its first
            # event when a stream): stamped before the send, so that the client has no byte before it.
            self.books.answering()
            await response.prepare(request)
            done = await self._relay(request, response, upstream, first, run)
            return response
        finally:
            if done:
                upstream.release()  # the connection is reused
            else:
                upstream.close()  # cancels the server's task: llama-server sees its connection close

    async def _open(self, request: web.Request, raw: bytes, run: Run | None) -> aiohttp.ClientResponse | web.Response:
        """The upstream answer's head; a 502 when llama-server did not answer (`Unanswered` for a `run`: it is
        sent again)."""
        try:
            return await self._send(request, raw, run)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            why = f"cannot be reached: {why_unreachable(exc)}"
            if run is not None:
                raise Unanswered(why, sent=False) from None  # it never had the request: sent when it is back
            self.books.count("failed")
            return error_response(502, f"llama-server at {self.upstream} {why}", "unavailable_error")
        except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as exc:
            what = type(exc).__name__
            if run is not None:
                raise Unanswered(f"broke the connection before answering: {what}", sent=True) from None
            self.books.count("failed")
            return error_response(
                502, f"llama-server at {self.upstream} failed before answering: {what}", "unavailable_error"
            )

    async def _relay(
        self,
        request: web.Request,
        response: web.StreamResponse,
        upstream: aiohttp.ClientResponse,
        first: bytes,
        run: Run | None,
    ) -> bool:
        """Stream the answer's body to the client as it comes; True when it came whole (the connection may be
        reused), False when it was broken off, stopped, or the client left."""
        try:
            if first:
                await response.write(first)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as exc:
            await self._broken_off(request, response, run, type(exc).__name__)
            return False
        except ConnectionError:
            return False  # the client left mid-answer: closing upstream cancels the server's task
        if run is not None and run.stop.is_set() and run.streaming:
            await self._end_stopped_stream(response, run)
            return False
        self.books.answered(response.status)  # the end to end: the answer came whole, its end goes now
        await response.write_eof()
        return True

    async def _broken_off(self, request: web.Request, response: web.StreamResponse, run: Run | None, what: str) -> None:
        """llama-server's answer broke off after the client had its head: end it as cleanly as the client can
        still be told (a stream the guard stopped says so)."""
        if run is not None and run.stop.is_set():
            await self._end_stopped_stream(response, run)
            return
        self.books.count("failed")
        log.warning("guard: llama-server broke off its answer to %s: %s", request.path, what)
        self.watch.down(f"it broke off an answer: {what}")
        if response.headers.get("Content-Type", "").startswith("text/event-stream"):
            # A stream that has begun: ended with an error event and a clean end of the body.
            upstream = self.upstream
            message = f"llama-server at {upstream} broke off this stream ({what}): it stopped or restarted"
            await end_stream(response, message, request.path in MESSAGES_ROUTES)
        elif request.transport is not None:
            # A whole answer cut short: all the client can still be told is that the connection ends here.
            request.transport.close()

    async def _first_event(self, upstream: aiohttp.ClientResponse, run: Run) -> bytes:
        """The first bytes of a stream's body; `Preempted` or `Unanswered` when it ends before them."""
        try:
            first = await upstream.content.readany()
        except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as exc:
            if run.stop.is_set():
                raise Preempted from None
            raise Unanswered(f"broke off a stream before its first event: {type(exc).__name__}", sent=True) from None
        if run.stop.is_set():
            raise Preempted  # the guard closed it meanwhile: whatever came, the client has none of it
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
