"""The file as a line source (`exporter.logs.source.LineSource`): a `LogTailer` (what is read, across
rotation and truncation), followed by `follow` (when it is read), with its stats and its problems.

The replay reads the file as it is to its end; `run` follows it from there. The tailer's problems (a file
missing, unreadable, a directory, binary data) are logged once when they appear and once when they clear,
after the replay and after every pass of the follower, lines or not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import ClassVar

from exporter.logs.follow import CatchUp, follow
from exporter.logs.tail import LogTailer, TailerStats
from exporter.logs.watch import Clock

log = logging.getLogger(__name__)


class FileSource:
    """A log file followed by path. `poll_interval`, `batch_interval` and `use_watchdog` are `follow`'s
    (`--log-poll-interval`, `--log-batch-interval`, `--fs-events`); `clock` its clock (None: the event loop's)."""

    #: llama-server truncates its --log-file as it starts: each run begins a new content of the file.
    restarts_rewrite: ClassVar[bool] = True

    def __init__(
        self,
        tailer: LogTailer,
        *,
        poll_interval: float = 1.0,
        batch_interval: float = 2.0,
        use_watchdog: bool = True,
        clock: Clock | None = None,
    ) -> None:
        self.tailer = tailer
        self.poll_interval, self.batch_interval, self.use_watchdog = poll_interval, batch_interval, use_watchdog
        self.clock = clock
        self._catch_up = CatchUp()
        self._reported: str | None = None  # the problem last logged

    @property
    def description(self) -> str:
        return str(self.tailer.path)

    @property
    def up(self) -> bool:
        t = self.tailer
        return t.is_open and t.last_error is None and t.unreadable is None

    @property
    def error(self) -> str | None:
        return self.tailer.last_error or self.tailer.unreadable

    @property
    def unreadable(self) -> str | None:
        return self.tailer.unreadable

    @property
    def stats(self) -> TailerStats:
        return self.tailer.stats

    @property
    def contents(self) -> int:
        stats = self.tailer.stats
        return stats.opens + stats.rotations + stats.truncations

    def replay(self, on_lines: Callable[[Sequence[str]], None]) -> None:
        """Read the file as it is now to its end, one poll's lines at a time."""
        tailer = self.tailer
        stats = tailer.stats
        switches = stats.truncations + stats.rotations
        while True:
            before = stats.bytes
            lines = tailer.read()
            on_lines(lines)
            # Stop at the end, on a poll that made no progress (a persistent read error must not spin),
            # and on a second truncation or rotation: a file that always looks rewritten (a procfs
            # file's size reads 0) would otherwise be replayed forever, before /metrics ever answers.
            if (
                not tailer.has_pending()
                or (not lines and stats.bytes == before)
                or stats.truncations + stats.rotations > switches + 1
            ):
                break
        self._report_error()

    async def run(self, on_lines: Callable[[Sequence[str]], None], stop: asyncio.Event) -> None:
        await follow(
            self.tailer,
            on_lines,
            after_drain=self._report_error,  # problems that arrive without lines are logged too
            poll_interval=self.poll_interval,
            use_watchdog=self.use_watchdog,
            stop=stop,
            batch_interval=self.batch_interval,
            catch_up=self._catch_up,
            clock=self.clock,
        )

    async def catch_up(self) -> None:
        """Before a scrape: have the follower read what the log holds now, not at the end of its batch wait."""
        await self._catch_up()

    def close(self) -> None:
        self.tailer.close()

    def _report_error(self) -> None:
        """Log a tailer problem once when it appears and once when it clears, not on every poll."""
        error = self.error
        if error != self._reported:
            if error:
                log.warning("%s", error)
            elif self._reported:
                log.info("log file %s is readable again", self.tailer.path)
            self._reported = error
