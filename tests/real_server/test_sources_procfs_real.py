"""The process sources against real processes: a server found by name, by the log it writes, by our stdin
pipe; the exporter started first; foreign servers never adopted. Each test runs with the /proc reader and
with the psutil reader (what Windows and macOS use)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import psutil
import pytest
from llama_harness import wait_for

from exporter.sources.process import ProcessFinder
from exporter.sources.procfs import ProcReader
from exporter.sources.psutil_reader import PsutilReader

SOURCES = ("procfs", "psutil")


class Readers:
    """Builds the reader under test: `root`, a /proc root for ProcReader, narrows psutil to the same pids."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, root: Path | None = None, **kw: object) -> ProcessFinder:
        if self.source == "procfs":
            return ProcReader(root or "/proc", **kw)  # type: ignore[arg-type]
        if root is not None:
            pids = [int(p.name) for p in root.iterdir() if p.name.isdigit()]
            kw["processes"] = lambda: [psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)]
        return PsutilReader(**kw)  # type: ignore[arg-type]


@pytest.fixture(params=SOURCES)
def reader(request: pytest.FixtureRequest) -> Readers:
    return Readers(request.param)


def test_a_server_taken_by_name_only_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, reader: Readers
) -> None:
    """With no log to compare with (a reader given neither a log file nor a unit), the lone llama-server
    is taken as a guess: said once, labelled."""
    with _lone_server(tmp_path) as (lone, root):
        guesser = reader(root)
        with caplog.at_level(logging.WARNING, logger="exporter.sources.process"):
            snaps = [guesser.read() for _ in range(3)]
        assert all(s.process is not None and (s.process.pid, s.process.found_by) == (lone.pid, "name") for s in snaps)
        assert len([r for r in caplog.records if "by its name only" in r.getMessage()]) == 1


def test_an_exporter_started_before_its_server_never_adopts_a_foreign_one(tmp_path: Path, reader: Readers) -> None:
    """A foreign llama-server (its own log) runs; the exporter starts before its server writes its log:
    the foreign one is never taken, and ours is, as soon as it starts."""
    from llama_harness import ExporterProcess

    ours, theirs = tmp_path / "ours" / "llama-server.log", tmp_path / "foreign.log"
    theirs.write_text("")  # llama-server creates its log as it starts
    sleeper = "import time; time.sleep(120)"
    foreign = _spawn("llama-server", sleeper, ["--log-file", str(theirs), "-c", "32768"])
    to_terminal = _spawn("llama-server", sleeper, ["-c", "65536"])  # names no log: writes to its terminal
    server = None
    try:
        _wait_exec(foreign, "llama-server")
        _wait_exec(to_terminal, "llama-server")
        assert reader(log_file=str(ours)).read().process is None
        exp = ExporterProcess(
            ours,
            ["--http", "off", "--nvml", "off", "--process-source", reader.source],
            output_file=tmp_path / "exporter.out",
        )
        with exp:
            assert exp.sample("llamacpp_exporter_source_up", {"source": "proc"}) == 0
            assert exp.sample("llamacpp_process_resident_memory_bytes") is None
            assert exp.sample("llamacpp_kv_pool_capacity_tokens") is None  # not a foreign server's 32,768 or 65,536
            ours.parent.mkdir()
            ours.write_text("")
            server = _spawn("llama-server", sleeper, ["--log-file", str(ours), "-c", "4096"])
            _wait_exec(server, "llama-server")
            wait_for(
                lambda: exp.sample("llamacpp_process_found_by", {"how": "log_file"}) == 1,
                timeout=15,
                what="our server adopted",
            )
            start = exp.sample("llamacpp_process_start_time_seconds")
            assert start is not None and abs(start - Path(f"/proc/{server.pid}").stat().st_mtime) < 5
            assert exp.sample("llamacpp_kv_pool_capacity_tokens") == 4096  # from our server's command line
        assert "by its name only" not in exp.output_file.read_text()
    finally:
        for p in (foreign, to_terminal, server):
            if p is not None:
                p.kill()
                p.wait()


def test_no_server_is_ours_while_our_log_does_not_exist(tmp_path: Path, reader: Readers) -> None:
    """A lone llama-server that names no log (it writes to a terminal) is not taken while our log file
    does not exist: no process writes a file that is not there."""
    with _lone_server(tmp_path) as (_, root):
        snap = reader(root, log_file=str(tmp_path / "missing.log")).read()
        assert snap.process is None
        assert snap.error is not None and "missing.log (it does not exist yet)" in snap.error
        assert "other llama-server processes run, not ours" in snap.error


