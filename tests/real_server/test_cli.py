"""The command line as an operator meets it: flags, environment, bad input, a log that is not there yet."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, free_port, http_request, wait_for
from paths import REPO

from exporter.config import DEFAULT_PORT, parse_config
from exporter.logs.tail import LogTailer
from exporter.model.incidents import KINDS as INCIDENT_KINDS
from exporter.serve import report_crash


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--log-file", "x.log", "--listen-address", "nonsense"], "--listen-address"),
        (["--log-file", "x.log", "--listen-address", "127.0.0.1:99999"], "--listen-address"),
        (["--log-file", "x.log", "--server-url", "ftp://x"], "--server-url"),
        (["--log-file", "x.log", "--log-poll-interval", "-1"], "--log-poll-interval"),
        (["--log-file", "x.log", "--log-batch-interval", "0"], "--log-batch-interval"),
        (["--log-file", "x.log", "--log-batch-interval", "1e300"], "--log-batch-interval"),
        (["--log-file", "x.log", "--server-url", "http://127.0.0.1:99999"], "--server-url"),
        (["--log-file", "x.log", "--server-url", "http://127.0.0.1:abc"], "--server-url"),
        (["--log-file", "x.log", "--server-url", "http://[::1"], "--server-url"),
        (["--log-file", "x.log", "--no-such-flag"], "--no-such-flag"),
        ([], "--log-file"),
    ],
)
def test_bad_flag_is_one_line_naming_it(args: list[str], names: str) -> None:
    result = _run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert names in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("variable", "value", "flag"),
    [("LOG_POLL_INTERVAL", "soon", "--log-poll-interval"), ("LOG_LEVEL", "verbose", "--log-level")],
)
def test_bad_environment_value_is_one_line_naming_it(variable: str, value: str, flag: str) -> None:
    result = _run("--log-file", "x.log", env={f"LLAMACPP_EXPORTER_{variable}": value})
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and flag in result.stderr, result.stderr
    assert f"error: LLAMACPP_EXPORTER_{variable} (the environment's {flag}): " in result.stderr, result.stderr


def test_help_documents_every_flag_with_its_environment_variable() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for flag in ("--log-file", "--listen-address", "--server-url", "--log-poll-interval", "--demo"):
        assert flag in result.stdout
        env = "LLAMACPP_EXPORTER_" + flag.lstrip("-").upper().replace("-", "_")
        assert env in result.stdout, env
    assert str(DEFAULT_PORT) in result.stdout


def test_environment_sets_flags_and_flags_win() -> None:
    env = {"LLAMACPP_EXPORTER_LOG_FILE": "/var/log/a.log", "LLAMACPP_EXPORTER_LISTEN_ADDRESS": "127.0.0.1:1234"}
    cfg = parse_config([], env)
    assert (cfg.logs.file, cfg.web.host, cfg.web.port) == ("/var/log/a.log", "127.0.0.1", 1234)
    cfg = parse_config(["--listen-address", ":4321"], env)
    assert (cfg.web.host, cfg.web.port) == ("", 4321)
    assert parse_config(["--log-file", "x"], {}).web.port == DEFAULT_PORT


def test_missing_log_is_waited_for_while_metrics_serve(tmp_path: Path) -> None:
    """No log yet: /metrics answers with source_up 0; once llama-server writes it, lines are counted."""
    log_file = tmp_path / "not-yet" / "llama-server.log"
    with ExporterProcess(log_file, ["--log-poll-interval", "0.2"], output_file=tmp_path / "exporter.out") as exporter:
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0
        assert exporter.sample("llamacpp_kv_retries_total") == 0
        log_file.parent.mkdir()
        log_file.write_text(
            "0.00.003.960 I srv  llama_server: initializing ...\n"
            "0.00.050.115 I slot launch_slot_: id  0 | task 0 | processing task, is_child = 0\n"
            "0.00.063.012 W srv        decode: failed to find free space in the KV cache, retrying with smaller "
            "batch size, off = 0, n_batch = 64, ret = 1\n"
        )
        wait_for(lambda: exporter.sample("llamacpp_kv_retries_total") == 1, timeout=15, what="retry counted")
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
        assert exporter.sample("llamacpp_server_starts_total") == 1
    output = exporter.output_file.read_text()
    assert output.count("its directory") == 1, output  # said once, not once per poll


def test_a_log_problem_that_starts_while_running_is_said_once(tmp_path: Path) -> None:
    """The log replaced by a directory while the exporter runs: one warning (no line carries it), up 0."""
    log_file = tmp_path / "llama-server.log"
    log_file.write_text("0.00.003.960 I srv  llama_server: initializing ...\n")
    with ExporterProcess(log_file, ["--log-poll-interval", "0.1"], output_file=tmp_path / "exporter.out") as exporter:
        wait_for(
            lambda: exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1, timeout=15, what="log up"
        )
        log_file.unlink()
        log_file.mkdir()
        wait_for(
            lambda: "is a directory, not a log" in exporter.output_file.read_text(), timeout=15, what="the warning"
        )
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0
        time.sleep(0.5)
    assert exporter.output_file.read_text().count("is a directory, not a log") == 1


def test_start_up_replay_ends_on_a_file_that_always_looks_rewritten(tmp_path: Path) -> None:
    """A procfs file reads as size 0 yet has content: every poll looks like a truncation. /metrics answers."""
    if not Path("/proc/cpuinfo").is_file():
        pytest.skip("no /proc/cpuinfo here")
    log_file = tmp_path / "cpuinfo.log"
    log_file.symlink_to("/proc/cpuinfo")
    with ExporterProcess(log_file, ["--log-poll-interval", "0.2"], output_file=tmp_path / "exporter.out") as exporter:
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) is not None


def test_unreadable_log_path_keeps_serving(tmp_path: Path) -> None:
    """A directory where the log should be: one clear line, source_up 0, no crash."""
    (tmp_path / "llama-server.log").mkdir()
    with ExporterProcess(tmp_path / "llama-server.log") as exporter:
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0
        assert exporter.scrape()
    assert "Traceback" not in exporter.output_file.read_text()


def test_port_in_use_is_one_line(tmp_path: Path) -> None:
    port = free_port()
    with ExporterProcess(tmp_path / "a.log", port=port):
        result = _run("--log-file", str(tmp_path / "b.log"), "--listen-address", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert "--listen-address" in result.stderr and "Traceback" not in result.stderr


def test_sigterm_stops_promptly(tmp_path: Path) -> None:
    exporter = ExporterProcess(tmp_path / "a.log").start()
    proc = exporter._proc
    assert proc is not None
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    # Not a timing goal: a hung shutdown would sit until the harness's kill after 10 s.
    assert time.monotonic() - started < 9


def test_demo_runs_and_moves_metrics(tmp_path: Path) -> None:
    """`--demo` (the README's first command) exports a replayed real log with no llama-server around."""
    port = free_port()
    output = tmp_path / "demo.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--demo", "--demo-speed", "20", "--listen-address", f"127.0.0.1:{port}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=output.open("wb"),
        stdin=subprocess.DEVNULL,
    )
    try:
        scraper = ExporterProcess(tmp_path / "unused.log", port=port)  # used only to scrape the demo

        def retries() -> float:
            try:
                return scraper.sample("llamacpp_kv_retries_total") or 0
            except OSError:  # not listening yet
                return 0

        wait_for(lambda: retries() > 0, timeout=60, what="demo cascade")
        assert scraper.sample("llamacpp_kv_pool_capacity_tokens") in (32768, 1024)
        assert (scraper.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) or 0) >= 4
        status, page = http_request(scraper.url + "/")
        # The status page says it is the demo, and shows the replayed incident.
        assert status == 200 and b"Demo mode" in page and b"pool overflow" in page
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    # The demo says what it is and does not warn about itself (its temporary log, the absence of a GPU); what it
    # warns of is the incident it replays, as it would on a real server (one line per incident).
    text = output.read_text()
    incident = tuple(f": {words}" for words in INCIDENT_KINDS.values())
    warned = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
    assert "demo" in text and not [line for line in warned if not any(k in line for k in incident)], warned


