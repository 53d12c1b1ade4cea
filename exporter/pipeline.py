"""The log pipeline, where `logs` meets `model`: lines from a source (`exporter.logs.source.LineSource`: a
file, standard input, the journal) → split by a router's prefix and parsed (`exporter.logs.router_split`) → applied
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
from exporter.logs.file_source import FileSource
from exporter.logs.router_split import split_parse
from exporter.logs.source import LineSource
from exporter.logs.tail import LogTailer
from exporter.model.incidents import Incident
from exporter.model.router import ServerLog
from exporter.model.state import ServerState

log = logging.getLogger(__name__)
#: Rejected log lines are reported at most this often (seconds) per reason: a flood is one line, not a flood.
REJECT_LOG_INTERVAL = 600
#: Incidents of one kind are logged at most this often (seconds) per server: a restart loop is a line a minute.
INCIDENT_LOG_INTERVAL = 60
#: What each kind of incident is counted in, for the reader of the exporter's log.
_INCIDENT_METRIC = {
    "overflow": "llamacpp_requests_aborted_total",
    "cascade_recovered": "llamacpp_kv_cascades_total",
    "crash": "llamacpp_server_crashes_total",
    "restart": "llamacpp_server_starts_total",
}


class LogPipeline:
    """Feeds the lines of a `LineSource` (a file, standard input, the journal) into a `ServerState`.

    A `LogTailer` given alone is followed as a `FileSource` with its defaults; without a source, the source
    is standard input.
    """

    def __init__(self, state: ServerState, source: LineSource | LogTailer | None = None) -> None:
        self.state = state
        self.log = ServerLog(state)  # the state, or in router mode the router's and one per child
        if source is None:
            from exporter.logs.stdin import StdinSource  # only here: most exporters follow a file

            source = StdinSource()
        self.source: LineSource = FileSource(source) if isinstance(source, LogTailer) else source
        self.lines = 0
        self.replayed_lines = 0
        self._warned_hidden = False
        self._rejected_reported: dict[str, tuple[int, float]] = {}  # reason -> (count, when) last logged
        self.stopped: str | None = None  # why the pipeline stopped following the log, if it did
        self._recognized = False  # a line only llama-server writes was seen
        self._warned_unrecognized = False
        self._contents = 0  # contents the source has begun so far (a file's opens, rotations, truncations)
        # Incidents logged: per server (None: the main one; a router child's name), the last seq logged, and
        # per kind when the last line was written and how many were left out since.
        self._incidents_logged: dict[str | None, int] = {}
        self._incident_last: dict[tuple[str | None, str], tuple[float, int]] = {}
        self._incidents_seen: dict[str | None, int] = {}  # the record's `changes` when last looked at
        # A file is rewritten at every server start (llama-server truncates it), so a new format can only
        # begin in a new file; the journal and standard input have no files: any start banner may.
        state.provenance.banners_reformat = not self.source.restarts_rewrite

    @property
    def description(self) -> str:
        """The log in words: its path, or the source's description."""
        return self.source.description

    # -- LogSourceStatus (read by the collector) -----------------------------------------------
    @property
    def up(self) -> bool:
        """True while the log is open and readable, and the pipeline still follows it."""
        return self.stopped is None and self.source.up

    @property
    def understood(self) -> bool | None:
        """True once a llama-server line was read; False when binary data was refused or the first lines held
        none (`exporter.logs.recognize`, the rule `diagnose` applies too); else None."""
        if self.source.unreadable is not None and not self._recognized:
            return False
        return recognize.understood(self.lines + self.replayed_lines, self._recognized)

    @property
    def problem(self) -> str | None:
        """Why the log is not followed, or not understood, in one line naming it; None when all is well."""
        if self.stopped is not None:
            return f"{self.description}: the pipeline stopped following it: {self.stopped}"
        if error := self.source.error:
            return error
        if self.understood is False:
            why = recognize.not_understood(self.lines + self.replayed_lines)
            return f"{self.description}: {why}: is it llama-server's log?"
        return None

    @property
    def truncations(self) -> int:
        return self.source.stats.truncations

    @property
    def rotations(self) -> int:
        return self.source.stats.rotations

    @property
    def lost_bytes(self) -> int:
        return self.source.stats.lost_bytes

    @property
    def long_lines(self) -> int:
        return self.source.stats.long_lines

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, lines: Iterable[str]) -> None:
        """Parse and apply live lines (counted)."""
        batch = lines if isinstance(lines, Sequence) else list(lines)
        self._apply(batch)
        self.lines += len(batch)
        self.report_incidents()
        self._report_hidden_lines()
        if self.state.rejected:
            self.report_rejected()
        if self.understood is False and not self._warned_unrecognized:
            self._report_unrecognized()

    def _report_unrecognized(self) -> None:
        self._warned_unrecognized = True
        if self.source.unreadable is not None:
            return  # binary data: the source's problem, said once as such
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

    def report_incidents(self, now: float | None = None, wall: float | None = None) -> list[str]:
        """Stamp the incidents recorded since the last call with the time (`wall`, seconds since the epoch), and
        log one WARNING line per settled incident (a clean restart: INFO), at most one per kind and server every
        INCIDENT_LOG_INTERVAL seconds (`now`, monotonic; the next line says how many were left out). Returns the
        lines logged."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        out: list[str] = []
        states: list[tuple[str | None, ServerState]] = [(None, self.state)]
        states += [(c.name, c.state) for c in self.log.router.children.values()]
        for name, state in states:
            record = state.incidents
            if self._incidents_seen.get(name) == record.changes:
                continue  # nothing new since the last batch (the common case: one comparison per batch)
            record.stamp(wall)
            self._incidents_seen[name] = record.changes
            done = self._incidents_logged.get(name, 0)
            for inc in record.settled_after(done):
                done = inc.seq
                line = self._incident_line(name, inc, now)
                if line is not None:
                    # A clean restart is routine (a deploy): said, not warned of; a crash loop warns per crash.
                    log.log(logging.INFO if inc.kind == "restart" else logging.WARNING, "%s", line)
                    out.append(line)
            self._incidents_logged[name] = done
        return out

    def _incident_line(self, name: str | None, inc: Incident, now: float) -> str | None:
        """The incident's line, or None when one of its kind was logged less than the interval ago."""
        key = (name, inc.kind)
        last, left_out = self._incident_last.get(key, (-INCIDENT_LOG_INTERVAL, 0))
        if now - last < INCIDENT_LOG_INTERVAL:
            self._incident_last[key] = (last, left_out + 1)
            return None
        self._incident_last[key] = (now, 0)
        where = self.description + (f", model {name}" if name is not None else "")
        more = f"; {left_out} more of this kind since the last report" if left_out else ""
        return f"{where}: {inc.summary()}{more} ({_INCIDENT_METRIC.get(inc.kind, 'the status page')})"

    def replay_existing(self) -> int:
        """Read the log as it is now, rebuilding gauges without counting events. Returns lines read."""
        self.log.set_counting(False)
        try:
            self.source.replay(self._replayed)
        finally:
            self.log.set_counting(True)
        self._report_hidden_lines()
        if self.understood is False:
            self._report_unrecognized()
        return self.replayed_lines

    def _replayed(self, lines: Sequence[str]) -> None:
        self._apply(lines)
        self.replayed_lines += len(lines)

    def _apply(self, lines: Sequence[str]) -> None:
        """Parse a batch of lines (one regex scan per part, see `split_parse`) and apply their events in order."""
        contents = self.source.contents
        if contents != self._contents:  # these lines may begin a new file: a new server, maybe a new format
            self._contents = contents
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

    async def catch_up(self) -> None:
        """Before a scrape: have the source read what the log holds now (a file's follower: not at the end of its
        batch wait)."""
        await self.source.catch_up()

    async def run(self, *, stop: asyncio.Event) -> None:
        """Follow the log until `stop` is set. If it ends for any other reason, `up` turns False for good."""
        try:
            await self.source.run(self.feed, stop)
        except asyncio.CancelledError:
            self.stopped = "cancelled"
            raise
        except Exception as exc:
            self.stopped = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            if self.stopped is None and not stop.is_set():
                self.stopped = "the log source ended"
