"""The web server's connection limits in process (the accept loop that the exporter's port and the guard's
share): the cap holds connections whose request bodies are still coming, a newcomer past it waits for one
to close, a connection just made is never closed for a newcomer that does not exist, and the address
options. Every wait is on the server's own state, never on a clock."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from exporter.web import server as web_server
from exporter.web.server import Limits, Serving, start_server

CAP = 8  # the smallest cap the server accepts


async def until(condition: Callable[[], bool], what: str, give_up: float = 60.0) -> None:
    """Let the loop run until `condition` holds; a bound against a hang, not a margin (it holds at once)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + give_up
    while not condition():
        assert loop.time() < end, f"never: {what}"
        await asyncio.sleep(0.005)


class Counted:
    """An application whose POST handler reads the whole body; it counts the requests it has seen."""

    def __init__(self) -> None:
        self.started = 0
        self.app = web.Application()
        self.app.router.add_post("/upload", self.upload)
        self.app.router.add_get("/health", self.health)

    async def upload(self, request: web.Request) -> web.Response:
        self.started += 1
        body = await request.read()
        return web.Response(text=f"{len(body)}\n")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")


@pytest.fixture
async def served() -> AsyncIterator[tuple[Counted, Serving]]:
    app = Counted()
    serving = await start_server(app.app, "127.0.0.1", 0, limits=Limits(head_timeout=600, max_connections=CAP))
    try:
        yield app, serving
    finally:
        await serving.close()


async def answer(reader: asyncio.StreamReader) -> bytes:
    return await reader.read()  # until the server closes (the requests ask it to)


async def test_a_newcomer_past_the_cap_waits_while_request_bodies_are_still_coming(
    served: tuple[Counted, Serving],
) -> None:
    app, serving = served
    clients = []
    for _ in range(CAP):  # each sends its head and 10 of its 100 body bytes, then stalls
        reader, writer = await asyncio.open_connection("127.0.0.1", serving.port)
        writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100\r\n\r\n0123456789")
        clients.append((reader, writer))
    connections = serving.connections
    await until(lambda: app.started == CAP, "every handler reading its body")
    late_reader, late_writer = await asyncio.open_connection("127.0.0.1", serving.port)
    late_writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    await until(lambda: serving.holding, "the newcomer accepted and held")
    # None of the eight was closed for it, and it has no answer.
    assert len(connections.open) == CAP and not any(c.closing for c in connections.open)
    assert not any(r.at_eof() for r, _ in clients)
    assert not late_reader.at_eof() and late_reader._buffer == b""  # type: ignore[attr-defined]
    # One of the eight leaves: the newcomer is served.
    _, leaving = clients.pop()
    leaving.close()
    assert (await answer(late_reader)).startswith(b"HTTP/1.1 200")
    # The others finish their bodies and get their answers.
    for _, writer in clients:
        writer.write(b"x" * 90)
    for reader, writer in clients:
        reply = await answer(reader)
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\n100\n"), reply
        writer.close()
    late_writer.close()


async def test_connections_at_the_cap_are_not_closed_before_a_newcomer_arrives(
    served: tuple[Counted, Serving],
) -> None:
    """Eight silent connections fill the cap: all eight stay open (room is made for a connection that has
    arrived, not ahead of one), and each request sent then is served."""
    app, serving = served
    clients = [await asyncio.open_connection("127.0.0.1", serving.port) for _ in range(CAP)]
    connections = serving.connections
    await until(lambda: len(connections.open) == CAP, "eight connections made")
    await until(lambda: serving.acceptors[0]._tasks == set(), "every accepted connection handed over")
    assert not any(c.closing for c in connections.open)
    for _, writer in clients:
        writer.write(b"POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
    for reader, writer in clients:
        assert (await answer(reader)).startswith(b"HTTP/1.1 200")
        writer.close()
    assert app.started == CAP


async def test_a_newcomer_past_the_cap_closes_the_oldest_silent_connection(served: tuple[Counted, Serving]) -> None:
    _, serving = served
    clients = [await asyncio.open_connection("127.0.0.1", serving.port) for _ in range(CAP)]
    connections = serving.connections
    await until(lambda: len(connections.open) == CAP, "eight connections made")
    oldest = next(iter(connections.open))
    reader, writer = await asyncio.open_connection("127.0.0.1", serving.port)
    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await answer(reader)).startswith(b"HTTP/1.1 200")
    assert oldest not in connections.open
    assert await clients[0][0].read() == b""  # the oldest one was closed for it
    for _, w in clients:
        w.close()
    writer.close()


def test_the_address_option_is_exclusive_where_the_system_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows has SO_EXCLUSIVEADDRUSE (its SO_REUSEADDR would let a second exporter bind a port in use);
    elsewhere SO_REUSEADDR (a restarted exporter binds at once, a second one cannot)."""
    assert not hasattr(socket, "SO_EXCLUSIVEADDRUSE")  # this is not Windows
    assert web_server.address_reuse_option() == socket.SO_REUSEADDR
    monkeypatch.setattr(socket, "SO_EXCLUSIVEADDRUSE", -5, raising=False)
    assert web_server.address_reuse_option() == -5
    options: list[tuple[int, int]] = []

    class Recording(socket.socket):
        def setsockopt(self, level: int, option: int, *value: Any) -> None:
            options.append((level, option))
            if option != -5:
                super().setsockopt(level, option, *value)

    monkeypatch.setattr(socket, "socket", Recording)
    sockets = web_server.listening_sockets("127.0.0.1", 0)
    try:
        assert (socket.SOL_SOCKET, -5) in options and (socket.SOL_SOCKET, socket.SO_REUSEADDR) not in options
    finally:
        for s in sockets:
            s.close()


async def test_a_second_server_cannot_bind_a_port_in_use(served: tuple[Counted, Serving]) -> None:
    _, serving = served
    with pytest.raises(OSError):
        await start_server(web.Application(), "127.0.0.1", serving.port)


async def test_a_burst_past_the_cap_holds_no_more_than_one_extra_connection(served: tuple[Counted, Serving]) -> None:
    """40 silent connections at once against a cap of 8: each newcomer closes the oldest silent one, and that one
    is gone before the next newcomer is taken (descriptors stay bounded by the cap, not by the burst)."""
    _, serving = served
    connections = serving.connections
    seen: list[int] = []
    room = connections.room

    def counted() -> bool:
        seen.append(len(connections.open) + connections.pending)
        return room()

    connections.room = counted  # type: ignore[method-assign]
    # Blocking connects, the loop not running: the kernel's backlog holds all 40 when the server looks.
    clients = [socket.create_connection(("127.0.0.1", serving.port)) for _ in range(40)]
    try:
        await until(lambda: len(seen) == 40, "every connection accepted")
        await until(lambda: len(connections.open) == CAP and not connections.pending, "the newest eight open")
        assert max(seen) <= CAP
    finally:
        for s in clients:
            s.close()
