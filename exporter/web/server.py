"""aiohttp server: `/metrics`, a landing page at `/`, and `/healthz` for the sidecar's own probes.

With `--web.config.file` (see `exporter.web.webconfig`) it speaks TLS, asks for basic auth on every page
but `/healthz` (which then says only up or down, and why in words, to a caller without credentials),
and adds the configured headers. Connections are held to limits that aiohttp lacks: a request head
must arrive within `head_timeout` of the connection or of its first byte, an idle keep-alive
connection is closed after `keepalive_timeout`, and at most `max_connections` are open (the oldest
one still waiting for its request head makes room for a new one). A malformed request gets its 400
and one log line at most every minute for all of them, not a traceback each. `start_server` serves
any aiohttp application so: the exporter's own pages, and the guard's proxy (which takes request
bodies and holds a connection for as long as its answer streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html
import json
import logging
import math
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from exporter import __version__
from exporter.web import exposition

if TYPE_CHECKING:
    from exporter.web.webconfig import WebConfigWatcher

BeforeScrape = Callable[[], Awaitable[None]]
#: The status document of now (`exporter.statuses.StatusSource.document`); its argument: whether the caller
#: may see paths and error texts (basic auth passed, or none configured).
StatusDocument = Callable[[bool], Awaitable[dict[str, object]]]


@dataclass(frozen=True)
class StatusPages:
    """`/` and `/api/status`: the document, the page made of it, and the page's Content-Security-Policy."""

    document: StatusDocument
    render: Callable[[dict[str, object]], str]
    csp: str


log = logging.getLogger(__name__)

_LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>llamacpp-exporter</title></head>
<body>
<h1>llamacpp-exporter {version}</h1>
<p>Prometheus exporter for llama.cpp's llama-server: slots, shared KV pool, retry cascades.</p>
{mode}<ul><li><a href="metrics">/metrics</a></li><li><a href="healthz">/healthz</a></li></ul>
</body></html>
"""
_AUTHORIZED = "llamacpp_exporter.authorized"  # request key: did the request carry valid credentials


@dataclass(frozen=True)
class Limits:
    """Connection limits (seconds, count)."""

    head_timeout: float = 10.0
    keepalive_timeout: float = 75.0
    max_connections: int = 256
    #: File descriptors each connection may take: 2 for a proxy, which opens one upstream per client.
    descriptors_per_connection: int = 1


def make_app(
    registry: CollectorRegistry,
    *,
    log_description: str,
    health: Callable[[], dict[str, object]],
    before_scrape: BeforeScrape | None = None,
    security: WebConfigWatcher | None = None,
    demo: bool = False,
    status: StatusPages | None = None,
) -> web.Application:
    """Build the application. `before_scrape` runs live reads (HTTP, NVML) before the registry is rendered;
    `status` makes `/` the status page and adds `/api/status` (else `/` is a page of links).

    `health()` gives {"status": "ok"|…, "summary": words without paths or secrets, …details}; a caller
    without credentials (where basic auth is configured) gets status and summary only.
    """

    async def metrics(request: web.Request) -> web.Response:
        if before_scrape is not None:
            await before_scrape()
        encoder, content_type = exposition.choose(request.headers.get("Accept", ""))
        body = encoder(registry)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = content_type
        return resp

    async def landing(request: web.Request) -> web.Response:
        mode = "<p><strong>Demo mode</strong>: replaying two recorded llama-server logs.</p>\n" if demo else ""
        if request.get(_AUTHORIZED, True) and not demo:
            mode = f"<p>Log: <code>{html.escape(log_description)}</code></p>\n"
        page = _LANDING.format(version=html.escape(__version__), mode=mode)
        return web.Response(text=page, content_type="text/html")

    async def status_page(request: web.Request) -> web.Response:
        assert status is not None
        doc = await status.document(request.get(_AUTHORIZED, True))
        resp = web.Response(text=status.render(doc), content_type="text/html")
        resp.headers["Content-Security-Policy"] = status.csp
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["Cache-Control"] = "no-store"
        return resp

    async def status_json(request: web.Request) -> web.Response:
        assert status is not None
        doc = await status.document(request.get(_AUTHORIZED, True))
        resp = web.Response(text=json.dumps(doc, allow_nan=False), content_type="application/json")
        resp.headers["Content-Security-Policy"] = "default-src 'none'; frame-ancestors 'none'"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Cache-Control"] = "no-store"
        return resp

    async def healthz(request: web.Request) -> web.Response:
        body = health()
        status = 200 if body.get("status") == "ok" else 503
        if not request.get(_AUTHORIZED, True):
            body = {"status": body.get("status"), "summary": body.get("summary")}
        return web.Response(text=json.dumps(body), content_type="application/json", status=status)

    app = web.Application(middlewares=[_security_middleware(security)] if security is not None else [])
    if status is not None:
        app.router.add_get("/", status_page)
        app.router.add_get("/api/status", status_json)
    else:
        app.router.add_get("/", landing)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    return app


def _security_middleware(security: WebConfigWatcher) -> Any:
    """Basic auth (all but `/healthz`, which answers in short without it) and the configured headers."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
        config = security.config
        authorized = True
        if config.users:
            authorized = await security.check_basic_auth(request.headers.get("Authorization", ""))
            if not authorized and request.path != "/healthz":
                resp: web.StreamResponse = web.Response(
                    status=401, text="Unauthorized\n", headers={"WWW-Authenticate": 'Basic realm="llamacpp-exporter"'}
                )
                resp.headers.update(config.headers)
                return resp
        request[_AUTHORIZED] = authorized
        resp = await handler(request)
        resp.headers.update(config.headers)
        return resp

    return middleware


