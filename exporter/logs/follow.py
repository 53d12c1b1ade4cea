"""Drive a `LogTailer` as its file changes: filesystem events, a timer, and batching under load.

`LogTailer.poll` (``exporter.logs.tail``) makes every decision about the file; `follow` only decides
when to call it.

It wakes on filesystem events for the path and on a ``poll_interval`` timer. The timer is the real
guarantee: inotify loses events (queue overflow), and does not work on NFS or for writes made on
another host or another overlayfs layer. Events only reduce latency. Truncation has no event of its
own: it arrives as an ordinary modification. On Linux the events come from inotify read on the
event loop itself (``_InotifyWatch``); elsewhere, or without inotify, from a watchdog observer
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
backends (macOS, BSD, Windows) report none, and there the batch wait runs its course.
The figures (bench/run.py, follow at 2,000 lines/s) are in docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import logging
import math
import os
import pathlib
import stat
import struct
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from exporter.logs.tail import LogTailer

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver, ObservedWatch

__all__ = ["CatchUp", "follow"]

logger = logging.getLogger(__name__)

#: The first batch wait when the log starts to change continuously; it doubles up to batch_interval.
BATCH_START = 0.025
#: A scrape waits for the follower's read only when at most this much is unread (about 25 ms of work).
CATCH_UP_MAX_BYTES = 512 * 1024
#: ...and never longer than this.
CATCH_UP_TIMEOUT = 0.1

# watchdog is imported on first use: on Linux follow() watches with inotify and never loads it. The
# observer class stays a module attribute so that it can be replaced (the tests do).
Observer: Any = None


def _wake_handler(target: str, directory: str, loop: asyncio.AbstractEventLoop, wake: _WakeUps) -> Any:
    """A watchdog event handler that runs on the watchdog thread and only hands a wake-up to the loop."""
    from watchdog.events import FileClosedEvent, FileSystemEvent, FileSystemEventHandler

    class WakeHandler(FileSystemEventHandler):
        def __init__(self) -> None:
            super().__init__()
            # The directory itself too: its deletion means the watch must be re-scheduled.
            self._paths = {os.path.normpath(target), os.path.normpath(directory)}

        def on_any_event(self, event: FileSystemEvent) -> None:
            if any(p and os.path.normpath(os.fsdecode(p)) in self._paths for p in (event.src_path, event.dest_path)):
                call = wake.writer_closed if isinstance(event, FileClosedEvent) else wake.changed
                with contextlib.suppress(RuntimeError):  # loop already closed: follow() is gone
                    loop.call_soon_threadsafe(call)

    return WakeHandler()


def _watchdog_observer() -> BaseObserver:
    global Observer
    if Observer is None:
        from watchdog.observers import Observer
    observer: BaseObserver = Observer()
    return observer


def _watchdog_events() -> list[type]:
    """The events to ask for. Our own open()/close() of the log shows up as FileOpenedEvent and
    FileClosedNoWriteEvent; leaving those out of the inotify mask keeps the follower from waking itself."""
    from watchdog.events import (
        DirDeletedEvent,
        FileClosedEvent,
        FileCreatedEvent,
        FileDeletedEvent,
        FileModifiedEvent,
        FileMovedEvent,
    )

    return [FileCreatedEvent, FileDeletedEvent, FileModifiedEvent, FileMovedEvent, FileClosedEvent, DirDeletedEvent]


def _directory_identity(path: pathlib.Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the directory at `path`; None when there is none (missing, or not a directory)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


class _ParentWatch:
    """A watchdog observer on the log's parent directory, re-scheduled when the directory is replaced."""

    def __init__(self, path: pathlib.Path, loop: asyncio.AbstractEventLoop, wake: _WakeUps) -> None:
        path = path.absolute()
        self._dir = path.parent
        self._handler = _wake_handler(str(path), str(self._dir), loop, wake)
        self._observer: BaseObserver | None = None
        self._watch: ObservedWatch | None = None
        self._dir_ident: tuple[int, int] | None = None
        self._disabled = False

    def ensure(self) -> None:
        """Called on every wake: (re)schedule the watch if the directory appeared or was replaced."""
        if self._disabled:
            return
        ident = _directory_identity(self._dir)
        if ident == self._dir_ident and (ident is None or self._watch is not None):
            return
        self._unschedule()
        self._dir_ident = ident
        if ident is None:
            return  # no directory yet: the timer keeps polling, and we retry on the next wake
        try:
            if self._observer is None:
                self._observer = _watchdog_observer()
                self._observer.start()
            self._watch = self._observer.schedule(
                self._handler, self._dir, recursive=False, event_filter=_watchdog_events()
            )
        except FileNotFoundError:
            self._dir_ident = None  # removed between stat and schedule; retry later
        except Exception as exc:  # e.g. OSError(EMFILE/ENOSPC): inotify instance or watch limit
            logger.warning("cannot watch %s for changes (%s); falling back to polling the log file", self._dir, exc)
            self._disabled = True
            self.close()

    def _unschedule(self) -> None:
        if self._observer is not None and self._watch is not None:
            with contextlib.suppress(Exception):
                self._observer.unschedule(self._watch)
        self._watch = None

    @property
    def sees_closes(self) -> bool:
        """A writer closing the log wakes the follower: watchdog's inotify backend (Linux) reports closes."""
        return sys.platform.startswith("linux") and self._watch is not None

    def take_events(self) -> bool:
        """Nothing to take: watchdog's observer thread hands each event to the waker as it comes."""
        return False

    def listen(self) -> None:
        """Always listening (on the observer thread)."""

    def close(self) -> None:
        if self._observer is not None:
            with contextlib.suppress(Exception):
                self._observer.stop()
                self._observer.join(timeout=2.0)
            self._observer = None
        self._watch = None