def test_real_proc_server_naming_or_writing_the_log(tmp_path: Path, reader: Readers) -> None:
    """Other llama-servers may run on this machine: being root, the reader knows they write other logs."""
    log = tmp_path / "llama-server.log"
    sleeper = "import time; time.sleep(60)"
    named = _spawn("llama-server", sleeper, ["--log-file", str(log)])
    try:
        _wait_exec(named, "llama-server")
        snap = reader(log_file=str(log)).read()
        assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (named.pid, "log_file")
    finally:
        named.kill()
        named.wait()
    with log.open("ab") as out:
        writer = _spawn("llama-server", sleeper, [], stdout=out)
    try:
        _wait_exec(writer, "llama-server")
        snap = reader(log_file=str(log)).read()
        assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (writer.pid, "log_file")
        # Another log: this server is known to write elsewhere and is not taken by name either.
        other = tmp_path / "other.log"
        other.touch()
        snap = reader(log_file=str(other)).read()
        assert snap.process is None or snap.process.pid != writer.pid
    finally:
        writer.kill()
        writer.wait()


def test_a_server_whose_wrapper_writes_the_log(tmp_path: Path, reader: Readers) -> None:
    """A wrapper (PowerShell's `2>`, a script) reads llama-server's output through a pipe and writes the log
    itself: the llama-server it started is ours, not taken by name."""
    log = tmp_path / "llama-server.stderr"
    child = f'exec -a llama-server "$0" -c "{_SLEEPER}"'
    wrapper_script = (
        "import subprocess, sys, time\n"
        "log = open(sys.argv[1], 'ab')\n"
        f"subprocess.Popen(['bash', '-c', {child!r}, sys.executable], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)\n"
        "time.sleep(60)"
    )
    wrapper = subprocess.Popen([sys.executable, "-c", wrapper_script, str(log)])
    try:
        wrapper_proc = psutil.Process(wrapper.pid)
        wait_for(lambda: wrapper_proc.children(), timeout=10, what="the wrapper's llama-server")
        (server,) = wrapper_proc.children()
        wait_for(lambda: server.cmdline()[:1] == ["llama-server"] and log.exists(), timeout=10, what="exec")
        snap = reader(log_file=str(log)).read()
        assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (server.pid, "log_file")
        if reader.source == "psutil":  # as on Windows and macOS: open files without their mode
            without_modes = reader(log_file=str(log))
            without_modes._modes = False  # type: ignore[attr-defined]
            snap = without_modes.read()
            assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (server.pid, "log_file")
        other = tmp_path / "other.stderr"
        other.write_text("")
        elsewhere = reader(log_file=str(other)).read().process  # the wrapper writes another log: not ours
        assert elsewhere is None or elsewhere.pid != server.pid
    finally:
        for p in psutil.Process(wrapper.pid).children():
            p.kill()
        wrapper.kill()
        wrapper.wait()


_SLEEPER = "import time; time.sleep(60)"


def test_real_proc_server_writing_into_our_stdin_pipe(tmp_path: Path, reader: Readers) -> None:
    """/proc sees which process writes into our pipe; psutil lists no pipes, so there the llama-server
    started by the exporter (or its parent) is taken; `tee` never."""
    read_end, write_end = os.pipe()
    try:
        server = _spawn("llama-server", "import time; time.sleep(60)", [], stdout=write_end)
        tee = _spawn("tee", "import time; time.sleep(60)", [], stdout=write_end)  # also writes: not a server
        try:
            _wait_exec(server, "llama-server")
            _wait_exec(tee, "tee")
            root = None
            if reader.source == "psutil":  # narrowed to these two, as other llama-servers may run on this host
                root = tmp_path
                for p in (server, tee):
                    (root / str(p.pid)).mkdir()
            snap = reader(root, stdin_fd=read_end).read()
            assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (server.pid, "log_file")
        finally:
            for p in (server, tee):
                p.kill()
                p.wait()
    finally:
        os.close(read_end)
        os.close(write_end)


@contextlib.contextmanager
def _lone_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real process named llama-server that names no log, and a /proc root holding only it (so that
    other llama-servers on the host do not count)."""
    lone = _spawn("llama-server", "import time; time.sleep(60)", [])
    try:
        _wait_exec(lone, "llama-server")
        root = tmp_path / "proc"
        root.mkdir()
        (root / "meminfo").symlink_to("/proc/meminfo")
        (root / str(lone.pid)).symlink_to(f"/proc/{lone.pid}")
        yield lone, root
    finally:
        lone.kill()
        lone.wait()


def _spawn(argv0: str, script: str, args: list[str], stdout: int | IO[bytes] | None = None) -> subprocess.Popen[bytes]:
    """A real process whose argv[0] is `argv0` (like `exec -a`), running a Python `script`."""
    return subprocess.Popen(
        ["bash", "-c", f'exec -a {argv0} "$0" -c "$1" "${{@:2}}"', sys.executable, script, *args],
        stdout=stdout,
    )


def _wait_exec(proc: subprocess.Popen[bytes], argv0: str) -> None:
    wait_for(
        lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(argv0.encode()),
        timeout=10,
        what=f"{argv0} exec'd",
    )