class _Connections:
    """The open connections (and the accepted ones still in their TLS handshake), for `Limits`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: dict[_GuardedProtocol, None] = {}  # in order of opening
        self.by_inner: dict[asyncio.Protocol, _GuardedProtocol] = {}  # aiohttp's protocol → ours
        self.pending = 0  # accepted, not yet handed to a protocol
        self.on_close: Callable[[], None] = lambda: None

    def room(self) -> bool:
        """Whether one more connection may be accepted; makes room by closing the oldest one still
        waiting for its request head if there is none."""
        if len(self.open) + self.pending < self.limits.max_connections:
            return True
        waiting = next((c for c in self.open if c.waiting_for_head and not c.closing), None)
        if waiting is None:
            return False
        waiting.close("too many connections: the oldest one without a request makes room")
        return True

    def closed(self, conn: _GuardedProtocol) -> None:
        self.open.pop(conn, None)
        self.by_inner.pop(conn.inner, None)
        self.on_close()

    def middleware(self) -> Any:
        """Tells each connection when its request's handler has ended (see `_GuardedProtocol.in_request`)."""

        @web.middleware
        async def request_done(
            request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
        ) -> web.StreamResponse:
            try:
                return await handler(request)
            finally:
                conn = self.by_inner.get(request.protocol)
                if conn is not None:
                    conn.in_request = False

        return request_done


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, with a deadline for each request head.

    From a head's end until its handler has ended (`in_request`), what arrives is the request's body (or a
    pipelined request, which aiohttp holds): no deadline then, however long the answer takes. A pipelined
    head left unfinished is closed by aiohttp's keep-alive timeout.
    """

    def __init__(self, inner: asyncio.Protocol, connections: _Connections) -> None:
        self.inner, self.connections = inner, connections
        self.transport: asyncio.Transport | None = None
        self.closing = False
        self.waiting_for_head = True
        self.in_request = False
        self.made = False  # connection_made has run: it counts as open, no longer as pending
        self._deadline: asyncio.TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        # `_Acceptor` accepted it only where there was room; from pending to open, never counted twice (a
        # connection counted twice would make `room()` close a newer one that has not sent its head yet).
        self.made = True
        self.connections.pending -= 1
        self.connections.open[self] = None
        self.connections.by_inner[self.inner] = self
        self._arm()
        self.inner.connection_made(transport)

    def _arm(self) -> None:
        self.waiting_for_head = True
        if self._deadline is None:
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(self.connections.limits.head_timeout, self.close, "request head too slow")

    def data_received(self, data: bytes) -> None:
        if self.in_request:  # its body, or a pipelined request
            self.inner.data_received(data)
            return
        seen = self._tail + data
        end = seen.find(b"\r\n\r\n")
        if end >= 0:  # a request head is complete; what follows is its body (or the next request)
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            self.waiting_for_head = False
            self.in_request = True
            self._tail = b""
        else:
            if not self.waiting_for_head:
                self._arm()  # the first bytes of the next request head (or a body nobody read)
            self._tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.connections.closed(self)
        self.inner.connection_lost(exc)

    def close(self, why: str) -> None:
        log.debug("closing a connection: %s", why)
        self.closing = True
        if self.transport is not None:
            self.transport.abort()


class _QuietServerLog(logging.Filter):
    """aiohttp logs each malformed request with a traceback: one line a minute for all of them instead."""

    def __init__(self, interval: float = 60.0) -> None:
        super().__init__()
        self.interval, self.count, self.last = interval, 0, -interval

    def filter(self, record: logging.LogRecord) -> bool:
        self.count += 1
        now = time.monotonic()
        if now - self.last < self.interval:
            return False
        exc = record.exc_info[1] if record.exc_info else None
        record.msg = "%d bad or failed HTTP request(s) since the last report (the latest: %s); next report in %.0f s"
        record.args = (self.count, _short(exc) or record.getMessage(), self.interval)
        record.exc_info = record.exc_text = None
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        self.count, self.last = 0, now
        return True


def _short(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


class _Acceptor:
    """Accepts connections on one listening socket, and serves each only while there is room for it.

    It waits on `loop.sock_accept`, which selector and proactor (Windows) loops both offer. A connection
    accepted when `_Connections` has no room (and no idle connection to close for it) is held, unread,
    until one closes; meanwhile this socket accepts nothing more, and the kernel's backlog holds the
    rest: a burst takes at most one descriptor per listening socket past the cap. Room is made only for
    a connection that has arrived, never ahead of one (a connection just made, whose request head is
    still on its way, must not be closed for a newcomer that does not exist).
    """

    def __init__(
        self,
        sock: socket.socket,
        factory: Callable[[], _GuardedProtocol],
        ssl_context: ssl.SSLContext | None,
        connections: _Connections,
    ) -> None:
        self.sock, self.factory, self.ssl_context, self.connections = sock, factory, ssl_context, connections
        self.loop = asyncio.get_running_loop()
        self.held = False  # a connection accepted waits for room
        self._room = asyncio.Event()
        self._reported = -math.inf
        self._tasks: set[asyncio.Task[None]] = set()
        self._task = self.loop.create_task(self._run(), name=f"accept on {sock.getsockname()}")
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and (exc := task.exception()) is not None:  # never expected: say it
            log.error("no longer accepting connections on %s: %s: %s", self.sock, type(exc).__name__, exc)

    def wake(self) -> None:
        """A connection closed: a held one may fit now."""
        self._room.set()

    async def _run(self) -> None:
        while True:
            try:
                conn, _ = await self.loop.sock_accept(self.sock)
            except (BlockingIOError, InterruptedError, ConnectionError):
                continue  # the client left before it was accepted (Windows says so; Linux skips it)
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS: try again in a second, say so once a minute
                now = time.monotonic()
                if now - self._reported >= 60:
                    log.warning("cannot accept connections: %s; retrying every second", exc.strerror or exc)
                    self._reported = now
                await asyncio.sleep(1.0)
                continue
            conn.setblocking(False)
            try:
                while True:
                    self._room.clear()
                    if self.connections.room():
                        break
                    if not self.held:  # the tests wait for this line
                        log.debug(
                            "connection cap reached (%d open): a new connection waits for one to close",
                            len(self.connections.open),
                        )
                    self.held = True
                    await self._room.wait()
            except BaseException:
                conn.close()
                raise
            finally:
                self.held = False
            self.connections.pending += 1
            task = self.loop.create_task(self._serve(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            # sock_accept returns without yielding while connections are waiting: let the loop run once, so that
            # a connection closed to make room lets go of its descriptor before the next one is taken (a burst
            # would otherwise reach the descriptor limit), and the others are served meanwhile.
            await asyncio.sleep(0)

    async def _serve(self, conn: socket.socket) -> None:
        made: list[_GuardedProtocol] = []

        def factory() -> _GuardedProtocol:
            made.append(self.factory())
            return made[-1]

        try:
            await self.loop.connect_accepted_socket(
                factory,
                conn,
                ssl=self.ssl_context,
                ssl_handshake_timeout=self.connections.limits.head_timeout if self.ssl_context else None,
            )
        except (OSError, ssl.SSLError, asyncio.TimeoutError, ConnectionError):
            conn.close()  # a failed TLS handshake (no client certificate, plain HTTP on the TLS port, too slow)
        finally:
            if not (made and made[0].made):
                self.connections.pending -= 1  # it never became a connection: its room is free again
                self.connections.on_close()

    async def close(self) -> None:
        """Stop accepting (and drop a held connection); then close the socket."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self.sock.close()
        for task in self._tasks:
            task.cancel()


