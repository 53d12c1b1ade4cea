"""Server units: one log's state, the live sources of the server that writes it, and the guard's hooks, made
into one immutable view per scrape that every collector of the unit renders.

A unit is built whole, everything passed in at construction and nothing set afterwards, the same way for
the server of a plain run, for each `--servers-file` entry and for each child of a router:

    line source ─▶ (router split ─▶) parse ─▶ ServerState ─┐
    live sources (NVML, /proc, HTTP) ──────────────────────┼─▶ ServerUnit ─▶ ServerView, once per scrape
    the guard's hooks (its queue, the prompts it measured) ┘

`FollowedServer` is one log: its unit (a plain server), or a router's own unit and one unit per child it
runs, whose live sources `child_live` opens when the child appears in the log and closes when it ends.
`refresh()` (the web app's `before_scrape`) reads the log up to now, then the live sources, then makes each
unit's view; the scrape renders those views and the next one makes new ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.registry import Collector

from exporter.metrics.exporter_health import ExporterCollector, SourcesUpCollector
from exporter.metrics.gpu import NvmlCollector
from exporter.metrics.live import live_collectors
from exporter.metrics.servers import RouterCollector, Unit, log_collectors
from exporter.model.activity import Activity
from exporter.model.forecast import Measured
from exporter.model.live import HttpSnapshot, NvmlSnapshot
from exporter.model.router import RouterChild, RouterLog
from exporter.model.state import ServerState
from exporter.model.view import ServerView, merge_view
from exporter.pipeline import LogPipeline
from exporter.settings import HostArea
from exporter.sources.live import LiveSources, SourceStatus

#: Builds a router child's live sources: the child, the router's live sources (its pid, its `/models`), and
#: the unit's name in the exporter's log lines.
ChildLive = Callable[[RouterChild, LiveSources, str], LiveSources]


def no_live(child: RouterChild, router: LiveSources, name: str) -> LiveSources:
    """A router child without live sources (none enabled, or the demo)."""
    return LiveSources(child.state, unit=name)


@dataclass(frozen=True)
class GuardHooks:
    """What the guard in front of a server adds to its view: the requests it holds in its queue (a gateway reads
    them as waiting), and by pool (None: the server's; a router's model name) the requests in flight whose
    prompts it counted at arrival (the forecast counts them before the log says their size)."""

    queued: Callable[[], int]
    measured: Callable[[str | None], Sequence[Measured]]


class ServerUnit:
    """One server's (or router child's) state, its live sources and the guard's hooks; `view()` is this scrape's.

    `pool` names the guard's pool of the unit (a router child's model); `nvml`, the live sources that read NVML
    for every unit (it is read once, by the first server); `router`, a router's children (its own unit)."""

    def __init__(
        self,
        state: ServerState,
        live: LiveSources,
        *,
        hooks: GuardHooks | None = None,
        pool: str | None = None,
        nvml: LiveSources | None = None,
        router: RouterLog | None = None,
        active_window: float = HostArea.kv_pool_active_window,
    ) -> None:
        self.state = state
        self.live = live
        self._activity = Activity()
        self._active_window = active_window
        self._hooks = hooks
        self._pool = pool
        self.nvml_owner = nvml or live
        self._router = router
        self._view: ServerView | None = None

    def make_view(self) -> ServerView:
        """The unit as the collectors render it now: the log's state merged with the live sources' last reads."""
        live, http = self.live, self.live.http
        # A router's own unit renders no forecast nor queue (its children do): the guard is not asked of it.
        hooks = self._hooks if self._router is None or not self._router.active else None
        state = merge_view(self.state, http)
        window = self._active_window
        active = self._activity.observe(time.monotonic(), state.run.slots, window, self.state.run)
        return ServerView(
            state,
            nvml=self.nvml_owner.nvml,
            proc=live.proc,
            http=http,
            requests_guard_queued=hooks.queued() if hooks is not None and self._pool is None else None,
            measured=tuple(hooks.measured(self._pool)) if hooks is not None else (),
            sources=live.readings(),
            http_rejected=dict(live.http_rejected),
            router=self._router,
            active_tokens=active if state.run.slot_count is not None else None,
            active_window=window,
            incidents=self.state.incidents.all(),
        )

    def refreshed(self) -> None:
        """The live sources were read for a scrape: make its view."""
        self._view = self.make_view()

    def view(self) -> ServerView:
        """This scrape's view: the one `refreshed()` made, else (a render without a refresh) one made now."""
        if self._view is None:
            self._view = self.make_view()
        return self._view

    def scraped(self) -> None:
        """The scrape is rendered: the next render gets a new view."""
        self._view = None

    def live_collectors(self) -> list[Collector]:
        """Collectors of the live sources' snapshots; NVML's of another unit's read, rendered with this pid."""
        live = self.live
        kinds = [
            k for k, r in (("nvml", live.nvml_reader), ("proc", live.proc_reader), ("http", live.http_reader)) if r
        ]
        out = live_collectors(self.view, kinds)
        if self.nvml_owner is not live and self.nvml_owner.nvml_reader is not None:
            out.append(NvmlCollector(lambda: self.view().nvml, lambda: self.view().pid))
        return out


