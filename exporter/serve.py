"""Serve: start what `build.py` builds, run until SIGINT or SIGTERM, and stop, the same way on every path.

Each step that starts something pushes its undoing onto one `AsyncExitStack`. A start that fails half way
(a port in use, a bad `--web.config.file`) undoes what had started, in reverse order, as a normal stop
does: background tasks are told to stop and awaited, then the web server, the guard, the servers' live
sources and the log tailers are closed, then the demo's files removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from exporter import __version__
from exporter.build import FollowedLog, build_logs, build_server, servers_registry
from exporter.config import Config
from exporter.metrics.servers import ServersCollector
from exporter.status.page import CSP, page
from exporter.statuses import StatusSource
from exporter.unit import FollowedServer, GuardHooks, refresh_all
from exporter.web.server import BindError, StatusPages, host_port, make_app, start_server

if TYPE_CHECKING:
    from exporter.guard import Guard
    from exporter.guard.accounting import Accounting
    from exporter.web.webconfig import WebConfigWatcher

log = logging.getLogger("llamacpp_exporter")

# How long a background task may take to finish once told to stop, before it is left behind.
TASK_STOP_TIMEOUT = 5.0


class StartError(Exception):
    """A start that cannot go on: a one-line message for stderr and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


async def serve(config: Config, stop: asyncio.Event | None = None) -> int:
    """Run until SIGINT/SIGTERM (or until `stop` is set). Returns the process exit code.

    Without `stop` (the program itself), the signals stay with it to the end: one that comes once the
    stop has begun, however late in asyncio's own shutdown, ends the process at once (`end_now`); after
    `serve`, in Python's, the system's default does (`default_on_signals`, called by `cli`).
    """
    async with contextlib.AsyncExitStack() as stack:
        if stop is None:
            stop = asyncio.Event()
            stack.callback(end_on_signals)
            stack.callback(stop_on_signals(stop))
        try:
            await start(config, stop, stack)
        except StartError as exc:
            print(f"llamacpp-exporter: error: {exc}", file=sys.stderr)
            return exc.code
        await stop.wait()
    return 0


def end_now(*_: object) -> None:
    """A stop signal while the stop is under way: end at once, in one line, exit code 130 (as `cli`'s
    Ctrl-C). A KeyboardInterrupt raised wherever the main thread is would print a traceback from
    asyncio's or Python's shutdown; nothing is left to save (the exporter keeps no state on disk)."""
    with contextlib.suppress(Exception):
        sys.stderr.write("llamacpp-exporter: interrupted\n")
        sys.stderr.flush()
    os._exit(128 + signal.SIGINT)


def end_on_signals() -> None:
    """From here to the process's end, a stop signal ends it at once (`end_now`)."""
    _on_stop_signals(end_now)


def default_on_signals() -> None:
    """Once the stop is done (`serve` has returned): a stop signal ends the process as the system does,
    killed by it, with no Python code run. Python's finalization clears its own handlers, and a signal one of
    them had caught just before is then printed as "Signal 2 ignored due to race condition" with a traceback.
    One caught before this call is handled first, by `end_now` (`signal.signal` runs pending handlers)."""
    _on_stop_signals(signal.SIG_DFL)


def _on_stop_signals(handler: Callable[[int, Any], object] | int) -> None:
    """`handler` for every stop signal, where this thread may set one."""
    for sig in stop_signals():
        with contextlib.suppress(ValueError, OSError):  # not the main thread
            signal.signal(sig, handler)


def stop_signals() -> list[signal.Signals]:
    """Ctrl-C (SIGINT), SIGTERM, and Windows' Ctrl-Break (SIGBREAK, where it exists)."""
    names = ("SIGINT", "SIGTERM", "SIGBREAK")
    return [getattr(signal, name) for name in names if hasattr(signal, name)]


