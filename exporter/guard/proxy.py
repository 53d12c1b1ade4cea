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
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from exporter.guard.admission import Admission, Pool, Ticket
from exporter.guard.books import GuardBooks
from exporter.guard.sizing import Plan, plan

log = logging.getLogger(__name__)

#: Headers that describe one connection, not the message (RFC 9110 7.6.1), and those aiohttp sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


@dataclass(frozen=True)
class GuardSettings:
    """The guard's flags."""

    upstream: str  # llama-server's base URL
    api_key: str | None = None  # for the guard's own sizing calls when the client sends no Authorization
    default_budget: int = 1024  # generation tokens assumed for a request that gives no limit
    max_queue: int = 64
    max_wait: float = 120.0
    max_body_bytes: int = 64 * 1024 * 1024
    connect_timeout: float = 10.0


def _end_to_end(headers: Mapping[str, str]) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in headers.items():
        if k.lower() not in _HOP_BY_HOP:
            out.add(k, v)
    return out


def error_response(status: int, message: str, error_type: str, retry_after: int | None = None) -> web.Response:
    """An error in llama-server's own JSON shape, with a one-line message."""
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    body = {"error": {"code": status, "message": message, "type": error_type}}
    return web.json_response(body, status=status, headers=headers)


class Sizer:
    """Counts a request's prompt tokens with llama-server's own tokenizer (its `/apply-template`, `/tokenize`)."""

    def __init__(self, session: aiohttp.ClientSession, upstream: str) -> None:
        self._session = session
        self._upstream = upstream

    async def _post(self, path: str, body: Any, headers: Mapping[str, str]) -> Any:
        async with self._session.post(self._upstream + path, json=body, headers=headers) as resp:
            if resp.status != 200:
                raise ValueError(f"{path} answered {resp.status}")
            return await resp.json(content_type=None)

    async def _tokens(self, text: str, headers: Mapping[str, str]) -> int:
        # add_special: the BOS the server adds to a prompt counts too (llama-server sizes prompts this way).
        out = await self._post("/tokenize", {"content": text, "add_special": True}, headers)
        tokens = out.get("tokens") if isinstance(out, dict) else None
        if not isinstance(tokens, list):
            raise ValueError("/tokenize gave no tokens")
        return len(tokens)

    async def prompt_tokens(self, p: Plan, raw: bytes, headers: Mapping[str, str]) -> int:
        """All tasks' prompt tokens together; raises ValueError (or an aiohttp error) when the server will not say."""
        if p.template:
            out = await self._post("/apply-template", json.loads(raw), headers)
            prompt = out.get("prompt") if isinstance(out, dict) else None
            if not isinstance(prompt, str):
                raise ValueError("/apply-template gave no prompt")
            return await self._tokens(prompt, headers)
        if p.count_route is not None:
            out = await self._post(p.count_route, json.loads(raw), headers)
            n = out.get("input_tokens") if isinstance(out, dict) else None
            if not isinstance(n, int):
                raise ValueError(f"{p.count_route} gave no input_tokens")
            return n
        total = sum(p.token_counts)
        for text in p.texts:
            total += await self._tokens(text, headers)
        return total


