"""Is it llama-server's log? One rule (exporter/logs/recognize.py) for the follower and for diagnose.

Another program's log (tests/fixtures/foreign/: sshd, nginx, syslog, a JSON-lines service) is said not to be
llama-server's within its first lines, through the real tailer and pipeline, in the file's name; binary data
and a directory are refused as such; every real log of every build is understood from its first line.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
from paths import FIXTURES, REPO

from exporter.diagnose.inputs import diagnose_file
from exporter.diagnose.read import InputError
from exporter.logs import recognize
from exporter.logs.file_source import FileSource
from exporter.logs.tail import LogTailer
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline

FOREIGN = sorted((FIXTURES / "foreign").iterdir())
REAL_LOGS = sorted(p for p in FIXTURES.rglob("*.log") if "foreign" not in p.parts)


def _pipeline(path: Path) -> LogPipeline:
    return LogPipeline(ServerState(), LogTailer(path))


def test_the_foreign_samples_are_four_programs_logs() -> None:
    assert [p.name for p in FOREIGN] == ["gateway.jsonl", "nginx-access.log", "sshd-auth.log", "syslog"]


@pytest.mark.parametrize("sample", FOREIGN, ids=lambda p: p.name)
def test_a_foreign_log_present_at_start_is_not_understood_at_the_first_scrape(
    sample: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The replay before the first scrape decides: 0, one WARNING naming the file and why."""
    log = tmp_path / "llama-server.log"
    log.write_bytes(sample.read_bytes())
    pipeline = _pipeline(log)
    with caplog.at_level(logging.WARNING, logger="exporter.pipeline"):
        pipeline.replay_existing()
    assert pipeline.understood is False
    assert pipeline.up  # a text file, read: the problem is what it holds
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert str(log) in warnings[0] and "no llama-server log lines in 60 lines" in warnings[0]
    assert pipeline.problem is not None and str(log) in pipeline.problem


@pytest.mark.parametrize("sample", FOREIGN, ids=lambda p: p.name)
def test_a_foreign_log_written_line_by_line_is_said_within_50_lines(
    sample: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Followed live from an empty file: undecided at first, 0 and one WARNING at the rule's line count (<= 50)."""
    log = tmp_path / "llama-server.log"
    log.write_bytes(b"")
    pipeline = _pipeline(log)
    pipeline.replay_existing()
    decided_at = None
    with caplog.at_level(logging.WARNING, logger="exporter.pipeline"), log.open("ab") as out:
        for n, line in enumerate(sample.read_bytes().splitlines(keepends=True), 1):
            out.write(line)
            out.flush()
            assert isinstance(pipeline.source, FileSource)
            pipeline.feed(pipeline.source.tailer.poll())
            if pipeline.understood is not None and decided_at is None:
                decided_at = n
    assert pipeline.understood is False
    assert decided_at == recognize.UNRECOGNIZED_AFTER_LINES <= 50
    assert len(caplog.records) == 1 and str(log) in caplog.records[0].getMessage()


@pytest.mark.parametrize("sample", FOREIGN, ids=lambda p: p.name)
def test_diagnose_refuses_the_same_file_with_the_same_words(sample: Path) -> None:
    with pytest.raises(InputError) as refused:
        diagnose_file(str(sample))
    assert str(refused.value) == f"{sample}: {recognize.not_understood(60)}"


def test_diagnose_and_the_follower_agree_on_a_short_file(tmp_path: Path) -> None:
    """Five sshd lines: diagnose, which has the whole file, refuses it; the follower, for which more may come,
    has not decided yet (and a llama-server line then would be understood)."""
    log = tmp_path / "auth.log"
    log.write_bytes(b"".join((FIXTURES / "foreign" / "sshd-auth.log").read_bytes().splitlines(keepends=True)[:5]))
    with pytest.raises(InputError, match="no llama-server log lines in 5 lines"):
        diagnose_file(str(log))
    pipeline = _pipeline(log)
    pipeline.replay_existing()
    assert pipeline.understood is None
    with log.open("a") as out:
        out.write("0.00.003.960 I srv  llama_server: initializing ...\n")
    assert isinstance(pipeline.source, FileSource)
    pipeline.feed(pipeline.source.tailer.poll())
    assert pipeline.understood is True


def test_a_binary_file_is_refused_not_followed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Random bytes: no line of it is parsed, the log is down and not understood, one line says why."""
    log = tmp_path / "llama-server.log"
    log.write_bytes(bytes(range(256)) * 4 + os.urandom(4096) + b"\nsome\nlines\n")
    pipeline = _pipeline(log)
    with caplog.at_level(logging.WARNING, logger="exporter.pipeline"):
        replayed = pipeline.replay_existing()
    assert replayed == 0
    assert not pipeline.up and pipeline.understood is False
    assert [r.getMessage() for r in caplog.records] == [
        f"log file {log}: binary data, not a text log (expected llama-server's --log-file): not followed"
    ]
    with pytest.raises(InputError, match="binary data, not a text log"):
        diagnose_file(str(log))


def test_a_directory_is_refused_as_such(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    pipeline = _pipeline(folder)
    with caplog.at_level(logging.WARNING, logger="exporter.pipeline"):
        assert pipeline.replay_existing() == 0
    assert not pipeline.up
    assert [r.getMessage() for r in caplog.records] == [
        f"log file {folder} is a directory, not a log: not followed (waiting for a regular file)"
    ]
    assert pipeline.problem == caplog.records[0].getMessage()


def test_every_build_is_understood_from_its_first_line(tmp_path: Path) -> None:
    """b9093, b10306, b11434, llama-cpp-python, xllamacpp, the router: the first line alone is enough."""
    builds = {p.relative_to(FIXTURES).parts[0] for p in REAL_LOGS}
    assert {"b9093", "b10306", "b11434", "llama-cpp-python-0.3.16", "xllamacpp-2026.10.11549", "router"} <= builds
    for real in REAL_LOGS:
        log = tmp_path / "llama-server.log"
        log.write_bytes(real.read_bytes().splitlines(keepends=True)[0])
        pipeline = _pipeline(log)
        pipeline.replay_existing()
        assert pipeline.understood is True, real
        assert pipeline.up and pipeline.problem is None, real


def test_the_docs_say_the_rules_line_count() -> None:
    """Where a page says after how many lines a log is not understood, it says the rule's number."""

    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "alerts" / "runbook.md"]
    said = [
        (page.name, int(n.replace(",", "")))
        for page in pages
        for n in re.findall(r"first ([\d,]+) lines|([\d,]+) lines without", " ".join(page.read_text().split()))
        for n in n
        if n
    ]
    assert len(said) >= 4 and all(n == recognize.UNRECOGNIZED_AFTER_LINES for _, n in said), said
