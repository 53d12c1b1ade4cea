"""Drive a `LogTailer` as its file changes: filesystem events, a timer, and batching under load.

`LogTailer.poll` (``exporter.logs.tail``) makes every decision about the file; `follow` only decides
when to call it.

It wakes on filesystem events for the path and on a ``poll_interval`` timer. The timer is the real
guarantee: inotify loses events (queue overflow), and does not work on NFS or for writes made on
another host or another overlayfs layer. Events only reduce latency. Truncation has no event of its
own: it arrives as an ordinary modification. On Linux the events come from inotify read on the
event loop itself (``watch.InotifyWatch``); elsewhere, or without inotify, from a watchdog observer
thread. File I/O runs on the event loop thread; reads are bounded by ``chunk_bytes`` and the driver
yields between chunks.

Cost: a wake-up costs far more than a line (on a busy machine a few hundred microseconds, against
a few per line), and the first lines after a wake-up cost two to three times what later ones do
(cold CPU caches). So the cadence adapts. A line after a quiet spell is read at once. While the
file keeps changing, the follower waits between reads, and nothing wakes the loop meanwhile (the
inotify reader is off, so the kernel folds the writes into one queued event); the wait starts at
``BATCH_START`` (25 ms) and doubles after every read that found lines, up to ``batch_interval``
(``--log-batch-interval``, 2 s by default): a server writing a thousand lines a second is read
every 2 s. The first read that finds nothing ends the batching; the next line is read at once
again.
Without close events (polling, or a watch that does not report them) the wait is at most
``poll_interval``, so that a restart loses no more than a poll's worth of the old server's lines.
A scrape does not wait for the batch: `CatchUp` (called before every scrape) ends the wait and
waits until the log is read as far as it reached when the scrape came, so /metrics shows every
line written before the scrape, whatever the cadence. Only a large backlog (a flood) is not waited
for: the scrape answers with what was read so far while the follower goes on.
A writer closing the file (a server exiting) ends a batch wait at once: a restarted server
truncates the log as it starts, and the old run's last lines, often the ones that explain the
restart, are read in that gap or lost. Closes are seen where inotify is (Linux); watchdog's other
backends (macOS, BSD, Windows) report none, and polling (``--fs-events false``) sees none either.
There the follower looks at the file while it waits (one fstat; see `Probe`), every ``PROBE_INTERVAL``
(50 ms) when idle and every ``PROBE_INTERVAL_BUSY`` (5 ms) during a batch wait and for a second after
lines were read: new bytes after a quiet
spell are read at once, a writer that stops ends a batch wait, a file found shrunk or rewritten ends it
at once, and what a truncation takes before it could be read is counted in ``lost_bytes``: what the
looks saw of the old content beyond the last read, and every run replaced in turn before a read.
Only what a server wrote after the last look before the next one truncated the log is not known.
The figures (bench/run.py, follow at 2,000 lines/s) are in docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Sequence

from exporter.logs.tail import LogTailer
from exporter.logs.watch import Clock, InotifyWatch, ParentWatch, Timer, Waker, WakeUps, resolve

__all__ = ["CatchUp", "Probe", "follow"]

logger = logging.getLogger(__name__)

#: The first batch wait when the log starts to change continuously; it doubles up to batch_interval.
BATCH_START = 0.025
#: A scrape waits for the follower's read only when at most this much is unread (about 25 ms of work).
CATCH_UP_MAX_BYTES = 512 * 1024
#: ...and never longer than this.
CATCH_UP_TIMEOUT = 0.1
#: Without close events, how often follow() looks at the file's size while it waits idle (see `Probe`),
#: and how long a writer is quiet before a batch wait ends.
PROBE_INTERVAL = 0.05
#: ...and during a batch wait or soon after lines: within the few milliseconds a wrapper takes to start
#: llama-server again. Always at this pace, an idle follower would cost about 3 % of a busy core.
PROBE_INTERVAL_BUSY = 0.005
#: How long after the log last had lines the follower looks at that pace while idle.
ACTIVE_SPAN = 1.0


def _progress(tailer: LogTailer) -> tuple[int, int, int, int]:
    s = tailer.stats
    return s.bytes, s.opens, s.rotations, s.truncations


def _read_once(tailer: LogTailer, on_lines: Callable[[Sequence[str]], None]) -> int:
    """One poll, its lines handed on; the number of lines (the list is gone before the next poll)."""
    lines = tailer.read()
    if lines:
        on_lines(lines)
    return len(lines)


async def _drain(
    tailer: LogTailer, on_lines: Callable[[Sequence[str]], None], stop: asyncio.Event, catch_up: CatchUp
) -> int:
    """Read until EOF (yielding between chunks); the number of lines read."""
    switches = tailer.stats.rotations + tailer.stats.truncations
    count = 0
    while not stop.is_set():
        before = _progress(tailer)
        count += _read_once(tailer, on_lines)
        catch_up._progress(tailer.stats.bytes)
        # Poll until a poll reaches EOF or makes no progress, rather than until has_pending() is False:
        # a read that ended exactly at EOF on the byte budget has not checked the path for rotation
        # yet. Judging by progress (not lines) also keeps a persistent read error from becoming a busy
        # loop, and so does leaving a path that switches files over and over to the next wake.
        if (
            tailer.at_eof
            or _progress(tailer) == before
            or tailer.stats.rotations + tailer.stats.truncations > switches + 1
        ):
            return count
        await asyncio.sleep(0)
    return count


class CatchUp:
    """A scrape's request to have what the log holds now read before it answers.

    Called before a scrape. If the files the tailer holds have unread bytes, it ends the follower's
    wait (between batches, or idle) and waits until the follower has read as far as the files
    reached when the scrape came (whether that read was just started or was under way), at most
    ``CATCH_UP_TIMEOUT``: /metrics shows every line written before the scrape. With more than
    ``CATCH_UP_MAX_BYTES`` unread (a flood), it only ends the wait: the scrape answers with what was
    read so far instead of waiting for the backlog.
    """

    def __init__(self) -> None:
        self._tailer: LogTailer | None = None  # set while follow() runs
        self._clock: Clock | None = None  # follow()'s, while it runs
        self._wake: WakeUps | None = None  # set while follow() waits
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []  # (bytes read by then, scrape)

    async def __call__(self) -> None:
        tailer, clock = self._tailer, self._clock
        pending = tailer.pending_bytes() if tailer is not None else 0
        if tailer is None or clock is None or pending == 0:
            return
        if self._wake is not None:
            self._wake.read_now()
        if pending > CATCH_UP_MAX_BYTES:
            return
        read: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = (tailer.stats.bytes + pending, read)
        self._waiters.append(waiter)
        timer = clock.call_later(CATCH_UP_TIMEOUT, resolve, read)  # on follow()'s clock, like its waits
        try:
            await read
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _attach(self, tailer: LogTailer | None, clock: Clock | None) -> None:
        """follow() starts (a tailer and its clock) or ends (None)."""
        self._tailer, self._clock = tailer, clock

    async def _wait(self, wake: WakeUps, waker: Waker, timeout: float, probing: Probe | None = None) -> None:
        """follow()'s wait on `waker`, which a scrape may end; probing the file meanwhile if asked."""
        self._wake = wake
        try:
            if probing is None:
                await waker.wait(timeout)
            else:
                await probing.wait(waker, timeout)
        finally:
            self._wake = None

    def _progress(self, bytes_read: int | None = None) -> None:
        """The follower has read `bytes_read` bytes in all (None: to the end of the log, or it stops):
        the scrapes waiting for no more than that go on."""
        for target, read in self._waiters:
            if (bytes_read is None or target <= bytes_read) and not read.done():
                read.set_result(None)