class Guard:
    """The proxy and its books. `pool()` says what the server offers now (from the exporter's state)."""

    def __init__(self, settings: GuardSettings, pool: Callable[[], Pool]) -> None:
        self.settings = settings
        self._pool_of_state = pool
        self.admission = Admission(max_queue=settings.max_queue, max_wait=settings.max_wait)
        self.books = GuardBooks()
        self._ids = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._props_window: int | None = None

    # ------------------------------------------------------------------ pool

    def pool(self) -> Pool:
        """The exporter's view of the pool; a slot window from `/props` where the log has not said it yet."""
        p = self._pool_of_state()
        if p.slot_window is None and self._props_window is not None:
            return Pool(p.capacity, self._props_window, p.unified)
        return p

    async def _learn_window(self, headers: Mapping[str, str]) -> None:
        """The slot window from `/props` (`default_generation_settings.n_ctx`), once, when the log has not given it."""
        if self._props_window is not None or self._pool_of_state().slot_window is not None:
            return
        with contextlib.suppress(aiohttp.ClientError, ValueError, asyncio.TimeoutError):
            async with self.session.get(self.settings.upstream + "/props", headers=headers) as resp:
                if resp.status == 200:
                    body = await resp.json(content_type=None)
                    n = body.get("default_generation_settings", {}).get("n_ctx") if isinstance(body, dict) else None
                    if isinstance(n, int) and n > 0:
                        self._props_window = n

    # ------------------------------------------------------------------ lifecycle

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.settings.connect_timeout),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
            )
        return self._session

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    # ------------------------------------------------------------------ requests

    def _sizing_headers(self, request: web.Request) -> dict[str, str]:
        auth = request.headers.get("Authorization")
        if auth is None and self.settings.api_key:
            auth = f"Bearer {self.settings.api_key}"
        return {"Authorization": auth} if auth else {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            limit = self.settings.max_body_bytes
            return error_response(
                413, f"request body larger than the guard's limit of {limit} bytes", "invalid_request_error"
            )
        p = plan(request.path, raw) if request.method == "POST" else None
        if p is None:
            if request.method == "POST" and request.path in _generation_paths():
                self.books.count("unsized")
            return await self._forward(request, raw)
        headers = self._sizing_headers(request)
        try:
            await self._learn_window(headers)
            prompt = await Sizer(self.session, self.settings.upstream).prompt_tokens(p, raw, headers)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
            return await self._forward(request, raw)  # the server is down: the forward says so (502)
        except (aiohttp.ClientError, ValueError):
            self.books.count("unsized")  # the server refuses to size it: it will refuse the request too, in its words
            return await self._forward(request, raw)
        budget = p.budget if p.budget is not None else self.settings.default_budget
        ticket = Ticket(
            next(self._ids), prompt=prompt, budget=budget * p.tasks, tasks=p.tasks, budget_known=p.budget is not None
        )
        decision = self.admission.offer(ticket, self.pool(), time.monotonic())
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
        try:
            return await self._forward(request, raw)
        finally:
            self._release(ticket.id)

    async def _wait(self, ticket: Ticket) -> web.Response | None:
        """Wait in the queue until admitted (None), or an error response when the wait runs out."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket.id] = fut
        start = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout=self.settings.max_wait)
        except TimeoutError:
            if not fut.done():
                self._release(ticket.id)
                self.books.count("refused")
                self.books.waited(time.monotonic() - start)
                wait = self.settings.max_wait
                return error_response(
                    503,
                    f"no room in the KV pool for this request after {wait:g} s in the guard's queue; retry later",
                    "unavailable_error",
                    retry_after=self.admission.retry_after(),
                )
        except BaseException:
            # The client went away while waiting: leave the queue (or give back a place just granted).
            self._waiters.pop(ticket.id, None)
            self.books.waited(time.monotonic() - start)
            self._release(ticket.id)
            raise
        finally:
            self._waiters.pop(ticket.id, None)
        self.books.waited(time.monotonic() - start)
        return None

    def _release(self, ticket_id: int) -> None:
        for admitted in self.admission.release(ticket_id, self.pool(), time.monotonic()):
            fut = self._waiters.get(admitted.id)
            if fut is not None and not fut.done():
                fut.set_result(None)

    async def _forward(self, request: web.Request, raw: bytes) -> web.StreamResponse:
        """Send the request upstream as it came; stream the answer back as it comes."""
        url = self.settings.upstream + str(request.rel_url)
        upstream_url = self.settings.upstream
        try:
            upstream = await self.session.request(
                request.method,
                url,
                headers=_end_to_end(request.headers),
                data=raw if raw else None,
                allow_redirects=False,
            )
        except aiohttp.ClientConnectorError as exc:
            self.books.count("failed")
            why = exc.os_error.strerror or str(exc.os_error)
            return error_response(502, f"llama-server at {upstream_url} cannot be reached: {why}", "unavailable_error")
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.books.count("failed")
            what = type(exc).__name__
            return error_response(
                502, f"llama-server at {upstream_url} failed before answering: {what}", "unavailable_error"
            )
        done = False
        try:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _HOP_BY_HOP or k.lower() == "content-length":
                    response.headers.add(k, v)
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # The answer has begun: all the client can still be told is that the connection ends here.
                self.books.count("failed")
                log.warning("guard: llama-server broke off its answer to %s: %s", request.path, type(exc).__name__)
                if request.transport is not None:
                    request.transport.close()
                return response
            await response.write_eof()
            done = True
            return response
        finally:
            if done:
                upstream.release()  # the connection is reused
            else:
                upstream.close()  # cancels the server's task: llama-server sees its connection close


def _generation_paths() -> frozenset[str]:
    from exporter.guard.sizing import GENERATION_ROUTES

    return GENERATION_ROUTES
