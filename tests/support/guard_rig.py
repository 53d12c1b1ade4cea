"""The guard in process for the unit tests: the real assembly (`start_guard`, its server and client) in front of
the scripted upstream (`scripted_upstream.py`), and a client session to it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer
from scripted_upstream import Upstream
from yarl import URL

from exporter.guard import GuardSettings, RunningGuard, start_guard
from exporter.guard.accounting import Accounting, ClientBooks
from exporter.guard.admission import Admission, Pool
from exporter.settings import GuardArea

POOL = Pool(capacity=1000, slot_window=1000, unified=True)


@dataclass
class Rig:
    up: Upstream
    guard: RunningGuard
    url: str
    session: aiohttp.ClientSession

    @property
    def books(self) -> Admission:
        return self.guard.guard.admission(None)

    def outcomes(self) -> dict[str, int]:
        return dict(self.guard.guard.books.outcomes)

    def client(self, name: str) -> ClientBooks:
        """The books of the client `name` (by the guard's accounting)."""
        return self.guard.guard.accounting.clients[name]

    def post(self, path: str, body: dict[str, Any], **headers: str) -> asyncio.Task[tuple[int, Any, dict[str, str]]]:
        """Send a request in the background: its (status, body, headers)."""

        async def go() -> tuple[int, Any, dict[str, str]]:
            async with self.session.post(URL(self.url + path, encoded=True), json=body, headers=headers) as resp:
                text = await resp.text()
                try:
                    parsed: Any = json.loads(text)
                except ValueError:
                    parsed = text
                return resp.status, parsed, dict(resp.headers)

        return asyncio.ensure_future(go())


@asynccontextmanager
async def rig(
    pool: Pool = POOL, up: Upstream | None = None, accounting: Accounting | None = None, **settings: Any
) -> AsyncIterator[Rig]:
    """The guard with `settings` (GuardSettings' fields) in front of `up` (a scripted upstream of the pool's
    window by default), for the pool `pool`; `accounting`: the guard's books by client (the default's, else)."""
    up = up or Upstream(window=pool.slot_window or 1000)
    server = TestServer(up.app())
    await server.start_server()
    upstream = settings.pop("upstream", str(server.make_url("")).rstrip("/"))
    running = await start_guard(
        GuardSettings.of(GuardArea(), upstream, **settings), lambda: pool, "127.0.0.1", 0, accounting=accounting
    )
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
    try:
        yield Rig(up, running, f"http://127.0.0.1:{running.port}", session)
    finally:
        await session.close()
        await running.close()
        await server.close()
