"""Many servers per exporter: each followed server, its router children, and their series, labelled.

One `FollowedServer` is one log (a `LogPipeline`) and the live sources of the server that writes it. A
plain llama-server is one unit of series. A router (`llama-server --models-dir`) is the router's own
unit (its health, process, how its children came and went) plus one unit per child, each with the
child's log state, its `/slots` and `/props` read through the router, its process and its VRAM.

`ServersCollector` renders every unit with its labels:

- one server, not a router: no label at all, exactly what a single-server exporter always exported;
- several servers (`--servers-file`): `server="NAME"` on every series of that server;
- router children: `model="NAME"` (the router's name for the model), next to `server` when there are
  several servers. A family's own label of that name (`llamacpp_server_info{model}`) is kept as
  `exported_model`, as Prometheus does with clashing labels.

Series of the host and the exporter (GPU totals, host memory, the exporter's version) are exported once,
unlabelled. The number of units is bounded: `servers_file.MAX_SERVERS` servers, `router.MAX_CHILDREN` children each.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from exporter.logs.pipeline import LogPipeline
from exporter.metrics.checkpoints import CheckpointCacheCollector
from exporter.metrics.exporter_health import ExporterCollector, SourcesUpCollector
from exporter.metrics.families import labelled_counter
from exporter.metrics.forecast import KVForecastCollector
from exporter.metrics.gpu import NvmlCollector
from exporter.metrics.live import live_collectors
from exporter.metrics.requests import RequestSizeCollector
from exporter.metrics.server_log import ServerLogCollector, rejected_lines_family, server_starts_family
from exporter.model.forecast import Measured
from exporter.model.live import HttpSnapshot
from exporter.model.router import EXIT_OUTCOMES, RouterChild
from exporter.model.state import ServerState
from exporter.sources.live import LiveSources, SourceStatus
from exporter.sources.process_readers import open_process_reader
from exporter.sources.server_http import ServerHttpReader

log = logging.getLogger(__name__)

#: Families about the host or the exporter, not a server: exported once, without server labels.
GLOBAL_FAMILIES = frozenset(
    {
        "llamacpp_gpu_memory_total_bytes",
        "llamacpp_gpu_memory_used_bytes",
        "llamacpp_gpu_memory_free_bytes",
        "llamacpp_host_memory_available_bytes",
        "llamacpp_host_memory_total_bytes",
        "llamacpp_exporter_build",
    }
)

Unit = tuple[Mapping[str, str], list[Collector]]


@dataclass(frozen=True)
class ChildSources:
    """How to read a router child's live sources: through the router's URL, and under /proc."""

    url: str | None
    api_key: str | None
    timeout: float
    proc_root: str | None  # None: no process source
    process_source: str = "auto"  # --process-source


def log_collectors(
    view: Callable[[], ServerState], measured: Callable[[], Sequence[Measured]] | None = None
) -> list[Collector]:
    """The collectors of what one server's log says (rendered from `view()`); `measured()` gives the requests
    in flight that the guard measured at arrival (the forecast counts them before the log sizes them)."""
    return [
        ServerLogCollector(view),
        KVForecastCollector(view, measured),
        CheckpointCacheCollector(view),
        RequestSizeCollector(view),
    ]


@dataclass
class _Child:
    child: RouterChild
    live: LiveSources
    collectors: list[Collector] = field(default_factory=list)


class FollowedServer:
    """One log and the server (plain, or a router and its children) that writes it."""

    def __init__(
        self,
        labels: Mapping[str, str],
        pipeline: LogPipeline,
        live: LiveSources,
        *,
        children: ChildSources,
        nvml_owner: LiveSources | None = None,
    ) -> None:
        self.labels = dict(labels)
        self.pipeline = pipeline
        self.live = live
        self.nvml_owner = nvml_owner or live
        self._child_sources = children
        self._children: dict[int, _Child] = {}  # port → live sources of a child that runs now
        self._refreshing = asyncio.Lock()  # one refresh at a time: a second scrape must not close a child
        # whose reads the first one still awaits
        # The guard's requests in flight, by pool (None: the server's; a router's model name), when it runs.
        self.measured: Callable[[str | None], Sequence[Measured]] | None = None
        exporter = ExporterCollector(pipeline, live.statuses)
        sources = live_collectors(live) + self._shared_nvml(live)
        self._own = [*log_collectors(live.view, self._measured_in(None)), exporter, *sources]
        self._router_own: list[Collector] = [exporter, RouterCollector(pipeline), *sources]

    def _measured_in(self, pool: str | None) -> Callable[[], Sequence[Measured]]:
        return lambda: self.measured(pool) if self.measured is not None else ()

    def _shared_nvml(self, live: LiveSources) -> list[Collector]:
        """NVML is read once for all servers (by `nvml_owner`); the others render its snapshot with their pid."""
        owner = self.nvml_owner
        if live is owner or owner.nvml_reader is None:
            return []
        return [NvmlCollector(lambda: owner.nvml, lambda: live.pid)]

    @property
    def is_router(self) -> bool:
        return self.pipeline.log.router.active

    def pids(self) -> Iterator[int]:
        """The processes of the server, or of the router and each child it runs, where /proc found them."""
        lives = [self.live, *(c.live for c in self._children.values())] if self.is_router else [self.live]
        for live in lives:
            if live.pid is not None:
                yield live.pid

    def units(self) -> Iterator[Unit]:
        """(labels, collectors) of the server, or of the router and each child it runs."""
        if not self.is_router:
            yield self.labels, self._own
            return
        yield self.labels, self._router_own
        for port, child in self.pipeline.log.router.children.items():
            c = self._children.get(port)
            if c is not None and c.child is child:
                yield {**self.labels, "model": child.name}, c.collectors

    async def refresh(self) -> None:
        """The log up to now, then the live sources: the server's (the router's), then each child's. Never raises."""
        async with self._refreshing:
            await self._refresh()

    async def _refresh(self) -> None:
        await self.pipeline.catch_up()  # the lines written so far first: a router's spawn lines name its children
        if self.live.http_reader is not None:
            self.live.http_reader.router = self.is_router
        await self.live.refresh()
        if not self.is_router:
            await self._close_children(set(self._children))
            return
        running = self.pipeline.log.router.children
        await self._close_children({p for p, c in self._children.items() if running.get(p) is not c.child})
        for port, child in running.items():
            if port not in self._children:
                self._children[port] = self._open_child(child)
        if self._children:
            await asyncio.gather(*(c.live.refresh() for c in self._children.values()))

    def _open_child(self, child: RouterChild) -> _Child:
        src = self._child_sources
        live = LiveSources(
            child.state,
            http=ServerHttpReader(src.url, api_key=src.api_key, timeout=src.timeout, model=child.name)
            if src.url
            else None,
            proc=open_process_reader(
                src.process_source, src.proc_root, router_pid=lambda: self.live.pid, port=child.port
            )
            if src.proc_root is not None
            else None,
            timeout=src.timeout,
            http_gate=_model_gate(lambda: self.live.http, child.name),
            unit=", ".join(f"{k} {v}" for k, v in {**self.labels, "model": child.name}.items()),
        )
        collectors = [
            *log_collectors(live.view, self._measured_in(child.name)),
            SourcesUpCollector(live.statuses),
            *live_collectors(live),
        ]
        return _Child(child, live, collectors + self._shared_nvml(live))

    def statuses(self) -> Iterator[SourceStatus]:
        """The live sources' health: the server's (the router's) and each child's."""
        yield from self.live.statuses.values()
        for c in self._children.values():
            yield from c.live.statuses.values()

    async def _close_children(self, ports: Iterable[int]) -> None:
        for port in list(ports):
            c = self._children.pop(port, None)
            if c is not None:
                await c.live.close()

    async def close(self) -> None:
        await self._close_children(set(self._children))
        await self.live.close()


