"""The log pipeline: tail → parse → state, with the start-up replay that rebuilds gauges.

At start the existing log is read to its end with `state.counting` off: slots, pool and
configuration come back exactly as they were, but no past event is counted again. Everything read
after that is live and counted. A log that does not exist yet is waited for (`up` stays False), and
everything in it is live once it appears, because it was written after the exporter started.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterable

from exporter.logs.parse import parse_line
from exporter.logs.tail import LogTailer, follow
from exporter.state import ServerState

log = logging.getLogger(__name__)


class LogPipeline:
    """Feeds lines from a `LogTailer` (or standard input) into a `ServerState`."""

    def __init__(self, state: ServerState, tailer: LogTailer | None) -> None:
        self.state = state
        self.tailer = tailer
        self.lines = 0
        self.replayed_lines = 0
        self._stdin_open = tailer is None
        self._reported_error: str | None = None
        self._warned_hidden = False

    # -- LogSourceStatus (read by the collector) -----------------------------------------------
    @property
    def up(self) -> bool:
        """True while the log is open and readable."""
        if self.tailer is None:
            return self._stdin_open
        return self.tailer.is_open and self.tailer.last_error is None

    @property
    def truncations(self) -> int:
        return self.tailer.stats.truncations if self.tailer else 0

    @property
    def rotations(self) -> int:
        return self.tailer.stats.rotations if self.tailer else 0

    @property
    def lost_bytes(self) -> int:
        return self.tailer.stats.lost_bytes if self.tailer else 0

    @property
    def long_lines(self) -> int:
        return self.tailer.stats.long_lines if self.tailer else 0

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, lines: Iterable[str]) -> None:
        """Parse and apply live lines (counted)."""
        apply = self.state.apply
        n = 0
        for line in lines:
            n += 1
            event = parse_line(line)
            if event is not None:
                apply(event)
        self.lines += n
        self._report_tailer_error()
        self._report_hidden_lines()

    def replay_existing(self) -> int:
        """Read the log as it is now, rebuilding gauges without counting events. Returns lines read."""
        if self.tailer is None:
            return 0
        self.state.counting = False
        try:
            while True:
                before = self.tailer.stats.bytes
                lines = self.tailer.poll()
                for line in lines:
                    event = parse_line(line)
                    if event is not None:
                        self.state.apply(event)
                self.replayed_lines += len(lines)
                # Stop at the end, and on a poll that made no progress (a persistent read error must not spin).
                if not self.tailer.has_pending() or (not lines and self.tailer.stats.bytes == before):
                    break
        finally:
            self.state.counting = True
        self._report_tailer_error()
        self._report_hidden_lines()
        return self.replayed_lines

    def _report_hidden_lines(self) -> None:
        """Say once per server start when the log's verbosity hides checkpoint and prompt-cache lines."""
        visible = self.state.checkpoint_lines_visible()
        if visible is False and not self._warned_hidden:
            log.warning(
                "llama-server logs at -lv %s: checkpoint and prompt-cache lines are hidden (trace level on b9829+); "
                "their metrics are left out (llamacpp_checkpoint_lines_visible 0). Run llama-server with -lv 4.",
                self.state.verbosity,
            )
        self._warned_hidden = visible is False

    def _report_tailer_error(self) -> None:
        """Log a tailer problem once when it appears and once when it clears, not on every poll."""
        error = self.tailer.last_error if self.tailer else None
        if error != self._reported_error:
            if error:
                log.warning("%s", error)
            elif self._reported_error:
                log.info("log file %s is readable again", self.tailer.path if self.tailer else "-")
            self._reported_error = error

    async def run(self, *, poll_interval: float, use_watchdog: bool, stop: asyncio.Event) -> None:
        """Follow the log until `stop` is set."""
        if self.tailer is None:
            await self._run_stdin(stop)
            return
        await follow(self.tailer, self.feed, poll_interval=poll_interval, use_watchdog=use_watchdog, stop=stop)

    async def _run_stdin(self, stop: asyncio.Event) -> None:
        """Read lines from standard input (`llama-server … 2>&1 | llamacpp-exporter --log-file -`)."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while not stop.is_set():
            try:
                raw = await reader.readline()
            except ValueError:  # line longer than the limit: skip it, keep going
                continue
            if not raw:
                self._stdin_open = False
                log.warning("standard input closed; serving the last known state")
                return
            self.feed([raw.decode("utf-8", errors="replace").rstrip("\r\n")])
