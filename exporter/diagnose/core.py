"""The pure core of `diagnose`: lines (or parsed events) in, one `Report` out."""

from __future__ import annotations

import heapq
import re
from collections import deque
from collections.abc import Iterable, Sequence

from exporter.diagnose.report import ENDINGS, SCHEMA, FileSummary, LargeRequest, OmittedRuns, Report, RunReport
from exporter.diagnose.run import _STAMP_FIRST, _Run, router_source
from exporter.logs import events as ev
from exporter.logs.parse import parse_line_events, parse_text_indexed, unwrap_marked

# Lines that feed_lines unwraps before its scan: JSONL, colours, CR.
_ODD_LINES = re.compile(r"\n\{|[\x1b\r]")
# A run of whole lines that are none of those and have no router prefix ("[ port] ").
_PLAIN_RUN = re.compile(r"^(?:[^\n\[{\x1b\r][^\n\x1b\r]*\n|\n)+", re.M)
_BANNER = frozenset({ev.ServerStarting, ev.BuildInfo, ev.Verbosity})


def _lines_of(text: str) -> list[str]:
    """`text` split after each "\\n" only (str.splitlines also splits at \\r, \\x1c, U+2028 ...)."""
    parts = text.split("\n")
    last = parts.pop()
    lines = [part + "\n" for part in parts]
    if last:
        lines.append(last)
    return lines


