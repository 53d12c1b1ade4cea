"""Every metric family the exporter and the guard emit, collected from their real collectors fed with the
tests' states: each log golden's capture as the assembled exporter follows it (`assembly`), two servers
sharing GPUs over the fake pynvml (`fake_nvml`) with their process found, llama-server's HTTP endpoints
(a plain server's and a router's), the guard's books (`expositions.guard_collector`) and its books by client
with an access log. tests/unit/test_metric_catalogue.py holds what they emit against the catalogue
(`exporter.metrics.catalogue`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

from expositions import guard_collector, state_until
from fake_nvml import GIB, FakeNvml, h200
from log_goldens import CAPTURES, Capture
from paths import FIXTURES
from prometheus_client.core import Metric

from exporter.guard.access_log import AccessLog
from exporter.guard.accounting import Accounting, Record, handling
from exporter.guard.admission import Ticket
from exporter.guard.books import GuardBooks
from exporter.guard.client_metrics import ClientCollector
from exporter.guard.clients import ClientNamer
from exporter.logs.tail import LogTailer
from exporter.metrics.forecast import KVForecastCollector
from exporter.metrics.process import ProcCollector
from exporter.metrics.requests import RequestSizeCollector
from exporter.metrics.server_http import ServerHttpCollector
from exporter.metrics.servers import ServersCollector
from exporter.model.live import HostMemory, HttpSnapshot, ProcessInfo, ProcSnapshot
from exporter.model.server_cmdline import parse_command_line
from exporter.model.state import ServerState
from exporter.model.view import ServerView
from exporter.pipeline import LogPipeline
from exporter.sources.live import LiveSources
from exporter.sources.nvml import NvmlReader
from exporter.sources.procfs import ProcReader
from exporter.sources.server_http import parse_props
from exporter.unit import FollowedServer, refresh_all

#: What feeds which families, by name (the test says which feeder emitted a family it did not expect).
Emitted = dict[str, list[Metric]]


def capture_families(capture: Capture, tmp: Path) -> list[Metric]:
    """The families of one scrape of the assembled exporter after it followed `capture` (as its golden)."""
    with capture.followed(tmp) as exporter:
        exporter.refresh()
        return list(exporter.collector.collect())


def _server(tmp: Path, name: str, pid: int, nvml: NvmlReader | None, owner: LiveSources | None) -> FollowedServer:
    """A followed server over the exhaust capture whose process /proc found (with the host's memory)."""
    log = tmp / f"{name}.log"
    log.write_bytes((FIXTURES / "b11434" / "exhaust-lv4" / "llama-server.log").read_bytes())
    pipeline = LogPipeline(ServerState(), LogTailer(log))
    pipeline.replay_existing()
    live = LiveSources(pipeline.state, nvml=nvml)
    cmdline = parse_command_line(["llama-server", "-c", "512"], {})
    live.proc = ProcSnapshot(
        process=ProcessInfo(pid, 1, 1.7e9, 1 << 30, cmdline, "pid"), host=HostMemory(64 << 30, 32 << 30)
    )
    return FollowedServer({"server": name}, pipeline, live, nvml_owner=owner)


def gpu_families(tmp: Path) -> list[Metric]:
    """Two servers on two GPUs (NVML at the pynvml boundary, every optional figure answered, an Xid waiting)."""
    first = h200(0, 100, [(100, 40 * GIB), (200, 50 * GIB)])
    first.xids.append(79)
    fake = FakeNvml([first, h200(1, 60, [(200, None)])])
    a = _server(tmp, "a", 100, NvmlReader(fake), None)
    b = _server(tmp, "b", 200, None, a.live)
    asyncio.run(refresh_all([a, b]))
    return list(ServersCollector([a, b]).collect())


def http_families() -> list[Metric]:
    """llama-server's endpoints answered (its /props a recorded one, every field read from it: a field the
    collector exports is fed with no change here; one /metrics value not understood), and a router's."""
    props = parse_props(json.loads((FIXTURES / "b11434" / "checkpoints" / "props.json").read_text(encoding="utf-8")))
    status = {"/health": 200, "/slots": 200, "/props": 200, "/metrics": 200}
    server = HttpSnapshot(up=True, status=status, **props._asdict())
    router = HttpSnapshot(up=True, status={"/health": 200, "/models": 200})
    rejected = {"llamacpp:requests_deferred": 1}
    return [
        *ServerHttpCollector(lambda: server, lambda: rejected).collect(),
        *ServerHttpCollector(lambda: router, lambda: rejected).collect(),
    ]


def filling_families() -> list[Metric]:
    """A pool filling towards full (the time to full is known) with requests queued in the guard."""
    view = ServerView(state_until("exhaust-long-lv4", 328), requests_guard_queued=1)
    return [*KVForecastCollector(lambda: view).collect(), *RequestSizeCollector(lambda: view).collect()]


def proc_families() -> list[Metric]:
    """The process /proc found (the recorded tree of tests/fixtures/proc/single) and the host's memory."""
    snap = ProcReader(
        FIXTURES / "proc" / "single",
        page_size=4096,
        clock_ticks=100,
        self_pid=4243,
        log_file="/srv/llama/logs/llama-server.log",
    ).read()
    return list(ProcCollector(lambda: snap).collect())


async def _handled(accounting: Accounting, record: Record, ticket: Ticket) -> None:
    """A request admitted and ended, its counts made from inside its handler's context (as the proxy does)."""
    handling(record)
    accounting.bind(ticket, None, 64)
    books = GuardBooks(clients=accounting)
    books.count("admitted")
    books.waited(0.5)


def client_families(tmp: Path) -> list[Metric]:
    """The guard's books by client: two clients' requests handled to their end, an access log written."""
    access_log = AccessLog(str(tmp / "access.log"))
    accounting = Accounting(ClientNamer(), access_log)
    for tid, client in ((1, "orchestrator"), (2, "claude-cli")):
        asyncio.run(_handled(accounting, Record(f"r{tid}", client, "/completion", 0.0, 0.0), Ticket(tid, 100, 64)))
        access_log.write({"id": f"r{tid}", "client": client})
    try:
        return list(ClientCollector(accounting).collect())
    finally:
        access_log.close()


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    logging.disable(logging.WARNING)  # the exporter's warnings about each capture's verbosity: not wanted here
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def emitted(tmp: Path) -> Emitted:
    """Every feeder's families, by feeder."""
    out: Emitted = {}
    with _quiet():
        for capture in CAPTURES:
            folder = tmp / capture.id.replace("/", "_")
            folder.mkdir()
            out[f"golden {capture.id}"] = capture_families(capture, folder)
        (tmp / "gpus").mkdir()
        out["two servers on GPUs"] = gpu_families(tmp / "gpus")
        out["http"] = http_families()
        out["process"] = proc_families()
        out["filling pool"] = filling_families()
        out["guard"] = list(guard_collector().collect())
        (tmp / "clients").mkdir()
        out["guard by client"] = client_families(tmp / "clients")
    return out
