"""How follow() batches a writer's lines and paces its wake-ups to the writer, and a scrape that reads what
the log holds before it answers, without waiting for the batch or a flood. Driven: the follower runs on a
`ManualClock` that the test moves (a millisecond between two writes, a quiet spell), so its batch waits, its
looks at the file and a scrape's timeout end when the test says, and what happens before that was caused by
an event, a close or a scrape; the only real-time limit is the hang guard.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
from follow_watch import HANG_GUARD, ManualClock, Seen, use_watch, wait_until
from seq_log import append, lines_bytes, seqs

from exporter.logs import follow as follow_mod
from exporter.logs import watch as watch_mod
from exporter.logs.follow import CatchUp, follow
from exporter.logs.tail import LogTailer


async def test_follow_batches_a_busy_writer(tmp_path: Path) -> None:
    """A write every millisecond is read in batches (at most one drain per batch interval), and all of it."""
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    clock = ManualClock()
    task = asyncio.create_task(follow(t, seen, clock=clock, poll_interval=60, stop=stop, batch_interval=0.05))
    await wait_until(lambda: seen.has(0), "seq 0")
    with p.open("ab") as f:
        for i in range(1, 301):
            f.write(lines_bytes(i, i + 1))
            f.flush()
            await clock.advance(0.001)
    await clock.run_until(lambda: seen.has(300), "seq 300", within=1)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(301))
    assert seen.batches - 1 <= clock.now / 0.05 + 4  # not one batch per write (the first wait is 25 ms)


@pytest.mark.parametrize("watch", ["inotify", "watchdog"])
async def test_follow_reads_at_once_when_the_writer_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: str
) -> None:
    """A server's last lines are read when it closes the log, not after the batch wait: a restarted
    server truncates the file as it starts, so whatever is still unread at that moment is lost."""
    use_watch(monkeypatch, watch)
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    # Batch waits of 600 s: once the follower is busy, only the close can have it read before the test ends.
    monkeypatch.setattr(follow_mod, "BATCH_START", 600.0)
    clock = ManualClock()
    task = asyncio.create_task(follow(t, seen, clock=clock, poll_interval=60, stop=stop, batch_interval=600))
    await wait_until(lambda: t.last_error is not None, "the first (missing-file) poll")
    with p.open("wb") as f:
        for i in range(100):  # a write every few ms: two drains close together make the follower busy
            f.write(lines_bytes(i, i + 1))
            f.flush()
            await clock.advance(0.003)
    # Closed: the server exited. Read within the 600 s batch wait (the clock stays short of its end),
    # before a successor truncates the log.
    await clock.run_until(lambda: seen.has(99), "the last line before the close", within=1)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(100))
    # Busy: the writes were not read one by one (the waits grew 25, 50, 100, 200, 400 ms meanwhile).
    assert seen.batches <= 8


def record_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The timeout of every wait follow() makes from now on (batch waits and idle waits), in order."""
    waits: list[float] = []
    real_wait = watch_mod.Waker.wait

    async def recording_wait(self: Any, timeout: float) -> None:
        waits.append(timeout)
        await real_wait(self, timeout)

    monkeypatch.setattr(watch_mod.Waker, "wait", recording_wait)
    return waits


@pytest.mark.linux  # inotify
async def test_follow_cadence_adapts_to_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While lines keep coming the batch wait doubles from 25 ms up to the batch interval, never
    beyond it; a line after a quiet spell is read at once, alone, with no batch wait before it."""
    waits = record_waits(monkeypatch)
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    clock = ManualClock()
    task = asyncio.create_task(follow(t, seen, clock=clock, poll_interval=60, stop=stop, batch_interval=0.2))
    await wait_until(lambda: seen.has(0), "seq 0")
    with p.open("ab") as f:  # a stream: a line every 5 ms for 2 s
        for i in range(1, 401):
            f.write(lines_bytes(i, i + 1))
            f.flush()
            await clock.advance(0.005)
    await clock.run_until(lambda: seen.has(400), "seq 400", within=1)
    await clock.advance(0.5)  # quiet: the follower goes back to waiting for an event
    batches, waits_before = seen.batches, len(waits)
    append(p, 401, 402)
    await wait_until(lambda: seen.has(401), "the line after the quiet spell")  # the clock stands: its event
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(402))

    batch_waits = [w for w in waits[:waits_before] if w < 60]
    assert batch_waits[:4] == [0.025, 0.05, 0.1, 0.2]  # doubling...
    assert max(batch_waits) == 0.2 and batch_waits.count(0.2) >= 5  # ...up to the interval, never beyond
    for prev, w in itertools.pairwise(batch_waits):
        assert w in (min(2 * prev, 0.2), 0.025), batch_waits  # or starting over after a quiet read
    assert batches < 60  # 400 writes, read a few times a second
    # The quiet line: its own batch, read on its event (the idle wait is 60 s), no batch wait first.
    assert seen.batches == batches + 1
    assert all(w == 60 for w in waits[waits_before:])


async def _in_a_batch_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Seen, CatchUp, Any, Any, ManualClock]:
    """A follower busy with a writer, now in a 600 s batch wait (the first one, made long), on a clock that stands
    still (what the test sees before it moves it happened because of the scrape, however slow the host): the
    log, what it read, its CatchUp, its stop event, its task and its clock."""
    waits = record_waits(monkeypatch)
    monkeypatch.setattr(follow_mod, "BATCH_START", 600.0)
    # Without close events (the portable pass) the size probe would end the wait once the writer is quiet.
    monkeypatch.setattr(follow_mod, "PROBE_INTERVAL", 60)
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t, seen, catch_up, stop, clock = LogTailer(p), Seen(), CatchUp(), asyncio.Event(), ManualClock()
    task = asyncio.create_task(
        follow(t, seen, clock=clock, poll_interval=60, stop=stop, batch_interval=600, catch_up=catch_up)
    )
    await wait_until(lambda: seen.has(0), "seq 0")
    append(p, 1, 2)  # soon after the last read: busy, so the read of it is followed by a batch wait
    await wait_until(lambda: seen.has(1) and 600.0 in waits, "the batch wait")
    return p, seen, catch_up, stop, task, clock


async def test_a_scrape_reads_the_log_without_waiting_for_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrape (CatchUp) during a batch wait has the lines written before it read at once, and
    waits for that read (several chunks: it goes on when the read reaches where the log ended);
    the follower then goes on batching."""
    p, seen, catch_up, stop, task, clock = await _in_a_batch_wait(tmp_path, monkeypatch)
    n = 2
    while p.stat().st_size < 200_000:  # several of the tailer's reads, below CATCH_UP_MAX_BYTES
        append(p, n, n + 500)
        n += 500
    # The clock stands: neither the 600 s batch wait nor the scrape's own timeout can end; the scrape did.
    await asyncio.wait_for(catch_up(), HANG_GUARD)
    assert seen.has(n - 1), "the lines written before the scrape are read when it returns"
    batches = seen.batches
    append(p, n, n + 10)
    await clock.advance(0.3)
    assert seen.batches == batches  # still batching: the next read is at the end of the wait
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(n))


