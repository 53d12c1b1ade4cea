"""The psutil process source (Windows, macOS) at its boundary, on this process: what psutil refuses
elsewhere (another user's process or environment, open files without their mode on Windows and macOS,
processes that exit between two calls) raised where psutil raises it; and `--process-source`.

Real processes read by both sources (servers naming or writing the log, foreign servers, zombies,
router children, the real llama-server) are in tests/real_server/test_sources_psutil_real.py.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psutil
import pytest

from exporter.config import parse_config
from exporter.model.state import ServerState
from exporter.sources.live import LiveSources
from exporter.sources.process_readers import open_process_reader, resolve_process_source
from exporter.sources.procfs import ProcReader
from exporter.sources.psutil_reader import PsutilReader

# What only Linux has: open files with their mode, and /proc to compare with.
linux_only = pytest.mark.skipif(not psutil.LINUX, reason="psutil gives open modes and there is /proc on Linux only")


def _me() -> list[psutil.Process]:
    return [psutil.Process()]


def test_without_open_modes_a_process_not_named_llama_server_is_never_taken(tmp_path: Path) -> None:
    """Windows and macOS: psutil lists open files without their mode, so this process (not named
    llama-server) holding the log open for writing cannot be told from a reader: not taken."""
    log = tmp_path / "llama-server.log"
    log.write_text("")
    with log.open("ab"):
        reader = PsutilReader(log_file=str(log), self_pid=-1, processes=_me)
        reader._modes = False  # open files as psutil lists them on Windows and macOS
        snap = reader.read()
        assert snap.process is None and snap.error is not None and "no llama-server process writing" in snap.error


@linux_only
def test_a_process_writing_the_log_is_found_by_its_open_mode(tmp_path: Path) -> None:
    """This process (not named llama-server, like a renamed binary) writes the log: found on Linux, where
    psutil gives the open mode; with the log only open for reading, not."""
    log = tmp_path / "llama-server.log"
    log.write_text("")
    with log.open("rb"):
        assert PsutilReader(log_file=str(log), self_pid=-1, processes=_me).read().process is None
    with log.open("ab"):
        snap = PsutilReader(log_file=str(log), self_pid=-1, processes=_me).read()
        assert snap.process is not None and (snap.process.pid, snap.process.found_by) == (os.getpid(), "log_file")
    # The exporter itself never matches.
    with log.open("ab"):
        assert PsutilReader(log_file=str(log), processes=_me).read().process is None


def test_a_process_that_exits_while_listed_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def gone(self: psutil.Process) -> str:
        raise psutil.NoSuchProcess(self.pid)

    monkeypatch.setattr(psutil.Process, "name", gone)
    snap = PsutilReader(self_pid=-1, processes=_me).read()
    assert snap.process is None and snap.error == "no llama-server process among this host's processes"


def test_an_unreadable_server_is_an_error_not_an_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: psutil.Process) -> object:
        raise psutil.AccessDenied(self.pid, "llama-server")

    monkeypatch.setattr(psutil.Process, "cmdline", refuse)  # a Windows service's process, to a plain user
    snap = PsutilReader(pid=os.getpid()).read()
    assert snap.process is None and snap.host is not None
    assert snap.error is not None and "cannot be read by this user" in snap.error and "administrator" in snap.error


def test_another_users_environment_refused_leaves_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS refuses another user's environment (AccessDenied): the command line alone counts, and it says so.
    (`LLAMA_*` read from a real server's environment: tests/real_server/test_sources_psutil_real.py.)"""
    snap = PsutilReader(pid=os.getpid()).read()
    assert snap.process is not None and snap.process.environ_readable

    def refuse(self: psutil.Process) -> dict[str, str]:
        raise psutil.AccessDenied(self.pid, "llama-server")

    monkeypatch.setattr(psutil.Process, "environ", refuse)
    snap = PsutilReader(pid=os.getpid()).read()
    assert snap.ok and snap.process is not None and not snap.process.environ_readable