class Probe:
    """Where no writer's close is seen (polling, or a watch without close events): a look at the file
    while follow() waits, one fstat (and a few small preads when it changed), no read.

    A restarted llama-server truncates its log as it starts, and whatever the old one wrote after the
    last read is gone. The probe narrows that window and counts what it cannot close. Every look is
    remembered by the tailer (`LogTailer.probe`): the size of the content read so far, so that a
    truncation before the next read counts in ``lost_bytes`` the bytes no read took; or, when the
    content was replaced, the new content's size, so that a run replaced in turn unread is counted too.
    The wait ends at once when a look finds the content replaced (the new run is read from its start,
    and the old one's loss counted), and when idle on any new byte (read at once, as an event would
    have it). During a batch wait, and for `ACTIVE_SPAN` after the log last had lines, the looks come
    every `PROBE_INTERVAL_BUSY`, so that the old server's last size is seen even when the next one
    starts a few milliseconds after its last line; a writer
    quiet for `PROBE_INTERVAL` ends the wait, since a server that stops writing may be exiting.
    """

    def __init__(self, tailer: LogTailer, idle: bool, now: float, active_until: float = -math.inf) -> None:
        self._tailer, self._idle, self._active_until = tailer, idle, active_until
        self._pending, self._changed_at = -1, now

    def interval(self, now: float) -> float:
        """The time from a look at `now` to the next: short during a batch wait and for `ACTIVE_SPAN` after
        the log last had lines (a restart comes then), the idle pace after."""
        return PROBE_INTERVAL_BUSY if not self._idle or now < self._active_until else PROBE_INTERVAL

    def step(self, now: float) -> bool:
        """One look at `now` (the loop's clock); True: the wait is to end."""
        pending = self._tailer.probe()
        if self._tailer.replaced or (pending and self._idle):
            return True
        if pending != self._pending:
            self._pending, self._changed_at = pending, now
            return False
        return pending > 0 and now - self._changed_at >= PROBE_INTERVAL

    async def wait(self, waker: Waker, timeout: float) -> None:
        """`waker.wait(timeout)`, ended early (the waker set) by what a look sees. A look is one timer
        callback, not a wake-up of follow(): an idle follower costs a few microseconds per look. The looks
        run on the waker's clock."""
        clock = waker.clock
        handle: Timer | None = None

        def probe() -> None:
            nonlocal handle
            if self.step(clock.time()):
                waker.set()
                return
            handle = clock.call_later(self.interval(clock.time()), probe)

        handle = clock.call_later(self.interval(clock.time()), probe)
        try:
            await waker.wait(timeout)
        finally:
            if handle is not None:
                handle.cancel()


