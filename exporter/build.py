"""Build: the objects the flags ask for (states, log pipelines, live sources, registries), not yet started.

`serve.py` starts, runs and stops them. Every builder here is synchronous and starts nothing: no task, no
socket, no thread; a file is opened only by a tailer's first read.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, ProcessCollector

from exporter.config import Config
from exporter.logs.source import LineSource
from exporter.logs.tail import LogTailer
from exporter.metrics.checkpoints import CheckpointCacheCollector
from exporter.metrics.exporter_health import ExporterCollector
from exporter.metrics.forecast import KVForecastCollector
from exporter.metrics.live import live_collectors
from exporter.metrics.server_log import ServerLogCollector
from exporter.metrics.servers import ChildSources, FollowedServer, ServersCollector
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline
from exporter.sources.live import LiveSources
from exporter.sources.nvml import NvmlReader
from exporter.sources.process_readers import open_process_reader
from exporter.sources.server_http import ServerHttpReader


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
    state.capacity_override = config.host.kv_pool_capacity
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
        http=ServerHttpReader(url, api_key=config.http.api_key, timeout=config.http.server_timeout)
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


def child_sources(config: Config, url: str | None) -> ChildSources:
    """How router children are read: through the router's URL (when HTTP is on), under the /proc root."""
    live = not config.logs.demo
    return ChildSources(
        url=url if config.http.enabled and live else None,
        api_key=config.http.api_key,
        timeout=config.http.server_timeout,
        proc_root=config.host.proc_root if config.host.proc and live else None,
        process_source=config.host.process_source,
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


def single_server(config: Config, log_file: str | None) -> tuple[FollowedServer, LogTailer | None, str]:
    """The one server of a plain run: its followed server, its tailer (None for stdin or the journal) and how
    its log is described. `log_file` is the demo's file under --demo."""
    state = ServerState()
    source = None if config.logs.demo else line_source(config)
    tailer = None
    if source is None:
        assert log_file is not None  # parse_config guarantees --log-file, a journal unit or --demo
        tailer = LogTailer(log_file)
    pipeline = LogPipeline(state, tailer, source)
    description = source.description if source is not None else str(log_file)
    live = build_live_sources(config, state, log_file if tailer is not None else None)
    return (
        FollowedServer({}, pipeline, live, children=child_sources(config, config.http.server_url)),
        tailer,
        description,
    )
