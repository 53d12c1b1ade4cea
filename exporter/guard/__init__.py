"""The guard: an optional reverse proxy in front of llama-server, in the exporter's process.

Clients talk to it instead of llama-server. It passes every request on unchanged, but sizes each
generation request first (with the server's own tokenizer) and sends it only when its demand fits the
KV pool next to the requests in flight; the others wait in a bounded queue. So a shared (`-kvu`) pool
keeps its memory savings and no request is aborted because another one outgrew it.

- `admission`: the books and the queue (pure);
- `sizing`: what a request's body asks for (pure);
- `pools`: the pools it admits against (one server's, or a router's per model);
- `proxy`: the aiohttp server, a request's steps (I/O); `relay`: the aiohttp client, answers streamed back;
- `preempt`: which request to stop when the slots are about to outgrow the pool (pure); `preempting`: the
  `/slots` loop that stops it, an object the proxy is given;
- `upstream`: the headers it passes, the errors it answers with, prompts counted by the server;
- `books`: its counts and their families on `/metrics`;
- `clients`, `accounting`, `client_metrics`, `access_log`: who sent each request, the books by client and
  their families, and the access log (one JSON line per generation request, written off the request path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.guard.accounting import Accounting
from exporter.guard.admission import Pool
from exporter.guard.books import GuardCollector
from exporter.guard.pools import Pools
from exporter.guard.proxy import Guard, GuardSettings
from exporter.model.state import ServerState
from exporter.web.server import Limits, Serving, start_server

__all__ = [
    "Accounting",
    "Guard",
    "GuardCollector",
    "GuardSettings",
    "Limits",
    "Pool",
    "RunningGuard",
    "ServerPools",
    "pool_from",
    "pool_of",
    "serve_guard",
    "start_guard",
]


def pool_from(s: ServerState) -> Pool:
    """What the exporter's state says of a pool: its capacity, one slot's window, whether it is shared."""
    capacity, _ = s.pool_capacity()
    unified = s.run.kv_unified
    if unified is None and s.command_line is not None:
        unified = s.command_line.kv_unified
    return Pool(capacity=capacity, slot_window=s.run.n_ctx_slot, unified=unified)


def pool_of(state: Callable[[], ServerState]) -> Callable[[], Pool]:
    """`pool_from` of the state `state()` returns, as a function."""
    return lambda: pool_from(state())


class ServerPools:
    """The pools behind the guard: one server's, or a router's, one per model it runs.

    `children()` gives a router's children's states by model name, None when the server is no router.
    A request for a model the router has not started yet is admitted against nothing (its pool is not
    known before the child logs it); once it runs, its requests are admitted against its own pool.
    """

    def __init__(self, state: Callable[[], ServerState], children: Callable[[], Mapping[str, ServerState] | None]):
        self._state = state
        self._children = children

    def key(self, model: str | None) -> str | None:
        return model if model and self._children() is not None else None

    def pool(self, key: str | None) -> Pool:
        if key is None:
            return pool_from(self._state())
        child = (self._children() or {}).get(key)
        return pool_from(child) if child is not None else Pool(None, None, None)


@dataclass
class RunningGuard:
    """A guard that serves; `close()` stops it."""

    guard: Guard
    serving: Serving

    @property
    def port(self) -> int:
        """The port bound (differs from the flag's for port 0)."""
        return self.serving.port

    async def close(self) -> None:
        await self.serving.close()
        await self.guard.close()


async def start_guard(
    settings: GuardSettings,
    pool: Pools | Callable[[], Pool],
    host: str,
    port: int,
    limits: Limits | None = None,
    also: Sequence[tuple[str, int]] = (),
    accounting: Accounting | None = None,
) -> RunningGuard:
    """Serve the guard on host:port (and the addresses `also`) within the exporter's connection limits (a head
    deadline, a keep-alive timeout, a connection cap); raises OSError (BindError) when an address cannot be
    bound. `accounting`: how clients are named and where the access log goes (default: named by User-Agent or
    address, no access log)."""
    return await serve_guard(Guard(settings, pool, accounting), host, port, limits, also)


async def serve_guard(
    guard: Guard, host: str, port: int, limits: Limits | None = None, also: Sequence[tuple[str, int]] = ()
) -> RunningGuard:
    """Serve a built `guard` as `start_guard` does; closes it when an address cannot be bound (OSError)."""
    # Each client connection may hold one upstream: two descriptors each.
    limits = dataclasses.replace(limits or Limits(), descriptors_per_connection=2)
    try:
        # handler_cancellation: a client that goes away cancels its handler, which closes the upstream
        # connection, and llama-server cancels the task.
        serving = await start_server(guard.make_app(), host, port, limits=limits, handler_cancellation=True, also=also)
    except OSError:
        await guard.close()
        raise
    return RunningGuard(guard, serving)
