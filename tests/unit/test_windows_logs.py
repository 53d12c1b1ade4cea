"""Windows' logs read right, on Linux: every b11434 capture as Windows leaves it (CRLF, a UTF-8 byte order
mark, PowerShell 5.1's UTF-16LE with its error record), followed through the real tailer and pipeline with
the C runtime's text-mode descriptors emulated, and read by `diagnose --json`: both equal the capture's
ground truth. The text-mode hazard itself is shown: opened the old way (no O_BINARY) the same log
miscounts. And Windows' delete-sharing open, all of it but the two Windows calls.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from corpus_replay import CAPTURES, capture, exported, follow, truth_mismatches
from paths import FIXTURES
from windows_logs import O_BINARY, VARIANTS, CrtTextMode, powershell51_appended, variant

from exporter.diagnose.cli import main as diagnose_main
from exporter.logs import fileopen
from exporter.logs import tail as tail_mod
from exporter.logs.tail import LogTailer
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline

B11434 = [p for p in CAPTURES if p.parent.name == "b11434"]


def _old_open(path: str | os.PathLike[str]) -> int:
    """How the tailer opened its log before: on Windows a text-mode descriptor."""
    return os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))


@pytest.mark.parametrize("kind", VARIANTS)
@pytest.mark.parametrize("folder", B11434, ids=[p.name for p in B11434])
def test_followed_metrics_equal_the_truth_in_every_windows_layout(
    folder: Path, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crt = CrtTextMode(monkeypatch, tmp_path)
    state, tailer = follow(folder, tmp_path, lambda data: variant(data, kind))
    assert truth_mismatches(folder, exported(state)) == []
    assert crt.opened and not any(text for _, text in crt.opened)  # read in binary, never in text mode
    assert (tailer.stats.truncations, tailer.stats.lost_bytes) == (len(capture(folder)["logs"]) - 1, 0)


def test_a_text_mode_descriptor_miscounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the emulation stands for: a CRLF log opened without O_BINARY is read wrong (reads shorter than
    the bytes they consume, offsets raw), so that the counters are wrong; opened as the tailer opens it,
    the same log and the same emulation give the truth (the test above)."""
    folder = FIXTURES / "b11434" / "pool-overflow-lv4"  # 315 lines
    CrtTextMode(monkeypatch, tmp_path)
    monkeypatch.setattr(tail_mod, "open_log", _old_open)
    state, tailer = follow(folder, tmp_path, lambda data: variant(data, "crlf"), polls=10)  # ten wake-ups
    wrong = truth_mismatches(folder, exported(state))
    print(wrong, tailer.stats)
    assert any(w.startswith("starts:") for w in wrong) and tailer.stats.truncations > 0


def test_a_ctrl_z_byte_in_a_line_is_read_as_a_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client's prompt logged at debug level may hold ^Z: a text-mode read stops there; a binary one does not."""
    crt = CrtTextMode(monkeypatch, tmp_path)
    log = tmp_path / "llama-server.log"
    log.write_bytes(b"first\r\nprompt: a\x1ab\r\nlast\r\n")
    tailer = LogTailer(log)
    assert tailer.poll() + tailer.poll() == ["first", "prompt: a\x1ab", "last"]
    assert crt.opened == [(str(log), False)]
    tailer.close()

    monkeypatch.setattr(tail_mod, "open_log", _old_open)
    old = LogTailer(log)
    lines = old.poll() + old.poll() + old.poll()
    assert lines != ["first", "prompt: a\x1ab", "last"], lines
    old.close()


