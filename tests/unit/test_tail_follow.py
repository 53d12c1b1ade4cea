"""follow() with a real filesystem watch (inotify on the event loop on Linux, a watchdog observer elsewhere
and as the fallback): rotation and truncation seen, idle when nothing happens, stopped and cancelled
cleanly, a parent directory created later, and the fallbacks when a watch is refused. Driven: the follower
runs on a `ManualClock` that stands still unless the test moves it, so a read before the test moves it was
caused by a filesystem event (or a stop); the only real-time limit is the hang guard.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from follow_watch import HANG_GUARD, ManualClock, Seen, live_watches, use_watch, wait_until
from seq_log import append, lines_bytes, seqs

from exporter.logs import watch as watch_mod
from exporter.logs.follow import follow
from exporter.logs.tail import LogTailer


def refuse_watches(monkeypatch: pytest.MonkeyPatch, refused: Callable[[int], bool]) -> None:
    """inotify_add_watch fails as it does at fs.inotify.max_user_watches (ENOSPC) for the masks `refused` picks."""
    found = watch_mod.libc_with_inotify()
    if found is None:
        pytest.skip("no inotify here")
    libc: ctypes.CDLL = found

    class Refusing:
        inotify_init1 = libc.inotify_init1
        inotify_rm_watch = libc.inotify_rm_watch

        @staticmethod
        def inotify_add_watch(fd: int, path: bytes, mask: int) -> int:
            if refused(mask):
                ctypes.set_errno(errno.ENOSPC)
                return -1
            return int(libc.inotify_add_watch(fd, path, mask))

    monkeypatch.setattr(watch_mod, "libc_with_inotify", Refusing)


@pytest.mark.parametrize("watch", ["inotify", "watchdog"])
async def test_follow_watchdog_rotation_and_truncation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: str
) -> None:
    use_watch(monkeypatch, watch)
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    # Batch waits run out on the clock; the 60 s poll timer never fires: every read is woken by an event.
    clock = ManualClock()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, clock=clock))
    await wait_until(lambda: t.last_error is not None, "the first (missing-file) poll")

    async def write(f: Any, start: int, stop_: int) -> None:
        for i in range(start, stop_, 50):
            f.write(lines_bytes(i, min(i + 50, stop_)))
            f.flush()
            await asyncio.sleep(0)

    with p.open("ab") as f:
        await write(f, 0, 700)
        await clock.run_until(lambda: seen.has(699), "seq 699", within=5)
        p.rename(tmp_path / "server.log.1")
    with p.open("ab") as f:
        await write(f, 700, 1400)
        await clock.run_until(lambda: seen.has(1399), "seq 1399", within=5)
    with p.open("wb") as f:  # llama-server restart
        await write(f, 1400, 2000)
        await clock.run_until(lambda: seen.has(1999), "seq 1999", within=5)

    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(2000))
    assert (t.stats.rotations, t.stats.truncations, t.stats.lost_bytes) == (1, 1, 0)
    assert clock.now < 60  # the poll timer never fired
    assert not live_watches()


async def test_follow_reads_a_backlog_in_chunks_on_one_wake(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    t = LogTailer(p, chunk_bytes=1024)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, clock=ManualClock()))
    await wait_until(lambda: t.last_error is not None, "the first poll")
    observed: list[int] = []

    async def ticker() -> None:
        while True:
            observed.append(seen.batches)
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    p.write_bytes(lines_bytes(0, 3000))  # one write, a handful of events, ~270 KB
    await wait_until(lambda: seen.has(2999), "seq 2999")
    ticking.cancel()
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(3000))
    assert seen.batches > 100  # delivered chunk by chunk...
    assert any(0 < n < seen.batches for n in observed)  # ...yielding to other tasks in between


async def test_follow_is_idle_when_nothing_happens(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 3)
    t = LogTailer(p)
    polls = 0
    real_poll = t.poll

    def counting_poll(max_bytes: int | None = None) -> list[str]:
        nonlocal polls
        polls += 1
        return real_poll(max_bytes)

    t.poll = counting_poll  # type: ignore[method-assign]
    seen = Seen()
    stop = asyncio.Event()
    # The clock moves only a second between lines (a quiet spell): the 60 s timer never wakes it, only events.
    clock = ManualClock()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, clock=clock))
    await wait_until(lambda: seen.has(2), "seq 2")
    for i in (3, 4):
        await clock.advance(1)
        # Absence of activity needs a window (not a deadline: a slow host only makes it see less): our own
        # open/read of the file must not wake us up, and a handled event must not leave us spinning.
        await asyncio.sleep(0.05)
        settled = polls
        await asyncio.sleep(0.05)
        assert polls == settled <= 6 * (i - 2)
        append(p, i, i + 1)
        await wait_until(lambda: seen.has(i), f"seq {i}")  # noqa: B023 (awaited right here)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert clock.now == 2


async def test_follow_poll_only_uses_stat_fallback(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    clock = ManualClock()
    t = LogTailer(p, clock=clock)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=1, use_watchdog=False, stop=stop, clock=clock))
    await wait_until(lambda: t.last_error is not None, "the first poll")
    assert not live_watches()
    append(p, 0, 100)
    await clock.run_until(lambda: seen.has(99), "seq 99", within=1)  # a look at the file, or the timer
    p.rename(tmp_path / "server.log.1")
    append(p, 100, 200)
    await clock.run_until(lambda: seen.has(199), "seq 199", within=1)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(200))
    assert t.stats.rotations == 1


async def test_follow_returns_promptly_on_stop(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 3)
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    clock = ManualClock()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, clock=clock))
    await wait_until(lambda: seen.has(2), "seq 2")
    assert live_watches()
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert clock.now == 0  # the stop ended the 60 s wait: no timer had to fire
    assert not live_watches()


async def test_follow_cancellation_stops_observer(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    t = LogTailer(p)
    task = asyncio.create_task(follow(t, Seen(), poll_interval=60, clock=ManualClock()))
    await wait_until(lambda: t.last_error is not None, "the first poll")
    assert live_watches()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not live_watches()


async def test_follow_parent_directory_created_later(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    p = d / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    clock = ManualClock()
    task = asyncio.create_task(follow(t, seen, poll_interval=1, stop=stop, clock=clock))
    await wait_until(lambda: t.last_error is not None, "the first poll")
    assert not live_watches()  # nothing to watch yet
    d.mkdir()
    append(p, 0, 10)
    await clock.run_until(lambda: seen.has(9), "seq 9", within=1)  # the poll timer: nothing watched it
    await wait_until(lambda: bool(live_watches()), "the watch to be scheduled")
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(10))


async def test_follow_falls_back_to_polling_when_watchdog_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenObserver:
        def start(self) -> None:
            raise OSError(errno.EMFILE, "inotify instance limit reached")

    monkeypatch.setattr(watch_mod, "libc_with_inotify", lambda: None)  # no inotify: watchdog's turn
    monkeypatch.setattr(watch_mod, "Observer", BrokenObserver)
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="exporter.logs.follow"):
        clock = ManualClock()
        task = asyncio.create_task(follow(t, seen, poll_interval=1, stop=stop, clock=clock))
        append(p, 0, 10)
        await clock.run_until(lambda: seen.has(9), "seq 9", within=1)
        append(p, 10, 20)
        await clock.run_until(lambda: seen.has(19), "seq 19", within=1)
        stop.set()
        await asyncio.wait_for(task, HANG_GUARD)
    warnings = [r for r in caplog.records if r.name == "exporter.logs.follow"]
    assert len(warnings) == 1 and "falling back to polling" in warnings[0].getMessage()
    assert seqs(seen.lines) == list(range(20))


@pytest.mark.linux  # inotify
async def test_follow_falls_back_to_polling_when_inotify_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    refuse_watches(monkeypatch, lambda mask: True)
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="exporter.logs.follow"):
        clock = ManualClock()
        task = asyncio.create_task(follow(t, seen, poll_interval=1, stop=stop, clock=clock))
        append(p, 0, 10)
        await clock.run_until(lambda: seen.has(9), "seq 9", within=1)
        assert not live_watches()
        append(p, 10, 20)
        await clock.run_until(lambda: seen.has(19), "seq 19", within=1)
        stop.set()
        await asyncio.wait_for(task, HANG_GUARD)
    warnings = [r for r in caplog.records if r.name == "exporter.logs.follow"]
    assert len(warnings) == 1 and "falling back to polling" in warnings[0].getMessage()
    assert seqs(seen.lines) == list(range(20))


@pytest.mark.linux  # inotify
async def test_follow_without_the_close_watch_still_watches_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No watch left for the second instance: one warning, and changes still wake the follower."""
    refuse_watches(monkeypatch, lambda mask: mask & watch_mod.IN_CHANGES == watch_mod.IN_CLOSE_WRITE)  # "closes"
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="exporter.logs.follow"):
        task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, clock=ManualClock()))
        await wait_until(lambda: t.last_error is not None, "the first (missing-file) poll")
        append(p, 0, 10)
        await wait_until(lambda: seen.has(9), "seq 9")  # the clock never moves: the changes watch woke it
        assert len(live_watches()) == 1
        stop.set()
        await asyncio.wait_for(task, HANG_GUARD)
    warnings = [r.getMessage() for r in caplog.records if r.name == "exporter.logs.follow"]
    assert len(warnings) == 1 and "closing its log" in warnings[0]
    assert not live_watches()
