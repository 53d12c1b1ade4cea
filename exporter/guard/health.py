"""Whether llama-server can take requests now: the guard's view of a restart (I/O).

When a request finds llama-server unreachable (its connection refused, or broken before any answer) or
loading its model (`503 Loading model`), the guard marks it down and reads `/health` (public, even with
`--api-key`) a few times a second until it answers 200 again. Requests wait for that (within their queue
timeout) instead of hearing of the restart, then go in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import aiohttp

log = logging.getLogger(__name__)


class ServerWatch:
    """Up or down, as the requests found llama-server; `wait_up` waits for it to come back."""

    def __init__(self, session: Callable[[], aiohttp.ClientSession], upstream: str, interval: float = 0.25) -> None:
        self._session = session
        self._upstream = upstream
        self._interval = interval
        self._up = asyncio.Event()
        self._up.set()
        self._poll: asyncio.Task[None] | None = None
        self._since = 0.0

    @property
    def up(self) -> bool:
        return self._up.is_set()

    def down(self, why: str) -> None:
        """A request found llama-server unreachable or loading: wait for `/health` before sending more."""
        if not self._up.is_set():
            return
        self._up.clear()
        self._since = time.monotonic()
        log.warning("guard: llama-server is not ready (%s); requests wait until its /health answers 200", why)
        self._poll = asyncio.create_task(self._poll_health(), name="guard health")

    async def wait_up(self, deadline: float) -> bool:
        """Wait until llama-server is up again, at most until `deadline` (monotonic); whether it is."""
        if self._up.is_set():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
            await asyncio.wait_for(self._up.wait(), left)
        return self._up.is_set()

    async def _poll_health(self) -> None:
        timeout = aiohttp.ClientTimeout(total=5.0)
        while True:
            # First a pause: what found it not ready a moment ago is not sent again at once.
            await asyncio.sleep(self._interval)
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError):
                async with self._session().get(self._upstream + "/health", timeout=timeout) as resp:
                    await resp.read()
                    if resp.status == 200:
                        log.warning(
                            "guard: llama-server is ready again after %.1f s; the waiting requests go in",
                            time.monotonic() - self._since,
                        )
                        self._up.set()
                        return

    async def close(self) -> None:
        if self._poll is not None:
            self._poll.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll
