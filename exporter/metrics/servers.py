"""Many servers per exporter: each followed server, its router children, and their series, labelled.

Each followed log (`exporter.unit.FollowedServer`) gives its units of series. A plain llama-server is one
unit. A router (`llama-server --models-dir`) is the router's own unit (its health, process, how its
children came and went) plus one unit per child, each with the child's log state, its `/slots` and
`/props` read through the router, its process and its VRAM. Every collector renders its unit's view of
the scrape (`exporter.model.view.ServerView`); nothing here builds or reads a source.

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

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from exporter.metrics.catalogue import CATALOGUE
from exporter.metrics.catalogue import live as c
from exporter.metrics.catalogue.family import HOST
from exporter.metrics.checkpoints import CheckpointCacheCollector
from exporter.metrics.forecast import KVForecastCollector
from exporter.metrics.latency import LatencyCollector
from exporter.metrics.requests import RequestSizeCollector
from exporter.metrics.server_log import ServerLogCollector, rejected_lines_family, server_starts_family
from exporter.model.live import NvmlSnapshot
from exporter.model.view import ServerView

#: Families about the host or the exporter, not a server: exported once, without server labels.
GLOBAL_FAMILIES = frozenset(f.family for f in CATALOGUE if f.scope == HOST)

Unit = tuple[Mapping[str, str], list[Collector]]


def log_collectors(view: Callable[[], ServerView]) -> list[Collector]:
    """The collectors of what one server's log says, each rendering the unit's `view()` of the scrape."""
    return [
        ServerLogCollector(view),
        KVForecastCollector(view),
        CheckpointCacheCollector(view),
        RequestSizeCollector(view),
        LatencyCollector(view),
    ]


class Followed(Protocol):
    """One followed log, as the collector renders it (`exporter.unit.FollowedServer`)."""

    def units(self) -> Iterator[Unit]:
        """(labels, collectors) of the server, or of a router and each child it runs."""
        ...

    def pids(self) -> Iterator[int]:
        """The processes of the server (and of each router child) where /proc found them."""
        ...

    def nvml(self) -> NvmlSnapshot | None:
        """The NVML snapshot of this scrape."""
        ...

    def scraped(self) -> None:
        """The scrape is rendered: the next one gets new views."""
        ...


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

    def __init__(self, view: Callable[[], ServerView]) -> None:
        self._view = view  # the router's own unit's view of this scrape

    def collect(self) -> Iterator[Metric]:
        """Yield the router families, the router's own starts and its rejected lines."""
        view = self._view()
        r, main = view.router, view.state
        if r is None:
            return
        yield c.ROUTER_CHILDREN.gauge(len(r.children))
        yield c.ROUTER_CHILDREN_LIMIT.gauge(r.limit)
        yield c.ROUTER_CHILD_STARTS.counter(r.starts)
        yield c.ROUTER_CHILD_EXITS.counts(r.exits)
        yield c.ROUTER_CHILDREN_REFUSED.counter(r.refused)
        yield server_starts_family(main)  # the router's own
        yield rejected_lines_family(main)


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

    def __init__(self, servers: Sequence[Followed]) -> None:
        self.servers = servers

    def collect(self) -> Iterator[Metric]:
        try:
            units = [u for s in self.servers for u in s.units()]
            if len(units) == 1 and not units[0][0]:  # one plain server: its families as they are
                for collector in units[0][1]:
                    yield from collector.collect()
                return
            yield from merge_units(units)
            yield from self._gpu_sharing()
        finally:
            for s in self.servers:
                s.scraped()

    def _gpu_sharing(self) -> Iterator[Metric]:
        """How many followed servers are on each GPU's process list: more than one share its free memory."""
        snap = self.servers[0].nvml() if self.servers else None
        if snap is None or not snap.gpus:
            return
        pids = [pid for s in self.servers for pid in s.pids()]
        family = c.GPU_SERVERS.gauge()
        for g in snap.gpus:
            held = sum(1 for pid in pids if g.processes is not None and pid in g.processes)
            family.add_metric([str(g.index), g.uuid, g.name], held)
        yield family
