"""`--demo`: replay recorded real llama-server logs into a file, at their recorded pace, in a loop.

The exporter then follows that file through the normal pipeline (tail → parse → state), so the demo
exercises exactly what production runs. Each loop truncates the file and starts over, the way
llama-server truncates its `--log-file` when it restarts, so `llamacpp_server_starts_total` moves too.
The logs are real b11434 captures (`-lv 4`): four slots filling a shared 32k pool until the retry
cascade aborts all four requests, and a pool that recovers by purging an idle slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from importlib import resources
from pathlib import Path

log = logging.getLogger(__name__)

DEMO_LOGS = ("demo-exhaust-long-lv4.log", "demo-recover-purge-lv4.log")
_TIMESTAMP = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")
MAX_GAP_SECONDS = 3.0  # recorded idle stretches (e.g. before shutdown) are shortened to keep the demo lively
PAUSE_BETWEEN_RUNS = 5.0


def recorded_lines(name: str) -> list[tuple[float, str]]:
    """The lines of a bundled log with their recorded time in seconds (continuation lines inherit it)."""
    text = resources.files("exporter").joinpath("data").joinpath(name).read_text(encoding="utf-8")
    out: list[tuple[float, str]] = []
    t = 0.0
    for line in text.splitlines(keepends=True):
        m = _TIMESTAMP.match(line)
        if m:
            t = int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
        out.append((t, line))
    return out


async def replay_forever(path: Path, *, speed: float = 1.0, stop: asyncio.Event | None = None) -> None:
    """Write the bundled logs into `path` one after another, forever (until `stop` is set)."""
    stop = stop or asyncio.Event()
    runs = 0
    while not stop.is_set():
        name = DEMO_LOGS[runs % len(DEMO_LOGS)]
        runs += 1
        log.info("demo: replaying %s into %s (run %d)", name, path, runs)
        # Mode "w" truncates, as llama-server does with --log-file at every start.
        with path.open("w", encoding="utf-8") as f:
            previous = 0.0
            for t, line in recorded_lines(name):
                gap = min(max(t - previous, 0.0), MAX_GAP_SECONDS) / speed
                previous = t
                if gap > 0.0005:
                    f.flush()
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=gap)
                        return
                    except asyncio.TimeoutError:
                        pass
                f.write(line)
            f.flush()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=PAUSE_BETWEEN_RUNS / speed)
