"""Entry point: `llamacpp-exporter --log-file PATH` (or `--demo`). Wires tail → parse → state → collector → web."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, ProcessCollector

from exporter import __version__
from exporter.config import Config, parse_config
from exporter.logs.pipeline import LogPipeline
from exporter.logs.source import LineSource
from exporter.logs.tail import LogTailer
from exporter.metrics.checkpoints import CheckpointCacheCollector
from exporter.metrics.exporter_health import ExporterCollector
from exporter.metrics.forecast import KVForecastCollector
from exporter.metrics.live import live_collectors
from exporter.metrics.server_log import ServerLogCollector
from exporter.metrics.servers import ChildSources, FollowedServer, ServersCollector
from exporter.model.state import ServerState
from exporter.sources.live import LiveSources
from exporter.sources.nvml import NvmlReader
from exporter.sources.procfs import ProcReader
from exporter.sources.server_http import ServerHttpReader
from exporter.web.server import make_app, start_server

if TYPE_CHECKING:
    import tempfile

    from exporter.guard import RunningGuard

log = logging.getLogger("llamacpp_exporter")


def build_registry(state: ServerState, pipeline: LogPipeline, live: LiveSources | None = None) -> CollectorRegistry:
    """A registry with one server's collectors (and the exporter's own process metrics), router mode aside.

    With `live`, the log collectors render `live.view()`: the state with `/slots` and the other live
    reads merged in.
    """
    registry = CollectorRegistry(auto_describe=True)
    view: Callable[[], ServerState] = live.view if live is not None else (lambda: state)
    registry.register(ServerLogCollector(view))
    registry.register(KVForecastCollector(view))
    registry.register(CheckpointCacheCollector(view))
    registry.register(ExporterCollector(pipeline, live.statuses if live is not None else None))
    for collector in live_collectors(live) if live is not None else []:
        registry.register(collector)
    ProcessCollector(registry=registry)
    return registry


def build_live_sources(
    config: Config,
    state: ServerState,
    log_file: str | None,
    *,
    url: str | None = None,
    pid: int | None = None,
    pid_file: str | None = None,
    nvml: bool = True,
    unit: str = "",
) -> LiveSources:
    """The live sources the flags ask for, for one server. `log_file` (None when not a file) lets /proc
    find it; `url`, `pid` and `pid_file` default to the flags' (a --servers-file entry gives its own);
    `nvml`: False for all but one server (NVML is read once)."""
    state.capacity_override = config.kv_pool_capacity
    # The demo replays recorded logs: no real llama-server process or endpoint belongs to it, nor does
    # this host's GPU.
    live = not config.demo
    if not config.servers:
        url, pid, pid_file = config.server_url, config.pid, config.pid_file
    return LiveSources(
        state,
        nvml=NvmlReader() if config.nvml and live and nvml else None,
        proc=ProcReader(
            config.proc_root,
            pid=pid,
            pid_file=pid_file,
            log_file=log_file,
            stdin_fd=0 if config.log_source == "stdin" else None,  # the server writes into our stdin pipe
            unit=config.journal_unit if config.log_source == "journald" else None,
        )
        if config.proc and live
        else None,
        http=ServerHttpReader(url, api_key=config.api_key, timeout=config.server_timeout)
        if config.http and live and url
        else None,
        timeout=config.server_timeout,
        unit=unit,
    )


def servers_registry(servers: ServersCollector) -> CollectorRegistry:
    """A registry with every followed server's series (`exporter.metrics.servers`) and the process metrics."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(servers)
    ProcessCollector(registry=registry)
    return registry


def child_sources(config: Config, url: str | None) -> ChildSources:
    """How router children are read: through the router's URL (when HTTP is on), under the /proc root."""
    live = not config.demo
    return ChildSources(
        url=url if config.http and live else None,
        api_key=config.api_key,
        timeout=config.server_timeout,
        proc_root=config.proc_root if config.proc and live else None,
    )