def _model_gate(router: Callable[[], HttpSnapshot | None], name: str) -> Callable[[], tuple[str, bool] | None]:
    """None when the router's last `/models` lists `name` as loaded; else (why not, whether it is loading).

    A child's endpoints are read only then: a model that is not loaded is never woken by a scrape, even
    by a router too old to know `autoload=false`."""

    def gate() -> tuple[str, bool] | None:
        snap = router()
        models = snap.models if snap is not None else None
        if models is None:
            return "the router's /models did not answer", False
        status = models.get(name)
        if status == "loaded":
            return None
        return f"model {name} is {status or 'not listed'} in the router's /models", status == "loading"

    return gate


class RouterCollector(Collector):
    """A router's children: how many run, the limit followed, and how they started and ended.

    # HELP llamacpp_router_children Router children (one per loaded model) running now, as the router's log says.
    # TYPE llamacpp_router_children gauge
    llamacpp_router_children 2.0
    # HELP llamacpp_router_child_exits_total Router children that ended, by outcome: unloaded …
    # TYPE llamacpp_router_child_exits_total counter
    llamacpp_router_child_exits_total{outcome="crashed"} 1.0
    llamacpp_router_child_exits_total{outcome="unloaded"} 3.0
    """

    def __init__(self, pipeline: LogPipeline) -> None:
        self._pipeline = pipeline

    def collect(self) -> Iterator[Metric]:
        """Yield the router families, the router's own starts and its rejected lines."""
        log = self._pipeline.log
        r = log.router
        yield GaugeMetricFamily(
            "llamacpp_router_children",
            "Router children (one per loaded model) running now, as the router's log says.",
            value=len(r.children),
        )
        yield GaugeMetricFamily(
            "llamacpp_router_children_limit",
            "Router children the exporter follows at most; a child past it is refused (not followed).",
            value=r.limit,
        )
        yield CounterMetricFamily(
            "llamacpp_router_child_starts", "Router children started (spawn lines).", value=r.starts
        )
        yield labelled_counter(
            "llamacpp_router_child_exits",
            "Router children that ended, by outcome: unloaded (after the router's stop line: an unload or an "
            "eviction), crashed (the child ended without being asked to).",
            "outcome",
            r.exits,
            EXIT_OUTCOMES,
        )
        yield CounterMetricFamily(
            "llamacpp_router_children_refused",
            "Router children not followed because the limit was reached (their lines are rejected as unfollowed).",
            value=r.refused,
        )
        yield server_starts_family(log.main)  # the router's own
        yield rejected_lines_family(log.main)


