"""`llamacpp-exporter diagnose` run as a program: exit status and JSON, standard input, closed or full
streams, garbage and corrupt gzip, a history of files; and a real llama-server's incident and restart."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from diagnose_checks import (
    CAPTURE_ROOT,
    check_against_lines,
    log_lines,
)
from llama_harness import LlamaServer, run_concurrent_completions, wait_for
from paths import B11434, REPO

from exporter import diagnose
from exporter.diagnose import diagnose_file, render_text, to_json

FIXTURES = B11434


def test_a_history_of_files_in_time_order_each_read_once(tmp_path: Path) -> None:
    """Rotated, gzipped and copied files (quoted pattern too): oldest first, a copy read once, a partial
    copy (taken while its run went on) counted once, a file that is not a log skipped and said; the same
    history as one stream on stdin gives the same runs."""
    names = ("exhaust-lv4", "recover-purge-lv4", "exhaust-long-lv4")
    lines = {n: (CAPTURE_ROOT / n / "llama-server.log").read_bytes() for n in names}
    crashed = b"".join(lines["exhaust-long-lv4"].splitlines(keepends=True)[:250])  # killed mid-request
    partial = b"".join(crashed.splitlines(keepends=True)[:200])  # copied while it still ran
    files = {
        "llama-server.log.2.gz": (gzip.compress(lines["exhaust-lv4"]), 1_000),
        "llama-server.log.1": (crashed, 2_000),
        "llama-server.log.prev-0920": (partial, 2_200),  # a wrapper's copy, taken mid-run
        "llama-server.log.prev-0930": (crashed, 2_500),  # a wrapper's copy of the same run
        "llama-server.log": (lines["recover-purge-lv4"], 3_000),
        "notes.txt": (b"not a log\n", 3_500),
    }
    for name, (data, mtime) in files.items():
        (tmp_path / name).write_bytes(data)
        os.utime(tmp_path / name, (mtime, mtime))
    paths, order = diagnose.input_files([str(tmp_path / "llama-server.log*"), str(tmp_path / "notes.txt")])
    assert order == "by modification time, oldest first"
    report = diagnose.diagnose_files(paths, max_runs=0)
    read = ["llama-server.log.2.gz", "llama-server.log.1", "llama-server.log.prev-0920", "llama-server.log"]
    assert [Path(f).name for f in report.files] == read
    assert [Path(r.file).name for r in report.runs] == [read[0], read[1], read[3]]
    assert [r.ending.how for r in report.runs] == ["clean", "died_mid_request", "clean"]
    assert report.runs[1].ending.in_flight and report.runs[1].last_line == 250
    assert len(report.skipped) == 2 and "the same content as" in report.skipped[0] and "notes.txt" in report.skipped[1]
    assert report.runs_total == 3 and [s.same_as for s in report.history] == [None, None, 2, None]
    assert (
        len(report.overlaps) == 1
        and "run 3 (" in report.overlaps[0]
        and "lines 1-200) is run 2 (" in report.overlaps[0]
    )
    assert [(Path(fs.file).name, fs.modified, fs.runs, fs.copies, fs.aborted_requests) for fs in report.by_file] == [
        ("llama-server.log.2.gz", 1_000, 1, 0, 4),
        ("llama-server.log.1", 2_000, 1, 0, 0),
        ("llama-server.log.prev-0920", 2_200, 0, 1, 0),
        ("llama-server.log", 3_000, 1, 0, 0),
    ]
    text = render_text(report)
    assert "  1970-01-01 00:16:40  llama-server.log.2.gz       1 run: 1 clean; 1 failure, 4 aborted" in text
    assert "llama-server.log.prev-0920  1 run read twice" in text and "Read twice: run 3 (" in text
    assert "Aborted requests per day: 1970-01-01 4" in text
    assert "Restart loop" not in text  # 1,000 s apart
    for name, (_, mtime) in files.items():  # the same three starts within one minute
        os.utime(tmp_path / name, (mtime / 100, mtime / 100))
    assert "Restart loop: 3 starts within one minute." in render_text(diagnose.diagnose_files(paths, max_runs=0))
    assert report.lines == sum(
        len(files[Path(f).name][0].splitlines()) for f in report.files if not f.endswith(".gz")
    ) + len(lines["exhaust-lv4"].splitlines())

    stream = subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", "--json", "--max-runs", "0", "-"],
        input=lines["exhaust-lv4"] + crashed + partial + lines["recover-purge-lv4"],
        capture_output=True,
        check=False,
        cwd=REPO,
    )
    from_stdin = json.loads(stream.stdout)
    from_files = json.loads(to_json(report))
    for key in ("runs_total", "failures_total", "aborted_requests_total", "endings", "lines"):
        assert from_stdin[key] == from_files[key], key
    for a, b in zip(from_stdin["runs"], from_files["runs"], strict=True):
        assert (a["counts"], a["ending"]["how"], a["failure_summary"]) == (
            b["counts"],
            b["ending"]["how"],
            b["failure_summary"],
        )


def test_cli_exit_status_and_json() -> None:
    bad = _cli(str(FIXTURES / "exhaust-lv4" / "llama-server.log"))
    assert bad.returncode == 1 and "Failure 1 at line 354" in bad.stdout and bad.stderr == ""
    good = _cli(str(FIXTURES / "recover-purge-lv4" / "llama-server.log"), "--json")
    assert good.returncode == 0 and json.loads(good.stdout)["failures_total"] == 0


def test_cli_reads_standard_input() -> None:
    data = (FIXTURES / "exhaust-lv4" / "llama-server.log").read_bytes()
    result = _cli("-", "--json", stdin=data)
    assert result.returncode == 1 and json.loads(result.stdout)["aborted_requests_total"] == 4


@pytest.mark.parametrize(
    ("log", "close_fd", "stdout_path", "message", "status"),
    [
        ("-", 0, None, "standard input is closed", 3),  # diagnose - <&-: no input
        ("exhaust-lv4", 1, None, "standard output is closed", 4),  # diagnose LOG >&-: no output
        ("exhaust-lv4", None, "/dev/full", "No space left on device", 4),  # diagnose LOG > /dev/full
    ],
)
def test_closed_or_full_standard_streams_are_one_line_errors(
    log: str, close_fd: int | None, stdout_path: str | None, message: str, status: int
) -> None:
    if stdout_path and not Path(stdout_path).exists():
        pytest.skip(f"no {stdout_path} here")
    path = log if log == "-" else str(FIXTURES / log / "llama-server.log")
    with Path(stdout_path or os.devnull).open("w") as stdout:
        result = subprocess.run(
            [sys.executable, "-m", "exporter", "diagnose", path],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=None if close_fd is None else lambda: os.close(close_fd),
            timeout=60,
            check=False,
        )
    assert result.returncode == status and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr


def test_corrupt_gzip_exits_3(tmp_path: Path) -> None:
    data = gzip.compress((FIXTURES / "exhaust-lv4" / "llama-server.log").read_bytes())
    path = tmp_path / "broken.log.gz"
    path.write_bytes(data[:200] + b"\x00garbage" * 50)
    result = _cli(str(path))
    assert result.returncode == 3 and "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_garbage_input_exits_3_with_one_line(tmp_path: Path) -> None:
    """A clear one-line message and exit status 3 (an input cannot be diagnosed), never a traceback; a wrong
    command line is 2."""
    for what, path, message in _garbage_files(tmp_path):
        result = _cli(str(path))
        assert result.returncode == 3, (what, result)
        assert result.stdout == "", what
        assert "Traceback" not in result.stderr, (what, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("llamacpp-exporter diagnose: error: ")
        assert message in result.stderr, (what, result.stderr)
    for args in (["--max-runs", "x", "a.log"], [], ["--nope", "a.log"]):
        result = _cli(*args)
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and "(see --help)" in result.stderr


@pytest.mark.llama_server
def test_real_llama_server_incident_and_restart(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> None:
    """Acceptance 2 on a live b11434: `-c 512 -np 4 -kvu -lv 4`, four concurrent requests, twice.

    The server truncates its --log-file at each start; the harness appends its stderr across restarts,
    which makes a real two-run log.
    """
    args = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "-t", "2"]
    with LlamaServer(llama_server_bin, tiny_llama_model, args, log_file=tmp_path / "llama-server.log") as srv:
        for attempt in (1, 2):
            if attempt == 2:
                srv.restart()
            results = run_concurrent_completions(srv.url, n=4)
            assert sum(status == 500 for status, _ in results) == 4, results
            wait_for(lambda: srv.log_lines("decode() failed"), timeout=15, what="decode() failed logged")
            report = diagnose_file(str(srv.log_file))
            print(render_text(report))
            check_against_lines(report, log_lines(srv.log_file))
            (run,) = report.runs
            assert run.configuration.pool_cells == 512 and run.configuration.overcommit == 4.0
            (f,) = run.failures
            assert f.aborted_requests == 4 and f.pool_cells == 512
            assert f.overflow is not None and f.overflow == f.failed_batch and f.overflow > 0
            assert run.recommendations[0].flags == "--kv-unified-per-slot 512"
            assert run.recommendations[0].pool_cells == 2048
        srv.stop()
    both = diagnose_file(str(srv.stderr_file), max_runs=0)
    assert both.runs_total == 2 and both.failures_total == 2 and both.aborted_requests_total == 8
    check_against_lines(both, log_lines(srv.stderr_file))


def _cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def _garbage_files(tmp: Path) -> Iterator[tuple[str, Path | str, str]]:
    empty = tmp / "empty.log"
    empty.write_bytes(b"")
    yield "empty", empty, "empty file"
    binary = tmp / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4096 + b"\x00" * 100_000)
    yield "binary", binary, "binary data"
    random_bytes = tmp / "random.log"
    random_bytes.write_bytes(bytes((i * 7919 + 13) % 251 for i in range(300_000)))
    yield "random", random_bytes, "binary data"
    other = tmp / "nginx.log"
    other.write_text(
        "\n".join(
            f'127.0.0.1 - - [29/Nov/2026:10:{i % 60:02d}:00 +0000] "GET /api/{i} HTTP/1.1" 200 {i * 3} "-" "curl/8.0"'
            for i in range(2000)
        )
        + "\nlistening on 0.0.0.0:80\n"
    )
    yield "another program", other, "no llama-server log lines in 2,001 lines"
    yield "missing", tmp / "nope.log", "no such file"
    yield "directory", tmp, "is a directory"
    zeros = tmp / "zeros.log"
    zeros.write_bytes(b"\x00" * 3_000_000)
    yield "only NUL bytes", zeros, "only NUL bytes"


def test_a_report_to_a_file_is_utf8_whatever_the_code_page(tmp_path: Path) -> None:
    """`diagnose LOG > report.txt` where standard output's encoding is cp1252 (Windows' ANSI code page):
    the whole report, in UTF-8, the path as it is."""
    log = tmp_path / "llama-server.log"
    text = (FIXTURES / "exhaust-lv4" / "llama-server.log").read_text()
    log.write_text(text.replace("models/tiny-llama.gguf", "C:/модели/模型-τ.gguf"), encoding="utf-8")
    report = tmp_path / "report.txt"
    with report.open("wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "exporter", "diagnose", str(log)],
            stdout=out,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONIOENCODING": "cp1252"},
            timeout=120,
        )
    assert done.returncode == 1 and not done.stderr, done.stderr  # 1: the log holds a failure
    assert "model 'C:/модели/模型-τ.gguf'" in report.read_text(encoding="utf-8")