def build_servers(config: Config) -> tuple[list[FollowedServer], list[LogTailer]]:
    """One `FollowedServer` per entry of --servers-file, each labelled with its name (their tailers too)."""
    servers: list[FollowedServer] = []
    tailers: list[LogTailer] = []
    owner: LiveSources | None = None
    for spec in config.servers:
        state = ServerState()
        tailer = LogTailer(spec.log_file)
        pipeline = LogPipeline(state, tailer)
        live = build_live_sources(
            config,
            state,
            spec.log_file,
            url=spec.url,
            pid=spec.pid,
            pid_file=spec.pid_file,
            nvml=owner is None,  # read once, for all servers
            unit=f"server {spec.name}",
        )
        owner = owner or live
        servers.append(
            FollowedServer(
                {"server": spec.name}, pipeline, live, children=child_sources(config, spec.url), nvml_owner=owner
            )
        )
        tailers.append(tailer)
    return servers, tailers


def line_source(config: Config) -> LineSource | None:
    """The log source other than a file (`--log-source stdin|journald`), or None for the file tailer."""
    # The modules of the sources, of --web.config.file and of --demo are imported where they are used:
    # each is memory that an exporter following a file would hold for nothing.
    if config.log_source == "journald":
        from exporter.logs.journald import JournaldSource

        assert config.journal_unit is not None  # parse_config checks it
        return JournaldSource(
            config.journal_unit, namespace=config.journal_namespace, directory=config.journal_directory
        )
    if config.log_source == "stdin":
        from exporter.logs.stdin import StdinSource

        return StdinSource()
    return None