def _relabel(sample: Sample, labels: Mapping[str, str]) -> Sample:
    new = dict(sample.labels)
    for key, value in labels.items():
        if key in new:
            new["exported_" + key] = new[key]
        new[key] = value
    return Sample(sample.name, new, sample.value, sample.timestamp, sample.exemplar)


def merge_units(units: Iterable[Unit]) -> Iterator[Metric]:
    """Every unit's families, one family per name, each sample with its unit's labels added."""
    merged: dict[str, Metric] = {}
    for labels, collectors in units:
        for collector in collectors:
            for family in collector.collect():
                out = merged.get(family.name)
                if out is None:
                    out = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                    if family.name in GLOBAL_FAMILIES:
                        out.samples.extend(family.samples)
                        continue
                if family.name in GLOBAL_FAMILIES:
                    continue  # the host's and the exporter's series: once, from the first unit
                if labels:
                    out.samples.extend(_relabel(s, labels) for s in family.samples)
                else:
                    out.samples.extend(family.samples)
    yield from merged.values()


class ServersCollector(Collector):
    """Every followed server's units, labelled (see the module's docstring), and (with more than one unit)
    which of them share a GPU.

    # HELP llamacpp_gpu_servers Followed servers (router children included) on the GPU's process list (NVML) …
    # TYPE llamacpp_gpu_servers gauge
    llamacpp_gpu_servers{gpu="0",name="NVIDIA H200",uuid="GPU-5f3c…"} 2.0
    """

    def __init__(self, servers: list[FollowedServer]) -> None:
        self.servers = servers

    def collect(self) -> Iterator[Metric]:
        units = [u for s in self.servers for u in s.units()]
        if len(units) == 1 and not units[0][0]:  # one plain server: its families as they are
            for collector in units[0][1]:
                yield from collector.collect()
            return
        yield from merge_units(units)
        yield from self._gpu_sharing()

    def _gpu_sharing(self) -> Iterator[Metric]:
        """How many followed servers are on each GPU's process list: more than one share its free memory."""
        owner = self.servers[0].nvml_owner if self.servers else None
        snap = owner.nvml if owner is not None else None
        if snap is None or not snap.gpus:
            return
        pids = [pid for s in self.servers for pid in s.pids()]
        family = GaugeMetricFamily(
            "llamacpp_gpu_servers",
            "Followed servers (router children included) on the GPU's process list (NVML); above 1 they share "
            "its free memory (llamacpp_process_gpu_memory_bytes says how much each holds).",
            labels=["gpu", "uuid", "name"],
        )
        for g in snap.gpus:
            held = sum(1 for pid in pids if g.processes is not None and pid in g.processes)
            family.add_metric([str(g.index), g.uuid, g.name], held)
        yield family

    async def refresh(self) -> None:
        """The web app's `before_scrape`: every server's live sources, concurrently."""
        if len(self.servers) == 1:  # no task to gather: one loop iteration less in every scrape
            await self.servers[0].refresh()
        else:
            await asyncio.gather(*(s.refresh() for s in self.servers))
