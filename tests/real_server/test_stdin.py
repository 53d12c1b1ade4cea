"""The standard-input source (`--log-file -`, `--log-source stdin`) against the file source, on the same lines.

Two real exporter processes read the same lines, one from a file it follows, one from a pipe:
first every real b11434 capture in turn (each one a server start), then the live output of a real
llama-server (`llama-server … 2>&1 | llamacpp-exporter --log-file -`) during the seed incident.
Every `llamacpp_*` sample about the server must be the same in both.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, LlamaServer, run_concurrent_completions, wait_for
from source_harness import (
    CAPTURES,
    NO_HTTP_SERVER,
    SourceExporter,
    count_lines,
    describe_difference,
    sample,
    server_samples,
    wait_lines,
)

from exporter.config import parse_config
from exporter.logs.stdin import StdinSource

SEED_ARGS = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "--metrics", "-t", "2"]


def test_captures_through_a_pipe_match_the_file_source(tmp_path: Path) -> None:
    """All eight captures, one after the other: after each, the pipe and the file give the same metrics."""
    assert len(CAPTURES) >= 8, CAPTURES
    log_file = tmp_path / "llama-server.log"  # does not exist yet: the file exporter waits for it
    with (
        ExporterProcess(log_file, NO_HTTP_SERVER, output_file=tmp_path / "file.out") as by_file,
        SourceExporter(["--log-file", "-"], workdir=tmp_path, name="stdin", stdin=subprocess.PIPE) as by_pipe,
    ):
        assert by_pipe.stdin is not None
        total = 0
        for capture in CAPTURES:
            data = capture.read_bytes()
            total += count_lines(data)
            log_file.write_bytes(data)  # truncate and rewrite, as llama-server does at every start
            by_pipe.stdin.write(data)
            by_pipe.stdin.flush()
            wait_lines(by_file, total, "file")
            wait_lines(by_pipe, total, "stdin")
            a, b = server_samples(by_file.scrape()), server_samples(by_pipe.scrape())
            assert a == b, f"{capture.parent.name}:\n{describe_difference(a, b, ('file', 'stdin'))}"
            assert a[("llamacpp_server_starts_total", ())] >= 1
        assert by_pipe.sample("llamacpp_server_starts_total") == len(CAPTURES)
        assert by_pipe.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
        # The writer goes away: the source is down, the last state is still served.
        by_pipe.stdin.close()
        wait_for(
            lambda: by_pipe.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0,
            timeout=30,
            what="source_up 0 after EOF",
        )
        assert server_samples(by_pipe.scrape()) == server_samples(by_file.scrape())


@pytest.mark.llama_server
def test_real_llama_server_stderr_through_a_pipe(
    llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    """`llama-server … 2>&1 | llamacpp-exporter --log-file -` and the same server's --log-file agree."""
    log_file = tmp_path / "llama-server.log"
    server = LlamaServer(llama_server_bin, tiny_llama_model, SEED_ARGS, log_file=log_file)
    read_end, write_end = os.pipe()
    proc: subprocess.Popen[bytes] | None = None
    try:
        with (
            SourceExporter(["--log-source", "stdin"], workdir=tmp_path, name="stdin", stdin=read_end) as by_pipe,
            ExporterProcess(log_file, NO_HTTP_SERVER, output_file=tmp_path / "file.out") as by_file,
        ):
            os.close(read_end)
            read_end = -1
            proc = subprocess.Popen(
                server.command, stdin=subprocess.DEVNULL, stdout=write_end, stderr=write_end, env=server.env
            )
            os.close(write_end)
            write_end = -1
            running = proc

            def healthy() -> bool:
                if running.poll() is not None:
                    raise RuntimeError(
                        f"llama-server exited rc={running.returncode}; log:\n{server.log_text()[-3000:]}"
                    )
                h = server.health()
                return h is not None and h[0] == 200

            wait_for(healthy, timeout=60, what="llama-server /health 200")
            results = run_concurrent_completions(server.url, n=4)
            assert [status for status, _ in results] == [500] * 4, results
            wait_for(lambda: len(server.log_lines("decode() failed")) == 1, timeout=30, what="decode() failed logged")

            def same() -> bool:
                a, b = server_samples(by_file.scrape()), server_samples(by_pipe.scrape())
                return a == b and a.get(("llamacpp_requests_aborted_total", (("reason", "context_exceeded"),))) == 4

            try:
                wait_for(same, timeout=30, what="the pipe and the file to agree")
            except TimeoutError:
                a, b = server_samples(by_file.scrape()), server_samples(by_pipe.scrape())
                pytest.fail(f"stdin and file exporters disagree:\n{describe_difference(a, b, ('file', 'stdin'))}")
            scrape = by_pipe.scrape()
            assert sample(scrape, "llamacpp_server_starts_total") == 1
            assert sample(scrape, "llamacpp_kv_pool_capacity_tokens") == 512
            assert sample(scrape, "llamacpp_kv_retries_total") == len(
                server.log_lines("retrying with smaller batch size")
            )
            # Every line of the --log-file also came through the pipe.
            assert (by_pipe.sample("llamacpp_exporter_log_lines_total") or 0) >= len(server.log_lines())

            proc.terminate()
            proc.wait(30)
            wait_for(
                lambda: by_pipe.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0,
                timeout=30,
                what="source_up 0 once llama-server closed the pipe",
            )
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_regular_file_on_standard_input(tmp_path: Path) -> None:
    """`llamacpp-exporter --log-file - < llama-server.log`: a regular file, not a pipe, on standard input."""
    capture = next(c for c in CAPTURES if c.parent.name == "exhaust-lv4")
    with (
        capture.open("rb") as stdin,
        SourceExporter(["--log-file", "-"], workdir=tmp_path, name="redirect", stdin=stdin) as exporter,
    ):
        lines = count_lines(capture.read_bytes())
        wait_for(lambda: exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0, timeout=30, what="EOF")
        assert exporter.sample("llamacpp_exporter_log_lines_total") == lines
        assert exporter.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 4