async def serve(config: Config) -> int:
    """Run until SIGINT/SIGTERM. Returns the process exit code."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on every platform
            loop.add_signal_handler(sig, stop.set)

    security = None
    if config.web_config_file is not None:
        from exporter.web.webconfig import WebConfigError, WebConfigWatcher

        try:
            security = WebConfigWatcher(config.web_config_file)
        except WebConfigError as exc:
            print(f"llamacpp-exporter: error: --web.config.file {exc}", file=sys.stderr)
            return 2
    background: list[asyncio.Task[None]] = []
    demo_dir: tempfile.TemporaryDirectory[str] | None = None
    log_file = config.log_file
    if config.demo:
        import tempfile

        from exporter.demo import replay_forever

        demo_dir = tempfile.TemporaryDirectory(prefix="llamacpp-exporter-demo-")
        demo_path = Path(demo_dir.name) / "llama-server.log"
        demo_path.touch()  # the replay writes into it; it exists from the start, like a running server's log
        log_file = str(demo_path)
        background.append(
            asyncio.create_task(replay_forever(demo_path, speed=config.demo_speed, stop=stop), name="demo replay")
        )
    if config.servers:
        servers, tailers = build_servers(config)
        log_description = f"{len(servers)} servers"
    else:
        state = ServerState()
        source = None if config.demo else line_source(config)
        tailers = []
        if source is None:
            assert log_file is not None  # parse_config guarantees --log-file, a journal unit or --demo
            tailers.append(LogTailer(log_file))
        pipeline = LogPipeline(state, tailers[0] if tailers else None, source)
        log_description = source.description if source is not None else str(log_file)
        live = build_live_sources(config, state, log_file if tailers else None)
        servers = [FollowedServer({}, pipeline, live, children=child_sources(config, config.server_url))]
    for server in servers:
        replayed = server.pipeline.replay_existing()
        where = server.pipeline.description if config.servers else log_description
        log.info("following %s (replayed %d existing lines without counting them)", where, replayed)
    collector = ServersCollector(servers)
    await collector.refresh()  # says once, at start, which live sources work and why the others do not
    registry = servers_registry(collector)
    guard = await _start_guard(config, servers[0], registry) if config.guard_listen is not None else None
    if config.guard_listen is not None and guard is None:
        for server in servers:
            await server.close()
        return 1

    def health() -> dict[str, object]:
        return servers_health(servers, log_description)

    app = make_app(
        registry,
        log_description=log_description,
        health=health,
        before_scrape=collector.refresh,
        security=security,
        demo=config.demo,
    )
    try:
        serving = await start_server(app, config.listen_host, config.listen_port, security=security)
    except OSError as exc:
        print(
            f"llamacpp-exporter: error: --listen-address {config.listen_host}:{config.listen_port}: {exc.strerror}",
            file=sys.stderr,
        )
        for task in background:
            task.cancel()
        if guard is not None:
            await guard.close()
        for server in servers:
            await server.close()
        return 1
    # The port bound, which differs from the flag's for port 0 ("any free port").
    port = serving.port
    scheme = "https" if security is not None and security.ssl_context is not None else "http"
    auth = " with basic auth" if security is not None and security.config.users else ""
    host = config.listen_host or "0.0.0.0"
    demo = " (demo: replaying two recorded llama-server logs in a loop)" if config.demo else ""
    log.info("llamacpp-exporter %s serving on %s://%s:%d/metrics%s%s", __version__, scheme, host, port, auth, demo)
    if security is not None:
        background.append(asyncio.create_task(security.watch(stop), name="web config watch"))

    for server in servers:
        background.append(
            asyncio.create_task(
                server.pipeline.run(
                    poll_interval=config.log_poll_interval,
                    batch_interval=config.log_batch_interval,
                    use_watchdog=config.fs_events,
                    stop=stop,
                ),
                name="log pipeline" + (f" of {server.labels['server']}" if config.servers else ""),
            )
        )
    for task in background:
        task.add_done_callback(_report_crash)
    try:
        await stop.wait()
    finally:
        stop.set()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, timeout=5)
        await serving.close()
        if guard is not None:
            await guard.close()
        for server in servers:
            await server.close()
        for tailer in tailers:
            tailer.close()
        if demo_dir is not None:
            demo_dir.cleanup()
    return 0


async def _start_guard(config: Config, server: FollowedServer, registry: CollectorRegistry) -> RunningGuard | None:
    """Start the guard in front of --server-url and add its families to `registry`; None (said on stderr) when
    its port cannot be bound."""
    from exporter.guard import GuardCollector, GuardSettings, Limits, ServerPools, start_guard

    assert config.guard_listen is not None
    host, port = config.guard_listen
    settings = GuardSettings(
        upstream=config.server_url,
        api_key=config.api_key,
        default_budget=config.guard_default_budget,
        max_queue=config.guard_queue_size,
        max_wait=config.guard_queue_timeout,
        max_body_bytes=config.guard_max_body_bytes,
        body_timeout=config.guard_head_timeout,
    )
    try:
        pools = ServerPools(
            lambda: server.live.state,
            lambda: (
                {c.name: c.state for c in server.pipeline.log.router.children.values()} if server.is_router else None
            ),
        )
        limits = Limits(config.guard_head_timeout, config.guard_keepalive_timeout, config.guard_max_connections)
        running = await start_guard(settings, pools, host, port, limits)
    except OSError as exc:
        why = os.strerror(exc.errno).lower() if exc.errno else str(exc)  # asyncio's strerror repeats the address
        print(f"llamacpp-exporter: error: --guard.listen-address {host}:{port}: {why}", file=sys.stderr)
        return None
    g = running.guard
    registry.register(GuardCollector(g.books, lambda: g.admissions.values(), lambda: g.pool(None).limit))
    # What a gateway reads as the server's queue includes the requests the guard holds back.
    server.live.guard_queue = lambda: sum(len(a.queue) for a in g.admissions.values())
    # The forecast counts the prompts the guard measured at arrival, before the log says their size.
    server.measured = g.measured
    log.info("guard serving on http://%s:%d in front of %s", host or "0.0.0.0", running.port, config.server_url)
    return running


def servers_health(servers: Sequence[FollowedServer], log_description: str) -> dict[str, object]:
    """`/healthz`: ok while every log pipeline follows its log; what each server's sources say."""
    stopped = [s for s in servers if s.pipeline.stopped is not None]
    unreadable = [s for s in servers if not s.pipeline.up]
    down = [st.name for s in servers for st in s.statuses() if not st.up]  # "http", "http of model alpha", …
    if stopped:
        summary = "the log pipeline stopped: restart the exporter"
    elif unreadable:
        summary = "serving; the log cannot be read yet"
    else:
        summary = "serving; following the log" + (f"; not answering: {', '.join(down)}" if down else "")

    def detail(s: FollowedServer) -> dict[str, object]:
        log_status: dict[str, object] = {"path": s.pipeline.description, "up": s.pipeline.up}
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


def _report_crash(task: asyncio.Task[None]) -> None:
    """A background task that died of an unexpected error says so in one line (its result is awaited at exit only)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("%s stopped: %s: %s; the exporter keeps serving", task.get_name(), type(exc).__name__, exc)


def main(argv: Sequence[str] | None = None) -> int:
    """Console script `llamacpp-exporter`."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["diagnose"]:
        from exporter.diagnose import main as diagnose_main

        return diagnose_main(args[1:])
    config = parse_config(args)
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
