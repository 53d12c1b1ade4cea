"""The guard's latency by client, in process: the real guard (`start_guard`) in front of the scripted upstream
(tests/support/scripted_upstream.py), which holds each request until the test lets it go.

Each check is causal: the guard's interval lies inside the client's own (the client sent before the guard's
clock started and read after it stopped) and contains the upstream's hold (the test's own clock, the same
monotonic clock, read at the upstream's arrival and at its release). Only answers that came whole with a 2xx
are timed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from guard_rig import Rig, rig
from prometheus_client import CollectorRegistry

from exporter.guard.accounting import Accounting
from exporter.guard.books import WAIT_BUCKETS
from exporter.guard.client_metrics import ClientCollector
from exporter.guard.clients import ClientNamer
from exporter.model.latency import DURATION_BUCKETS, TTFT_BUCKETS


@asynccontextmanager
async def named() -> AsyncIterator[Rig]:
    """The guard, its clients named by the `X-Client-Name` header."""
    async with rig(accounting=Accounting(ClientNamer(header="X-Client-Name", sources=["header"]))) as r:
        yield r


@dataclass
class Measured:
    """What the client measured of one request (monotonic seconds)."""

    status: int
    sent: float
    first: float  # the first body bytes read
    end: float  # the body read whole


async def post(r: Rig, client: str, body: dict[str, object]) -> Measured:
    sent = time.monotonic()
    async with r.session.post(r.url + "/completion", json=body, headers={"X-Client-Name": client}) as resp:
        await resp.content.readany()
        first = time.monotonic()
        await resp.read()
        return Measured(resp.status, sent, first, time.monotonic())


async def test_a_stream_is_timed_inside_its_clients_interval_and_around_the_upstreams_hold() -> None:
    async with named() as r:
        r.up.hold("s", "s+")
        task = asyncio.ensure_future(post(r, "chat", {"prompt": "a b c", "tag": "s", "script": "stream-hold"}))
        await r.up.arrived("s")
        arrived = time.monotonic()  # the guard's clock started before this
        opened = time.monotonic()
        r.up.release("s")  # the first event goes now: the guard's time to first byte ends after this
        record = next(iter(r.guard.guard.accounting.records.values()))
        while record.first_byte is None:
            await asyncio.sleep(0.01)
        released = time.monotonic()  # the guard's clock stops after this
        r.up.release("s+")
        m = await task
        books = r.client("chat")
        assert m.status == 200 and books.first_bytes.count == books.durations.count == 1
        ttfb, e2e = books.first_bytes.sum, books.durations.sum
        assert opened - arrived <= ttfb and released - arrived <= e2e  # contain the upstream's holds
        assert ttfb <= e2e <= m.end - m.sent  # inside the client's interval
        assert ttfb <= m.first - m.sent


async def test_the_first_byte_is_stamped_when_the_head_goes_not_per_chunk() -> None:
    async with named() as r:
        r.up.hold("s", "s+")
        task = asyncio.ensure_future(post(r, "chat", {"prompt": "a", "tag": "s", "script": "stream-hold"}))
        await r.up.arrived("s")
        start = time.monotonic()
        r.up.release("s")
        record = next(iter(r.guard.guard.accounting.records.values()))
        while record.first_byte is None:
            await asyncio.sleep(0.01)
        assert record.first_byte >= start and record.last_byte is None  # the first event went; the end waits
        await asyncio.sleep(0.05)
        stamped = record.first_byte
        hold = time.monotonic()
        r.up.release("s+")
        m = await task
        assert m.status == 200 and record.first_byte == stamped and record.last_byte is not None
        assert record.last_byte >= hold  # the end after the rest came
        books = r.client("chat")
        assert books.first_bytes.sum == stamped - record.t0 and books.durations.sum == record.last_byte - record.t0


async def test_refusals_errors_and_a_client_gone_are_counted_never_timed() -> None:
    async with named() as r:
        failed = await post(r, "batch", {"prompt": "a", "tag": "f", "script": "fail"})
        assert failed.status == 500
        answered = await post(r, "batch", {"prompt": "a", "tag": "a"})  # a whole answer, not streamed
        assert answered.status == 200
        # A client that leaves mid-stream: its handler is cancelled, its answer never came whole.
        r.up.hold("g+")
        async with r.session.post(
            r.url + "/completion",
            json={"prompt": "a", "tag": "g", "script": "stream-hold"},
            headers={"X-Client-Name": "batch"},
        ) as resp:
            await resp.content.readany()
        await r.up.was_cancelled("g")
        while r.client("batch").in_flight:
            await asyncio.sleep(0.01)
        books = r.client("batch")
        assert books.first_bytes.count == books.durations.count == 1  # the whole 2xx answer only
        assert books.first_bytes.sum <= books.durations.sum <= answered.end - answered.sent
        assert books.outcomes["admitted"] == 3


async def test_the_families_are_histograms_by_client_in_the_latency_buckets() -> None:
    async with named() as r:
        for name in ("a", "b"):
            assert (await post(r, name, {"prompt": "x", "tag": name})).status == 200
        registry = CollectorRegistry()
        registry.register(ClientCollector(r.guard.guard.accounting))
        families = {f.name: f for f in registry.collect()}
        for family, bounds in (
            ("llamacpp_guard_client_time_to_first_byte_seconds", TTFT_BUCKETS),
            ("llamacpp_guard_client_request_duration_seconds", DURATION_BUCKETS),
            ("llamacpp_guard_client_queue_wait_seconds", WAIT_BUCKETS),
        ):
            f = families[family]
            assert f.type == "histogram"
            counts = {s.labels["client"]: s.value for s in f.samples if s.name.endswith("_count")}
            les = {s.labels["le"] for s in f.samples if s.name.endswith("_bucket") and s.labels["client"] == "a"}
            assert les == {str(b) for b in bounds} | {"+Inf"}
            if family != "llamacpp_guard_client_queue_wait_seconds":
                assert counts == {"a": 1, "b": 1}
