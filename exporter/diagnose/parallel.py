"""One big log diagnosed on several cores: split at server starts, each part in its own process.

llama-server's runs are independent: a run's report depends only on its own lines. A log is split
into parts that each begin with a start line (`initializing ...`), every part is diagnosed by its own
`Diagnoser` in a worker process, and the parts are joined in order (`Diagnoser.absorb`): runs are
numbered on, lines were numbered from where each part starts (counted first, by the workers), the last
run of a part is closed as "another start followed". The result is the same report as one process
reading the whole log (a test holds it to that). The pool series that --json and --html show for the
last runs is kept only by the parts that may hold one of them (the last, or all where the start lines
counted in the last are fewer), and a part that turns out to hold one after all is read again with it.

The split is only taken where that holds; otherwise the log is read in one process as before:

* a part whose last run was still starting and had not printed its own `initializing ...` (the
  next start line would then continue that run, as a crash loop during start-up does);
* router mode (`[port]` prefixes): the children's runs run across the router's starts (such a log is
  read twice: that it is one is known only once the parts are read);
* a first MiB that is not a log (one process stops reading there and says so).

Only plain files at least `MIN_BYTES` long are split (gzip cannot be read from the middle; standard
input cannot be read twice).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import accumulate
from multiprocessing import get_context
from pathlib import Path

from exporter.diagnose.core import Diagnoser, Part
from exporter.diagnose.read import ReadStats, feed_log, read_blocks
from exporter.logs import events as ev
from exporter.logs.encoding import newlines
from exporter.logs.parse import parse_line_events

#: Logs smaller than this are read in one process (starting workers costs more than it saves).
MIN_BYTES = 32 * 1024 * 1024
#: How far past a split point a start line is looked for.
_SEARCH_BYTES = 64 * 1024 * 1024
_BLOCK = 1024 * 1024
_START_TEXT = b"initializing ..."
_START = re.compile(re.escape(_START_TEXT))


@dataclasses.dataclass
class _Job:
    path: str
    start: int  # byte offset: the first byte of a line (a start line, but for the first part)
    end: int
    first_line: int  # the number of the part's first line in the file
    last: bool  # the part that ends the file
    max_runs: int
    max_failures: int
    series: bool


@dataclasses.dataclass
class _Result:
    part: Part
    stats: ReadStats
    open_run: tuple[bool, bool] | None  # see Diagnoser.close_open
    routed: bool


class _Slice(io.RawIOBase):
    """Bytes [start, end) of a file, as a stream."""

    def __init__(self, f: io.BufferedReader, start: int, end: int) -> None:
        f.seek(start)
        self._f, self._left = f, end - start

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = self._f.readinto(memoryview(buffer)[: min(len(buffer), self._left)])
        self._left -= n
        return n


def _diagnose_part(job: _Job) -> _Result:
    """In a worker: one part of the log through its own Diagnoser."""
    d = Diagnoser(job.path, max_runs=job.max_runs, max_failures=job.max_failures, series=job.series)
    stats = ReadStats()
    with open(job.path, "rb") as raw:  # noqa: PTH123 (a raw binary file, read in slices)
        f = io.BufferedReader(_Slice(raw, job.start, job.end), _BLOCK)
        if job.start == 0:
            feed_log(d, f, stats, 0)  # the first part decides whether the file is a log at all
        else:
            for text in read_blocks(f, stats):
                stats.lines += d.feed_text(text, job.first_line + stats.lines)
    open_run = d.close_open(next_start=not job.last)
    return _Result(d.part(), stats, open_run, d.routed)


def _is_start(line: bytes) -> bool:
    return not line.startswith(b"[") and any(
        type(e) is ev.ServerStarting for e in parse_line_events(line.decode("utf-8", "replace"))
    )


def _skip_line(f: io.BufferedReader) -> None:
    """Read past the end of the line the file is in, a block at a time (a line may be gigabytes long)."""
    while (more := f.readline(_BLOCK)) and not more.endswith(b"\n"):
        pass


def _start_after(f: io.BufferedReader, offset: int, limit: int) -> int | None:
    """The offset of the first start line that begins after `offset` (and before `limit`), or None."""
    f.seek(offset)
    _skip_line(f)  # the rest of the line `offset` is in
    pos = f.tell()
    while pos < limit:
        block = f.read(_BLOCK)
        whole = block.rfind(b"\n") + 1
        if not whole:  # no line ends in it: past the end, or in a line longer than a block
            if not block:
                return None
            _skip_line(f)
            pos = f.tell()
            continue
        block = block[:whole]  # whole lines only: a start line never crosses it
        for m in _START.finditer(block):
            begin = block.rfind(b"\n", 0, m.start()) + 1
            if _is_start(block[begin : block.find(b"\n", m.end()) + 1]):
                return pos + begin
        pos += whole
        f.seek(pos)
    return None


def _targets(size: int, workers: int) -> list[int]:
    """Where the parts should begin: each takes 1/(workers + 1) of what is left, down to a quarter of `MIN_BYTES`
    (each part costs a Diagnoser of its own and the return of its runs). Parts of a log differ in how much work
    a byte is, and the processes take the next part as they finish one: parts that shrink towards the end keep
    every process busy until then (equal parts left one with a whole part to read while the others waited: a
    measured 1 GB log, 50 s and 57 s in two halves)."""
    smallest = MIN_BYTES // 4
    targets, at = [0], 0
    while size - at > smallest:
        at += max((size - at) // (workers + 1), smallest)
        targets.append(at)
    return targets[:-1] if size - targets[-1] < smallest // 2 else targets


def _split(path: str, size: int, targets: list[int]) -> list[int]:
    """Offsets of the parts: 0, then the first start line after each target."""
    offsets = [0]
    with open(path, "rb") as f:  # noqa: PTH123
        for target in targets[1:]:
            at = _start_after(f, max(target, offsets[-1] + 1), min(size, target + _SEARCH_BYTES))
            if at is not None and at > offsets[-1]:
                offsets.append(at)
    return offsets


def _count(path: str, start: int, end: int, starts: bool) -> tuple[int, int]:
    """In a worker: the newlines in bytes [start, end) of the file and, with `starts`, about how many server
    starts (a start line cut by a block's end is missed: at most as many as there are)."""
    lines = found = 0
    with open(path, "rb") as f:  # noqa: PTH123
        f.seek(start)
        pos = start
        while pos < end:
            block = f.read(min(_BLOCK, end - pos))
            if not block:
                break
            lines += newlines(block)
            if starts:
                found += block.count(_START_TEXT)
            pos += len(block)
    return lines, found


def start_method() -> str:
    """How the workers start. fork: at once, with everything imported; a process with threads (fork copies only
    the calling one, perhaps with a lock held) uses a fresh server process instead. Where there is no fork
    (Windows), spawn: each worker starts a Python that imports the diagnoser; the same report, slower (a 64 MiB
    log on a busy 2-core Linux: 13.9 and 14.8 s with fork, 15.3 and 18.0 s with spawn), so fork where it exists."""
    if not hasattr(os, "fork"):
        return "spawn"
    return "fork" if threading.active_count() == 1 else "forkserver"


def workers() -> int:
    """The processes to use: the cores this process may run on, at most 8."""
    try:
        return min(len(os.sched_getaffinity(0)), 8)
    except AttributeError:  # not Linux
        return min(os.cpu_count() or 1, 8)


def feed_in_parts(d: Diagnoser, path: str, stats: ReadStats, *, max_runs: int, max_failures: int, series: bool) -> bool:
    """Diagnose the plain file `path` in parts on several cores, into `d`; False (and `d` unchanged)
    where it cannot be split so that the report is the same: then the caller reads it as a whole."""
    n = workers()
    size = Path(path).stat().st_size
    if n < 2 or size < MIN_BYTES:
        return False
    offsets = _split(path, size, _targets(size, n))
    if len(offsets) < 2:
        return False
    ends = [*offsets[1:], size]
    try:
        with ProcessPoolExecutor(min(n, len(offsets)), mp_context=get_context(start_method())) as pool:
            last = len(offsets) - 1
            counts = list(pool.map(_count, [path] * len(offsets), offsets, ends, [i == last for i in range(last + 1)]))
            first_lines = list(accumulate((lines for lines, _ in counts[:-1]), initial=1))
            # The pool series (a point per event: about a tenth of the work) only where a run may be among the
            # last --max-runs, the ones the report shows: in the last part, and in all where it holds fewer.
            shown = [series and (max_runs <= 0 or i == last or counts[-1][1] < max_runs) for i in range(last + 1)]
            jobs = [
                _Job(path, start, end, line, i == last, max_runs, max_failures, shown[i])
                for i, (start, end, line) in enumerate(zip(offsets, ends, first_lines, strict=True))
            ]
            # Those with the series first: they take longer, and what takes longest should not come last.
            order = sorted(range(last + 1), key=lambda i: not shown[i])
            futures = {i: pool.submit(_diagnose_part, jobs[i]) for i in order}
            results = [futures[i].result() for i in range(last + 1)]
            # A part left without its series whose runs are shown after all (fewer runs followed it than the
            # count of start lines said): read again with it.
            again = {
                i: pool.submit(_diagnose_part, dataclasses.replace(job, series=True))
                for i, job in enumerate(jobs)
                if series and not job.series and sum(r.part.runs_total for r in results[i + 1 :]) < max_runs
            }
            for i, future in again.items():
                results[i] = future.result()
    except BrokenProcessPool:  # a worker died (killed for memory, say): one process reads it all
        return False
    if results[0].stats.bytes < ends[0]:  # the first part stopped at its first MiB: not a log
        return False
    if any(r.routed for r in results):
        return False
    if any(r.open_run is not None and r.open_run[0] and not r.open_run[1] for r in results[:-1]):
        return False
    for r in results:
        d.absorb(r.part)
    first = results[0].stats
    stats.bytes, stats.nul_bytes, stats.replaced = size, first.nul_bytes, first.replaced
    stats.lines = first_lines[-1] - 1 + results[-1].stats.lines
    stats.long_lines = sum(r.stats.long_lines for r in results)
    return True
