"""The log pipeline, where `logs` meets `model`: lines from a source (`exporter.logs`: the tailer, standard
input, the journal) → split by a router's prefix and parsed (`exporter.logs.router_split`) → applied
(`exporter.model.router.ServerLog`) to the server's state, with the start-up replay that rebuilds gauges.

At start the existing log is read to its end with `state.counting` off: slots, pool and
configuration come back exactly as they were, but no past event is counted again. Everything read
after that is live and counted. A log that does not exist yet is waited for (`up` stays False), and
everything in it is live once it appears, because it was written after the exporter started.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence

from exporter.logs import recognize
from exporter.logs.follow import CatchUp, follow
from exporter.logs.router_split import split_parse
from exporter.logs.source import LineSource
from exporter.logs.tail import LogTailer
from exporter.model.router import ServerLog
from exporter.model.state import ServerState

log = logging.getLogger(__name__)
#: Rejected log lines are reported at most this often (seconds) per reason: a flood is one line, not a flood.
REJECT_LOG_INTERVAL = 600


class LogPipeline:
    """Feeds lines from a `LogTailer`, or another `LineSource` (standard input, the journal), into a `ServerState`.

    Without a tailer and without a source, the source is standard input.
    """

    def __init__(self, state: ServerState, tailer: LogTailer | None, source: LineSource | None = None) -> None:
        self.state = state
        self.log = ServerLog(state)  # the state, or in router mode the router's and one per child
        self.tailer = tailer
        if source is None and tailer is None:
            from exporter.logs.stdin import StdinSource  # only here: most exporters follow a file

            source = StdinSource()
        self.source: LineSource | None = source
        self.lines = 0
        self.replayed_lines = 0
        self._reported_error: str | None = None
        self._warned_hidden = False
        self._rejected_reported: dict[str, tuple[int, float]] = {}  # reason -> (count, when) last logged
        self.stopped: str | None = None  # why the pipeline stopped following the log, if it did
        self._recognized = False  # a line only llama-server writes was seen
        self._warned_unrecognized = False
        self._file_starts = 0  # opens, rotations and truncations of the log file so far
        self._catch_up = CatchUp()
        # A file is rewritten at every server start (llama-server truncates it), so a new format can only
        # begin in a new file; the journal and standard input have no files: any start banner may.
        state.provenance.banners_reformat = tailer is None

    @property
    def description(self) -> str:
        """The log in words: its path, or the source's description."""
        if self.tailer is not None:
            return str(self.tailer.path)
        return self.source.description if self.source is not None else "standard input"

    # -- LogSourceStatus (read by the collector) -----------------------------------------------
    @property
    def up(self) -> bool:
        """True while the log is open and readable, and the pipeline still follows it."""
        if self.stopped is not None:
            return False
        if self.tailer is None:
            return self.source is not None and self.source.up
        return self.tailer.is_open and self.tailer.last_error is None and self.tailer.unreadable is None

    @property
    def understood(self) -> bool | None:
        """True once a llama-server line was read; False when binary data was refused or the first lines held
        none (`exporter.logs.recognize`, the rule `diagnose` applies too); else None."""
        if self.tailer is not None and self.tailer.unreadable is not None and not self._recognized:
            return False
        return recognize.understood(self.lines + self.replayed_lines, self._recognized)

    @property
    def problem(self) -> str | None:
        """Why the log is not followed, or not understood, in one line naming it; None when all is well."""
        if self.stopped is not None:
            return f"{self.description}: the pipeline stopped following it: {self.stopped}"
        if self.tailer is not None and (error := self.tailer.last_error or self.tailer.unreadable):
            return error
        if self.tailer is None and self.source is not None and not self.source.up:
            return f"{self.description} cannot be read"
        if self.understood is False:
            why = recognize.not_understood(self.lines + self.replayed_lines)
            return f"{self.description}: {why}: is it llama-server's log?"
        return None

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
        batch = lines if isinstance(lines, Sequence) else list(lines)
        self._apply(batch)
        self.lines += len(batch)
        self._report_hidden_lines()
        if self.state.rejected:
            self.report_rejected()
        if self.understood is False and not self._warned_unrecognized:
            self._report_unrecognized()

    def _report_unrecognized(self) -> None:
        self._warned_unrecognized = True
        if self.tailer is not None and self.tailer.unreadable is not None:
            return  # binary data: the tailer's problem, said once as such
        log.warning(
            "%s: %s: is it llama-server's log? (llamacpp_exporter_log_understood 0)",
            self.description,
            recognize.not_understood(self.lines + self.replayed_lines),
        )

    def report_rejected(self, now: float | None = None) -> None:
        """Log rejected lines once per reason when they start, then at most every REJECT_LOG_INTERVAL seconds."""
        now = time.monotonic() if now is None else now
        for reason, count in self.state.rejected.items():
            last_count, last_when = self._rejected_reported.get(reason, (0, -REJECT_LOG_INTERVAL))
            if count > last_count and now - last_when >= REJECT_LOG_INTERVAL:
                detail = (
                    f" ({self.state.last_unexpected})" if reason == "unexpected" and self.state.last_unexpected else ""
                )
                log.warning(
                    "%d log line(s) rejected as %s so far%s: not applied, counted in "
                    "llamacpp_exporter_log_lines_rejected_total (next report in %d s at the earliest)",
                    count,
                    reason,
                    detail,
                    REJECT_LOG_INTERVAL,
                )
                self._rejected_reported[reason] = (count, now)

    def replay_existing(self) -> int:
        """Read the log as it is now, rebuilding gauges without counting events. Returns lines read."""
        if self.tailer is None:
            return self._replay_source()
        self.log.set_counting(False)
        stats = self.tailer.stats
        switches = stats.truncations + stats.rotations
        try:
            while True:
                before = stats.bytes
                lines = self.tailer.poll()
                self._apply(lines)
                self.replayed_lines += len(lines)
                # Stop at the end, on a poll that made no progress (a persistent read error must not spin),
                # and on a second truncation or rotation: a file that always looks rewritten (a procfs
                # file's size reads 0) would otherwise be replayed forever, before /metrics ever answers.
                if (
                    not self.tailer.has_pending()
                    or (not lines and stats.bytes == before)
                    or stats.truncations + stats.rotations > switches + 1
                ):
                    break
        finally:
            self.log.set_counting(True)
        self._report_tailer_error()
        self._report_hidden_lines()
        if self.understood is False:
            self._report_unrecognized()
        return self.replayed_lines

    def _replay_source(self) -> int:
        """The non-file sources' equivalent of the replay: their history, applied without counting."""
        lines = self.source.history() if self.source is not None else []
        self.log.set_counting(False)
        try:
            self._apply(lines)
        finally:
            self.log.set_counting(True)
        self.replayed_lines += len(lines)
        self._report_hidden_lines()
        return self.replayed_lines

    def _apply(self, lines: Sequence[str]) -> None:
        """Parse a batch of lines (one regex scan per part, see `split_parse`) and apply their events in order."""
        if self.tailer is not None:
            stats = self.tailer.stats
            starts = stats.opens + stats.rotations + stats.truncations
            if starts != self._file_starts:  # these lines may begin a new file: a new server, maybe a new format
                self._file_starts = starts
                self.state.provenance.new_file = True
        try:
            events = self.log.apply(split_parse(lines))
        except Exception as exc:  # parse rejects bad numbers itself; anything else must not stop the pipeline
            self.state.last_unexpected = f"parse: {type(exc).__name__}: {exc}"[:200]
            self.state.rejected["unexpected"] += len(lines)
            return
        if not self._recognized:  # until the first one only: free afterwards
            self._recognized = recognize.specific(events)
            if self._recognized and self._warned_unrecognized:
                log.info(
                    "%s: a llama-server line read: understood (llamacpp_exporter_log_understood 1)", self.description
                )
        if self.log.router.refused_names:
            self._report_refused()

    def _report_refused(self) -> None:
        """One line per router child refused at the limit (the counter says how many in all)."""
        router = self.log.router
        for name in router.refused_names:
            log.warning(
                "router child %s not followed: the exporter follows at most %d children per router; its lines "
                "are rejected (llamacpp_router_children_refused_total)",
                name,
                router.limit,
            )
        router.refused_names.clear()

    def _report_hidden_lines(self) -> None:
        """Say once per server start when the log's verbosity hides checkpoint and prompt-cache lines."""
        visible = self.state.run.checkpoint_lines_visible()
        if visible is False and not self._warned_hidden:
            log.warning(
                "llama-server logs at -lv %s: checkpoint and prompt-cache lines are hidden (trace level on b9829+); "
                "their metrics are left out (llamacpp_checkpoint_lines_visible 0). Run llama-server with -lv 4.",
                self.state.run.verbosity,
            )
        self._warned_hidden = visible is False

    def _report_tailer_error(self) -> None:
        """Log a tailer problem once when it appears and once when it clears, not on every poll."""
        error = (self.tailer.last_error or self.tailer.unreadable) if self.tailer else None
        if error != self._reported_error:
            if error:
                log.warning("%s", error)
            elif self._reported_error:
                log.info("log file %s is readable again", self.tailer.path if self.tailer else "-")
            self._reported_error = error

    async def catch_up(self) -> None:
        """Before a scrape: have the follower read what the log holds now, not at the end of its batch wait."""
        await self._catch_up()

    async def run(
        self, *, poll_interval: float, batch_interval: float, use_watchdog: bool, stop: asyncio.Event
    ) -> None:
        """Follow the log until `stop` is set. If it ends for any other reason, `up` turns False for good."""
        try:
            if self.tailer is None:
                if self.source is not None:
                    await self.source.run(self.feed, stop)
                return
            await follow(
                self.tailer,
                self.feed,
                after_drain=self._report_tailer_error,  # problems that arrive without lines are logged too
                poll_interval=poll_interval,
                use_watchdog=use_watchdog,
                stop=stop,
                batch_interval=batch_interval,
                catch_up=self._catch_up,
            )
        except asyncio.CancelledError:
            self.stopped = "cancelled"
            raise
        except Exception as exc:
            self.stopped = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if self.stopped is None and not stop.is_set():
                self.stopped = "the log source ended"
