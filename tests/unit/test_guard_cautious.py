"""The guard in process, against a scripted upstream whose `/slots` answers late: while the guard cannot see the
slots in time it admits requests without max_tokens as whole windows, and as given once its reads are timely.

The upstream is aiohttp's test server with llama-server's routes scripted (a generation that ends when the test
says so, a `/slots` that answers after `lag` seconds); the faults themselves are tested against a real
llama-server in tests/real_server/.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from exporter.guard.admission import Pool
from exporter.guard.proxy import Guard, GuardSettings
from exporter.settings import GuardArea

POOL = Pool(capacity=1000, slot_window=600, unified=True)


class Upstream:
    """llama-server's routes the guard uses, scripted."""

    def __init__(self) -> None:
        self.lag = 0.0
        self.finish = asyncio.Event()

    async def completion(self, request: web.Request) -> web.Response:
        await request.read()
        await self.finish.wait()
        return web.json_response({"content": "", "tokens_predicted": 0})

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": list(range(1 + len(body["content"])))})  # a BOS and one per byte

    async def slots(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.lag)
        return web.json_response([])

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/completion", self.completion)
        app.router.add_get("/slots", self.slots)
        app.router.add_post("/tokenize", self.tokenize)
        return app


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[Upstream, Guard, TestServer]]:
    upstream = Upstream()
    server = TestServer(upstream.app())
    await server.start_server()
    settings = GuardSettings.of(
        GuardArea(default_budget=100), str(server.make_url("")).rstrip("/"), poll_interval=0.05, blind_after=0.2
    )
    guard = Guard(settings, lambda: POOL)
    front = TestServer(guard.make_app())
    await front.start_server()
    try:
        yield upstream, guard, front
    finally:
        upstream.finish.set()
        await front.close()
        await guard.close()
        await server.close()


async def until(condition: object, what: str) -> None:
    async def poll() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(poll(), 60)
    except TimeoutError:
        raise AssertionError(f"never: {what}") from None


async def test_unknown_budgets_count_as_windows_while_the_slots_are_seen_late(
    guarded: tuple[Upstream, Guard, TestServer],
) -> None:
    upstream, guard, front = guarded
    books = guard.admission(None)
    upstream.lag = 0.5  # every read of /slots comes 0.5 s late: past blind_after
    async with aiohttp.ClientSession() as client:
        first = asyncio.ensure_future(client.post(front.make_url("/completion"), json={"prompt": "a"}))
        await until(lambda: len(books.in_flight) == 1, "the first request admitted")
        await until(lambda: books.cautious, "the guard blind")
        [ticket] = books.in_flight.values()
        assert ticket.demand == 600  # its unknown budget counts as its slot's window
        second = asyncio.ensure_future(client.post(front.make_url("/completion"), json={"prompt": "b"}))
        await until(lambda: len(books.queue) == 1, "the second request waiting")  # 600 + 600 > 1000
        upstream.lag = 0.0
        await until(lambda: not books.cautious, "the guard seeing again")
        await until(lambda: len(books.in_flight) == 2 and not books.queue, "the second request admitted")
        assert books.demand == 2 * (2 + 100)  # as given: prompts counted by the tokenizer, the default budgets
        upstream.finish.set()
        for answer in await asyncio.gather(first, second):
            assert answer.status == 200
            answer.release()
    await until(lambda: not books.in_flight, "the books empty")
