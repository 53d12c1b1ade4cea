"""The exporter as a process with what Windows' Python lacks taken away (tests/support/portable on PYTHONPATH)
and without: `--help`, a start and a clean stop on Ctrl-C, the guard on several addresses. These run in both
of the suite's configurations; the portable one itself is checked to take things away in a child process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, free_port, http_request
from paths import REPO

SHIM = REPO / "tests" / "support" / "portable"
CONFIGURATIONS = {"as-is": {}, "portable": {"PYTHONPATH": str(SHIM)}}


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_the_portable_configuration_takes_away_what_windows_lacks_in_a_child() -> None:
    """What an exporter process started by the tests gets: no resource, fcntl, os.sysconf, os.fork; a loop that
    refuses add_reader and add_signal_handler; the process source on psutil."""
    code = """
import asyncio, importlib, os, signal
for name in ("resource", "fcntl"):
    try:
        importlib.import_module(name)
        print(name, "present")
    except ImportError:
        print(name, "missing")
print("sysconf", hasattr(os, "sysconf"), "fork", hasattr(os, "fork"))
async def main():
    loop = asyncio.get_running_loop()
    for what, call in (("add_reader", lambda: loop.add_reader(0, print)),
                       ("add_signal_handler", lambda: loop.add_signal_handler(signal.SIGINT, print))):
        try:
            call()
            print(what, "works")
        except NotImplementedError:
            print(what, "refused")
asyncio.run(main())
print("source", os.environ.get("LLAMACPP_EXPORTER_PROCESS_SOURCE"))
"""
    out = python(code, CONFIGURATIONS["portable"])
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == [
        "resource missing",
        "fcntl missing",
        "sysconf False fork False",
        "add_reader refused",
        "add_signal_handler refused",
        "source psutil",
        "",
    ], out.stdout


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_help_works(configuration: str) -> None:
    env = CONFIGURATIONS[configuration]
    for args in (["--help"], ["diagnose", "--help"]):
        out = subprocess.run(
            [sys.executable, "-m", "exporter", *args],
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0 and out.stdout.startswith("usage:") and not out.stderr, out.stderr


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_ctrl_c_stops_with_one_line_and_exit_code_0(configuration: str, tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    log.write_text("")
    exporter = ExporterProcess(
        log, ["--nvml", "off", "--http", "off", "--proc", "off"], env=CONFIGURATIONS[configuration]
    ).start()
    proc = exporter._proc
    assert proc is not None
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 0
    output = exporter.output_file.read_text(errors="replace")
    assert "received SIGINT: stopping" in output and "Traceback" not in output and "KeyboardInterrupt" not in output


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_a_second_ctrl_c_while_stopping_ends_without_a_traceback(configuration: str, tmp_path: Path) -> None:
    """Ctrl-C twice: the second comes once the first has started the stop (wherever the stop then is, up to
    Python's own shutdown). The process ends: exit code 0 (the stop was done), 130 (ended at once), or
    killed by the signal (Python's own end, where the handlers are the default again); never a traceback."""
    log = tmp_path / "llama-server.log"
    log.write_text("")
    exporter = ExporterProcess(
        log, ["--nvml", "off", "--http", "off", "--proc", "off"], env=CONFIGURATIONS[configuration]
    ).start()
    proc = exporter._proc
    assert proc is not None
    proc.send_signal(signal.SIGINT)
    deadline = time.monotonic() + 60  # a hang guard
    while "received SIGINT: stopping" not in exporter.output_file.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.001)
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) in (0, 130, -signal.SIGINT)
    output = exporter.output_file.read_text(errors="replace")
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_once_stopped_a_ctrl_c_ends_the_process_as_the_system_does(configuration: str, tmp_path: Path) -> None:
    """After the stop (`main` has returned), the stop signals are the system's default again: one that comes
    during Python's own finalization kills the process with no Python code run. With a Python handler still
    in place, finalization clears it, and a signal it had caught just before is printed as "Signal 2 ignored
    due to race condition" with a traceback (seen once in CI). Here the signal is sent from the process itself
    after `main`: killed by SIGINT, nothing printed after."""
    log = tmp_path / "llama-server.log"
    log.write_text("")
    code = f"""
import os, signal, threading
from exporter.cli import main
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
code = main(["--log-file", {str(log)!r}, "--listen-address", "127.0.0.1:0", "--nvml", "off", "--http", "off",
             "--proc", "off"])
print("main returned", code, flush=True)
os.kill(os.getpid(), signal.SIGINT)
print("still running", flush=True)
"""
    out = python(code, CONFIGURATIONS[configuration])
    assert out.returncode == -signal.SIGINT, (out.returncode, out.stdout, out.stderr)
    assert out.stdout == "main returned 0\n", out.stdout
    assert "received SIGINT: stopping" in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize("configuration", CONFIGURATIONS)
def test_the_guard_listens_on_every_address_given(configuration: str, tmp_path: Path) -> None:
    """127.0.0.1 and ::1 both answer (502: no llama-server behind it); an address that cannot be bound ends the
    start in one line, and none is left bound."""
    log = tmp_path / "llama-server.log"
    log.write_text("")
    v4, v6 = free_port(), free_port()
    upstream = f"http://127.0.0.1:{free_port()}"
    base = ["--nvml", "off", "--http", "off", "--proc", "off", "--server-url", upstream]
    with ExporterProcess(
        log, [*base, "--guard.listen-address", f"127.0.0.1:{v4},[::1]:{v6}"], env=CONFIGURATIONS[configuration]
    ) as exporter:
        assert http_request(f"http://127.0.0.1:{v4}/health")[0] == 502
        assert http_request(f"http://[::1]:{v6}/health")[0] == 502
        output = exporter.output_file.read_text(errors="replace")
        assert f"guard serving on http://127.0.0.1:{v4}, http://[::1]:{v6} in front of" in output
        taken = exporter.port  # the exporter's own port: in use
        free = free_port()
        bad = subprocess.run(
            [sys.executable, "-m", "exporter", "--log-file", str(log), "--listen-address", f"127.0.0.1:{free_port()}",
             *base, "--guard.listen-address", f"127.0.0.1:{free},127.0.0.1:{taken}"],
            cwd=REPO, env={**os.environ, **CONFIGURATIONS[configuration]}, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert bad.returncode == 1, bad.stderr
        errors = [line for line in bad.stderr.splitlines() if "error" in line]
        assert errors == [f"llamacpp-exporter: error: --guard.listen-address 127.0.0.1:{taken}: address already in use"]