def address_reuse_option() -> int:
    """The socket option that lets a restarted exporter bind its port again at once, and no second one.

    Windows' SO_REUSEADDR would let a second socket bind a port in use: there SO_EXCLUSIVEADDRUSE (which
    exists only there) keeps the port to one socket, and a port in TIME_WAIT can be bound anyway."""
    return getattr(socket, "SO_EXCLUSIVEADDRUSE", socket.SO_REUSEADDR)


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for `host` ("" = every interface, IPv4 and IPv6)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, type_, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, type_, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, address_reuse_option(), 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # one port for all families
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            try:
                sock.bind(address)
            except OSError:
                if family == socket.AF_INET6 and len(infos) > 1:  # no IPv6 on this host: IPv4 will do
                    sockets.pop().close()
                    continue
                raise
            sock.listen(128)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _descriptor_limit() -> int | None:
    """The soft limit on open descriptors (RLIMIT_NOFILE); None where there is none to read (Windows has no
    `resource` module, and its sockets are handles without such a limit)."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft > 0 else None


class BindError(OSError):
    """An address that cannot be bound; `address` says which (HOST:PORT)."""

    def __init__(self, errno: int | None, strerror: str, address: str) -> None:
        super().__init__(errno, strerror)
        self.address = address


def host_port(host: str, port: int) -> str:
    """`host:port` as a URL writes it (IPv6 in brackets; "" is every interface)."""
    host = host or "0.0.0.0"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass
class Serving:
    """A running server: aiohttp's runner and the sockets that accept for it."""

    runner: web.AppRunner
    acceptors: list[_Acceptor]

    @property
    def connections(self) -> _Connections:
        """The open connections, counted against the cap."""
        return self.acceptors[0].connections

    @property
    def holding(self) -> bool:
        """A connection accepted past the cap waits for one to close."""
        return any(a.held for a in self.acceptors)

    @property
    def addresses(self) -> list[str]:
        """Every address listened on, as HOST:PORT (the bound port, for port 0)."""
        return [host_port(*a.sock.getsockname()[:2]) for a in self.acceptors]

    @property
    def port(self) -> int:
        """The port listened on (differs from the flag's for port 0)."""
        return int(self.acceptors[0].sock.getsockname()[1])

    async def close(self) -> None:
        """Stop accepting, then let aiohttp finish and close its connections."""
        for acceptor in self.acceptors:
            await acceptor.close()
        await self.runner.cleanup()


