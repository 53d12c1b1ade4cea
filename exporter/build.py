"""Build: the objects the flags ask for (states, log pipelines, live sources, registries), not yet started.

`serve.py` starts, runs and stops them. Every builder here is synchronous and starts nothing: no task, no
socket, no thread; a file is opened only by a tailer's first read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, ProcessCollector

from exporter.config import Config
from exporter.logs.file_source import FileSource
from exporter.logs.source import LineSource
from exporter.logs.tail import LogTailer
from exporter.metrics.servers import ServersCollector
from exporter.model.router import RouterChild
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline
from exporter.servers_file import ServerSpec
from exporter.sources.live import LiveSources
from exporter.sources.nvml import NvmlReader
from exporter.sources.process_readers import open_process_reader
from exporter.sources.server_http import ServerHttpReader
from exporter.unit import ChildLive, FollowedServer, GuardHooks, model_gate, no_live


@dataclass(frozen=True)
class FollowedLog:
    """One server's log side, built before its unit (the guard admits against its state): line source →
    (router split →) parse → state. `spec`: its --servers-file entry (None for the server of a plain run)."""

    pipeline: LogPipeline
    log_file: str | None  # the file's path as given (None: standard input or the journal)
    description: str  # the log in words, for the exporter's log
    spec: ServerSpec | None = None


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
    router: Callable[[], bool] = lambda: False,
) -> LiveSources:
    """The live sources the flags ask for, for one server. `log_file` (None when not a file) lets /proc
    find it; `url`, `pid` and `pid_file` default to the flags' (a --servers-file entry gives its own);
    `nvml`: False for all but one server (NVML is read once)."""
    # The demo replays recorded logs: no real llama-server process or endpoint belongs to it, nor does
    # this host's GPU.
    live = not config.logs.demo
    if not config.servers:
        url, pid, pid_file = config.http.server_url, config.host.pid, config.host.pid_file
    return LiveSources(
        state,
        nvml=NvmlReader() if config.host.nvml and live and nvml else None,
        proc=open_process_reader(
            config.host.process_source,
            config.host.proc_root,
            pid=pid,
            pid_file=pid_file,
            log_file=log_file,
            stdin_fd=0 if config.logs.source == "stdin" else None,  # the server writes into our stdin pipe
            unit=config.logs.journal_unit if config.logs.source == "journald" else None,
        )
        if config.host.proc and live
        else None,
        http=ServerHttpReader(url, api_key=config.http.api_key, timeout=config.http.server_timeout, router=router)
        if config.http.enabled and live and url
        else None,
        timeout=config.http.server_timeout,
        unit=unit,
    )


def servers_registry(servers: ServersCollector) -> CollectorRegistry:
    """A registry with every followed server's series (`exporter.metrics.servers`) and the process metrics."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(servers)
    ProcessCollector(registry=registry)
    return registry


def child_live(config: Config, url: str | None) -> ChildLive:
    """How router children's live sources are built: read through the router's URL (when HTTP is on), found
    under the /proc root as the router's child started with their port."""
    live = not config.logs.demo
    url = url if config.http.enabled and live else None
    proc_root = config.host.proc_root if config.host.proc and live else None
    if url is None and proc_root is None:
        return no_live

    def build(child: RouterChild, router: LiveSources, unit: str) -> LiveSources:
        return LiveSources(
            child.state,
            http=ServerHttpReader(
                url, api_key=config.http.api_key, timeout=config.http.server_timeout, model=child.name
            )
            if url
            else None,
            proc=open_process_reader(
                config.host.process_source, proc_root, router_pid=lambda: router.pid, port=child.port
            )
            if proc_root is not None
            else None,
            timeout=config.http.server_timeout,
            http_gate=model_gate(lambda: router.http, child.name),
            unit=unit,
        )

    return build


def build_logs(config: Config, log_file: str | None) -> tuple[list[FollowedLog], str]:
    """Every followed log (one per --servers-file entry, else the one of a plain run: `log_file` is the demo's
    under --demo) and how they are described."""
    if config.servers:
        logs = []
        for spec in config.servers:
            followed = LogPipeline(
                ServerState(capacity_override=config.host.kv_pool_capacity), file_source(config, spec.log_file)
            )
            logs.append(FollowedLog(followed, spec.log_file, followed.description, spec))
        return logs, f"{len(logs)} servers"
    source = None if config.logs.demo else line_source(config)
    if source is None:
        assert log_file is not None  # parse_config guarantees --log-file, a journal unit or --demo
        pipeline = LogPipeline(
            ServerState(capacity_override=config.host.kv_pool_capacity), file_source(config, log_file)
        )
        return [FollowedLog(pipeline, log_file, str(log_file))], str(log_file)
    pipeline = LogPipeline(ServerState(capacity_override=config.host.kv_pool_capacity), source)
    return [FollowedLog(pipeline, None, source.description)], source.description


def file_source(config: Config, log_file: str) -> FileSource:
    """A log file, followed as the flags say (`--log-poll-interval`, `--log-batch-interval`, `--fs-events`)."""
    return FileSource(
        LogTailer(log_file),
        poll_interval=config.logs.poll_interval,
        batch_interval=config.logs.batch_interval,
        use_watchdog=config.logs.fs_events,
    )


def build_server(
    config: Config, log: FollowedLog, *, hooks: GuardHooks | None = None, nvml_owner: LiveSources | None = None
) -> FollowedServer:
    """A followed server around its log, the same for the server of a plain run and each --servers-file entry:
    its live sources, its router children's (built as they appear), the guard's hooks (when it guards this
    server). `nvml_owner`: the server that reads NVML for all (None: this one does)."""
    spec = log.spec
    router = log.pipeline.log.router

    def is_router() -> bool:  # the log says whether the server is a router: its endpoints differ
        return router.active

    if spec is None:
        live = build_live_sources(config, log.pipeline.state, log.log_file, router=is_router)
        return FollowedServer(
            {},
            log.pipeline,
            live,
            child_live=child_live(config, config.http.server_url),
            hooks=hooks,
            active_window=config.host.kv_pool_active_window,
        )
    live = build_live_sources(
        config,
        log.pipeline.state,
        spec.log_file,
        url=spec.url,
        pid=spec.pid,
        pid_file=spec.pid_file,
        nvml=nvml_owner is None,  # read once, for all servers
        unit=f"server {spec.name}",
        router=is_router,
    )
    return FollowedServer(
        {"server": spec.name},
        log.pipeline,
        live,
        child_live=child_live(config, spec.url),
        hooks=hooks,
        nvml_owner=nvml_owner,
        active_window=config.host.kv_pool_active_window,
    )


def line_source(config: Config) -> LineSource | None:
    """The log source other than a file (`--log-source stdin|journald`), or None for a file."""
    # The modules of the sources, of --web.config.file and of --demo are imported where they are used:
    # each is memory that an exporter following a file would hold for nothing.
    if config.logs.source == "journald":
        from exporter.logs.journald import JournaldSource

        assert config.logs.journal_unit is not None  # parse_config checks it
        return JournaldSource(
            config.logs.journal_unit, namespace=config.logs.journal_namespace, directory=config.logs.journal_directory
        )
    if config.logs.source == "stdin":
        from exporter.logs.stdin import StdinSource

        return StdinSource()
    return None
