"""Benchmark: what the books by client add to each request on the guard's path, in-process. Prints a table.

    $ .venv/bin/python bench/guard_accounting.py              # 20,000 requests, a few seconds
    $ .venv/bin/python bench/guard_accounting.py --requests 2000

The guard's wrapper (`Accounting.wrap`) around a handler that answers at once, against the same handler
unwrapped, alternated request by request: per request it names the client (a header, an API key's digest
looked up, the User-Agent, the address), makes the record, counts two outcomes through `GuardBooks`, and
queues the access log line for the writer thread (a real file under a temporary folder). Also the
monitor's `placed` for 16 requests (once per read of `/slots`) and one scrape of the client families with
17 clients. Time is the thread's CPU time (`time.thread_time_ns`), so other processes on the host do not
count; the writer thread's work is off the request path (its lines written and dropped are reported).
Exits 1 when the added p99 passes 5 ms, the guard bench's limit for a small request.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402
from aiohttp.test_utils import make_mocked_request  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from exporter.guard.access_log import AccessLog  # noqa: E402
from exporter.guard.accounting import Accounting, Record  # noqa: E402
from exporter.guard.admission import Ticket  # noqa: E402
from exporter.guard.books import GuardBooks  # noqa: E402
from exporter.guard.client_metrics import ClientCollector  # noqa: E402
from exporter.guard.clients import ClientNamer, key_digest  # noqa: E402
from exporter.guard.preempt import SlotView  # noqa: E402

LIMIT_MS = 5.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


async def run(n: int, folder: Path) -> dict[str, float]:
    keys = {key_digest(f"sk-{i}"): f"team-{i}" for i in range(8)}
    namer = ClientNamer(header="X-Client-Name", keys=keys, max_clients=16)
    log = AccessLog(str(folder / "access.log"))
    accounting = Accounting(namer, log)
    books = GuardBooks(clients=accounting)
    ids = iter(range(1, 10 * n))

    async def handler(request: web.Request) -> web.StreamResponse:
        ticket = Ticket(next(ids), prompt=120, budget=256)
        accounting.bind(ticket, None, 256)
        books.count("admitted")
        books.count("queued")
        return web.Response(status=200)

    wrapped = accounting.wrap(handler)
    headers = [
        {"X-Client-Name": "orchestrator"},
        {"Authorization": "Bearer sk-3", "User-Agent": "OpenAI/Python 1.99.1"},
        {"User-Agent": "claude-cli/1.0.61 (external, cli)"},
        {},
    ]
    requests = [make_mocked_request("POST", "/v1/chat/completions", headers=headers[i % 4]) for i in range(64)]
    plain, accounted = [], []
    for i in range(n):
        request = requests[i % len(requests)]
        t0 = time.thread_time_ns()
        await handler(request)
        t1 = time.thread_time_ns()
        await wrapped(request)
        t2 = time.thread_time_ns()
        plain.append((t1 - t0) / 1e6)
        accounted.append((t2 - t1) / 1e6)
    added = [a - p for a, p in zip(accounted, plain, strict=True)]
    # The monitor's side: 16 requests placed at once, once per read of /slots.
    accounting.records = {
        tid: Record(f"b{tid}", f"client-{tid}", "/completion", 0.0, 0.0, ticket=Ticket(tid, 120, 256))
        for tid in range(1, 17)
    }
    slots = {tid: SlotView(tid, held=400 + tid, prompt=120, n_predict=256, task=tid) for tid in range(1, 17)}
    t0 = time.thread_time_ns()
    for _ in range(1000):
        accounting.placed(range(1, 17), slots)
    placed_ms = (time.thread_time_ns() - t0) / 1e6 / 1000
    registry = CollectorRegistry()
    registry.register(ClientCollector(accounting))
    t0 = time.thread_time_ns()
    for _ in range(200):
        generate_latest(registry)
    scrape_ms = (time.thread_time_ns() - t0) / 1e6 / 200
    log.close()
    return {
        "requests": n,
        "plain_p50": statistics.median(plain),
        "accounted_p50": statistics.median(accounted),
        "added_p50": statistics.median(added),
        "added_p99": pct(added, 0.99),
        "added_max": max(added),
        "placed_ms": placed_ms,
        "scrape_ms": scrape_ms,
        "written": log.written,
        "dropped": sum(log.dropped.values()),
        "clients": len(accounting.clients),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        r = asyncio.run(run(args.requests, Path(tmp)))
    print(f"{int(r['requests']):,} requests through Accounting.wrap, CPU ms of the request's own thread")
    print("| measure | value | limit |")
    print("|---|---|---|")
    print(f"| handler alone, p50 | {r['plain_p50']:.4f} ms | |")
    print(f"| handler through the books by client, p50 | {r['accounted_p50']:.4f} ms | |")
    added = f"{r['added_p50']:.4f} / {r['added_p99']:.4f} / {r['added_max']:.3f} ms"
    print(f"| added per request, p50 / p99 / max | {added} | p99 ≤ {LIMIT_MS:g} ms |")
    print(f"| monitor: 16 requests placed, per read of /slots | {r['placed_ms']:.4f} ms | |")
    print(f"| scrape of the client families ({int(r['clients'])} clients) | {r['scrape_ms']:.3f} ms | |")
    print(f"| access log lines written / dropped | {int(r['written']):,} / {int(r['dropped']):,} | |")
    return 0 if r["added_p99"] <= LIMIT_MS else 1


if __name__ == "__main__":
    sys.exit(main())
