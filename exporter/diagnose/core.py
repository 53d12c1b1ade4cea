"""The pure core of `diagnose`: lines (or parsed events) in, one `Report` out."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.diagnose.advice import history_advice
from exporter.diagnose.blocks import lines_of, odd_spans, unwrapped
from exporter.diagnose.report import (
    CRASHED_MID_REQUEST,
    ENDINGS,
    SCHEMA,
    FileSummary,
    LargeRequest,
    OmittedRuns,
    Report,
    RunReport,
    RunSummary,
)
from exporter.diagnose.run import STAMP_FIRST, Run, router_source
from exporter.diagnose.sizing import size_pool
from exporter.diagnose.trace import FINGERPRINT_LINES, Fingerprint, PoolSeries
from exporter.logs import events as ev
from exporter.logs.parse import find_line_start, is_plain, parse_line_events, parse_text_indexed
from exporter.model.request_sizes import ExactValues, RequestSizes, RequestSummary, summarize

# Events that feed_event handles itself before (or instead of) the run: formats, rejects, starts.
_SPECIAL = frozenset({ev.LineFormat, ev.Rejected, ev.SlotsInitialized, ev.ChildSpawned, ev.ChildExited, *ev.BANNERS})
_GENERIC = ev.GENERIC
_FINGERPRINTED = FINGERPRINT_LINES[-1]  # a run's lines that its fingerprint hashes


class Diagnoser:
    """The pure core: feed it lines (or parsed events) in order, then call `finish`.

    >>> d = Diagnoser("example.log")
    >>> d.feed_line("0.00.003.960 I srv  llama_server: initializing ...", 1)
    >>> d.finish().runs_total
    1
    """

    def __init__(self, file: str, *, max_runs: int = 10, max_failures: int = 10, series: bool = False) -> None:
        self.file = file
        self.files = [file]
        self.skipped: list[str] = []
        self._lines_before = 0  # lines of the files before this one
        self.max_runs = max_runs
        self.max_failures = max_failures
        self.lines = 0
        self.long_lines = 0
        self.events = 0
        self.routed = False  # a line with a router prefix was seen (llama-server's router mode)
        self._child_names: dict[str, str] = {}  # router child port → model, from the router's spawn lines
        self.specific_events = 0  # events only llama-server writes (not `listening on …`, `loading model '…'`)
        self._current: dict[str | None, Run] = {}
        self._line_format: dict[str | None, ev.LineFormat] = {}  # of the latest line with an event, by source
        self._done: deque[RunReport] = deque(maxlen=max_runs if max_runs > 0 else None)
        self._runs = 0
        # Every run in one line, and its fingerprint: the totals are made from these at the end, once
        # runs read twice (overlapping files) are known. Memory grows with runs, not with lines.
        self._history: list[tuple[RunSummary, Fingerprint]] = []
        self._series = series  # keep each shown run's pool series (for --html)
        self.series: dict[int, PoolSeries] = {}  # by run index, for the runs in _done

    def feed_line(self, line: str, lineno: int, wall: float | None = None) -> None:
        """Parse one raw line (any format the exporter reads) and apply it; `wall`: when it was written
        (epoch seconds), where the input says (the journal)."""
        if lineno > self.lines:
            self.lines = lineno
        events = parse_line_events(line)
        source = router_source(line) if line[:1] == "[" else None
        if source is not None:
            self.routed = True
        if events:
            for e in events:
                self.feed_event(e, lineno, line, source=source)
        run = self._current.get(source)
        if run is None:
            return
        if wall is not None:
            run.note_wall(wall)
        if not events:
            run.last_line = lineno
            if line[:1] in STAMP_FIRST:
                run.note_stamp(line)

    def feed_lines(self, lines: Sequence[str], first_lineno: int) -> None:
        """`feed_line` for consecutive lines, numbered from `first_lineno`, with one regex scan for all.

        The same result as feeding them one by one (a test holds it to that), several times faster:
        lines without an event cost no Python code, except the last stamped line before each event.
        A batch with router prefixes goes line by line (each line's prefix picks its run).
        """
        text = "".join(lines)
        if "\n[" in text or text[:1] == "[":  # router mode: each line's prefix names its server
            for i, line in enumerate(lines):
                self.feed_line(line, first_lineno + i)
            return
        if not is_plain(text) or text[:1] == "{":
            # JSONL, colours, CR: scan what parse_line would scan (only those lines need unwrapping)
            text = unwrapped(text, lines)
        done = 0  # lines[:done] are applied
        for index, _, e in parse_text_indexed(text):
            self._skip(lines, done, index, first_lineno)
            self.feed_event(e, first_lineno + index, lines[index])
            done = index + 1
        self._skip(lines, done, len(lines), first_lineno)
        if lines:
            self.lines = max(self.lines, first_lineno + len(lines) - 1)

    def feed_text(self, text: str, first_lineno: int) -> int:
        """`feed_lines` for a block of whole lines (each ends in "\\n", but perhaps the last), numbered
        from `first_lineno`, without splitting it into lines: only the lines that need unwrapping
        (JSONL, colours, CR) or carry a router prefix go through `feed_lines`. The same result as
        feeding its lines one by one (a test holds it to that). Returns the number of lines (counted
        here, with the scan: a reader need not count them again).
        """
        if not text:
            return 0
        if text[:1] not in "[{" and find_line_start(text, "[") < 0 and is_plain(text):
            return self._feed_plain(text, first_lineno)
        lineno, pos = first_lineno, 0
        for start, end in odd_spans(text):
            if start > pos:
                lineno += self._feed_plain(text[pos:start], lineno)
            odd = text[start:end]
            self.feed_lines(lines_of(odd), lineno)
            lineno += odd.count("\n")
            pos = end
        if pos < len(text):
            lineno += self._feed_plain(text[pos:], lineno)
        return lineno - first_lineno + (text[-1] != "\n")  # (a last line without its end: one more)

    def _feed_plain(self, text: str, first_lineno: int) -> int:
        """`feed_text` for lines that need no unwrapping and have no router prefix.

        `feed_event` written out inline for the common event (one of the current run's own, not a start
        or a format), the hot path of a big log. The lines without an event before such a line need no
        look (`_skip_text`) when it is stamped in a run that has its first stamp: the event's line then
        overwrites all that look would note. Returns the number of lines."""
        done, done_at = 0, 0  # lines before `done` (starting at offset `done_at`) are applied
        line, index, start = "", 0, 0
        current, find, size = self._current, text.find, len(text)
        events = specific = 0  # the common events' counts, added at the end
        for index, start, e in parse_text_indexed(text):
            kind = type(e)
            run = current.get(None)
            common = run is not None and kind not in _SPECIAL
            if index >= done:
                end = find("\n", start) + 1 or size
                line = text[start:end]
                if index > done and not (
                    common and run.first_elapsed is not None and line[:1] in STAMP_FIRST  # type: ignore[union-attr]
                ):
                    self._skip_text(text, done_at, start, first_lineno + index - 1)
                done, done_at = index + 1, end
            if not common:
                self.feed_event(e, first_lineno + index, line)
                continue
            assert run is not None
            events += 1
            if kind not in _GENERIC:
                specific += 1
            lineno = first_lineno + index
            if line[:1] in STAMP_FIRST:
                run.note_stamp(line)
            fingerprint = run.fingerprint
            if fingerprint.lines < _FINGERPRINTED:
                fingerprint.add(lineno, line)
            run.apply(e, lineno, line)
        self.events += events
        self.specific_events += specific
        # The block's last line: newlines counted only past the last event's line (the scan counted up to it).
        last = first_lineno + index + text.count("\n", start, len(text) - 1)
        if done_at < len(text):
            self._skip_text(text, done_at, len(text), last)
        self.lines = max(self.lines, last)
        return last - first_lineno + 1

    def _skip_text(self, text: str, start: int, end: int, last_lineno: int) -> None:
        """`_skip` for the lines of text[start:end] (whole lines, none with an event)."""
        run = self._current.get(None)
        if run is None:
            return
        run.last_line = last_lineno
        if run.first_elapsed is None:  # the run's first time stamp may be among them
            run.note_first_stamp(lines_of(text[start:end]))
        stop = end
        while stop > start:  # the last line that may carry a time stamp, from the end
            begin = max(text.rfind("\n", start, stop - 1) + 1, start)
            if text[begin] in STAMP_FIRST:
                run.last_stamped_line = text[begin:stop]
                return
            stop = begin

    def _skip(self, lines: Sequence[str], start: int, end: int, first_lineno: int) -> None:
        """What `feed_line` does for lines[start:end], lines without an event (plain ones, no router prefix)."""
        run = self._current.get(None)
        if run is None or start >= end:
            return
        run.last_line = first_lineno + end - 1
        if run.first_elapsed is None:  # the run's first time stamp may be among them
            run.note_first_stamp(lines[start:end])
        for i in range(end - 1, start - 1, -1):
            if lines[i][:1] in STAMP_FIRST:
                run.last_stamped_line = lines[i]
                break

    def feed_event(self, e: ev.Event, lineno: int, line: str = "", *, source: str | None = None) -> None:
        """Apply one parsed event; `line` is the raw line (read only for a fatal decode's offset and time)."""
        kind = type(e)
        run = self._current.get(source)
        if run is None or kind in _SPECIAL:
            run = self._run_for(e, run, lineno, source)
            if run is None:
                return
        else:  # most events: nothing but the run's own work
            self.events += 1
            if kind not in ev.GENERIC:
                self.specific_events += 1
        if line:
            if line[:1] in STAMP_FIRST:
                run.note_stamp(line)
            if run.fingerprint.lines < _FINGERPRINTED:
                run.fingerprint.add(lineno, line)
        run.apply(e, lineno, line)

    def _run_for(self, e: ev.Event, run: Run | None, lineno: int, source: str | None) -> Run | None:
        """`feed_event` for a line format, a rejected line, a start line, or the first event of a source:
        the run that the event goes on to (a new one for a start), or None when it was dealt with here."""
        kind = type(e)
        if isinstance(e, ev.LineFormat):  # how the next line is written: for the run's state, and for a run it starts
            self._line_format[source] = e
            if run is not None:
                run.state.apply(e)
            return None
        self.events += 1
        # A forged start must not split a run: a start line the state rejects is only counted. (Other
        # rejected events reach `Run.apply`, which counts them and acts on none.)
        if kind is ev.Rejected or (kind is ev.SlotsInitialized and run is not None and not run.state.accepts(e)):
            if run is not None:
                run.state.apply(e)
            return None
        if kind not in ev.GENERIC:
            self.specific_events += 1
        if isinstance(e, ev.ChildSpawned) and source is None:  # the router names the child on that port
            for port in [p for p, name in self._child_names.items() if name == e.name]:
                del self._child_names[port]  # one instance per name: an older one is gone
            self._child_names[str(e.port)] = e.name
        elif isinstance(e, ev.ChildExited) and source is None:
            self._child_exited(e)
        restart = isinstance(e, ev.SlotsInitialized) and run is not None and run.state.run.n_slots is not None
        banner = ev.banner_line(e) if kind in ev.BANNERS else None  # type: ignore[arg-type]
        if banner is not None or restart:
            # A new server process, unless this is one more banner line of a start already seen (a banner
            # line this start has already printed means a new process: a crash loop during start-up).
            if run is not None and (restart or not run.in_startup or banner in run.banner_seen):
                self._close(run, next_start=True)
                run = None
            if run is None:
                run = self._new_run(source, lineno)
            run.started = True
            run.in_startup = True
            if banner is not None:
                run.banner_seen.add(banner)
        elif run is None:
            run = self._new_run(source, lineno)
        return run

    def _child_exited(self, e: ev.ChildExited) -> None:
        """The router saw a child end: its run ends here (a child that did not log its exit was killed)."""
        port = next((p for p, name in self._child_names.items() if name == e.name), None)
        if port is not None:
            del self._child_names[port]
        child = self._current.pop(port, None) if port is not None else None
        if child is not None:
            self._close(child, next_start=not child.state.run.exiting)

    @property
    def keeps_series(self) -> bool:
        """Whether each shown run's pool series is kept (for --html)."""
        return self._series

    def close_open(self, *, next_start: bool) -> tuple[bool, bool] | None:
        """Close every open run; `next_start`: as if another start followed. Returns, for the open run
        without a router prefix, whether it was still starting and whether it printed `initializing
        ...` (what decides if a start line that followed would begin a new run), or None."""
        run = self._current.get(None)
        state = (run.in_startup, ev.ServerStarting in run.banner_seen) if run is not None else None
        for open_run in sorted(self._current.values(), key=lambda r: r.first_line):
            self._close(open_run, next_start=next_start)
        self._current = {}
        return state

    def part(self) -> Part:
        """What this diagnoser found, for `absorb` by another (a part of a log read in another process)."""
        return Part(
            list(self._done), self._history, self.series, self._runs, self.lines, self.events, self.specific_events
        )

    def absorb(self, part: Part) -> None:
        """Add the runs of a later part of the current file, found by another diagnoser (its runs are
        numbered after this one's, its lines were numbered from where the part starts)."""
        offset = self._runs
        for summary, _ in part.history:
            summary.index += offset
        for report in part.runs:
            report.index += offset
            if self._done.maxlen is not None and len(self._done) == self._done.maxlen:
                self.series.pop(self._done[0].index, None)
            self._done.append(report)
        shown = {r.index for r in self._done}
        self.series.update({i + offset: s for i, s in part.series.items() if i + offset in shown})
        self._history.extend(part.history)
        self._runs += part.runs_total
        self.lines = max(self.lines, part.lines)
        self.events += part.events
        self.specific_events += part.specific_events

    def next_file(self, file: str) -> None:
        """The lines that follow come from `file`, numbered from 1 again. llama-server truncates its log
        as it starts, so a file is a later run: a run still open here ended without its exit line."""
        self.close_open(next_start=True)
        self._line_format = {}
        self._lines_before += self.lines
        self.lines = 0
        self.files.append(file)

    def _new_run(self, source: str | None, lineno: int) -> Run:
        self._runs += 1
        run = Run(self._runs, source, lineno, self.max_failures, self.files[-1], series=self._series)
        if source is not None:
            run.model = self._child_names.get(source)
        run.state.provenance.banners_reformat = True  # a file holds one run after another: each start may change it
        line_format = self._line_format.get(source)
        if line_format is not None:
            run.state.apply(line_format)
        self._current[source] = run
        return run

    def _close(self, run: Run, *, next_start: bool = False) -> None:
        report = run.finish(next_start=next_start)
        ending = report.ending
        in_flight = [f.prompt_tokens or f.tokens for f in ending.in_flight]
        summary = RunSummary(
            index=report.index,
            file=report.file,
            source=report.source,
            first_line=report.first_line,
            last_line=report.last_line,
            ending=ending.how,
            failures=report.failure_summary.total,
            aborted_requests=report.counts.aborted_requests,
            retries=report.counts.retries,
            largest_request_tokens=report.counts.largest_request_tokens,
            duration_s=report.duration_s,
            started_at=run.first_wall,
            ended_at=run.last_wall,
            clock="log" if run.first_wall is not None else None,
            in_flight_prompt_tokens=max(in_flight) if in_flight and ending.how in CRASHED_MID_REQUEST else None,
            n_ctx_slot=report.configuration.n_ctx_slot,
            memory=ending.memory,
            model=report.model,
            pool_cells=report.configuration.pool_cells,
            held_at_failure=report.failure_summary.max_held_together or None,
            held_at_failure_line=report.failure_summary.max_held_line,
            request_sizes=RequestSizes.of(run.state.request_values),
            configuration=report.configuration,
        )
        run.fingerprint.close()
        self._history.append((summary, run.fingerprint))
        if self._done.maxlen is not None and len(self._done) == self._done.maxlen:
            self.series.pop(self._done[0].index, None)  # about to leave the shown runs
        if run.series is not None:
            self.series[run.index] = run.series
        self._done.append(report)

    def finish(self, modified: dict[str, float] | None = None) -> Report:
        """Close every open run and return the report (runs in order). `modified`: each file's
        modification time, which dates its last run where the log has no wall-clock time stamps."""
        self.close_open(next_start=False)
        overlaps = self._mark_copies()
        order = {f: i for i, f in enumerate(self.files)}
        history = sorted((s for s, _ in self._history), key=lambda s: (order.get(s.file, len(order)), s.first_line))
        _date_by_file(history, modified or {})
        kept = [s for s in history if s.same_as is None]
        copies = {s.index for s in history if s.same_as is not None}
        by_file = {f: FileSummary(f, modified.get(f) if modified else None) for f in self.files}
        for s in history:
            if s.same_as is not None:
                by_file.setdefault(s.file, FileSummary(s.file)).copies += 1
        shown = sorted(
            (r for r in self._done if r.index not in copies),
            key=lambda r: (order.get(r.file, len(order)), r.first_line),
        )
        shown_ids = {r.index for r in shown}
        omitted = OmittedRuns()
        streak = longest = 0
        for s in kept:
            if s.index not in shown_ids:
                omitted.runs += 1
                omitted.failures += s.failures
                omitted.aborted_requests += s.aborted_requests
                omitted.retries += s.retries
            fs = by_file.setdefault(s.file, FileSummary(s.file))
            fs.runs += 1
            fs.failures += s.failures
            fs.aborted_requests += s.aborted_requests
            fs.endings[s.ending] = fs.endings.get(s.ending, 0) + 1
            streak = streak + 1 if s.ending == "failed_start" else 0
            longest = max(longest, streak)
        endings: dict[str, int] = {}
        for s in kept:
            endings[s.ending] = endings.get(s.ending, 0) + 1
        sized = [(s.largest_request_tokens, s.index, s.file) for s in kept if s.largest_request_tokens]
        largest = heapq.nlargest(3, sized)
        requests = _requests(kept)
        sizing = size_pool(kept, requests)
        return Report(
            schema=SCHEMA,
            file=self.file if len(self.files) == 1 else f"{len(self.files)} files",
            files=list(self.files),
            files_order=None,
            skipped=list(self.skipped),
            lines=self._lines_before + self.lines,
            long_lines=self.long_lines,
            runs_total=len(kept),
            failures_total=sum(s.failures for s in kept),
            aborted_requests_total=sum(s.aborted_requests for s in kept),
            runs=shown,
            omitted_runs=omitted,
            endings={how: endings[how] for how in ENDINGS if how in endings},
            failed_starts_in_a_row=longest,
            by_file=[by_file[f] for f in self.files],
            largest_requests=[LargeRequest(t, r, f) for t, r, f in largest],
            history=history,
            overlaps=overlaps,
            history_advice=history_advice(kept, requests, sizing),
            requests=requests,
            sizing=sizing,
            series={i: self.series[i] for i in shown_ids if i in self.series},
        )

    def _mark_copies(self) -> list[str]:
        """Find runs read twice (the same first lines, in two files or twice in a stream): the one with
        fewer lines is marked `same_as` the other and counted once. Returns one sentence per copy."""
        by_start: dict[bytes, list[int]] = {}  # digest of the first 16 lines -> positions in _history
        for i, (_, fp) in enumerate(self._history):
            if fp.stamped and 16 in fp.digests:
                by_start.setdefault(fp.digests[16], []).append(i)
        said = []
        for group in by_start.values():
            if len(group) < 2:
                continue

            # Longest first (then one dated by the journal): each run that matches a longer one is its copy.
            def longest(i: int) -> tuple[int, bool]:
                s = self._history[i][0]
                return s.last_line - s.first_line, s.clock == "log"

            group.sort(key=longest, reverse=True)
            for n, i in enumerate(group):
                s, fp = self._history[i]
                for j in group[:n]:
                    t, other = self._history[j]
                    if t.same_as is None and fp.same_run(other):
                        s.same_as = t.index
                        if t.clock is None and s.clock == "log":  # the copy kept is undated: its start is
                            t.started_at, t.clock = s.started_at, "log"
                            t.ended_at = (
                                s.ended_at if t.last_line - t.first_line <= s.last_line - s.first_line else None
                            )
                        said.append(
                            f"run {s.index} ({s.file}, lines {s.first_line:,}-{s.last_line:,}) is run {t.index} "
                            f"({t.file}) again: counted once"
                        )
                        break
        return said


@dataclass
class Part:
    """The runs a `Diagnoser` found in a part of a log (see `Diagnoser.part` and `absorb`)."""

    runs: list[RunReport]  # the shown ones (the last --max-runs)
    history: list[tuple[RunSummary, Fingerprint]]
    series: dict[int, PoolSeries]
    runs_total: int
    lines: int  # the last line number seen
    events: int
    specific_events: int


def _date_by_file(history: list[RunSummary], modified: dict[str, float]) -> None:
    """Date the last run of each file by the file's modification time, where the log gave no time."""
    last: dict[str, RunSummary] = {}
    for s in history:
        last[s.file] = s
    for file, s in last.items():
        if s.clock is None and file in modified:
            s.clock = "file"
            s.ended_at = modified[file]
            s.started_at = s.ended_at - s.duration_s if s.duration_s is not None else None


def analyze(lines: Iterable[str], file: str = "-", *, max_runs: int = 10, max_failures: int = 10) -> Report:
    """Diagnose an iterable of log lines (pure; used by tests and by `main`)."""
    d = Diagnoser(file, max_runs=max_runs, max_failures=max_failures)
    for i, line in enumerate(lines, 1):
        d.feed_line(line, i)
    return d.finish()


def _requests(runs: Sequence[RunSummary]) -> RequestSummary | None:
    """The request sizes and concurrency of the runs (not copies) added up; None when none had a request."""
    values = ExactValues()
    for s in runs:
        if s.request_sizes is not None:
            s.request_sizes.add_to(values)
    if not values.tokens:
        return None
    pools = [s.pool_cells for s in runs if s.pool_cells]
    largest = max((s.largest_request_tokens for s in runs), default=0)
    return summarize(values, largest, max(pools) if pools else None)