async def start_server(
    app: web.Application,
    host: str,
    port: int,
    *,
    security: WebConfigWatcher | None = None,
    limits: Limits | None = None,
    handler_cancellation: bool = False,
    also: Sequence[tuple[str, int]] = (),
) -> Serving:
    """Start serving `app` (with TLS where the web config says so) on `host:port` and the addresses `also`,
    within `limits`; the caller closes what it returns. Raises BindError when an address cannot be bound
    (then none is)."""
    limits = limits or Limits()
    soft = _descriptor_limit()
    if soft is not None:  # below the descriptor limit: log files, inotify, the HTTP client and NVML need some too
        fit = (soft - 64) // limits.descriptors_per_connection
        limits = dataclasses.replace(limits, max_connections=max(8, min(limits.max_connections, fit)))
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _QuietServerLog) for f in server_log.filters):
        server_log.addFilter(_QuietServerLog())
    connections = _Connections(limits)
    app.middlewares.insert(0, connections.middleware())  # outermost: it must see every request end
    sockets: list[socket.socket] = []
    try:
        for h, p in [(host, port), *also]:  # all or nothing
            try:
                sockets += listening_sockets(h, p)
            except OSError as exc:
                raise BindError(exc.errno, exc.strerror or str(exc), host_port(h, p)) from None
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    # handler_cancellation: a client that goes away cancels its handler (the guard then closes its upstream
    # connection, and llama-server cancels the task); the exporter's pages are short either way.
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.keepalive_timeout,
        handle_signals=False,
        handler_cancellation=handler_cancellation,
    )
    try:
        await runner.setup()
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    server = runner.server
    assert server is not None

    def factory() -> _GuardedProtocol:
        return _GuardedProtocol(server(), connections)

    ssl_context = security.ssl_context if security is not None else None
    acceptors = [_Acceptor(sock, factory, ssl_context, connections) for sock in sockets]

    def wake_all() -> None:
        for acceptor in acceptors:
            acceptor.wake()

    connections.on_close = wake_all
    return Serving(runner, acceptors)
