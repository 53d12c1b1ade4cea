"""What Windows' and macOS' Python lack, in process: each portable path of the exporter on a loop that refuses
what Windows' proactor loop refuses (`ProactorLikeLoop`), or with the missing module or function taken away;
and the portable configuration itself (scripts/test.sh's second pass) checked to take them away."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import portable_loop
import pytest
from aiohttp import web
from big_log import build_log
from diagnose_checks import CAPTURE_ROOT, record_splits
from portable_loop import ProactorLikeLoop

from exporter import diagnose
from exporter import serve as serve_mod
from exporter.config import parse_config
from exporter.diagnose import parallel
from exporter.logs.stdin import MAX_LINE_BYTES, StdinSource
from exporter.logs.watch import InotifyWatch, WakeUps
from exporter.loops import waits_on_descriptors
from exporter.serve import stop_on_signals
from exporter.sources.procfs import ProcReader
from exporter.web.server import BindError, start_server

T = TypeVar("T")


def on_proactor_like(work: Coroutine[Any, Any, T]) -> T:
    loop = ProactorLikeLoop()
    try:
        return loop.run_until_complete(work)
    finally:
        loop.close()


# ------------------------------------------------------------------------------ the configuration itself


def test_this_run_is_in_the_configuration_it_says() -> None:
    """In the portable pass (LLAMACPP_EXPORTER_PORTABLE=1) what Windows lacks is gone from this very process;
    in the other pass it is all there. Either way the assertions bite: the pass cannot silently do nothing."""
    if os.environ.get("LLAMACPP_EXPORTER_PORTABLE") == "1":
        with pytest.raises(ImportError):
            import resource
        with pytest.raises(ImportError):
            import fcntl  # noqa: F401
        assert not any(hasattr(os, name) for name in ("sysconf", "fork", "pread", "sched_getaffinity"))
        assert isinstance(asyncio.get_event_loop_policy(), portable_loop.PortablePolicy)
        import watchdog.observers
        from watchdog.observers.polling import PollingObserver

        assert watchdog.observers.Observer is PollingObserver
        assert os.environ["LLAMACPP_EXPORTER_PROCESS_SOURCE"] == "psutil"
        assert portable_loop.active()
    else:
        import resource

        assert resource.getrlimit(resource.RLIMIT_NOFILE)
        assert hasattr(os, "sysconf") and not portable_loop.active()


def test_the_proactor_like_loop_refuses_what_the_proactor_loop_refuses() -> None:
    async def check() -> None:
        loop = asyncio.get_running_loop()
        a, b = socket.socketpair()
        try:
            calls: list[Callable[[], object]] = [
                lambda: loop.add_reader(a.fileno(), print),
                lambda: loop.add_writer(a.fileno(), print),
                lambda: loop.add_signal_handler(signal.SIGINT, print),
            ]
            for call in calls:
                with pytest.raises(NotImplementedError):
                    call()
            r, w = os.pipe()
            with open(r, "rb") as reading, pytest.raises(NotImplementedError):  # noqa: PTH123
                await loop.connect_read_pipe(asyncio.Protocol, reading)
            os.close(w)
            assert not waits_on_descriptors(loop)
            # Its own sockets work, as the proactor loop's do.
            reader, writer = await asyncio.open_unix_connection(sock=b)
            a.sendall(b"line\n")
            assert await reader.readline() == b"line\n"
            writer.close()
        finally:
            a.close()

    on_proactor_like(check())


async def test_a_selector_loop_waits_on_descriptors() -> None:
    if portable_loop.active():
        assert not waits_on_descriptors(asyncio.get_running_loop())
    else:
        assert waits_on_descriptors(asyncio.get_running_loop())


# -------------------------------------------------------------------------------------------- start-up


def test_the_default_proc_root_is_not_checked_and_a_given_one_only_with_proc_on(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where there is no /proc (Windows, macOS) the default is never checked; --proc-root given on purpose
    must be a directory while --proc is on."""
    import exporter.config as config_mod

    class NoProc(type(Path())):  # type: ignore[misc]
        def is_dir(self) -> bool:
            return False

    monkeypatch.setattr(config_mod, "Path", NoProc)
    assert parse_config(["--log-file", "x.log"], env={}).host.proc_root == "/proc"
    assert parse_config(["--log-file", "x.log", "--proc", "off", "--proc-root", "/no/such"], env={}).host.proc is False
    with pytest.raises(SystemExit) as exit_:
        parse_config(["--log-file", "x.log", "--proc-root", "/no/such"], env={})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--proc-root: not a directory: '/no/such'" in err