async def follow(
    tailer: LogTailer,
    on_lines: Callable[[Sequence[str]], None],
    *,
    poll_interval: float = 1.0,
    use_watchdog: bool = True,
    stop: asyncio.Event | None = None,
    batch_interval: float = 2.0,
    after_drain: Callable[[], None] | None = None,
    catch_up: CatchUp | None = None,
    clock: Clock | None = None,
) -> None:
    """Feed new lines of ``tailer`` to ``on_lines`` until ``stop`` is set (or the task is cancelled).

    ``after_drain`` is called after every pass, lines or not (e.g. to report ``tailer.last_error``).
    ``catch_up``, called before a scrape, has the follower read at once (see `CatchUp`). ``clock``: what
    the follower reads the time from and times its waits with (the event loop's; a test's moves when the
    test says).

    A line written after a quiet spell is read at once. While the file keeps changing (a read less
    than twice the current wait after the previous one), the follower waits before it reads again:
    ``BATCH_START`` first, doubling after each read that found lines, at most ``batch_interval``. A
    server writing hundreds of times a second is so read in batches, one every 2 s, with one
    wake-up per batch rather than one per write. Except when a writer closes the file: then it is
    read at once (see `WakeUps`).
    """
    follower = _Follower(
        tailer,
        on_lines,
        clock if clock is not None else asyncio.get_running_loop(),
        poll_interval=poll_interval,
        batch_interval=batch_interval,
        after_drain=after_drain,
        catch=catch_up if catch_up is not None else CatchUp(),
    )
    await follower.run(stop if stop is not None else asyncio.Event(), use_watchdog)


