"""The exporter as a process given the wrong file: another program's log, binary data, a directory.

It keeps serving; /metrics, /healthz and one WARNING line in its own output say which file and why, from
the first scrape; nothing claims the file is "followed". A real llama-server log is understood from line 1.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, http_request
from paths import FIXTURES

from exporter.logs.recognize import UNRECOGNIZED_AFTER_LINES

FOREIGN = sorted((FIXTURES / "foreign").iterdir())


def _healthz(exporter: ExporterProcess) -> dict[str, object]:
    status, raw = http_request(exporter.url + "/healthz", timeout=10)
    assert status == 200, raw
    body = json.loads(raw)
    assert isinstance(body, dict)
    return body


def _warnings(exporter: ExporterProcess, about: Path) -> list[str]:
    """The exporter's WARNING lines about `about` (the pipeline's, or the file source's about the file itself)."""
    return [
        line
        for line in exporter.output_file.read_text().splitlines()
        if (" WARNING exporter.pipeline: " in line or " WARNING exporter.logs.file_source: " in line)
        and str(about) in line
    ]


@pytest.mark.parametrize("sample", FOREIGN, ids=lambda p: p.name)
def test_another_programs_log_is_said_not_to_be_llama_servers(sample: Path, tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    shutil.copy(sample, log)
    with ExporterProcess(log, output_file=tmp_path / "exporter.out") as exporter:
        assert exporter.sample("llamacpp_exporter_log_understood") == 0  # the first scrape
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1  # read; not understood
        health = _healthz(exporter)
        assert health["summary"] == "serving; the log followed is not llama-server's (log.error says why)"
        assert health["log"] == {
            "path": str(log),
            "up": True,
            "understood": False,
            "error": f"{log}: no llama-server log lines in 60 lines (expected llama-server's --log-file output, "
            "plain, prefixed, coloured or --log-jsonl): is it llama-server's log?",
        }
    warnings = _warnings(exporter, log)
    assert len(warnings) == 1 and "no llama-server log lines in 60 lines" in warnings[0], warnings


def test_a_log_that_turns_out_foreign_while_followed_is_said_within_the_rules_lines(tmp_path: Path) -> None:
    """Written after the start, line by line: undecided (no gauge) until the rule's count, then 0 and a WARNING."""
    log = tmp_path / "llama-server.log"
    log.write_bytes(b"")
    lines = (FIXTURES / "foreign" / "sshd-auth.log").read_bytes().splitlines(keepends=True)
    with ExporterProcess(log, ["--log-poll-interval", "0.1"], output_file=tmp_path / "exporter.out") as exporter:
        with log.open("ab") as out:
            out.write(b"".join(lines[: UNRECOGNIZED_AFTER_LINES - 1]))
        # Causality, not time: a scrape reads what the log holds when it is asked (the pipeline catches up).
        assert exporter.sample("llamacpp_exporter_log_lines_total") == UNRECOGNIZED_AFTER_LINES - 1
        assert exporter.sample("llamacpp_exporter_log_understood") is None
        with log.open("ab") as out:
            out.write(lines[UNRECOGNIZED_AFTER_LINES - 1])
        assert exporter.sample("llamacpp_exporter_log_lines_total") == UNRECOGNIZED_AFTER_LINES <= 50
        assert exporter.sample("llamacpp_exporter_log_understood") == 0
        assert len(_warnings(exporter, log)) == 1


def test_a_binary_file_is_refused_and_the_exporter_serves(tmp_path: Path) -> None:
    log = tmp_path / "garbage.bin"
    log.write_bytes(bytes(range(256)) * 64)
    with ExporterProcess(log, output_file=tmp_path / "exporter.out") as exporter:
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0
        assert exporter.sample("llamacpp_exporter_log_understood") == 0
        assert exporter.sample("llamacpp_exporter_log_replayed_lines") == 0  # not one line parsed
        why = f"log file {log}: binary data, not a text log (expected llama-server's --log-file): not followed"
        assert _healthz(exporter)["log"] == {"path": str(log), "up": False, "understood": False, "error": why}
    output = exporter.output_file.read_text()
    assert _warnings(exporter, log) == [line for line in output.splitlines() if line.endswith(why)]
    assert len(_warnings(exporter, log)) == 1
    assert f"following {log}" not in output


def test_a_directory_is_refused_and_the_exporter_serves(tmp_path: Path) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    with ExporterProcess(folder, output_file=tmp_path / "exporter.out") as exporter:
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0
        why = f"log file {folder} is a directory, not a log: not followed (waiting for a regular file)"
        assert _healthz(exporter)["log"] == {"path": str(folder), "up": False, "error": why}
    output = exporter.output_file.read_text()
    assert len(_warnings(exporter, folder)) == 1 and _warnings(exporter, folder)[0].endswith(why)
    assert f"following {folder}" not in output


def test_a_real_log_is_understood_from_its_first_line(tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    real = FIXTURES / "b11434" / "exhaust-lv4" / "llama-server.log"
    log.write_bytes(real.read_bytes().splitlines(keepends=True)[0])
    with ExporterProcess(log, output_file=tmp_path / "exporter.out") as exporter:
        assert exporter.sample("llamacpp_exporter_log_understood") == 1
        assert "error" not in _healthz(exporter)["log"]  # type: ignore[operator]
    assert f"following {log} (replayed 1 existing lines" in exporter.output_file.read_text()