def test_the_journal_unit_needs_proc() -> None:
    snap = PsutilReader(unit="llama-server.service").read()
    assert snap.process is None and snap.error is not None and "--process-source procfs" in snap.error


@linux_only
def test_host_memory_and_this_process_as_the_proc_reader_reads_them() -> None:
    a, b = PsutilReader(pid=os.getpid()).read(), ProcReader(pid=os.getpid()).read()
    assert a.ok and b.ok and a.process is not None and b.process is not None and a.host and b.host
    assert a.host.total_bytes == b.host.total_bytes
    assert (a.process.pid, a.process.found_by, a.process.command_line) == (b.process.pid, "pid", b.process.command_line)
    assert a.process.start_time_seconds == pytest.approx(b.process.start_time_seconds, abs=0.05)


def test_process_source_flag_variable_and_auto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_config(["--log-file", "x"], {}).host.process_source == "auto"
    assert parse_config(["--log-file", "x", "--process-source", "psutil"], {}).host.process_source == "psutil"
    env = {"LLAMACPP_EXPORTER_PROCESS_SOURCE": "psutil"}
    assert parse_config(["--log-file", "x"], env).host.process_source == "psutil"
    assert parse_config(["--log-file", "x", "--process-source", "procfs"], env).host.process_source == "procfs"
    for argv, env in ((["--process-source", "wmi"], {}), ([], {"LLAMACPP_EXPORTER_PROCESS_SOURCE": "wmi"})):
        with pytest.raises(SystemExit) as exc:
            parse_config(["--log-file", "x", *argv], env)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "--process-source" in err and "'wmi'" in err and len(err.strip().splitlines()) == 1
    assert resolve_process_source("auto", tmp_path) == "psutil"  # no <root>/self/stat: as on Windows and macOS
    assert resolve_process_source("procfs", tmp_path) == "procfs"
    assert isinstance(open_process_reader("auto", tmp_path), PsutilReader)


@linux_only
def test_auto_is_procfs_where_proc_is_readable(tmp_path: Path) -> None:
    assert resolve_process_source("auto", "/proc") == "procfs"
    assert isinstance(open_process_reader("auto", "/proc", pid=1), ProcReader)
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "stat").write_text("1 (x) S 0")
    assert resolve_process_source("auto", tmp_path) == "procfs"


@pytest.mark.parametrize(
    ("refusal", "taken"), [(psutil.NoSuchProcess, False), (psutil.AccessDenied, True)], ids=["exited", "denied"]
)
def test_a_server_whose_open_files_cannot_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: type[psutil.Error], taken: bool
) -> None:
    """A llama-server that exits between the listing and the look at its open files writes nothing (it is
    not guessed by name); one whose files this user may not see is the only one that could be ours: taken
    by name, and said."""
    log = tmp_path / "llama-server.log"
    log.write_text("")
    monkeypatch.setattr(psutil.Process, "name", lambda self: "llama-server")

    def refuse(self: psutil.Process) -> list[object]:
        raise refusal(self.pid)

    monkeypatch.setattr(psutil.Process, "open_files", refuse)
    snap = PsutilReader(log_file=str(log), self_pid=-1, processes=_me).read()
    assert (snap.process is not None) == taken
    if snap.process is not None:
        assert snap.process.found_by == "name"


async def test_an_unreadable_environment_is_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(self: psutil.Process) -> dict[str, str]:
        raise psutil.AccessDenied(self.pid, "llama-server")

    monkeypatch.setattr(psutil.Process, "environ", refuse)
    live = LiveSources(ServerState(), proc=PsutilReader(pid=os.getpid()))
    with caplog.at_level(logging.WARNING, logger="exporter.sources.live"):
        for _ in range(3):
            await live.refresh()
    said = [r.getMessage() for r in caplog.records if "environment is not readable" in r.getMessage()]
    assert len(said) == 1 and f"pid {os.getpid()}" in said[0]
    assert live.statuses["proc"].up  # the rest was read
    await live.close()