class _Follower:
    """follow()'s loop, and what it keeps from one pass to the next: the watch, the current batch wait, when
    it last read and last found lines."""

    def __init__(
        self,
        tailer: LogTailer,
        on_lines: Callable[[Sequence[str]], None],
        clock: Clock,
        *,
        poll_interval: float,
        batch_interval: float,
        after_drain: Callable[[], None] | None,
        catch: CatchUp,
    ) -> None:
        self.tailer, self.on_lines, self.clock, self.catch = tailer, on_lines, clock, catch
        self.poll_interval, self.batch_interval, self.after_drain = poll_interval, batch_interval, after_drain
        self.first_wait = min(BATCH_START, batch_interval)
        self.wait = self.first_wait  # the next batch wait while the file keeps changing
        self.wake = WakeUps(clock, self.first_wait)
        self.watch: InotifyWatch | ParentWatch | None = None
        self.last_drain = self.last_lines = -math.inf

    async def run(self, stop: asyncio.Event, use_watchdog: bool) -> None:
        """Pass after pass (read to the end, then a batch wait or an idle wait) until `stop` is set."""
        if use_watchdog:
            path, wake = self.tailer.path, self.wake
            self.watch = InotifyWatch.create(path, wake) or ParentWatch(path, asyncio.get_running_loop(), wake)
        stop_task = asyncio.ensure_future(stop.wait())
        stop_task.add_done_callback(lambda _: self.wake.read_now())
        self.catch._attach(self.tailer, self.clock)
        try:
            while not stop.is_set():
                busy, lines, sees_closes = await self._pass(stop)
                if stop.is_set():
                    break
                if busy and lines and await self._batch_wait(sees_closes):
                    continue
                await self._idle_wait(sees_closes)
        finally:
            self.catch._progress()
            self.catch._attach(None, None)
            stop_task.cancel()
            if self.watch is not None:
                self.watch.close()

    async def _pass(self, stop: asyncio.Event) -> tuple[bool, int, bool]:
        """The watch's events taken, the log read to its end, the scrapes waiting told, problems reported:
        whether the writer is busy (this read soon after the last), the lines read, whether closes are seen."""
        watch = self.watch
        if watch is not None:
            watch.ensure()
            watch.take_events()  # what they announce, this drain reads
        self.wake.clear()  # from here on, an event means one more pass
        now = self.clock.time()
        busy, self.last_drain = now - self.last_drain < 2 * self.wait, now
        lines = await _drain(self.tailer, self.on_lines, stop, self.catch)
        if lines:
            self.last_lines = self.clock.time()
        sees_closes = watch is not None and watch.sees_closes
        if not sees_closes:
            self.tailer.probe()  # a look as the read ends: how the writer goes on, for the estimate of `Probe`
        self.catch._progress()
        if self.after_drain is not None:
            self.after_drain()
        return busy, lines, sees_closes

    async def _batch_wait(self, sees_closes: bool) -> bool:
        """The wait between two reads of a busy writer, ended early by a close (or a probe's look), the next
        one twice as long; True: read again at once (the log changed meanwhile), False: the idle wait next."""
        wake, tailer = self.wake, self.tailer
        probe = None if sees_closes else Probe(tailer, False, self.clock.time())
        await self.catch._wait(wake, wake.urgent, self.wait, probe)
        # Without close events a restart's last lines are read only at the end of the wait
        # (before the new server truncates the log, or never): then no longer than a poll.
        limit = self.batch_interval if sees_closes else min(self.batch_interval, self.poll_interval)
        self.wait = min(2 * self.wait, limit)
        return wake.any.is_set() or (self.watch is not None and self.watch.take_events()) or tailer.has_pending()

    async def _idle_wait(self, sees_closes: bool) -> None:
        """Quiet: until an event, a probe's look at the file or the poll timer; the next line is read at once,
        and batching starts over."""
        self.wait = self.first_wait
        watch = self.watch
        if isinstance(watch, InotifyWatch):
            watch.any_name = self.tailer.rotated_files > 0
        if watch is not None:
            watch.listen()
        probe = None if sees_closes else Probe(self.tailer, True, self.clock.time(), self.last_lines + ACTIVE_SPAN)
        await self.catch._wait(self.wake, self.wake.any, self.poll_interval, probe)
