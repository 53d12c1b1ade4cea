"""`serve` stops the same way on every path: what a start opened is closed whether the start failed half way
(a port in use) or the exporter ran and was told to stop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
from pathlib import Path

import pytest

from exporter.config import Config, parse_config
from exporter.serve import serve

DEMO_PREFIX = "llamacpp-exporter-demo-"


def _demo_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob(DEMO_PREFIX + "*")}


def _open_files() -> set[str]:
    out = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # the directory's own descriptor is gone once listed
            out.add(str(fd.readlink()))
    return out


def _config(port: int, *more: str) -> Config:
    return parse_config(
        ["--demo", "--demo-speed", "50", "--listen-address", f"127.0.0.1:{port}", "--nvml", "off", *more], {}
    )


def _leftovers(before_dirs: set[str], before_files: set[str]) -> dict[str, object]:
    """What a stop may not leave behind: background tasks, the demo's files, open log files."""
    tasks = [t.get_name() for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    return {
        "tasks": tasks,
        "demo dirs": sorted(_demo_dirs() - before_dirs),
        "open logs": sorted(f for f in _open_files() - before_files if "llama-server.log" in f),
    }


NOTHING: dict[str, object] = {"tasks": [], "demo dirs": [], "open logs": []}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd to see open files")
async def test_a_start_that_fails_half_way_undoes_what_started(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before_dirs, before_files = _demo_dirs(), _open_files()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # By the time the port is tried, the demo's file, its replay task and the log tailer exist.
        code = await serve(_config(port))
    assert code == 1
    assert capsys.readouterr().err.strip() == (
        f"llamacpp-exporter: error: --listen-address 127.0.0.1:{port}: Address already in use"
    )
    assert _leftovers(before_dirs, before_files) == NOTHING


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd to see open files")
async def test_a_stop_after_running_leaves_the_same_nothing_behind() -> None:
    before_dirs, before_files = _demo_dirs(), _open_files()
    stop = asyncio.Event()
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    running = asyncio.create_task(serve(_config(port), stop))
    for _ in range(500):  # until it serves: the demo's log is open and /metrics answers
        await asyncio.sleep(0.02)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        writer.close()
        await writer.wait_closed()
        break
    assert _demo_dirs() - before_dirs, "the demo's folder exists while it runs"
    stop.set()
    assert await running == 0
    assert _leftovers(before_dirs, before_files) == NOTHING
    with socket.socket() as again:  # the port was released
        again.bind(("127.0.0.1", port))
