"""Watching follow() from a test: wait on a condition (bounded, never a fixed sleep), collect the batches
it delivers, list the filesystem watches the process holds, and pick inotify or watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from seq_log import seqs
from watchdog.observers.api import BaseObserver

from exporter.logs import watch as watch_mod


async def wait_until(cond: Callable[[], bool], what: str, timeout: float = 3.0) -> None:
    """Wait until `cond()` holds; fail naming `what` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


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

    def __call__(self, batch: list[str]) -> None:
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