async def test_a_scrape_does_not_wait_for_a_flood(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With more unread than CATCH_UP_MAX_BYTES, a scrape only ends the batch wait: it answers with
    what was read so far while the follower reads the backlog."""
    p, seen, catch_up, stop, task, _clock = await _in_a_batch_wait(tmp_path, monkeypatch)
    n = 2
    while p.stat().st_size < 2 * follow_mod.CATCH_UP_MAX_BYTES:
        append(p, n, n + 1000)
        n += 1000
    await catch_up()
    assert not seen.has(2)  # returned before the follower read anything
    await wait_until(lambda: seen.has(n - 1), "the backlog, read before the 600 s wait ends")  # the clock stands
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(n))


async def test_a_scrape_before_or_after_the_follower_returns_at_once(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 1)
    catch_up = CatchUp()
    await asyncio.wait_for(catch_up(), HANG_GUARD)  # no follower yet
    t, seen, stop, clock = LogTailer(p), Seen(), asyncio.Event(), ManualClock()
    task = asyncio.create_task(follow(t, seen, clock=clock, poll_interval=60, stop=stop, catch_up=catch_up))
    await wait_until(lambda: seen.has(0), "seq 0")
    batches = seen.batches
    await asyncio.wait_for(catch_up(), HANG_GUARD)  # idle, nothing unread: at once (the clock stands)
    assert seen.batches == batches
    append(p, 1, 2)
    await catch_up()  # written just before the scrape, its filesystem event not handled yet: read now
    assert seen.has(1)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    await asyncio.wait_for(catch_up(), HANG_GUARD)  # stopped


async def test_a_scrape_reads_a_polled_log_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without filesystem events (--fs-events false) the follower idles until its next look at the file
    (its size probe, made 60 s here): a scrape reads what was written meanwhile."""
    monkeypatch.setattr(follow_mod, "PROBE_INTERVAL", 60)
    monkeypatch.setattr(follow_mod, "ACTIVE_SPAN", 0)  # not even in the second after a line
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t, seen, stop, catch_up, clock = LogTailer(p), Seen(), asyncio.Event(), CatchUp(), ManualClock()
    task = asyncio.create_task(
        follow(t, seen, clock=clock, poll_interval=60, use_watchdog=False, stop=stop, catch_up=catch_up)
    )
    await wait_until(lambda: seen.has(0), "seq 0")
    append(p, 1, 10)
    await clock.advance(0.1)
    assert not seen.has(1)  # looked at every 60 s
    await asyncio.wait_for(catch_up(), HANG_GUARD)
    assert seen.has(9)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)


async def test_follow_batches_a_writer_that_closes_after_every_write(tmp_path: Path) -> None:
    """`echo line >> log` closes the file after each line: those closes do not end the batch wait."""
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    clock = ManualClock()
    task = asyncio.create_task(follow(t, seen, clock=clock, poll_interval=60, stop=stop, batch_interval=0.05))
    await wait_until(lambda: seen.has(0), "seq 0")
    for i in range(1, 301):
        append(p, i, i + 1)
        await clock.advance(0.001)
    await clock.run_until(lambda: seen.has(300), "seq 300", within=1)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(301))
    assert seen.batches - 1 <= clock.now / 0.05 + 3  # not one batch per write
