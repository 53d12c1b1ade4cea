"""The guard: an optional reverse proxy in front of llama-server, in the exporter's process.

Clients talk to it instead of llama-server. It passes every request on unchanged, but sizes each
generation request first (with the server's own tokenizer) and sends it only when its demand fits the
KV pool next to the requests in flight; the others wait in a bounded queue. So a shared (`-kvu`) pool
keeps its memory savings and no request is aborted because another one outgrew it.

- `admission`: the books and the queue (pure);
- `sizing`: what a request's body asks for (pure);
- `proxy`: the aiohttp server and client (I/O);
- `books`: its counts and their families on `/metrics`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from exporter.guard.admission import Pool
from exporter.guard.books import GuardCollector
from exporter.guard.proxy import Guard, GuardSettings
from exporter.state import ServerState

__all__ = ["Guard", "GuardCollector", "GuardSettings", "Pool", "RunningGuard", "pool_of", "start_guard"]


def pool_of(state: Callable[[], ServerState]) -> Callable[[], Pool]:
    """What the exporter's state says of the pool: its capacity, one slot's window, whether it is shared."""

    def pool() -> Pool:
        s = state()
        capacity, _ = s.pool_capacity()
        unified = s.kv_unified
        if unified is None and s.command_line is not None:
            unified = s.command_line.kv_unified
        return Pool(capacity=capacity, slot_window=s.n_ctx_slot, unified=unified)

    return pool


@dataclass
class RunningGuard:
    """A guard that serves; `close()` stops it."""

    guard: Guard
    runner: web.AppRunner
    port: int

    async def close(self) -> None:
        await self.runner.cleanup()
        await self.guard.close()


async def start_guard(settings: GuardSettings, pool: Callable[[], Pool], host: str, port: int) -> RunningGuard:
    """Serve the guard on host:port (raises OSError when the port cannot be bound)."""
    guard = Guard(settings, pool)
    # handler_cancellation: a client that goes away cancels its handler, which closes the upstream
    # connection, and llama-server cancels the task.
    runner = web.AppRunner(guard.make_app(), access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host or None, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        await guard.close()
        raise
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    return RunningGuard(guard, runner, bound)