# inotify(7): the events that can mean "the log changed", and the ones that end a directory watch.
_IN_CHANGES = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200  # MODIFY ATTRIB CLOSE_WRITE MOVED_FROM/TO CREATE DELETE
_IN_CLOSE_WRITE = 0x8
_IN_DIR_GONE = 0x400 | 0x800 | 0x8000  # DELETE_SELF MOVE_SELF IGNORED
_IN_Q_OVERFLOW = 0x4000
_IN_ONLYDIR = 0x01000000
_IN_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of NUL-padded name


def _libc_with_inotify() -> ctypes.CDLL | None:
    """The C library, if it offers inotify (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018  (AttributeError where it is missing)
    except (OSError, AttributeError):
        return None
    return libc


class _InotifyWatch:
    """Linux inotify on the log's parent directory, read by the event loop itself: no threads.

    The same job as `_ParentWatch`, for a fraction of the CPU: watchdog hands every event through
    its own threads and a queue, which for a server appending a line every millisecond costs more
    than reading the lines. Here one read() takes whatever events piled up, events for other files
    in the directory are skipped by name, and a wake-up is one call. Used where libc has inotify;
    `create` returns None elsewhere and follow() uses watchdog.

    Two inotify instances watch the directory. The "changes" one is read only while follow() is
    idle, so that during a batch wait the kernel folds a busy writer's modifications into one
    queued event instead of waking the loop for each. The "closes" one reports only a writer
    closing a file (IN_CLOSE_WRITE, e.g. the server exiting) and is read at all times: those
    last lines must be read before a restarted server truncates the file.
    """

    def __init__(self, libc: ctypes.CDLL, path: pathlib.Path, wake: _WakeUps) -> None:
        path = path.absolute()
        self._libc, self._wake = libc, wake
        self._dir, self._name = path.parent, os.fsencode(path.name)
        self._fd = -1  # the "changes" instance, opened once there is a directory to watch
        self._closes_fd = -1  # the "closes" instance, read by the event loop from the start
        self._listening = False  # the event loop reads the "changes" instance
        self._wd: int | None = None
        self._closes_wd: int | None = None
        self._dir_ident: tuple[int, int] | None = None
        self._disabled = False
        # Wake for any file in the directory, not only the log's name: while the tailer reads a rotated
        # file (its writer may go on under the new name).
        self.any_name = False

    @classmethod
    def create(cls, path: pathlib.Path, wake: _WakeUps) -> _InotifyWatch | None:
        """A watch, or None where inotify is missing: then follow() uses watchdog."""
        libc = _libc_with_inotify()
        return cls(libc, path, wake) if libc is not None else None

    def ensure(self) -> None:
        """Called on every wake: (re)add the watches if the directory appeared or was replaced."""
        if self._disabled:
            return
        ident = _directory_identity(self._dir)
        if ident == self._dir_ident and (ident is None or self._wd is not None):
            return
        # Drop the watches on a replaced directory (this fails harmlessly where the kernel dropped them).
        if self._wd is not None:
            self._libc.inotify_rm_watch(self._fd, self._wd)
            self._wd = None
        if self._closes_wd is not None:
            self._libc.inotify_rm_watch(self._closes_fd, self._closes_wd)
            self._closes_wd = None
        self._dir_ident = ident
        if ident is None:
            return  # no directory yet: the timer keeps polling, and we retry on the next wake
        if self._fd < 0 and not self._open_instances():
            return
        directory = os.fsencode(self._dir)
        wd = self._libc.inotify_add_watch(self._fd, directory, _IN_CHANGES | _IN_ONLYDIR)
        if wd < 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR):
                self._dir_ident = None  # removed between stat and watch; retry later
            else:
                self._give_up(err)  # e.g. ENOSPC: the watch limit (fs.inotify.max_user_watches) is reached
            return
        self._wd = wd
        if self._closes_fd < 0:
            return
        closes_wd = self._libc.inotify_add_watch(self._closes_fd, directory, _IN_CLOSE_WRITE | _IN_ONLYDIR)
        if closes_wd >= 0:
            self._closes_wd = closes_wd
            return
        err = ctypes.get_errno()
        if err in (errno.ENOENT, errno.ENOTDIR):  # removed between the two watches: undo, retry later
            self._libc.inotify_rm_watch(self._fd, wd)
            self._wd = self._dir_ident = None
        else:
            self._without_closes(err)

    def _open_instances(self) -> bool:
        """The two inotify instances; without the "closes" one, the watch still works as before."""
        fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:  # EMFILE: the instance limit (fs.inotify.max_user_instances) is reached
            self._give_up(ctypes.get_errno())
            return False
        self._fd = fd
        closes_fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if closes_fd < 0:
            self._without_closes(ctypes.get_errno())
        else:
            self._closes_fd = closes_fd
            asyncio.get_running_loop().add_reader(closes_fd, self._on_closes)
        return True

    def _give_up(self, err: int) -> None:
        logger.warning(
            "cannot watch %s for changes (%s); falling back to polling the log file", self._dir, os.strerror(err)
        )
        self._disabled = True
        self.close()

    def _without_closes(self, err: int) -> None:
        logger.warning(
            "cannot watch %s for the server closing its log (%s); lines it writes just before a restart may be lost",
            self._dir,
            os.strerror(err),
        )
        self._close_fd(self._closes_fd)
        self._closes_fd, self._closes_wd = -1, None

    @property
    def sees_closes(self) -> bool:
        """A writer closing the log wakes the follower (the "closes" instance is read)."""
        return self._closes_wd is not None

    def listen(self) -> None:
        """Have the event loop wake follow() on the next change (it stops listening at that change)."""
        if self._fd >= 0 and not self._listening:
            asyncio.get_running_loop().add_reader(self._fd, self._on_changes)
            self._listening = True

    def _on_changes(self) -> None:
        if self.take_events():
            # Stop listening until follow() is idle again: meanwhile the kernel folds repeated writes
            # into one queued event, instead of waking the loop for each of them.
            asyncio.get_running_loop().remove_reader(self._fd)
            self._listening = False
            self._wake.changed()

    def _on_closes(self) -> None:
        if self._read_events(self._closes_fd):
            self._wake.writer_closed()

    def take_events(self) -> bool:
        """Read the queued changes; True if one concerns the log file (or the watch itself)."""
        return self._read_events(self._fd)

    def _read_events(self, fd: int) -> bool:
        if fd < 0:
            return False
        try:
            data = os.read(fd, 64 * 1024)
        except OSError:  # EAGAIN: nothing (left) to read
            return False
        wake = False
        pos = 0
        while pos + _IN_EVENT.size <= len(data):
            wd, mask, _, size = _IN_EVENT.unpack_from(data, pos)
            name = data[pos + _IN_EVENT.size : pos + _IN_EVENT.size + size].rstrip(b"\0")
            pos += _IN_EVENT.size + size
            if mask & _IN_DIR_GONE and wd == (self._wd if fd == self._fd else self._closes_wd):
                self._wd = None  # the directory went away: ensure() watches its successor
            wake = wake or name == self._name or self.any_name or bool(mask & (_IN_DIR_GONE | _IN_Q_OVERFLOW))
        return wake

    def close(self) -> None:
        self._close_fd(self._fd)
        self._close_fd(self._closes_fd)
        self._fd = self._closes_fd = -1
        self._listening = False
        self._wd = self._closes_wd = None

    @staticmethod
    def _close_fd(fd: int) -> None:
        if fd >= 0:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)


class _WakeUps:
    """What ends follow()'s waits: the log changed (ends an idle wait), or read now (ends a batch wait too).

    Read now: a writer closed the file, which is what a server does as it exits, and a restarted
    server truncates the file as it starts; its last lines are read in that gap or never. Or stop.
    A writer that opens and closes the file for every write (`echo >> log`) closes it again and
    again: a close less than a batch interval after the previous one is only a change, or such a
    writer would be read once per line. llama-server keeps its log open until it exits.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, batch_interval: float) -> None:
        self.any = _Waker(loop)  # ends an idle wait
        self.urgent = _Waker(loop)  # also ends a batch wait
        self._loop, self._batch_interval = loop, batch_interval
        self._last_close = -math.inf

    def clear(self) -> None:
        self.any.clear()
        self.urgent.clear()

    def changed(self) -> None:
        self.any.set()

    def writer_closed(self) -> None:
        now = self._loop.time()
        if now - self._last_close < self._batch_interval:
            self.any.set()
        else:
            self.read_now()
        self._last_close = now

    def read_now(self) -> None:
        self.urgent.set()
        self.any.set()