def test_a_utf16_file_on_standard_input(tmp_path: Path) -> None:
    """`type llama-server.stderr | llamacpp-exporter --log-file -` of PowerShell 5.1's `2>` file (UTF-16LE, its
    error record): read as the UTF-8 log, through a pipe, every line counted, the record's lines not."""
    from windows_logs import variant

    capture = next(c for c in CAPTURES if c.parent.name == "exhaust-lv4")
    data = capture.read_bytes()
    with SourceExporter(["--log-file", "-"], workdir=tmp_path, name="utf16", stdin=subprocess.PIPE) as exporter:
        assert exporter.stdin is not None
        exporter.stdin.write(variant(data, "powershell51"))
        exporter.stdin.close()
        wait_for(lambda: exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0, timeout=30, what="EOF")
        assert exporter.sample("llamacpp_exporter_log_lines_total") == count_lines(data)
        assert exporter.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 4
        assert exporter.sample("llamacpp_server_starts_total") == 1


def test_dev_null_on_standard_input(tmp_path: Path) -> None:
    """systemd's StandardInput=null, `docker run` without -i: one warning, the log source down, still serving."""
    with SourceExporter(["--log-file", "-"], workdir=tmp_path, name="devnull", stdin=subprocess.DEVNULL) as exporter:
        wait_for(lambda: exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 0, timeout=30, what="EOF")
        assert exporter.sample("llamacpp_exporter_log_lines_total") == 0
        output = exporter.output()
    assert "standard input closed" in output and "Traceback" not in output and "Exception in" not in output, output


async def test_closed_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started with standard input closed (`<&-`): Python has no sys.stdin; the source is down, nothing raises."""
    monkeypatch.setattr(sys, "stdin", None)
    source = StdinSource()
    await asyncio.wait_for(source.run(lambda lines: None, asyncio.Event()), timeout=5)
    assert not source.up


@pytest.mark.parametrize(
    ("argv", "env", "source"),
    [
        (["--log-file", "-"], {}, "stdin"),
        (["--log-source", "stdin"], {}, "stdin"),
        ([], {"LLAMACPP_EXPORTER_LOG_SOURCE": "stdin"}, "stdin"),
        (["--log-file", "x.log"], {}, "file"),
        (["--log-source", "file", "--log-file", "x.log"], {}, "file"),
    ],
)
def test_stdin_flags(argv: list[str], env: dict[str, str], source: str) -> None:
    assert parse_config(argv, env).logs.source == source
