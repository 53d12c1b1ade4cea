"""The suite's portable configuration: on Linux, what Windows' CPython (and partly macOS') lacks is taken away,
so that the code those systems run is the code the tests run.

`take_away()` (called by `portable/sitecustomize.py` in every Python started with that folder on
PYTHONPATH: pytest and each exporter process the tests start) removes:

- the modules `resource` and `fcntl` (an `import` of either raises ImportError, as on Windows);
- `os.sysconf`, `os.fork`, `os.pread` and `os.sched_getaffinity` (Windows has none; macOS has no
  `sched_getaffinity`); multiprocessing then has only `spawn` to offer, as on Windows;
- the event loop's `add_reader`/`add_writer`, `add_signal_handler`, and `connect_read_pipe` on a pipe the
  loop did not open itself: every loop is a `ProactorLikeLoop`, which refuses them with
  NotImplementedError as Windows' ProactorEventLoop does (its sockets, streams and subprocesses work);
- inotify for the log follower, through the loop (the follower then falls back to watchdog), and watchdog's
  inotify observer: `watchdog.observers.Observer` is its PollingObserver, an observer thread without close
  events, as on Windows (ReadDirectoryChangesW) and macOS (FSEvents).

It also sets LLAMACPP_EXPORTER_PROCESS_SOURCE=psutil (no /proc: the process source on psutil) and
LLAMACPP_EXPORTER_PORTABLE=1, which tests read to know the configuration they run in.

What it cannot take away: `sys.platform` stays "linux" (journald is refused off Linux by platform, and
tested so with a patched `sys.platform`); text-mode reads and file sharing are emulated by the tests of
the log readers themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import os
import sys
from typing import Any

#: Set while the loop starts a subprocess: the proactor loop reads the pipes it opened itself.
_OWN_PIPES: contextvars.ContextVar[bool] = contextvars.ContextVar("own_pipes", default=False)
TAKEN_MODULES = ("resource", "fcntl")
TAKEN_OS = ("sysconf", "fork", "pread", "sched_getaffinity")


class ProactorLikeLoop(asyncio.SelectorEventLoop):
    """A selector loop that refuses what Windows' ProactorEventLoop refuses (CPython's BaseEventLoop raises
    NotImplementedError for them there). The loop's own sockets, transports and subprocesses work."""

    def add_reader(self, fd: Any, callback: Any, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("add_reader: not on a proactor loop (portable configuration)")

    def add_writer(self, fd: Any, callback: Any, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("add_writer: not on a proactor loop (portable configuration)")

    def add_signal_handler(self, sig: int, callback: Any, *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError("add_signal_handler: not on a proactor loop (portable configuration)")

    async def connect_read_pipe(self, protocol_factory: Any, pipe: Any) -> Any:
        if not _OWN_PIPES.get():
            raise NotImplementedError(
                "connect_read_pipe: a proactor loop cannot read an anonymous pipe it did not open"
            )
        return await super().connect_read_pipe(protocol_factory, pipe)

    async def _make_subprocess_transport(self, *args: Any, **kwargs: Any) -> Any:
        token = _OWN_PIPES.set(True)  # the pipes' tasks copy this context
        try:
            return await super()._make_subprocess_transport(*args, **kwargs)  # type: ignore[misc]
        finally:
            _OWN_PIPES.reset(token)


class PortablePolicy(asyncio.DefaultEventLoopPolicy):
    """New loops are `ProactorLikeLoop`s."""

    _loop_factory = ProactorLikeLoop


def take_away() -> None:
    """Remove what Windows lacks from this interpreter (see the module's docstring)."""
    with contextlib.suppress(ImportError):  # psutil's Linux backend reads os.sysconf at import (not on Windows)
        importlib.import_module("psutil")
    for name in TAKEN_MODULES:
        sys.modules[name] = None  # type: ignore[assignment]  # `import resource` raises ImportError
    for name in TAKEN_OS:
        if hasattr(os, name):
            delattr(os, name)
    asyncio.set_event_loop_policy(PortablePolicy())
    try:
        import watchdog.observers
        from watchdog.observers.polling import PollingObserver
    except ImportError:
        pass
    else:
        watchdog.observers.Observer = PollingObserver
    os.environ["LLAMACPP_EXPORTER_PROCESS_SOURCE"] = "psutil"
    os.environ["LLAMACPP_EXPORTER_PORTABLE"] = "1"


def active() -> bool:
    """This interpreter runs in the portable configuration."""
    return (
        os.environ.get("LLAMACPP_EXPORTER_PORTABLE") == "1" and "resource" in sys.modules and not hasattr(os, "sysconf")
    )