class _Waker:
    """What follow() sleeps on between drains: set by filesystem events or stop, or the timer runs out.

    One future and one timer per sleep; cheaper than an asyncio.Event waited on through tasks, which
    counts when a busy server wakes the follower a hundred times a second.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._set = False
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def clear(self) -> None:
        self._set = False

    def is_set(self) -> bool:
        return self._set

    async def wait(self, timeout: float) -> None:
        """Until set() (at once if it was set since the last clear()) or `timeout` seconds."""
        if self._set:
            return
        future = self._future = self._loop.create_future()
        timer = self._loop.call_later(timeout, _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _progress(tailer: LogTailer) -> tuple[int, int, int, int]:
    s = tailer.stats
    return s.bytes, s.opens, s.rotations, s.truncations


def _read_once(tailer: LogTailer, on_lines: Callable[[list[str]], None]) -> int:
    """One poll, its lines handed on; the number of lines (the list is gone before the next poll)."""
    lines = tailer.poll()
    if lines:
        on_lines(lines)
    return len(lines)


async def _drain(
    tailer: LogTailer, on_lines: Callable[[list[str]], None], stop: asyncio.Event, catch_up: CatchUp
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
        self._wake: _WakeUps | None = None  # set while follow() waits
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []  # (bytes read by then, scrape)

    async def __call__(self) -> None:
        tailer = self._tailer
        pending = tailer.pending_bytes() if tailer is not None else 0
        if tailer is None or pending == 0:
            return
        if self._wake is not None:
            self._wake.read_now()
        if pending > CATCH_UP_MAX_BYTES:
            return
        read = asyncio.get_running_loop().create_future()
        waiter = (tailer.stats.bytes + pending, read)
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(read, CATCH_UP_TIMEOUT)
        except asyncio.TimeoutError:
            pass
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    async def _wait(self, wake: _WakeUps, waker: _Waker, timeout: float) -> None:
        """follow()'s wait on `waker`, which a scrape may end."""
        self._wake = wake
        try:
            await waker.wait(timeout)
        finally:
            self._wake = None

    def _progress(self, bytes_read: int | None = None) -> None:
        """The follower has read `bytes_read` bytes in all (None: to the end of the log, or it stops):
        the scrapes waiting for no more than that go on."""
        for target, read in self._waiters:
            if (bytes_read is None or target <= bytes_read) and not read.done():
                read.set_result(None)