def test_journald_is_refused_off_linux_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(SystemExit) as exit_:
        parse_config(["--journal-unit", "llama-server.service"], env={})
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only on Linux" in err and "--log-file" in err


def test_the_proc_reader_is_built_without_sysconf(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delattr(os, "sysconf", raising=False)
    reader = ProcReader(tmp_path)
    assert reader.clock_ticks == 100 and reader.page_size > 0


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("127.0.0.1:8081,[::1]:8081", None),
        (":8081", None),
        ("127.0.0.1:8081,", "empty items"),
        ("127.0.0.1:8081,127.0.0.1:8081", "twice"),
        ("127.0.0.1:8081,[::1]", "expected HOST:PORT"),
    ],
)
def test_several_guard_listen_addresses(value: str, error: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--log-file", "x.log", "--guard.listen-address", value]
    if error is None:
        config = parse_config(args, env={})
        first, *more = [("::1" if "[" in item else item.rpartition(":")[0], 8081) for item in value.split(",")]
        assert config.guard.listen == first and list(config.guard.listen_also) == more
        return
    with pytest.raises(SystemExit):
        parse_config(args, env={})
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--guard.listen-address" in err and error in err


async def test_every_address_is_bound_or_none_is() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    free_port = free.getsockname()[1]
    free.close()
    try:
        with pytest.raises(BindError) as bad:
            await start_server(web.Application(), "127.0.0.1", free_port, also=[("127.0.0.1", port)])
        assert bad.value.address == f"127.0.0.1:{port}"
        probe = socket.socket()
        probe.bind(("127.0.0.1", free_port))  # the first address was let go again
        probe.close()
        serving = await start_server(web.Application(), "127.0.0.1", 0, also=[("::1", 0)])
        try:
            assert [a.rpartition(":")[0] for a in serving.addresses] == ["127.0.0.1", "[::1]"]
        finally:
            await serving.close()
    finally:
        taken.close()


# ------------------------------------------------------------------------------------ the accept loop


def test_the_server_accepts_and_serves_on_a_proactor_like_loop() -> None:
    async def check() -> None:
        app = web.Application()

        async def hello(request: web.Request) -> web.Response:
            return web.Response(text="hello\n")

        app.router.add_get("/", hello)
        serving = await start_server(app, "127.0.0.1", 0)
        try:
            for _ in range(3):
                reader, writer = await asyncio.open_connection("127.0.0.1", serving.port)
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                answer = await reader.read()
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello\n")
                writer.close()
        finally:
            await serving.close()

    on_proactor_like(check())


# --------------------------------------------------------------------------------- following the log


def test_standard_input_is_read_in_a_thread_on_a_proactor_like_loop() -> None:
    """The same lines, the same skip of an over-long line, the same end at EOF as the pipe reader."""
    r, w = os.pipe()
    payload = b"first\r\n" + b"x" * (MAX_LINE_BYTES + 10) + b"\nsecond\n" + "caf\u00e9 \xff\n".encode("latin-1")

    async def check() -> tuple[list[str], bool]:
        got: list[str] = []
        with open(r, "rb", buffering=0) as stream:  # noqa: PTH123
            source = StdinSource(stream)
            task = asyncio.ensure_future(source.run(got.extend, asyncio.Event()))
            await asyncio.get_running_loop().run_in_executor(None, os.write, w, payload[:50])
            while not got:
                await asyncio.sleep(0.01)
            await asyncio.get_running_loop().run_in_executor(None, writeall, w, payload[50:])
            os.close(w)
            await task
            return got, source.up

    got, up = on_proactor_like(check())
    assert got == ["first", "second", "caf\ufffd \ufffd"] and not up


@pytest.mark.parametrize("loop", ["proactor-like", "selector"])
def test_standard_input_in_utf16_is_told_and_read_as_a_file_is(loop: str) -> None:
    """PowerShell 5.1's `2>` file on standard input: UTF-16LE with a byte order mark and its error record,
    written in pieces split inside characters: the lines as the UTF-8 log's, the record taken off; in a
    thread (Windows' loop) and through the loop's pipe reader alike."""
    from windows_logs import variant

    plain = b"build: 11434 (a1b2c3d)\nmain: caf\xc3\xa9 \xe2\x82\xac\nlast\n"
    data = variant(plain, "powershell51")
    r, w = os.pipe()

    async def check() -> list[str]:
        got: list[str] = []
        with open(r, "rb", buffering=0) as stream:  # noqa: PTH123
            task = asyncio.ensure_future(StdinSource(stream).run(got.extend, asyncio.Event()))
            for i in range(0, len(data), 7):  # odd pieces: a UTF-16 unit split between two reads
                await asyncio.get_running_loop().run_in_executor(None, writeall, w, data[i : i + 7])
            os.close(w)
            await asyncio.wait_for(task, 60)
        return got

    got = on_proactor_like(check()) if loop == "proactor-like" else asyncio.run(check())
    assert got == ["build: 11434 (a1b2c3d)", "main: caf\u00e9 \u20ac", "last"]


def writeall(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def test_a_stop_ends_the_thread_reader_while_the_pipe_stays_open() -> None:
    r, w = os.pipe()

    async def check() -> bool:
        stop = asyncio.Event()
        with open(r, "rb", buffering=0) as stream:  # noqa: PTH123
            source = StdinSource(stream)
            task = asyncio.ensure_future(source.run(lambda lines: stop.set(), stop))
            os.write(w, b"one line\n")
            await asyncio.wait_for(task, 60)  # the line sets stop; the reader thread stays blocked in read()
            return source.up

    try:
        assert on_proactor_like(check())  # stopped, not closed
    finally:
        os.close(w)


def test_the_follower_uses_watchdog_where_the_loop_cannot_wait_on_inotify(tmp_path: Path) -> None:
    async def check() -> InotifyWatch | None:
        return InotifyWatch.create(tmp_path / "llama-server.log", WakeUps(asyncio.get_running_loop(), 0.025))

    assert on_proactor_like(check()) is None


# ------------------------------------------------------------------------------------------- stopping


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGBREAK"])
def test_a_stop_signal_through_signal_signal_where_the_loop_has_no_handlers(
    name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Windows' proactor loop has no add_signal_handler: Ctrl-C, SIGTERM and Ctrl-Break (SIGBREAK, played here
    by SIGUSR1) stop the exporter through signal.signal; a second one while stopping ends it at once."""
    if name == "SIGBREAK":
        monkeypatch.setattr(signal, "SIGBREAK", signal.SIGUSR1, raising=False)
    sig = getattr(signal, name)
    before = signal.getsignal(sig)

    class Ended(Exception):
        """`end_now`, which would end this process (os._exit), in the test."""

    def ended() -> None:
        raise Ended

    monkeypatch.setattr(serve_mod, "end_now", ended)

    async def check() -> None:
        stop = asyncio.Event()
        restore = stop_on_signals(stop)
        try:
            assert signal.getsignal(sig) is not before
            os.kill(os.getpid(), sig)
            await asyncio.wait_for(stop.wait(), 60)
            with pytest.raises(Ended):
                os.kill(os.getpid(), sig)
                await asyncio.sleep(60)  # the handler ends the process from the main thread, here
        finally:
            restore()

    with caplog.at_level("INFO", logger="llamacpp_exporter"):
        on_proactor_like(check())
    assert signal.getsignal(sig) is before
    assert f"received {sig.name}: stopping" in caplog.text


async def test_sigterm_stops_on_the_running_loop() -> None:
    """Through the loop's own handlers (a selector loop) or signal.signal (the portable configuration's)."""
    stop = asyncio.Event()
    restore = stop_on_signals(stop)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 60)
    finally:
        restore()


# ------------------------------------------------------------------------------------------- diagnose


def test_diagnose_spawns_its_workers_where_there_is_no_fork(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Where os.fork is missing the workers are spawned; the report is the one a single process gives."""
    if hasattr(os, "fork"):
        assert parallel.start_method() in ("fork", "forkserver")
    monkeypatch.delattr(os, "fork", raising=False)
    assert parallel.start_method() == "spawn"
    path = build_log(tmp_path / "big.log", 3 * 2**20, root=CAPTURE_ROOT).path
    split = record_splits(monkeypatch, workers=2)
    in_parts = diagnose.diagnose_files([str(path)], max_runs=0)
    monkeypatch.setattr(parallel, "MIN_BYTES", 1 << 62)
    whole = diagnose.diagnose_files([str(path)], max_runs=0)
    assert split[0] is True and len(in_parts.history) > 50
    assert diagnose.to_json(in_parts) == diagnose.to_json(whole)