def test_help_names_diagnose_and_errors_are_exact(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "exporter", "--help"], cwd=REPO, capture_output=True, text=True)
    assert "llamacpp-exporter diagnose LOG" in re.sub(r"-\s+", "-", " ".join(out.stdout.split()))
    bad = subprocess.run(
        [sys.executable, "-m", "exporter", "--log-file", "x", "--listen-address", ":99999"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "llamacpp-exporter: error: argument --listen-address: port 99999 is out of range (0 to 65535) in "
        "':99999' (see --help)"
    )
    tailer = LogTailer(tmp_path / "no-such-dir" / "llama-server.log")
    assert tailer.poll() == []
    assert tailer.last_error == (
        f"log file {tmp_path}/no-such-dir/llama-server.log: its directory {tmp_path}/no-such-dir does not exist "
        "(yet); waiting for both"
    )
    (tmp_path / "no-such-dir").mkdir()
    tailer.poll()
    assert tailer.last_error == f"log file {tmp_path}/no-such-dir/llama-server.log does not exist yet"


async def test_a_background_task_that_dies_says_so_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken(), name="log pipeline")
    task.add_done_callback(report_crash)
    with caplog.at_level(logging.ERROR):
        await asyncio.wait({task})
        await asyncio.sleep(0)  # done callbacks run on the next loop iteration
    assert [r.getMessage() for r in caplog.records] == [
        "log pipeline stopped: RuntimeError: boom; the exporter keeps serving"
    ]


def test_credentials_in_the_server_url_are_redacted() -> None:
    from exporter.sources.server_http import redact, redact_url

    url = "http://admin:pa55@host:8080/x"
    assert redact_url(url) == "http://admin:***@host:8080/x"
    assert redact_url("http://host:8080") == "http://host:8080"
    assert (
        redact(f"Cannot connect to {url}: pa55 refused", url)
        == "Cannot connect to http://admin:***@host:8080/x: *** refused"
    )