def stop_on_signals(stop: asyncio.Event) -> Callable[[], None]:
    """Set `stop` on each of `stop_signals()`, saying which in one line; returns the undoing.

    Through the loop's own handlers where it has them (selector loops); else (Windows' proactor loop)
    through `signal.signal`, whose handler runs in the main thread between two steps of the loop and
    hands the stop to it. There a second signal, while the stop is under way, ends the program at once
    (`end_now`).
    """
    loop = asyncio.get_running_loop()
    undo: list[Callable[[], object]] = []

    def stopping(sig: signal.Signals) -> None:
        if not stop.is_set():
            log.info("received %s: stopping", sig.name)
        stop.set()

    for sig in stop_signals():
        try:
            loop.add_signal_handler(sig, stopping, sig)
            undo.append(functools.partial(loop.remove_signal_handler, sig))
            continue
        except NotImplementedError:
            pass

        def handler(signum: int, frame: object, sig: signal.Signals = sig) -> None:
            if stop.is_set():
                end_now()  # a second Ctrl-C: the stop is stuck, end now (exit code 130)
            loop.call_soon_threadsafe(stopping, sig)

        undo.append(functools.partial(signal.signal, sig, signal.signal(sig, handler)))

    def restore() -> None:
        for step in reversed(undo):
            with contextlib.suppress(Exception):  # the loop may be closing
                step()

    return restore


async def start(config: Config, stop: asyncio.Event, stack: contextlib.AsyncExitStack) -> None:
    """Start everything the flags ask for, each undoing pushed onto `stack`."""
    security = load_web_config(config)
    log_file = start_demo(config, stop, stack) if config.logs.demo else config.logs.file
    logs, log_description = build_logs(config, log_file)
    # The guard is built (not started) before the servers: the first admits against its state, and its
    # queue and measured prompts go into that server's views.
    guard = build_guard(config, logs[0]) if config.guard.listen is not None else None
    servers = open_servers(config, logs, guard_hooks(guard) if guard is not None else None, stack)
    await refresh_all(servers)  # says once, at start, which live sources work and why the others do not
    registry = servers_registry(ServersCollector(servers))
    if guard is not None:
        await start_guard(config, guard, servers[0], registry, stack)

    def health() -> dict[str, object]:
        return servers_health(servers, log_description)

    status = StatusSource(servers, demo=config.logs.demo, guard=guard_figures(guard) if guard is not None else None)
    start_task(stack, stop, status.run(stop), "status history")

    app = make_app(
        registry,
        log_description=log_description,
        health=health,
        before_scrape=lambda: refresh_all(servers),
        security=security,
        demo=config.logs.demo,
        status=StatusPages(status.document, page, CSP),
    )
    await start_web(config, app, security, stack)
    if security is not None:
        start_task(stack, stop, security.watch(stop), "web config watch")
    for server in servers:
        name = "log pipeline" + (f" of {server.labels['server']}" if config.servers else "")
        run = server.pipeline.run(stop=stop)
        start_task(stack, stop, run, name)


def load_web_config(config: Config) -> WebConfigWatcher | None:
    """`--web.config.file`, read and checked (its module is imported only when the flag is given)."""
    if config.web.config_file is None:
        return None
    from exporter.web.webconfig import WebConfigError, WebConfigWatcher

    try:
        return WebConfigWatcher(config.web.config_file)
    except WebConfigError as exc:
        raise StartError(f"--web.config.file {exc}", code=2) from None


def start_demo(config: Config, stop: asyncio.Event, stack: contextlib.AsyncExitStack) -> str:
    """`--demo`: a temporary log file that a task fills with recorded real logs in a loop; its path."""
    import tempfile

    from exporter.demo import replay_forever

    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="llamacpp-exporter-demo-"))
    path = Path(folder) / "llama-server.log"
    path.touch()  # the replay writes into it; it exists from the start, like a running server's log
    start_task(stack, stop, replay_forever(path, speed=config.logs.demo_speed, stop=stop), "demo replay")
    return str(path)