async def follow(
    tailer: LogTailer,
    on_lines: Callable[[list[str]], None],
    *,
    poll_interval: float = 1.0,
    use_watchdog: bool = True,
    stop: asyncio.Event | None = None,
    batch_interval: float = 2.0,
    after_drain: Callable[[], None] | None = None,
    catch_up: CatchUp | None = None,
) -> None:
    """Feed new lines of ``tailer`` to ``on_lines`` until ``stop`` is set (or the task is cancelled).

    ``after_drain`` is called after every pass, lines or not (e.g. to report ``tailer.last_error``).
    ``catch_up``, called before a scrape, has the follower read at once (see `CatchUp`).

    A line written after a quiet spell is read at once. While the file keeps changing (a read less
    than twice the current wait after the previous one), the follower waits before it reads again:
    ``BATCH_START`` first, doubling after each read that found lines, at most ``batch_interval``. A
    server writing hundreds of times a second is so read in batches, one every 2 s, with one
    wake-up per batch rather than one per write. Except when a writer closes the file: then it is
    read at once (see `_WakeUps`).
    """
    loop = asyncio.get_running_loop()
    first_wait = min(BATCH_START, batch_interval)
    wake = _WakeUps(loop, first_wait)
    stop_event = stop if stop is not None else asyncio.Event()
    watch: _InotifyWatch | _ParentWatch | None = None
    if use_watchdog:
        watch = _InotifyWatch.create(tailer.path, wake) or _ParentWatch(tailer.path, loop, wake)
    stop_task = asyncio.ensure_future(stop_event.wait())
    stop_task.add_done_callback(lambda _: wake.read_now())
    last_drain = -math.inf
    wait = first_wait  # the next batch wait while the file keeps changing
    catch = catch_up if catch_up is not None else CatchUp()
    catch._tailer = tailer
    try:
        while not stop_event.is_set():
            if watch is not None:
                watch.ensure()
                watch.take_events()  # what they announce, this drain reads
            wake.clear()  # from here on, an event means one more pass
            now = loop.time()
            busy, last_drain = now - last_drain < 2 * wait, now
            lines = await _drain(tailer, on_lines, stop_event, catch)
            catch._progress()
            if after_drain is not None:
                after_drain()
            if stop_event.is_set():
                break
            if busy and lines:
                await catch._wait(wake, wake.urgent, wait)
                # Without close events a restart's last lines are read only at the end of the wait
                # (before the new server truncates the log, or never): then no longer than a poll.
                sees_closes = watch is not None and watch.sees_closes
                wait = min(2 * wait, batch_interval if sees_closes else min(batch_interval, poll_interval))
                if wake.any.is_set() or (watch is not None and watch.take_events()) or tailer.has_pending():
                    continue
            wait = first_wait  # quiet: the next line is read at once, and batching starts over
            if isinstance(watch, _InotifyWatch):
                watch.any_name = tailer.rotated_files > 0
            if watch is not None:
                watch.listen()
            await catch._wait(wake, wake.any, poll_interval)
    finally:
        catch._progress()
        catch._tailer = None
        stop_task.cancel()
        if watch is not None:
            watch.close()