@dataclass
class _Child:
    child: RouterChild
    unit: ServerUnit
    collectors: list[Collector]


class FollowedServer:
    """One log and the server (plain, or a router and its children) that writes it."""

    def __init__(
        self,
        labels: Mapping[str, str],
        pipeline: LogPipeline,
        live: LiveSources,
        *,
        child_live: ChildLive | None = None,
        hooks: GuardHooks | None = None,
        nvml_owner: LiveSources | None = None,
        active_window: float = HostArea.kv_pool_active_window,
    ) -> None:
        self.labels = dict(labels)
        self._active_window = active_window
        self.pipeline = pipeline
        self.live = live
        self.nvml_owner = nvml_owner or live
        self._child_live = child_live or no_live
        self._hooks = hooks
        self.unit = ServerUnit(
            pipeline.state,
            live,
            hooks=hooks,
            nvml=self.nvml_owner,
            router=pipeline.log.router,
            active_window=active_window,
        )
        self._children: dict[int, _Child] = {}  # port → unit of a child that runs now
        self._refreshing = asyncio.Lock()  # one refresh at a time: a second scrape must not close a child
        # whose reads the first one still awaits
        view = self.unit.view
        exporter = ExporterCollector(pipeline, lambda: view().sources)
        sources = self.unit.live_collectors()
        self._own = [*log_collectors(view), exporter, *sources]
        self._router_own: list[Collector] = [exporter, RouterCollector(view), *sources]

    @property
    def is_router(self) -> bool:
        return self.pipeline.log.router.active

    def nvml(self) -> NvmlSnapshot | None:
        """The NVML snapshot of this scrape (read once for all servers, by the first)."""
        return self.nvml_owner.nvml

    def pids(self) -> Iterator[int]:
        """The processes of the server, or of the router and each child it runs, where /proc found them."""
        lives = [self.live, *(c.unit.live for c in self._children.values())] if self.is_router else [self.live]
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

    def server_units(self) -> Iterator[tuple[dict[str, str], ServerUnit]]:
        """(labels, unit) of the server, or of the router and each child it runs (as `units()`)."""
        yield self.labels, self.unit
        if not self.is_router:
            return
        for port, child in self.pipeline.log.router.children.items():
            c = self._children.get(port)
            if c is not None and c.child is child:
                yield {**self.labels, "model": child.name}, c.unit

    def scraped(self) -> None:
        """The scrape is rendered: every unit makes a new view for the next."""
        self.unit.scraped()
        for c in self._children.values():
            c.unit.scraped()

    async def refresh(self) -> None:
        """The log up to now, then the live sources: the server's (the router's), then each child's; then each
        unit's view of this scrape. Never raises."""
        async with self._refreshing:
            await self._refresh()
        self.unit.refreshed()
        for c in self._children.values():
            c.unit.refreshed()

    async def _refresh(self) -> None:
        await self.pipeline.catch_up()  # the lines written so far first: a router's spawn lines name its children
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
            await asyncio.gather(*(c.unit.live.refresh() for c in self._children.values()))

    def _open_child(self, child: RouterChild) -> _Child:
        name = ", ".join(f"{k} {v}" for k, v in {**self.labels, "model": child.name}.items())
        live = self._child_live(child, self.live, name)
        unit = ServerUnit(
            child.state,
            live,
            hooks=self._hooks,
            pool=child.name,
            nvml=self.nvml_owner,
            active_window=self._active_window,
        )
        collectors = [
            *log_collectors(unit.view),
            SourcesUpCollector(lambda: unit.view().sources),
            *unit.live_collectors(),
        ]
        return _Child(child, unit, collectors)

    def statuses(self) -> Iterator[SourceStatus]:
        """The live sources' health: the server's (the router's) and each child's."""
        yield from self.live.statuses.values()
        for c in self._children.values():
            yield from c.unit.live.statuses.values()

    async def _close_children(self, ports: Iterable[int]) -> None:
        for port in list(ports):
            c = self._children.pop(port, None)
            if c is not None:
                await c.unit.live.close()

    async def close(self) -> None:
        await self._close_children(set(self._children))
        await self.live.close()


def model_gate(router: Callable[[], HttpSnapshot | None], name: str) -> Callable[[], tuple[str, bool] | None]:
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


async def refresh_all(servers: Sequence[FollowedServer]) -> None:
    """The web app's `before_scrape`: every server's log, live sources and views, concurrently."""
    if len(servers) == 1:  # no task to gather: one loop iteration less in every scrape
        await servers[0].refresh()
    else:
        await asyncio.gather(*(s.refresh() for s in servers))
