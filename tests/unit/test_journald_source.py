"""The journald source in process: journal entries in each output form, start banners, its flags and their
errors, the journalctl command line, and a missing journalctl reported once and not fatal. Against a
real systemd-journald: tests/system/test_journald.py."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from source_harness import (
    CAPTURES,
)

from exporter.config import parse_config
from exporter.logs.journald import JournaldSource, is_start_banner, parse_entry


def test_parse_entry_forms() -> None:
    """journalctl -o json: text, byte arrays (control characters), repeated fields, empty messages."""
    e = parse_entry('{"__CURSOR":"s=a;i=1","_PID":"42","MESSAGE":"srv  load_model: loading model"}')
    assert e is not None and e.cursor == "s=a;i=1" and e.pid == "42" and e.lines == ["srv  load_model: loading model"]
    colour = list(b"\x1b[31mE\x1b[0m red")
    e = parse_entry(f'{{"__CURSOR":"c","MESSAGE":{colour}}}')
    assert e is not None and e.lines == ["\x1b[31mE\x1b[0m red"]
    e = parse_entry('{"__CURSOR":"c","MESSAGE":["first","second"],"_PID":["1","2"]}')
    assert e is not None and e.lines == ["first"] and e.pid == "1"
    e = parse_entry('{"__CURSOR":"c","MESSAGE":""}')
    assert e is not None and e.lines == [""]
    e = parse_entry('{"__CURSOR":"c","MESSAGE":null}')  # a field journalctl left out
    assert e is not None and e.lines == []
    assert parse_entry("not json") is None and parse_entry("[1]") is None


def test_start_banner_lines() -> None:
    capture = next(c for c in CAPTURES if c.parent.name == "exhaust-lv4").read_text().splitlines()
    banners = [line for line in capture if is_start_banner(line)]
    assert banners and banners[0] == capture[0], banners  # `initializing ...` opens the log
    assert not any(is_start_banner(line) for line in capture[10:])


@pytest.mark.parametrize(
    ("argv", "env", "error"),
    [
        (["--log-source", "journald"], {}, "--journal-unit"),
        (["--log-source", "journald", "--journal-unit", "x", "--log-file", "a.log"], {}, "exclude each other"),
        (["--journal-unit", "x", "--log-source", "file", "--log-file", "a.log"], {}, "--journal-unit needs"),
        (["--journal-unit", ""], {}, "--journal-unit: empty"),
        ([], {"LLAMACPP_EXPORTER_LOG_SOURCE": "syslog"}, "--log-source"),
        ([], {}, "--log-file is required"),
    ],
)
def test_journald_flag_errors(
    argv: list[str], env: dict[str, str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(argv, env)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert error in err and err.count("\n") == 1, err


def test_journald_flags() -> None:
    c = parse_config(["--journal-unit", "llama-server.service"], {})
    assert (c.logs.source, c.logs.journal_unit, c.logs.journal_namespace, c.logs.journal_directory) == (
        "journald",
        "llama-server.service",
        None,
        None,
    )
    env = {
        "LLAMACPP_EXPORTER_LOG_SOURCE": "journald",
        "LLAMACPP_EXPORTER_JOURNAL_UNIT": "llama-server",
        "LLAMACPP_EXPORTER_JOURNAL_NAMESPACE": "llm",
        "LLAMACPP_EXPORTER_JOURNAL_DIRECTORY": "/host/var/log/journal",
    }
    c = parse_config([], env)
    assert (c.logs.source, c.logs.journal_unit, c.logs.journal_namespace, c.logs.journal_directory) == (
        "journald",
        "llama-server",
        "llm",
        "/host/var/log/journal",
    )
    cmd = JournaldSource("llama-server", namespace="llm", directory="/j").command("--reverse")
    assert cmd[0] == "journalctl" and "--unit=llama-server" in cmd and "--namespace=llm" in cmd
    assert "--directory=/j" in cmd and "--output=json" in cmd and "--all" in cmd and cmd[-1] == "--reverse"


def test_journalctl_missing_is_reported_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """No journalctl: the source is down, one warning names the problem, and nothing raises."""
    source = JournaldSource("llama-server.service", journalctl=str(tmp_path / "no-journalctl"), restart_delay=0.01)
    with caplog.at_level(logging.WARNING):
        assert source.history() == []
    assert not source.up
    assert "cannot run" in caplog.text and "no-journalctl" in caplog.text

    async def follow_briefly() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(source.run(lambda lines: None, stop))
        while source.restarts < 3:
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 60)  # a hang guard

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        asyncio.run(follow_briefly())
    assert not source.up
    assert caplog.text.count("cannot run") == 0  # already reported once, not on every retry
