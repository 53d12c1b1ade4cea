"""Driving follow() from a test: a clock that stands still until the test moves it (`ManualClock`), a wait
on a condition (`wait_until`, with a hang guard only, never a fixed sleep), the batches it delivers, the
filesystem watches the process holds, and inotify or watchdog.

With `ManualClock` no wait of the follower ends by itself: a batch wait, a poll timer, a probe's look or a
scrape's timeout comes when the test moves the clock, so what a test sees before it does was caused by a
filesystem event, a writer's close, a scrape or a stop, however slow the host. The only real-time limit is
`HANG_GUARD`, which fires only if the code hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from seq_log import seqs
from watchdog.observers.api import BaseObserver

from exporter.logs import watch as watch_mod

#: Real seconds after which a wait is taken for a hang: the only wall-clock limit of the follower's tests.
HANG_GUARD = 60.0


async def wait_until(cond: Callable[[], bool], what: str, timeout: float = HANG_GUARD) -> None:
    """Wait until `cond()` holds, letting the event loop run (filesystem events come in); fail naming `what`
    only if it never does (`timeout`: a hang guard, not a margin)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"hung waiting for {what}")
        await asyncio.sleep(0.002)


async def settle(rounds: int = 20) -> None:
    """Let the event loop run what is ready (a woken follower's pass, the events already in), `rounds` turns."""
    for _ in range(rounds):
        await asyncio.sleep(0)


@dataclass(order=True)
class _Timer:
    when: float
    seq: int
    callback: Callable[..., object] = field(compare=False)
    args: tuple[Any, ...] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """follow()'s clock in a test (`exporter.logs.watch.Clock`), and the tailer's (it is callable): it stands
    still until the test moves it (`advance`, `run_until`); the timers due then fire at their times, in order,
    each one's effect run before the next fires. `delays` lists the delays of the timers set, in order."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now
        self.delays: list[float] = []
        self._timers: list[_Timer] = []
        self._seq = 0

    def __call__(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> _Timer:
        timer = _Timer(self.now + delay, self._seq, callback, args)
        self._seq += 1
        self.delays.append(delay)
        heapq.heappush(self._timers, timer)
        return timer

    def next_timer(self) -> float | None:
        """When the next timer set and not cancelled is due; None when there is none."""
        while self._timers and self._timers[0].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0].when if self._timers else None

    async def advance(self, seconds: float) -> None:
        """Move the clock `seconds` on, firing every timer due meanwhile at its time."""
        until = self.now + seconds
        while (when := self.next_timer()) is not None and when <= until:
            timer = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            timer.callback(*timer.args)
            await settle()
        self.now = until
        await settle()

    async def run_until(self, cond: Callable[[], bool], what: str, *, within: float = math.inf) -> float:
        """Let the follower run until `cond()` holds, moving the clock to the next timer whenever what is
        ready has run, but never more than `within` seconds on from now: a timer later than that does not
        fire (say, a 60 s poll timer), so what the follower does then must be caused by something else (a
        filesystem event). Fails only if it hangs. Returns the seconds it took on the clock."""
        loop = asyncio.get_running_loop()
        start, deadline = self.now, loop.time() + HANG_GUARD
        while True:
            await settle()
            if cond():
                return self.now - start
            if loop.time() > deadline:
                raise AssertionError(f"hung waiting for {what} (the clock at {self.now - start} s)")
            when = self.next_timer()
            if when is None or when - start > within:
                await asyncio.sleep(0.001)  # no timer to fire: something (the kernel, a thread) must come in
            else:
                await self.advance(when - self.now)


def live_watches() -> list[str]:
    """The filesystem watches this process holds: watchdog observer threads and inotify instances (Linux)."""
    watches = [th.name for th in threading.enumerate() if isinstance(th, BaseObserver) and th.is_alive()]
    fds = Path("/proc/self/fd")
    for fd in fds.iterdir() if fds.is_dir() else ():
        with contextlib.suppress(OSError):
            if str(fd.readlink()) == "anon_inode:inotify":
                watches.append(f"inotify fd {fd.name}")
    return watches


class Seen:
    """follow()'s on_lines callback: every line it delivered, and how many batches."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.batches = 0

    def __call__(self, batch: Sequence[str]) -> None:
        assert batch, "on_lines called with an empty batch"
        self.lines += batch
        self.batches += 1

    def has(self, i: int) -> bool:
        return bool(self.lines) and seqs(self.lines[-1:])[0] >= i


def use_watch(monkeypatch: pytest.MonkeyPatch, watch: str) -> None:
    """Have follow() use watchdog, or our own inotify watch (skipped where there is none)."""
    if watch == "watchdog":
        monkeypatch.setattr(watch_mod, "libc_with_inotify", lambda: None)
    elif watch_mod.libc_with_inotify() is None:
        pytest.skip("no inotify here")
