"""Wake-ups for one log path: filesystem events (inotify read on the event loop on Linux, a watchdog
observer thread elsewhere) and the wakers `follow` waits on.

Events only reduce latency; `follow`'s timer is the guarantee (see `exporter.logs.follow`). Both watches
watch the log's directory, not the file, so that a rotation or a re-creation is seen; both end a wait
through `WakeUps`: `any` for a change, `urgent` also for a writer closing the file. The wakers' timers run
on a `Clock`: the event loop, or a test's that moves only when the test moves it."""

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
from typing import TYPE_CHECKING, Any, Protocol

from exporter.loops import waits_on_descriptors

if TYPE_CHECKING:
    from watchdog.observers.api import BaseObserver, ObservedWatch

logger = logging.getLogger("exporter.logs.follow")  # what it says is part of following the log

# watchdog is imported on first use: on Linux follow() watches with inotify and never loads it. The
# observer class stays a module attribute so that it can be replaced (the tests do).
Observer: Any = None


#: Windows (NTFS) and macOS (APFS, HFS+) match file names without regard to case, and their events may
#: name the log in another case than the one it was given in (`--log-file C:\Llama\server.log` against
#: `c:\llama\Server.log`). A module attribute so that the tests can force the rule on Linux.
CASE_INSENSITIVE_PATHS = sys.platform in ("win32", "darwin")


def path_key(path: str | bytes) -> str:
    """What two names of one file have in common: the normalized path, case-folded where names ignore case."""
    key = os.path.normpath(os.fsdecode(path))
    return key.casefold() if CASE_INSENSITIVE_PATHS else key


def wake_handler(target: str, directory: str, loop: asyncio.AbstractEventLoop, wake: WakeUps) -> Any:
    """A watchdog event handler that runs on the watchdog thread and only hands a wake-up to the loop."""
    from watchdog.events import FileClosedEvent, FileSystemEvent, FileSystemEventHandler

    class WakeHandler(FileSystemEventHandler):
        def __init__(self) -> None:
            super().__init__()
            # The directory itself too: its deletion means the watch must be re-scheduled.
            self._paths = {path_key(target), path_key(directory)}

        def on_any_event(self, event: FileSystemEvent) -> None:
            if any(p and path_key(p) in self._paths for p in (event.src_path, event.dest_path)):
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


def _reports_closes(observer: BaseObserver | None) -> bool:
    """The observer reports a writer closing a file: watchdog's inotify observer does, no other one."""
    try:
        from watchdog.observers.inotify import InotifyObserver
    except ImportError:  # not Linux
        return False
    return isinstance(observer, InotifyObserver)


def _directory_identity(path: pathlib.Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the directory at `path`; None when there is none (missing, or not a directory)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


class ParentWatch:
    """A watchdog observer on the log's parent directory, re-scheduled when the directory is replaced."""

    def __init__(self, path: pathlib.Path, loop: asyncio.AbstractEventLoop, wake: WakeUps) -> None:
        path = path.absolute()
        self._dir = path.parent
        self._handler = wake_handler(str(path), str(self._dir), loop, wake)
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
        """A writer closing the log wakes the follower: only watchdog's inotify backend (Linux) reports closes."""
        return self._watch is not None and _reports_closes(self._observer)

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
IN_CHANGES = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200  # MODIFY ATTRIB CLOSE_WRITE MOVED_FROM/TO CREATE DELETE


IN_CLOSE_WRITE = 0x8


IN_DIR_GONE = 0x400 | 0x800 | 0x8000  # DELETE_SELF MOVE_SELF IGNORED


IN_Q_OVERFLOW = 0x4000


IN_ONLYDIR = 0x01000000


IN_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of NUL-padded name


def libc_with_inotify() -> ctypes.CDLL | None:
    """The C library, if it offers inotify (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1  # noqa: B018  (AttributeError where it is missing)
    except (OSError, AttributeError):
        return None
    return libc


class InotifyWatch:
    """Linux inotify on the log's parent directory, read by the event loop itself: no threads.

    The same job as `ParentWatch`, for a fraction of the CPU: watchdog hands every event through
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

    def __init__(self, libc: ctypes.CDLL, path: pathlib.Path, wake: WakeUps) -> None:
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
    def create(cls, path: pathlib.Path, wake: WakeUps) -> InotifyWatch | None:
        """A watch, or None where inotify is missing or the loop cannot wait on its descriptor: then
        follow() uses watchdog."""
        libc = libc_with_inotify()
        if libc is None or not waits_on_descriptors(asyncio.get_running_loop()):
            return None
        return cls(libc, path, wake)

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
        wd = self._libc.inotify_add_watch(self._fd, directory, IN_CHANGES | IN_ONLYDIR)
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
        closes_wd = self._libc.inotify_add_watch(self._closes_fd, directory, IN_CLOSE_WRITE | IN_ONLYDIR)
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
        while pos + IN_EVENT.size <= len(data):
            wd, mask, _, size = IN_EVENT.unpack_from(data, pos)
            name = data[pos + IN_EVENT.size : pos + IN_EVENT.size + size].rstrip(b"\0")
            pos += IN_EVENT.size + size
            if mask & IN_DIR_GONE and wd == (self._wd if fd == self._fd else self._closes_wd):
                self._wd = None  # the directory went away: ensure() watches its successor
            wake = wake or name == self._name or self.any_name or bool(mask & (IN_DIR_GONE | IN_Q_OVERFLOW))
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


class WakeUps:
    """What ends follow()'s waits: the log changed (ends an idle wait), or read now (ends a batch wait too).

    Read now: a writer closed the file, which is what a server does as it exits, and a restarted
    server truncates the file as it starts; its last lines are read in that gap or never. Or stop.
    A writer that opens and closes the file for every write (`echo >> log`) closes it again and
    again: a close less than a batch interval after the previous one is only a change, or such a
    writer would be read once per line. llama-server keeps its log open until it exits.
    """

    def __init__(self, clock: Clock, batch_interval: float) -> None:
        self.any = Waker(clock)  # ends an idle wait
        self.urgent = Waker(clock)  # also ends a batch wait
        self._clock, self._batch_interval = clock, batch_interval
        self._last_close = -math.inf

    def clear(self) -> None:
        self.any.clear()
        self.urgent.clear()

    def changed(self) -> None:
        self.any.set()

    def writer_closed(self) -> None:
        now = self._clock.time()
        if now - self._last_close < self._batch_interval:
            self.any.set()
        else:
            self.read_now()
        self._last_close = now

    def read_now(self) -> None:
        self.urgent.set()
        self.any.set()


class Timer(Protocol):
    """A timer `Clock.call_later` started (`asyncio.TimerHandle`)."""

    def cancel(self) -> None: ...


class Clock(Protocol):
    """The time follow() reads and the timers it waits with: the event loop itself, or in a test a clock that
    stands still until the test moves it, so that the follower's tests are driven step by step, not timed."""

    def time(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any) -> Timer: ...


class Waker:
    """What follow() sleeps on between drains: set by filesystem events or stop, or the timer runs out.

    One future and one timer per sleep; cheaper than an asyncio.Event waited on through tasks, which
    counts when a busy server wakes the follower a hundred times a second. The timer runs on `clock`.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
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
        future = self._future = asyncio.get_running_loop().create_future()
        timer = self.clock.call_later(timeout, resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None


def resolve(future: asyncio.Future[None]) -> None:
    """Resolve `future` (a wait's end) unless something resolved it first."""
    if not future.done():
        future.set_result(None)