def _diagnose_json(paths: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert diagnose_main(["--json", *paths]) in (0, 1)
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


@pytest.mark.parametrize("folder", B11434, ids=[p.name for p in B11434])
def test_diagnose_json_equals_the_truth_in_every_windows_layout(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = capture(folder)
    truth = recorded["truth"]
    reports = {}
    for kind in VARIANTS:
        paths = []
        for name in recorded["logs"]:
            (tmp_path / kind).mkdir(exist_ok=True)
            path = tmp_path / kind / name
            path.write_bytes(variant((folder / name).read_bytes(), kind))
            shutil.copystat(folder / name, path)  # the same times: the same order of the files
            paths.append(str(path))
        text = json.dumps(_diagnose_json(paths, capsys))
        reports[kind] = json.loads(text.replace(str(tmp_path / kind), "DIR"))
    for kind, report in reports.items():
        runs = report["runs"]
        assert isinstance(runs, list)
        assert report["runs_total"] == truth["starts"], kind
        failures = [f for run in runs for f in run["failures"]]
        assert [(sorted(s["slot"] for s in f["slots"]), f["tokens_sum"]) for f in failures] == [
            (f["slots"], f["tokens_sum"]) for f in truth["failures"]
        ], kind
        assert sum(f["aborted_requests"] for f in failures) == truth["requests_aborted"], kind
        if kind == "powershell51":  # the files hold the record's lines too (six after the first)
            assert report["lines"] == reports["lf"]["lines"] + 6 * len(recorded["logs"])
            report["lines"] = reports["lf"]["lines"]
            _unshift_lines(report)  # the line numbers of the file, where its first line is followed by six more
        assert report == reports["lf"], kind  # and every other figure as the plain log's


RESTARTS = sorted(FIXTURES.glob("*/restart-kill9"))


@pytest.mark.parametrize("folder", RESTARTS, ids=[p.parent.name for p in RESTARTS])
def test_a_powershell51_restart_loop_appending_each_run_is_read_as_its_runs(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`2>>` in a restart loop: a record around the first line of every run, mid-file. Followed (each run
    appended as it is written, the C runtime emulated) and read by diagnose: the starts, the runs and every
    figure equal the truth, no line rejected, and none of the records' lines counted as read."""
    recorded = capture(folder)
    runs = [(folder / name).read_bytes() for name in recorded["logs"]]
    pieces = powershell51_appended(runs)
    plain_lines = sum(run.count(b"\n") for run in runs)
    CrtTextMode(monkeypatch, tmp_path)
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(b"")
    state = ServerState()
    tailer = LogTailer(log)
    pipeline = LogPipeline(state, tailer)
    pipeline.replay_existing()
    for piece in pieces:
        with log.open("ab") as f:
            f.write(piece)
        while tailer.has_pending():
            pipeline.feed(tailer.poll())
    pipeline.feed(tailer.poll())
    tailer.close()
    assert truth_mismatches(folder, exported(state)) == []
    assert (tailer.stats.lines, tailer.stats.truncations, tailer.stats.lost_bytes) == (plain_lines, 0, 0)

    report = _diagnose_json([str(log)], capsys)
    assert report["runs_total"] == recorded["truth"]["starts"]
    assert report["lines"] == plain_lines + 6 * len(runs)  # the file's lines, the records' included
    plain = tmp_path / "plain.log"
    plain.write_bytes(b"".join(runs))
    expected = _diagnose_json([str(plain)], capsys)
    for key in ("runs_total", "failures_total", "aborted_requests_total", "endings", "failed_starts_in_a_row"):
        assert report[key] == expected[key], key


def _unshift_lines(data: object) -> None:
    """Line numbers (keys ending in `line`) as in the file without PowerShell's record: past its first
    line (which the record wraps) six lines less."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in list(items):
        if isinstance(key, str) and key.endswith("line") and isinstance(value, int) and value >= 2:
            data[key] = value - 6  # type: ignore[index]
        else:
            _unshift_lines(value)


class FakeWindows:
    """CreateFileW and msvcrt.open_osfhandle over the real files: a handle is a descriptor here."""

    def __init__(self, crt: CrtTextMode, winerror: int = 0, fail_osfhandle: bool = False) -> None:
        self.crt, self.winerror, self.fail_osfhandle = crt, winerror, fail_osfhandle
        self.calls: list[tuple[object, ...]] = []
        self.closed: list[int] = []

    def create_file(self, path: str, access: int, share: int, disposition: int, flags: int) -> tuple[int, int]:
        self.calls.append(("CreateFileW", path, access, share, disposition, flags))
        if self.winerror:
            return fileopen.INVALID_HANDLE_VALUE, self.winerror
        return os.open(path, os.O_RDONLY | O_BINARY), 0  # the handle: binary, whatever the CRT does with it

    def open_osfhandle(self, handle: int, flags: int) -> int:
        self.calls.append(("open_osfhandle", handle, flags))
        if self.fail_osfhandle:
            raise OSError(errno.EMFILE, "Too many open files")
        if not flags & O_BINARY:
            self.crt.text_fds.add(handle)
        return handle

    def close_handle(self, handle: int) -> None:
        self.closed.append(handle)
        os.close(handle)


def test_windows_open_shares_delete_and_is_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper may rename or delete the file we hold: CreateFileW shares read, write and delete; the
    descriptor made of its handle is binary, so CRLF and ^Z come through as they are."""
    crt = CrtTextMode(monkeypatch, tmp_path)
    win = FakeWindows(crt)
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(b"a\r\nb\x1a\r\n")
    fd = fileopen.open_shared(str(log), win.create_file, win.open_osfhandle, win.close_handle)
    assert win.calls == [
        ("CreateFileW", str(log), 0x80000000, 0x7, 3, 0x80),  # GENERIC_READ, all three shares, OPEN_EXISTING
        ("open_osfhandle", fd, os.O_RDONLY | O_BINARY),
    ]
    assert os.read(fd, 100) == b"a\r\nb\x1a\r\n"
    os.close(fd)


@pytest.mark.parametrize(
    ("winerror", "raised"),
    [(2, FileNotFoundError), (3, FileNotFoundError), (5, PermissionError), (32, PermissionError), (1117, OSError)],
)
def test_windows_open_errors_are_the_usual_exceptions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, winerror: int, raised: type[OSError]
) -> None:
    """The tailer tells a missing file from a refused one by the exception, as with os.open."""
    win = FakeWindows(CrtTextMode(monkeypatch, tmp_path), winerror=winerror)
    with pytest.raises(raised) as info:
        fileopen.open_shared(str(tmp_path / "x.log"), win.create_file, win.open_osfhandle, win.close_handle)
    assert info.value.filename == str(tmp_path / "x.log")


def test_windows_open_closes_the_handle_when_no_descriptor_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    win = FakeWindows(CrtTextMode(monkeypatch, tmp_path), fail_osfhandle=True)
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(b"x\n")
    with pytest.raises(OSError, match="Too many"):
        fileopen.open_shared(str(log), win.create_file, win.open_osfhandle, win.close_handle)
    assert len(win.closed) == 1


def test_the_tailer_follows_through_windows_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tailer as Windows runs it (sys.platform win32: CreateFileW, then open_osfhandle), on a CRLF log."""
    crt = CrtTextMode(monkeypatch, tmp_path)
    win = FakeWindows(crt)
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(fileopen, "_create_file_w", win.create_file)
    monkeypatch.setattr(fileopen, "_open_osfhandle", win.open_osfhandle)
    monkeypatch.setattr(fileopen, "_close_handle", win.close_handle)
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(b"one\r\ntwo\r\n")
    tailer = LogTailer(log)
    assert tailer.poll() == ["one", "two"]
    with log.open("ab") as f:
        f.write(b"three\r\n")
    assert tailer.poll() == ["three"]
    assert [c[0] for c in win.calls] == ["CreateFileW", "open_osfhandle"]
    assert not crt.text_fds
    tailer.close()
    missing = LogTailer(tmp_path / "nothing.stderr")
    assert missing.poll() == [] and missing.last_error == f"log file {tmp_path / 'nothing.stderr'} does not exist yet"