class Diagnoser:
    """The pure core: feed it lines (or parsed events) in order, then call `finish`.

    >>> d = Diagnoser("example.log")
    >>> d.feed_line("0.00.003.960 I srv  llama_server: initializing ...", 1)
    >>> d.finish().runs_total
    1
    """

    def __init__(self, file: str, *, max_runs: int = 10, max_failures: int = 10) -> None:
        self.file = file
        self.files = [file]
        self.skipped: list[str] = []
        self._lines_before = 0  # lines of the files before this one
        self.max_runs = max_runs
        self.max_failures = max_failures
        self.lines = 0
        self.long_lines = 0
        self.events = 0
        self.specific_events = 0  # events only llama-server writes (not `listening on …`, `loading model '…'`)
        self._current: dict[str | None, _Run] = {}
        self._line_format: dict[str | None, ev.LineFormat] = {}  # of the latest line with an event, by source
        self._done: deque[RunReport] = deque(maxlen=max_runs if max_runs > 0 else None)
        self._omitted = OmittedRuns()
        self._runs = 0
        self._failures = 0
        self._aborted = 0
        self._by_file: dict[str, FileSummary] = {}
        self._largest: list[tuple[int, int, str]] = []  # a min-heap of (tokens, run, file), at most 3
        self._failed_streak = self._longest_failed_streak = 0

    def feed_line(self, line: str, lineno: int) -> None:
        """Parse one raw line (any format the exporter reads) and apply it."""
        if lineno > self.lines:
            self.lines = lineno
        events = parse_line_events(line)
        source = router_source(line) if line[:1] == "[" else None
        if not events:
            run = self._current.get(source)
            if run is not None:
                run.last_line = lineno
                if line[:1] in _STAMP_FIRST:
                    run.note_stamp(line)
            return
        for e in events:
            self.feed_event(e, lineno, line, source=source)

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
        if _ODD_LINES.search(text) is not None or text[:1] == "{":
            # JSONL, colours, CR: scan what parse_line would scan (only those lines need unwrapping)
            text = "\n".join([unwrap_marked(x) if x[:1] == "{" or "\x1b" in x else x.rstrip("\r\n") for x in lines])
        done = 0  # lines[:done] are applied
        for index, _, e in parse_text_indexed(text):
            self._skip(lines, done, index, first_lineno)
            self.feed_event(e, first_lineno + index, lines[index])
            done = index + 1
        self._skip(lines, done, len(lines), first_lineno)
        if lines:
            self.lines = max(self.lines, first_lineno + len(lines) - 1)

    def feed_text(self, text: str, first_lineno: int) -> None:
        """`feed_lines` for a block of whole lines (each ends in "\\n", but perhaps the last), numbered
        from `first_lineno`, without splitting it into lines: only the lines that need unwrapping
        (JSONL, colours, CR) or carry a router prefix go through `feed_lines`. The same result as
        feeding its lines one by one (a test holds it to that).
        """
        if not text:
            return
        if text[:1] not in "[{" and "\n[" not in text and _ODD_LINES.search(text) is None:
            self._feed_plain(text, first_lineno)
            return
        lineno, pos = first_lineno, 0
        for m in _PLAIN_RUN.finditer(text):
            if m.start() > pos:
                odd = text[pos : m.start()]
                self.feed_lines(_lines_of(odd), lineno)
                lineno += odd.count("\n")
            plain = m.group()
            self._feed_plain(plain, lineno)
            lineno += plain.count("\n")
            pos = m.end()
        if pos < len(text):
            self.feed_lines(_lines_of(text[pos:]), lineno)

    def _feed_plain(self, text: str, first_lineno: int) -> None:
        """`feed_text` for lines that need no unwrapping and have no router prefix."""
        done, done_at = 0, 0  # lines before `done` (starting at offset `done_at`) are applied
        line = ""
        for index, start, e in parse_text_indexed(text):
            if index > done:
                self._skip_text(text, done_at, start, first_lineno + index - 1)
            if index >= done:
                end = text.find("\n", start) + 1 or len(text)
                line = text[start:end]
                done, done_at = index + 1, end
            self.feed_event(e, first_lineno + index, line)
        last = first_lineno + text.count("\n", 0, len(text) - 1)  # the block's last line
        if done_at < len(text):
            self._skip_text(text, done_at, len(text), last)
        self.lines = max(self.lines, last)

    def _skip_text(self, text: str, start: int, end: int, last_lineno: int) -> None:
        """`_skip` for the lines of text[start:end] (whole lines, none with an event)."""
        run = self._current.get(None)
        if run is None:
            return
        run.last_line = last_lineno
        if run.first_elapsed is None:  # the run's first time stamp may be among them
            run.note_first_stamp(_lines_of(text[start:end]))
        stop = end
        while stop > start:  # the last line that may carry a time stamp, from the end
            begin = max(text.rfind("\n", start, stop - 1) + 1, start)
            if text[begin] in _STAMP_FIRST:
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
            if lines[i][:1] in _STAMP_FIRST:
                run.last_stamped_line = lines[i]
                break

    def feed_event(self, e: ev.Event, lineno: int, line: str = "", *, source: str | None = None) -> None:
        """Apply one parsed event; `line` is the raw line (read only for a fatal decode's offset and time)."""
        kind = type(e)
        run = self._current.get(source)
        if isinstance(e, ev.LineFormat):  # how the next line is written: for the run's state, and for a run it starts
            self._line_format[source] = e
            if run is not None:
                run.state.apply(e)
            return
        self.events += 1
        # A forged start must not split a run: a start line the state rejects is only counted. (Other
        # rejected events reach `_Run.apply`, which counts them and acts on none.)
        if kind is ev.Rejected or (kind is ev.SlotsInitialized and run is not None and not run.state.accepts(e)):
            if run is not None:
                run.state.apply(e)
            return
        if kind not in ev.GENERIC:
            self.specific_events += 1
        restart = isinstance(e, ev.SlotsInitialized) and run is not None and run.state.n_slots is not None
        if kind in _BANNER or restart:
            # A new server process, unless this is one more banner line of a start already seen (a banner
            # line this start has already printed means a new process: a crash loop during start-up).
            if run is not None and (restart or not run.in_startup or kind in run.banner_seen):
                self._close(run, next_start=True)
                run = None
            if run is None:
                run = self._new_run(source, lineno)
            run.started = True
            run.in_startup = True
            run.banner_seen.add(kind)
        elif run is None:
            run = self._new_run(source, lineno)
        if line[:1] in _STAMP_FIRST:
            run.note_stamp(line)
        run.apply(e, lineno, line)

    def next_file(self, file: str) -> None:
        """The lines that follow come from `file`, numbered from 1 again. llama-server truncates its log
        as it starts, so a file is a later run: a run still open here ended without its exit line."""
        for run in sorted(self._current.values(), key=lambda r: r.first_line):
            self._close(run, next_start=True)
        self._current = {}
        self._line_format = {}
        self._lines_before += self.lines
        self.lines = 0
        self.files.append(file)

    def _new_run(self, source: str | None, lineno: int) -> _Run:
        self._runs += 1
        run = _Run(self._runs, source, lineno, self.max_failures, self.files[-1])
        run.state.provenance.banners_reformat = True  # a file holds one run after another: each start may change it
        line_format = self._line_format.get(source)
        if line_format is not None:
            run.state.apply(line_format)
        self._current[source] = run
        return run

    def _close(self, run: _Run, *, next_start: bool = False) -> None:
        report = run.finish(next_start=next_start)
        how = report.ending.how
        self._failed_streak = self._failed_streak + 1 if how == "failed_start" else 0
        self._longest_failed_streak = max(self._longest_failed_streak, self._failed_streak)
        self._failures += report.failure_summary.total
        self._aborted += report.counts.aborted_requests
        fs = self._by_file.setdefault(report.file, FileSummary(report.file))
        fs.runs += 1
        fs.failures += report.failure_summary.total
        fs.aborted_requests += report.counts.aborted_requests
        fs.endings[how] = fs.endings.get(how, 0) + 1
        if report.counts.largest_request_tokens:
            entry = (report.counts.largest_request_tokens, report.index, report.file)
            if len(self._largest) < 3:
                heapq.heappush(self._largest, entry)
            else:
                heapq.heappushpop(self._largest, entry)
        if self._done.maxlen is not None and len(self._done) == self._done.maxlen:
            old = self._done[0]
            self._omitted.runs += 1
            self._omitted.failures += old.failure_summary.total
            self._omitted.aborted_requests += old.counts.aborted_requests
            self._omitted.retries += old.counts.retries
        self._done.append(report)

    def _ended(self, how: str) -> int:
        """Runs that ended `how`, in every file."""
        return sum(fs.endings.get(how, 0) for fs in self._by_file.values())

    def finish(self) -> Report:
        """Close every open run and return the report (runs in order of their first line)."""
        for run in sorted(self._current.values(), key=lambda r: r.first_line):
            self._close(run)
        self._current = {}
        return Report(
            schema=SCHEMA,
            file=self.file if len(self.files) == 1 else f"{len(self.files)} files",
            files=list(self.files),
            files_order=None,
            skipped=list(self.skipped),
            lines=self._lines_before + self.lines,
            long_lines=self.long_lines,
            runs_total=self._runs,
            failures_total=self._failures,
            aborted_requests_total=self._aborted,
            runs=sorted(self._done, key=lambda r: r.first_line),
            omitted_runs=self._omitted,
            endings={how: total for how in ENDINGS if (total := self._ended(how))},
            failed_starts_in_a_row=self._longest_failed_streak,
            by_file=[self._by_file.get(f) or FileSummary(f) for f in self.files],
            largest_requests=[LargeRequest(t, r, f) for t, r, f in sorted(self._largest, reverse=True)],
        )


def analyze(lines: Iterable[str], file: str = "-", *, max_runs: int = 10, max_failures: int = 10) -> Report:
    """Diagnose an iterable of log lines (pure; used by tests and by `main`)."""
    d = Diagnoser(file, max_runs=max_runs, max_failures=max_failures)
    for i, line in enumerate(lines, 1):
        d.feed_line(line, i)
    return d.finish()
