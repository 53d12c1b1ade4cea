"""Expositions built in process, shared by the unit tests that read them and the promtool checks that
lint them (tests/real_server/test_exposition_promtool.py): a capture's log state, a router's children,
NVML's GPUs, the guard's books."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from paths import FIXTURES
from prometheus_client import CollectorRegistry, generate_latest

from exporter.guard.admission import Admission, Pool, Ticket
from exporter.guard.books import GuardBooks, GuardCollector
from exporter.logs.parse import parse_line
from exporter.metrics.catalogue.guard import Outcome
from exporter.metrics.exporter_health import ExporterCollector
from exporter.metrics.forecast import KVForecastCollector
from exporter.metrics.live import live_collectors
from exporter.metrics.server_log import ServerLogCollector
from exporter.metrics.servers import ServersCollector
from exporter.model.state import ServerState
from exporter.model.view import ServerView
from exporter.pipeline import LogPipeline
from exporter.sources.live import LiveSources
from exporter.sources.nvml import NvmlReader
from exporter.unit import FollowedServer, ServerUnit, refresh_all


def state_until(name: str, last_line: int) -> ServerState:
    """The state after the first ``last_line`` lines of the b11434 capture ``name``."""
    state = ServerState()
    lines = (FIXTURES / "b11434" / name / "llama-server.log").read_text(encoding="utf-8").splitlines()
    for line in lines[:last_line]:
        event = parse_line(line)
        if event is not None:
            state.apply(event)
    return state


def log_registry(state: ServerState) -> CollectorRegistry:
    """The log's collectors (server log, forecast) on ``state``."""
    registry = CollectorRegistry()
    registry.register(ServerLogCollector(lambda: ServerView(state)))
    registry.register(KVForecastCollector(lambda: ServerView(state)))
    return registry


class LogStatus:
    """A follower's status, as the exporter's own collector reads it."""

    up = True
    lines = 414
    replayed_lines = 0
    truncations = 1
    rotations = 0
    lost_bytes = 0
    long_lines = 0
    understood = True


#: The recorded router run (tests/fixtures/router/README.md).
ROUTER = FIXTURES / "router"
ROUTER_LINES = (ROUTER / "router.log").read_text().splitlines()
SNAPSHOT_AT = 648  # lines before beta's unload: the /slots snapshots were taken there


def router_exposition(pipeline: LogPipeline) -> str:
    """One scrape of the multi-server collector following ``pipeline`` (a router's log)."""
    live = LiveSources(pipeline.state)
    server = FollowedServer({}, pipeline, live)
    collector = ServersCollector([server])
    asyncio.run(refresh_all([server]))  # opens the children's live sources (none reads here: no URL, no /proc)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(collector)
    return generate_latest(registry).decode()


#: llama-server's pid in the NVML tests' fake process lists.
SERVER_PID = 4242


def nvml_live(reader: NvmlReader) -> tuple[LiveSources, CollectorRegistry]:
    """Live sources reading only NVML through ``reader``, and a registry of their collectors."""
    live = LiveSources(ServerState(), nvml=reader)
    view = ServerUnit(live.state, live).make_view  # a view made at each render, as each scrape makes one
    reg = CollectorRegistry()
    for c in live_collectors(view, ["nvml"]):
        reg.register(c)
    reg.register(
        ExporterCollector(
            SimpleNamespace(
                up=True,
                lines=0,
                replayed_lines=0,
                truncations=0,
                rotations=0,
                lost_bytes=0,
                long_lines=0,
                understood=True,
            ),
            lambda: view().sources,
        )
    )
    return live, reg


def guard_collector() -> GuardCollector:
    """The guard's real collector over real books and admission: per minute, 120 requests admitted, 60 queued,
    6 refused, 3 preempted and replayed; waits of 0.5 s (240), 2.5 s (120) and 20.75 s (240); now one request of
    400 + 100 tokens in flight and one waiting, on a pool of 1000 cells."""
    books = GuardBooks()
    counts: tuple[tuple[Outcome, int], ...] = (
        ("admitted", 120),
        ("queued", 60),
        ("refused", 6),
        ("preempted", 3),
        ("replayed", 3),
    )
    for outcome, n in counts:
        for _ in range(n):
            books.count(outcome)
    for seconds, n in ((0.5, 240), (2.5, 120), (20.75, 240)):
        for _ in range(n):
            books.waited(seconds)
    admission, pool = Admission(max_queue=2, max_wait=60.0), Pool(capacity=1000, slot_window=1000, unified=True)
    assert admission.offer(Ticket(1, prompt=400, budget=100), pool, now=0.0).kind == "admit"
    assert admission.offer(Ticket(2, prompt=450, budget=100), pool, now=0.0).kind == "queue"
    return GuardCollector(books, lambda: [admission], lambda: pool.limit)
