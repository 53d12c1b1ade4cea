"""A log's encoding told from its first bytes, and PowerShell 5.1's error record taken off, by the tailer
and by `diagnose`, however the bytes arrive (one at a time, a character split between reads); what is
not text shown as such, never as a quiet "up"; file events matched without regard to case where the
system's names are (Windows, macOS), forced here on Linux."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path

import pytest
from windows_logs import powershell51_record, variant

from exporter.diagnose import diagnose_file
from exporter.logs import watch as watch_mod
from exporter.logs.encoding import UTF8, Encoding, PowerShellRecord, sniff
from exporter.logs.tail import LogTailer
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline

LINES = ["build: 11434 (a1b2c3d) with MSVC 19.44 for x64", "main: n_ctx = 4096 — ünïcödé ✓", "srv  init: ok"]


@pytest.mark.parametrize(
    ("head", "encoding"),
    [
        (b"\xef\xbb\xbfbuild", Encoding("utf-8", 3)),
        (b"\xff\xfeb\x00", Encoding("utf-16-le", 2)),
        (b"\xfe\xff\x00b", Encoding("utf-16-be", 2)),
        (b"\xff\xfe\x00\x00b\x00\x00\x00", Encoding("utf-32-le", 4)),
        (b"b\x00u\x00", Encoding("utf-16-le")),  # no byte order mark, ASCII in UTF-16LE
        (b"build", UTF8),
        (b"ab\n", UTF8),
        (b"\xef", None),  # a prefix of a byte order mark: wait for more
        (b"\xef\xbb", None),
        (b"\xff", None),
        (b"\xff\xfe", None),  # UTF-16LE or UTF-32LE
        (b"b\x00", None),  # may be UTF-16LE
        (b"", None),
    ],
)
def test_sniff(head: bytes, encoding: Encoding | None) -> None:
    assert sniff(head) == encoding


@pytest.mark.parametrize("kind", ["crlf", "utf8-bom", "utf16le-bom", "powershell51"])
def test_the_tailer_reads_every_layout_a_byte_at_a_time(tmp_path: Path, kind: str) -> None:
    """Written one byte per poll: a byte order mark, a UTF-16 character and a CRLF each split between reads."""
    data = variant("".join(line + "\n" for line in LINES).encode(), kind)
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(b"")
    tailer = LogTailer(log)
    got: list[str] = []
    for i in range(len(data)):
        with log.open("ab") as f:
            f.write(data[i : i + 1])
        got += tailer.poll()
    assert got == LINES
    assert tailer.stats.bytes == len(data) and tailer.unreadable is None


def test_a_restart_in_another_encoding_is_told_again(tmp_path: Path) -> None:
    """Each content is sniffed anew: a wrapper that switches from PowerShell 5.1 to cmd between runs."""
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(variant(b"first run\n", "powershell51"))
    tailer = LogTailer(log)
    assert tailer.poll() == ["first run"]
    log.write_bytes(variant(b"second\nrun two\n", "crlf"))
    assert tailer.poll() == ["second", "run two"] and tailer.stats.truncations == 1


def test_a_first_line_that_only_looks_like_a_record_is_kept() -> None:
    record = PowerShellRecord()
    assert record.feed(["warmup : done"]) == []  # held: the next line decides
    assert record.feed(["main: next", "more"]) == ["warmup : done", "main: next", "more"]
    assert record.done and not record.found


def test_the_record_is_taken_off_also_from_a_script_and_with_a_drive_letter() -> None:
    record = PowerShellRecord()
    lines = powershell51_record("build: 11434", exe=r"C:\llama\llama-server.exe")
    lines[1] = r"At C:\Users\me\run-llama.ps1:12 char:5"
    assert record.feed([*lines, "main: loading"]) == ["build: 11434", "main: loading"]
    assert (
        record.found and record.prefix == "C:\\llama\\llama-server.exe : " and not record.done
    )  # watching for the next


def test_a_held_first_line_is_read_when_the_file_is_truncated(tmp_path: Path) -> None:
    """A lone first line that looks like a record waits for the next; a restart (truncation) ends the wait."""
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(b"llama-server.exe : build: 11434\r\n")
    tailer = LogTailer(log)
    assert tailer.poll() == []
    log.write_bytes(b"x\n")
    assert tailer.poll() == ["llama-server.exe : build: 11434", "x"]


def test_a_log_that_is_not_text_shows_as_down(tmp_path: Path) -> None:
    """A gzipped log given by mistake (NUL-laden bytes that are not UTF-16): refused, not parsed, not "up"."""
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(gzip.compress("".join(line + "\n" for line in LINES).encode() * 50, mtime=0))
    tailer = LogTailer(log)
    pipeline = LogPipeline(ServerState(), tailer)
    assert pipeline.replay_existing() == 0  # not one line of it parsed
    assert tailer.is_open and tailer.last_error is None
    assert tailer.unreadable is not None and "binary data, not a text log" in tailer.unreadable
    assert pipeline.up is False
    log.write_bytes(variant("".join(line + "\n" for line in LINES).encode(), "utf16le-bom"))  # rewritten
    pipeline.feed(tailer.poll())
    assert pipeline.up is True


@pytest.mark.parametrize("kind", ["utf8-bom", "utf16le-bom", "powershell51"])
def test_diagnose_reads_the_first_line_of_every_layout(tmp_path: Path, kind: str) -> None:
    """A byte order mark no longer hides the first line, UTF-16 is no longer "binary data"."""
    capture = Path(__file__).parent.parent / "fixtures" / "b11434" / "pool-overflow-default" / "llama-server.log"
    log = tmp_path / "llama-server.stderr"
    log.write_bytes(variant(capture.read_bytes(), kind))
    report = diagnose_file(str(log))
    plain = diagnose_file(str(capture))
    assert report.runs_total == plain.runs_total == 1
    assert report.runs[0].first_line == 1
    assert [f.tokens_sum for r in report.runs for f in r.failures] == [
        f.tokens_sum for r in plain.runs for f in r.failures
    ]


def _handler_wakes(monkeypatch: pytest.MonkeyPatch, case_insensitive: bool, event_path: str, target: str) -> bool:
    from watchdog.events import FileModifiedEvent

    monkeypatch.setattr(watch_mod, "CASE_INSENSITIVE_PATHS", case_insensitive)
    loop = asyncio.new_event_loop()
    try:
        wake = watch_mod.WakeUps(loop, 0.025)
        handler = watch_mod.wake_handler(target, str(Path(target).parent), loop, wake)
        handler.on_any_event(FileModifiedEvent(event_path))
        loop.run_until_complete(asyncio.sleep(0))
        return wake.any.is_set()
    finally:
        loop.close()


def test_file_events_match_the_log_without_regard_to_case_where_names_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows reports `C:\\Llama\\Server.log` for a log given as `c:\\llama\\server.log`; the rule forced on Linux."""
    target = "/srv/Llama/llama-server.stderr"
    assert _handler_wakes(monkeypatch, True, "/srv/llama/LLAMA-SERVER.stderr", target)
    assert not _handler_wakes(monkeypatch, False, "/srv/llama/LLAMA-SERVER.stderr", target)
    assert _handler_wakes(monkeypatch, False, target, target)
    assert not _handler_wakes(monkeypatch, True, "/srv/llama/other.log", target)