def open_servers(
    config: Config, logs: list[FollowedLog], hooks: GuardHooks | None, stack: contextlib.AsyncExitStack
) -> list[FollowedServer]:
    """The followed servers (the guard's `hooks` for the first, which it guards), each log's existing lines
    replayed, and their undoing pushed onto `stack`."""
    servers: list[FollowedServer] = []
    for followed in logs:
        owner = servers[0].live if servers else None  # NVML is read once, by the first server
        servers.append(build_server(config, followed, hooks=hooks if not servers else None, nvml_owner=owner))
    for followed in logs:
        stack.callback(followed.pipeline.source.close)
    for server in servers:
        stack.push_async_callback(server.close)
    for server, followed in zip(servers, logs, strict=True):
        replayed = server.pipeline.replay_existing()
        if server.pipeline.up:
            log.info("following %s (replayed %d existing lines without counting them)", followed.description, replayed)
        # else the pipeline said why it is not (a directory, binary data, missing) in one WARNING line
    return servers


async def start_web(
    config: Config, app: Any, security: WebConfigWatcher | None, stack: contextlib.AsyncExitStack
) -> None:
    """Bind `--listen-address` and serve `app` on it."""
    try:
        serving = await start_server(app, config.web.host, config.web.port, security=security)
    except OSError as exc:
        raise StartError(f"--listen-address {config.web.host}:{config.web.port}: {exc.strerror}") from None
    stack.push_async_callback(serving.close)
    # The port bound, which differs from the flag's for port 0 ("any free port").
    scheme = "https" if security is not None and security.ssl_context is not None else "http"
    auth = " with basic auth" if security is not None and security.config.users else ""
    host = config.web.host or "0.0.0.0"
    demo = " (demo: replaying two recorded llama-server logs in a loop)" if config.logs.demo else ""
    log.info(
        "llamacpp-exporter %s serving on %s://%s:%d/metrics%s%s", __version__, scheme, host, serving.port, auth, demo
    )


def build_guard(config: Config, log: FollowedLog) -> Guard:
    """The guard in front of --server-url, admitting against `log`'s state (a router's: per child), not started."""
    from exporter.guard import Guard, GuardSettings, ServerPools

    settings = GuardSettings.of(config.guard, config.http.server_url, config.http.api_key)
    server_log = log.pipeline.log
    pools = ServerPools(
        lambda: server_log.main,
        lambda: {c.name: c.state for c in server_log.router.children.values()} if server_log.router.active else None,
    )
    return Guard(settings, pools, guard_accounting(config))


def guard_figures(guard: Guard) -> Callable[[], dict[str, object]]:
    """The guard's figures on the status page: its queue and requests in flight now, its counts, who holds the pool."""

    def figures() -> dict[str, object]:
        admissions = list(guard.admissions.values())
        books = guard.books.outcomes
        return {
            "in_flight": sum(len(a.in_flight) for a in admissions),
            "queued": sum(len(a.queue) for a in admissions),
            **{outcome: books[outcome] for outcome in ("admitted", "refused", "retried", "preempted", "failed")},
            "pool_by_client": guard.accounting.pool_tokens(),
        }

    return figures


def guard_hooks(guard: Guard) -> GuardHooks:
    """What the guard adds to its server's views: its queue (waiting too) and the prompts it measured."""
    return GuardHooks(lambda: sum(len(a.queue) for a in guard.admissions.values()), guard.measured)


async def start_guard(
    config: Config, guard: Guard, server: FollowedServer, registry: CollectorRegistry, stack: contextlib.AsyncExitStack
) -> None:
    """Serve `guard` on --guard.listen-address and add its families to `registry`."""
    from exporter.guard import GuardCollector, Limits, serve_guard
    from exporter.guard.client_metrics import ClientCollector

    assert config.guard.listen is not None
    host, port = config.guard.listen
    access_log = guard.accounting.access_log
    if access_log is not None:
        stack.callback(access_log.close)  # after the guard has stopped: its last lines are written
    try:
        limits = Limits(config.guard.head_timeout, config.guard.keepalive_timeout, config.guard.max_connections)
        running = await serve_guard(guard, host, port, limits, also=config.guard.listen_also)
    except OSError as exc:
        why = os.strerror(exc.errno).lower() if exc.errno else str(exc)  # asyncio's strerror repeats the address
        where = exc.address if isinstance(exc, BindError) else host_port(host, port)
        raise StartError(f"--guard.listen-address {where}: {why}") from None
    stack.push_async_callback(running.close)
    g = running.guard
    registry.register(GuardCollector(g.books, lambda: g.admissions.values(), lambda: g.pool(None).limit))
    # Cells by client, as fresh as the exporter's own /slots read for the scrape.
    registry.register(ClientCollector(g.accounting, lambda: server.live.http.slots if server.live.http else None))
    where = ", ".join(f"http://{a}" for a in running.serving.addresses)
    log.info("guard serving on %s in front of %s", where, config.http.server_url)


