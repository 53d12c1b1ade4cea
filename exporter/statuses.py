"""The status page's wiring: each followed server's units as `status.document.UnitStatus`, made from the views a
scrape makes (`exporter.unit`), and the last hour of each unit sampled into its ring on a timer.

`/` and `/api/status` call `StatusSource.document()`: the same refresh as a scrape (`refresh_all`: the log up to
now, the live sources), then one document from each unit's view of it. The ring is sampled every
`history.STEP_SECONDS` from the log's state and the live sources' last reads (no read of its own, so a scrape
costs nothing more for it), and forgets a unit that is gone (a router child unloaded). A point's pool fill is
the fill then, or where the pool overflowed since the previous point, what the overflow's slots held of it:
the peak an incident's shape needs, at no cost on the log's hot path.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from exporter import __version__
from exporter.model.live import NvmlSnapshot
from exporter.model.state import ServerState
from exporter.model.view import merge_view
from exporter.status.document import LogStatus, UnitStatus, document, unit_name
from exporter.status.history import STEP_SECONDS, History
from exporter.unit import FollowedServer, ServerUnit, refresh_all

#: The guard's figures for its server's part of the page (None: no guard).
GuardFigures = Callable[[], Mapping[str, object]]


def gpu_free(nvml: NvmlSnapshot | None, pid: int | None) -> int | None:
    """Free VRAM of the GPUs the server uses (the least of them; every GPU where NVML lists no process of it)."""
    if nvml is None or not nvml.gpus:
        return None
    used = [g for g in nvml.gpus if pid is not None and g.processes and pid in g.processes]
    return min(g.free_bytes for g in (used or nvml.gpus))


def pool_ratio(state: ServerState) -> float | None:
    """Cells held / pool, as `llamacpp_kv_pool_usage_ratio` (None while the pool size is not known)."""
    capacity, _ = state.pool_capacity()
    return state.run.pool_used() / capacity if capacity else None


class StatusSource:
    """Every followed server's units for the page, and their rings."""

    def __init__(
        self,
        servers: Sequence[FollowedServer],
        *,
        demo: bool = False,
        guard: GuardFigures | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.servers = servers
        self.demo = demo
        self.guard = guard
        self.clock = clock
        self.histories: dict[str, History] = {}
        self.step = STEP_SECONDS

    def units(self) -> Iterator[tuple[Mapping[str, str], ServerUnit, FollowedServer]]:
        """(labels, unit, its followed server) of every unit now."""
        for server in self.servers:
            for labels, unit in server.server_units():
                yield labels, unit, server

    def sample(self, now: float | None = None) -> None:
        """One point of every unit's ring, from the log's state and the last live reads."""
        now = self.clock() if now is None else now
        seen: set[str] = set()
        for labels, unit, _ in self.units():
            name = unit_name(labels)
            seen.add(name)
            history = self.histories.get(name)
            if history is None:
                history = self.histories[name] = History()
            state = merge_view(unit.state, unit.live.http)
            pid = unit.live.proc.process.pid if unit.live.proc is not None and unit.live.proc.process else None
            aborted = sum(unit.state.requests_aborted.values())
            fill = pool_ratio(state)
            # An overflow between two points is the step's peak: the cells its slots held, of the pool.
            peaks = [
                i.held / i.pool
                for i in unit.state.incidents.all()
                if i.kind == "overflow" and i.pool and i.time is not None and now - self.step < i.time <= now
            ]
            if peaks:
                fill = max([fill or 0.0, *peaks])
            history.add(now, fill, gpu_free(unit.nvml_owner.nvml, pid), aborted)
        for name in set(self.histories) - seen:
            del self.histories[name]

    async def run(self, stop: asyncio.Event) -> None:
        """Sample every `step` seconds until `stop` is set."""
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.step)

    def statuses(self) -> list[UnitStatus]:
        """Every unit's status from its view of this scrape."""
        out: list[UnitStatus] = []
        first = True
        for labels, unit, server in self.units():
            p = server.pipeline
            own = unit is server.unit
            log = (
                LogStatus(
                    p.description, p.up, p.understood, p.problem, p.truncations, p.rotations, p.lost_bytes, p.long_lines
                )
                if own
                else None
            )
            history = self.histories.get(unit_name(labels))
            extra: dict[str, object] = {}
            if first and self.guard is not None:
                extra["guard"] = dict(self.guard())
            first = False
            out.append(UnitStatus(labels, unit.view(), log, history.snapshot() if history else None, extra))
        return out

    async def document(self, authorized: bool = True) -> dict[str, object]:
        """The document of now: the servers refreshed as for a scrape, then rendered from their views."""
        await refresh_all(self.servers)
        return document(self.statuses(), version=__version__, time=self.clock(), demo=self.demo, authorized=authorized)
