"""Whether a log line is the running server's own: its run's line format, and what its run said before. Pure.

Clients write into the log: a request path with an encoded newline (`GET /x%0A…`, logged by builds
before b9617), a prompt at debug levels. What follows such a newline is a line of its own, in the
client's words. So a line that looks like a metric line is applied only when it also has what the
server's own lines have, and a forged one lacks. A line that fails is rejected and counted
(`llamacpp_exporter_log_lines_rejected_total{reason}`), never applied:

``format``
    A server start fixes how its run writes lines: an elapsed time stamp, a level letter, colours,
    JSONL. The server writes that prefix once per entry, so the text after a newline in a request
    path or a prompt has none. A metric line without its run's prefix (or JSONL wrapping) is
    rejected. The one exception is the server's own: before b9230, `print_timing` wrote its timings
    as continuation lines without prefix, believed right after that entry's first line. The format
    changes only at a start banner, and only where a new server can have started: a log file that
    was truncated or replaced (llama-server truncates its `--log-file` at every start), or a source
    without files (the journal, standard input), where every banner is a start.
``inconsistent``
    Within a run that was followed from its start, a line must fit what the run said before:
    `initializing, n_slots` once per start, `new slot` lines only before the server listens, a
    failed or retried decode only while a slot is processing, a request aborted by a fatal error
    only for a task that was started, slot progress and a new context checkpoint only for the task
    the slot is running (or one that started). (Slot ids, counts and sizes that the server cannot
    have are `out_of_range`, see `exporter.model.bounds`.)

What this cannot catch: a forged line that copies its run's prefix (a time stamp in the right shape,
a level letter) and fits the run (names a slot's real task, or a retry while requests run); a forged
start banner in the run's format (it starts a new run); and, in a log without prefix, any forged line
that fits the run. The prefix is on by default from b9151; on older builds, run llama-server with
`--log-prefix --log-timestamps` (or `--log-jsonl`, where a newline never starts a line).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.logs import events as ev
from exporter.model.run import ServerRun

#: Tasks remembered as started (besides each slot's current one): a request errors out shortly after it starts.
RECENT_TASKS = 4096

# Lines that start a server (the state resets on the first of them): they may set a new format.
_STARTS = ev.BANNERS
_TIMINGS = frozenset({ev.PromptEvalTiming, ev.GenerationTiming, ev.TotalTiming, ev.DraftAcceptance})


def _slot_processing(run: ServerRun, slot: int) -> bool:
    s = run.slots.get(slot)
    return s is not None and s.processing


# Slot lines about a task (the bulk of a busy log, checked inline): the slot's task, or one that started.
_PROGRESS = ev.TASK_LINES

# The other rules for runs followed from their start: a line of these kinds must fit what the run said before.
_FITS: dict[type[Any], Callable[[Provenance, ServerRun, Any], bool]] = {
    # In a cascade (a retry was believed), a slot is processing: the retries that follow need no search.
    ev.KVRetry: lambda p, run, e: run.in_cascade or run.processing(),
    ev.MemorySlotFailure: lambda p, run, e: run.in_cascade or run.processing(),
    ev.DecodeFatal: lambda p, run, e: run.processing(),
    ev.DecodeFailed: lambda p, run, e: p.failing or run.processing(),
    ev.RequestError: lambda p, run, e: e.reason not in ev.FATAL_REASONS or e.task in p.tasks,
    ev.CheckpointCreated: lambda p, run, e: _slot_processing(run, e.slot),
}

#: The kinds whose line, in its run's format, `Provenance.admit` only holds to their rule in `_FITS` (the line
#: changes nothing there): `ServerState.apply_events` asks the rule itself, without the call to `admit`.
FITS_ONLY: dict[type[Any], Callable[[Provenance, ServerRun, Any], bool]] = {
    kind: fits for kind, fits in _FITS.items() if kind is not ev.DecodeFatal
}

#: Kinds that `Provenance.admit` must see even when their line is in the run's format; for the others, a
#: line in the run's format is all there is to check (`ServerState.apply` skips the call for them). Slot
#: lines about a task are checked by the state's handlers, which have the slot at hand (`knows`).
CHECKED: frozenset[type[Any]] = frozenset(
    {*_FITS, *_TIMINGS, ev.TimingsHead, ev.TaskStarted, ev.NewPrompt, ev.SlotsInitialized, ev.SlotCreated}
)


class NotOwnLine(Exception):
    """Raised by a state handler for a slot line about a task that its run never started."""


class Provenance:
    """The run's line format and the facts the rules check, kept beside a `ServerState`."""

    __slots__ = (
        "banners_reformat",
        "failing",
        "from_start",
        "line_format",
        "new_file",
        "run_format",
        "tasks",
        "timings",
    )
    run_format: int | None  # LineFormat code of the run; None until its first line
    line_format: int  # LineFormat code of the line being applied
    new_file: bool  # the lines that follow begin a new file: a start banner there is a new run, maybe in a new format
    banners_reformat: bool  # any start banner may set a new format (sources without files)
    from_start: bool  # the run was followed from its start banner
    tasks: dict[int, None]  # tasks started in this run (the latest RECENT_TASKS), in order
    timings: int  # timings continuation lines still believed after a `TimingsHead` (its next three, a fourth draft one)
    failing: bool  # a decode failed fatally and no task started since

    def __init__(self) -> None:
        self.run_format = None
        self.line_format = 0
        self.new_file = False
        self.banners_reformat = False
        self.from_start = False
        self.tasks = {}
        self.timings = 0
        self.failing = False

    def start(self) -> None:
        """A server start: its banner line fixes the run's format; what the old run said is forgotten."""
        self.run_format = self.line_format
        self.new_file = False
        self.from_start = True
        self.tasks = {}
        self.timings = 0
        self.failing = False

    def check(self, run: ServerRun, kind: type[Any], e: Any) -> str | None:
        """Why `e` (of type `kind`) is not the running server's own line; None when it fits. No side effects."""
        if kind is ev.CrashCause:
            # ggml_abort writes to stderr without the log's prefix. A forged cause cannot count a crash
            # (only a run that ends without its exit line does); at worst it names the wrong cause.
            return None
        if kind in _TIMINGS and e.continuation:
            # The last of a head's lines may only be a speculative decoding summary.
            return None if self.timings > (0 if kind is ev.DraftAcceptance else 1) else "inconsistent"
        if (
            self.line_format != self.run_format
            and self.run_format is not None
            and not (kind in _STARTS and (self.new_file or self.banners_reformat))
        ):
            return "format"
        if not self.from_start:
            pass
        elif kind in _PROGRESS:
            s = run.slots.get(e.slot)
            return None if (s is not None and s.task == e.task) or self.knows(e.task) else "inconsistent"
        else:
            fits = _FITS.get(kind)
            if fits is not None and not fits(self, run, e):
                return "inconsistent"
        if kind is ev.SlotsInitialized:
            return "inconsistent" if run.n_slots is not None else None
        if kind is ev.SlotCreated:
            return "inconsistent" if run.ready else None
        return None

    def admit(self, run: ServerRun, kind: type[Any], e: Any) -> str | None:
        """`check`, and take note of what an admitted line tells about the lines after it."""
        if kind is ev.CrashCause:  # its format (none, from ggml_abort) is not the run's: leave that as it is
            return None
        if self.line_format == self.run_format:  # the common case, in one call
            fits = _FITS.get(kind)
            if fits is not None:  # the bulk of a cascade: its retries
                if self.from_start and not fits(self, run, e):
                    return "inconsistent"
                if kind is ev.DecodeFatal:
                    self.failing = True
                return None
            if kind is ev.TaskStarted or kind is ev.NewPrompt:
                self._started(e.task)
                return None
            if kind in _TIMINGS and not e.continuation:
                return None
        reason = self.check(run, kind, e)
        if reason is not None:
            return reason
        if kind in _TIMINGS and e.continuation:
            self.timings -= 1
            return None
        if self.run_format != self.line_format:
            # Joined mid-run (the first line sets the format), or a start where a new format may begin.
            self.run_format = self.line_format
            self.new_file = False
        if kind is ev.TimingsHead:
            self.timings = 4  # `prompt eval time`, `eval time`, `total time`, maybe `draft acceptance rate`
        elif kind is ev.TaskStarted or kind is ev.NewPrompt:
            self._started(e.task)
        elif kind is ev.DecodeFatal:
            self.failing = True
        return None

    def knows(self, task: int) -> bool:
        """A task a slot line may name: one that started in this run (or any, in a run joined midway)."""
        return task < 0 or not self.from_start or task in self.tasks

    def _started(self, task: int) -> None:
        self.failing = False
        self.timings = 0  # a new task: the last request's timings entry is over
        if task in self.tasks:
            return
        if len(self.tasks) >= RECENT_TASKS:
            del self.tasks[next(iter(self.tasks))]
        self.tasks[task] = None
