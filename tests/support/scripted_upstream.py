"""A scripted stand-in for llama-server's HTTP side, for the guard's in-process proxy tests.

It answers the routes the guard talks to as b11434 does in shape (`/tokenize`, `/apply-template`, the counting
routes, `/props`, `/slots`) with a tokenizer a test can reason about (one token per word, plus a BOS), and holds
each generation request until the test lets it go, so the order of events is the test's, not the clock's.
The real llama-server is tested against the guard in tests/real_server/test_guard_e2e.py; this one is for the
paths that a real server cannot be made to take on cue (a stop at a chosen moment, a connection that dies).

A generation request's body says how it is answered, in keys llama-server would ignore: `tag` names it,
`script` is `answer` (JSON), `stream` (two SSE events), `stream-hold` (one event, then the rest when the
test releases `tag + "+"`), `die` (the connection closed before any answer),
`fail` (500 in llama-server's error shape).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

GENERATION = (
    "/completion",
    "/completions",
    "/v1/completions",
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/infill",
)


def words(text: str) -> int:
    """The scripted tokenizer: one token per word, plus a BOS."""
    return len(text.split()) + 1


def _chat_text(messages: Any) -> str:
    out: list[str] = []
    for m in messages if isinstance(messages, list) else []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return " ".join(out)


@dataclass
class Call:
    """One request the upstream received."""

    method: str
    raw_path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Upstream:
    """The scripted server's state: what it received, what it holds, what the test lets go."""

    window: int = 1000
    count_routes: bool = True  # False: a build without the counting routes (404)
    slots: list[dict[str, Any]] = field(default_factory=list)
    slot_reads: int = 0  # the /slots reads answered
    #: Reads of /slots past this many wait until `release_slots` (None: none wait).
    slot_reads_allowed: int | None = None
    calls: list[Call] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    arrivals: Counter[str] = field(default_factory=Counter)
    _slots_gate: asyncio.Event = field(default_factory=asyncio.Event)
    _gates: dict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    _seen: dict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))
    _cancel_seen: dict[str, asyncio.Event] = field(default_factory=lambda: defaultdict(asyncio.Event))

    # -------------------------------------------------------------- the test's side

    def hold(self, *tags: str) -> None:
        """Generation requests with these tags wait (at each arrival) until `release`."""
        for t in tags:
            self._gates[t].clear()

    def release(self, tag: str) -> None:
        self._gates[tag].set()

    def release_slots(self) -> None:
        """Let the /slots reads held by `slot_reads_allowed` through, and every later one."""
        self.slot_reads_allowed = None
        self._slots_gate.set()

    async def arrived(self, tag: str, times: int = 1) -> None:
        """Until the request `tag` has reached the upstream `times` times."""
        while self.arrivals[tag] < times:
            self._seen[tag].clear()
            await self._seen[tag].wait()

    async def was_cancelled(self, tag: str) -> None:
        """Until the upstream has seen the connection of request `tag` close while it held it."""
        while tag not in self.cancelled:
            self._cancel_seen[tag].clear()
            await self._cancel_seen[tag].wait()

    def paths(self) -> list[str]:
        return [c.raw_path for c in self.calls]

    # -------------------------------------------------------------- the server's side

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/apply-template", self._apply_template)
        for route in ("/v1/responses/input_tokens", "/v1/chat/completions/input_tokens", "/v1/messages/count_tokens"):
            app.router.add_post(route, self._count)
        app.router.add_get("/props", self._props)
        app.router.add_get("/slots", self._slots)
        for route in GENERATION:
            app.router.add_post(route, self._generate)
        app.router.add_route("*", "/{tail:.*}", self._other)
        return app

    async def _record(self, request: web.Request) -> bytes:
        body = await request.read()
        self.calls.append(Call(request.method, request.raw_path, dict(request.headers), body))
        return body

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = json.loads(await self._record(request))
        return web.json_response({"tokens": list(range(words(body["content"])))})

    async def _apply_template(self, request: web.Request) -> web.Response:
        body = json.loads(await self._record(request))
        return web.json_response({"prompt": _chat_text(body.get("messages"))})

    async def _count(self, request: web.Request) -> web.Response:
        body = json.loads(await self._record(request))
        if not self.count_routes:
            return web.json_response({"error": {"code": 404, "message": "File Not Found"}}, status=404)
        if request.path.startswith("/v1/responses"):
            inp = body.get("input")
            text = inp if isinstance(inp, str) else _chat_text(inp)
            text = f"{body.get('instructions', '')} {text}"
        else:
            text = _chat_text(body.get("messages"))
        return web.json_response({"input_tokens": words(text)})

    async def _props(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"default_generation_settings": {"n_ctx": self.window}})

    async def _slots(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.slot_reads_allowed is not None and self.slot_reads >= self.slot_reads_allowed:
            await self._slots_gate.wait()
        self.slot_reads += 1
        return web.json_response(self.slots)

    async def _other(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        return web.json_response(
            {"path": request.raw_path, "method": request.method, "size": len(body)},
            headers={"X-Upstream": "scripted"},
        )

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        raw = await self._record(request)
        body = json.loads(raw)
        tag = body.get("tag", "")
        self.arrivals[tag] += 1
        self._seen[tag].set()
        try:
            if tag in self._gates:
                await self._gates[tag].wait()
        except asyncio.CancelledError:
            self.cancelled.append(tag)
            self._cancel_seen[tag].set()
            raise
        script = body.get("script", "answer")
        if script == "die":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if script == "fail":
            error = {"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}
            return web.json_response(error, status=500)
        if script in ("stream", "stream-hold"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"content": "a"}\n\n')
            if script == "stream-hold":  # the stream has begun; the rest waits for `release(tag + "+")`
                try:
                    await self._gates[tag + "+"].wait()
                except asyncio.CancelledError:
                    self.cancelled.append(tag)
                    self._cancel_seen[tag].set()
                    raise
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        return web.json_response({"content": "ok", "tag": tag, "n": self.arrivals[tag]})