def guard_accounting(config: Config) -> Accounting:
    """The guard's client names and access log from the flags."""
    from exporter.guard.access_log import AccessLog
    from exporter.guard.accounting import Accounting
    from exporter.guard.clients import ClientNamer, KeysFileError, read_keys_file

    opts = config.clients
    try:
        keys = read_keys_file(opts.keys_file) if opts.keys_file else None
    except KeysFileError as exc:
        raise StartError(f"--guard.client-keys-file {exc}") from None
    namer = ClientNamer(header=opts.header, keys=keys, sources=opts.sources, max_clients=opts.max_clients)
    access_log = None
    if opts.access_log:
        try:
            access_log = AccessLog(opts.access_log, opts.access_log_max_bytes)
        except OSError as exc:
            raise StartError(f"--guard.access-log {opts.access_log}: {exc.strerror or exc}") from None
    return Accounting(namer, access_log)


def start_task(
    stack: contextlib.AsyncExitStack, stop: asyncio.Event, work: Coroutine[Any, Any, None], name: str
) -> asyncio.Task[None]:
    """Run `work` in the background; at stop, `stop` is set and the task awaited (at most TASK_STOP_TIMEOUT)."""
    task = asyncio.create_task(work, name=name)
    task.add_done_callback(report_crash)

    async def finish() -> None:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, timeout=TASK_STOP_TIMEOUT)

    stack.push_async_callback(finish)
    return task


def report_crash(task: asyncio.Task[None]) -> None:
    """A background task that died of an unexpected error says so in one line (its result is awaited at exit only)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s stopped: %s: %s; the exporter keeps serving", task.get_name(), type(exc).__name__, exc)


def servers_health(servers: Sequence[FollowedServer], log_description: str) -> dict[str, object]:
    """`/healthz`: ok while every log pipeline follows its log; what each server's sources say."""
    stopped = [s for s in servers if s.pipeline.stopped is not None]
    unreadable = [s for s in servers if not s.pipeline.up]
    down = [st.name for s in servers for st in s.statuses() if not st.up]  # "http", "http of model alpha", …
    if stopped:
        summary = "the log pipeline stopped: restart the exporter"
    elif unreadable:
        summary = "serving; the log cannot be read (log.error says why)"
    elif any(s.pipeline.understood is False for s in servers):
        summary = "serving; the log followed is not llama-server's (log.error says why)"
    else:
        summary = "serving; following the log" + (f"; not answering: {', '.join(down)}" if down else "")

    def detail(s: FollowedServer) -> dict[str, object]:
        log_status: dict[str, object] = {"path": s.pipeline.description, "up": s.pipeline.up}
        if s.pipeline.understood is not None:
            log_status["understood"] = s.pipeline.understood
        if (problem := s.pipeline.problem) is not None:
            log_status["error"] = problem
        if s.pipeline.stopped is not None:
            log_status["stopped"] = s.pipeline.stopped
        return {
            "log": log_status,
            "sources": {st.name: {"up": st.up, "error": st.error} for st in s.statuses()},
            "server_pid": s.live.pid,
        }

    body: dict[str, object] = {
        # A pipeline that stopped following the log never recovers by itself: restart the exporter.
        "status": "failing" if stopped else "ok",
        "summary": summary,  # all a caller without credentials sees: no paths, no addresses
        "version": __version__,
    }
    if len(servers) == 1 and "server" not in servers[0].labels:
        one = detail(servers[0])
        one["log"] = {**one["log"], "path": log_description}  # type: ignore[dict-item]
        body.update(one)
    else:
        body["servers"] = {s.labels["server"]: detail(s) for s in servers}
    return body
