"""One server run of a log: the events applied to its own `ServerState`, its failures, how it ended."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from exporter.diagnose.advice import advise
from exporter.diagnose.first_tokens import MemoryKind, first_tokens
from exporter.diagnose.report import (
    Configuration,
    Counts,
    Ending,
    Failure,
    FailureSummary,
    InFlight,
    MemoryFigures,
    RunReport,
    SlotAtAbort,
)
from exporter.diagnose.trace import Fingerprint, PoolSeries
from exporter.logs import events as ev
from exporter.logs.parse import ANSI
from exporter.logs.router_split import router_port
from exporter.model.bounds import MIB
from exporter.model.forecast import forecast
from exporter.model.request_sizes import ExactValues
from exporter.model.state import ServerState

# Parsed locally because the events do not carry them (exporter.logs.events.DecodeFatal has only the
# reason): the offset and n_batch of the fatal decode line, and the elapsed-time stamp of a line.
_FATAL_POS = re.compile(r"\b(?:off|i) = (\d+), n_batch = (\d+)")
_STAMP = re.compile(r"^(?:\[\s*\d+\] )?(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")
_JSONL_TIME = re.compile(r'^\{.*?"time":\s*(\d+)')
# An abort has one release per slot; a bound keeps memory fixed even for a malformed log.
_MAX_ABORT_LINES = 4096
STAMP_FIRST = frozenset("0123456789{[\x1b")  # first characters of a line that may carry a time stamp
# Sets of event types, tested with `type(e) in …` (cheaper than isinstance() on a tuple, for every event of a
# log that may hold millions), derived from each kind's traits (`exporter.logs.event_class.Traits`).
_PROGRESS = ev.PROGRESS
# Events after which the forecast of the requests in flight may grow, or shrink.
_DEMAND_GROWS = ev.DEMAND_GROWS
_DEMAND_SHRINKS = ev.DEMAND_SHRINKS
# Events after which the pool series (`diagnose --html`) takes a point.
_SERIES = ev.SERIES_POINTS
# What does not end an abort's trail of lines (the aborted requests' errors and releases).
_ABORT_TRAIL = ev.ABORT_TRAIL


def elapsed_seconds(line: str) -> float | None:
    """Seconds since the server started, from a line's `m.ss.mmm.uuu` stamp or JSONL `time` (µs).

    >>> elapsed_seconds("62.05.123.500 I srv  update_slots: all slots are idle")
    3725.1235
    """
    if "\x1b" in line:
        line = ANSI.sub("", line)
    m = _STAMP.match(line)
    if m is not None:
        return int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
    j = _JSONL_TIME.match(line)
    if j is not None:
        return int(j[1]) / 1e6
    return None


def router_source(line: str) -> str | None:
    """The port of a router child's line (`[PORT] `, llama-server's router mode), as text, if any."""
    port = router_port(line)
    return None if port is None else str(port)


@dataclass
class _Cascade:
    """A retry cascade in progress: what is needed to explain the failure it may end in."""

    retries: int = 0
    failures: int = 0
    purges: int = 0
    smallest_batch: int | None = None
    last_failure_size: int | None = None
    segment_offset: int | None = None  # offset of the batch being retried
    segment_n_batch: int | None = None
    segment_batch: int | None = None  # size of the first failed attempt at that offset

    def memory_slot_failure(self, size: int) -> None:
        self.failures += 1
        self.last_failure_size = size

    def retry(self, offset: int, n_batch: int) -> None:
        self.retries += 1
        self.smallest_batch = n_batch if self.smallest_batch is None else min(self.smallest_batch, n_batch)
        # After a successful sub-batch llama-server restores n_batch and moves `off` on; a retry at a new
        # offset (or with n_batch no longer halved) is the first failed attempt of the next sub-batch, and
        # the memory-slot line just before it names that sub-batch's size: everything from `off` on.
        new_segment = offset != self.segment_offset or self.segment_n_batch is None or n_batch >= self.segment_n_batch
        if new_segment:
            self.segment_offset = offset
            self.segment_batch = self.last_failure_size
        self.segment_n_batch = n_batch

    def failed_batch(self, offset: int | None) -> int | None:
        """Tokens of the batch that found no room when the decode was given up at `offset`."""
        if offset is not None and offset == self.segment_offset and self.segment_batch is not None:
            return self.segment_batch
        return self.last_failure_size


@dataclass
class _Abort:
    """The lines right after a fatal decode: `send_error` and the release of every in-flight slot."""

    line: int
    elapsed_s: float | None
    reason: str
    offset: int | None
    cascade: _Cascade
    errored_tasks: list[int] = field(default_factory=list)
    releases: list[ev.SlotReleased] = field(default_factory=list)
    predictable: _Predictable | None = None
    tokens_at_fatal: tuple[int, ...] = ()  # every slot's cells at the fatal line (for the pool series)


@dataclass
class _Predictable:
    """The line at which the prompts in flight first needed more than the pool (since they last fitted)."""

    line: int
    elapsed_s: float | None
    demand: int
    sources: list[str]


class Run:
    """Accumulates one server run. Memory is bounded: counters, the slots, and at most N failures."""

    def __init__(
        self,
        index: int,
        source: str | None,
        first_line: int,
        max_failures: int,
        file: str = "",
        *,
        series: bool = False,
    ) -> None:
        self.index = index
        self.source = source
        self.model: str | None = None  # a router child's model name (its spawn line)
        self.file = file
        self.first_line = first_line
        self.last_line = first_line
        self.state = ServerState(request_values=ExactValues())
        self.started = False
        self.in_startup = False
        self.banner_seen: set[object] = set()  # `ev.banner_line` of the banner lines this start printed
        self.events = 0
        self.first_elapsed: float | None = None
        self.last_stamped_line = ""
        self.first_wall: float | None = None  # wall-clock time of its first and last line (the journal's)
        self.last_wall: float | None = None
        self.fingerprint = Fingerprint()
        self.series = PoolSeries() if series else None
        self.tasks_started = 0
        self.releases = 0
        self.largest_request = 0
        self.over_share = 0
        self.over_share_known = False
        self.kv_swa_section = False
        self.kv_full: ev.KVCacheSize | None = None
        self.kv_swa_mib = 0.0
        self.memory = MemoryKind()  # the model's memory as the start-up lines name it (first tokens' section)
        self.cascade: _Cascade | None = None
        self.abort: _Abort | None = None
        self.predictable: _Predictable | None = None
        # Failures kept in detail: the first half and the last half of `max_failures` (0 = all).
        self.head_max = (max_failures + 1) // 2 if max_failures > 0 else None
        self.head: list[Failure] = []
        self.tail: deque[Failure] = deque(maxlen=max_failures - self.head_max if self.head_max is not None else None)
        self.summary = FailureSummary()

    # -- events

    def apply(self, e: ev.Event, lineno: int, line: str) -> None:
        self.events += 1
        self.last_line = lineno
        kind = type(e)
        if self.abort is not None and kind not in _ABORT_TRAIL and self.state.accepts(e):
            if kind is ev.DecodeFailed:
                self.state.apply(e)
                self._close_abort()
                return
            self._close_abort()
        if not self.state.apply(e):
            return  # rejected: counted by the state, never acted on here
        # Demand only grows with a new task or prompt: the other changes matter once it passed the pool.
        if kind in _DEMAND_GROWS or (kind in _DEMAND_SHRINKS and self.predictable is not None):
            self._note_demand(lineno, line)

        if kind in _PROGRESS:
            self.in_startup = False
            self.cascade = None  # a cascade that is followed by progress recovered
        handler = _RUN_HANDLERS.get(kind)
        if handler is not None:
            handler(self, e, lineno, line)
        if self.series is not None and kind in _SERIES:
            self._sample(lineno, line, keep=kind is ev.DecodeFatal)

    def _sample(self, lineno: int, line: str, *, keep: bool) -> None:
        """One point of the pool series: every slot's tokens now."""
        series = self.series
        assert series is not None
        elapsed = elapsed_seconds(line) if line[:1] in STAMP_FIRST else None
        if not series.x:
            series.by_line = elapsed is None  # a run without time stamps is drawn by line number
        if series.by_line:
            x = float(lineno)
        elif elapsed is None:
            return
        else:
            x = elapsed
        series.add(x, self._slot_tokens(), keep=keep)

    def _slot_tokens(self) -> tuple[int, ...]:
        """Every slot's tokens, by slot id from 0 (0 for a slot not seen): a point of the pool series."""
        slots = self.state.run.slots
        if not slots:
            return ()
        tokens = [0] * (max(slots) + 1)  # (slot ids are never negative: the scan reads digits)
        for i, slot in slots.items():
            tokens[i] = slot.tokens
        return tuple(tokens)

    def _series_failure(self, a: _Abort, aborted: list[ev.SlotReleased]) -> None:
        """The failure's point of the pool series: each aborted slot's cells as its release line says
        (what the text counts), the other slots as they were at the fatal line."""
        series = self.series
        if series is None:
            return
        if not series.x and not series.failures:
            series.by_line = a.elapsed_s is None
        x = float(a.line) if series.by_line else a.elapsed_s
        if x is None:
            return
        cells = list(a.tokens_at_fatal)
        for r in aborted:
            cells.extend([0] * (r.slot + 1 - len(cells)))
            cells[r.slot] = r.n_tokens
        series.add_failure(x, tuple(cells))

    # One handler per event type that the report follows beyond the state (dispatched by type).

    def _released(self, e: ev.SlotReleased, lineno: int, line: str) -> None:
        self.releases += 1
        self.largest_request = max(self.largest_request, e.n_tokens)
        share = self._equal_share()
        if share is not None:
            self.over_share_known = True
            self.over_share += e.n_tokens > share
        if self.abort is not None and len(self.abort.releases) < _MAX_ABORT_LINES:
            self.abort.releases.append(e)

    def _task_started(self, e: ev.TaskStarted, lineno: int, line: str) -> None:
        self.tasks_started += 1

    def _new_prompt(self, e: ev.NewPrompt, lineno: int, line: str) -> None:
        self.largest_request = max(self.largest_request, e.n_prompt_tokens)

    def _request_error(self, e: ev.RequestError, lineno: int, line: str) -> None:
        if self.abort is not None and e.reason in ev.FATAL_REASONS and len(self.abort.errored_tasks) < _MAX_ABORT_LINES:
            self.abort.errored_tasks.append(e.task)

    def _memory_slot_failure(self, e: ev.MemorySlotFailure, lineno: int, line: str) -> None:
        self._cascade().memory_slot_failure(e.batch_size)

    def _retry(self, e: ev.KVRetry, lineno: int, line: str) -> None:
        self._cascade().retry(e.offset, e.n_batch)

    def _purged(self, e: ev.SlotPurged, lineno: int, line: str) -> None:
        self._cascade().purges += 1

    def _decode_fatal(self, e: ev.DecodeFatal, lineno: int, line: str) -> None:
        pos = _FATAL_POS.search(line)
        self.abort = _Abort(
            line=lineno,
            elapsed_s=elapsed_seconds(line),
            reason=e.reason,
            offset=int(pos[1]) if pos else None,
            cascade=self.cascade or _Cascade(),
            tokens_at_fatal=self._slot_tokens(),
            predictable=self.predictable,
        )
        self.cascade = None
        self.predictable = None

    def _ready(self, e: ev.ServerReady, lineno: int, line: str) -> None:
        self.in_startup = False

    def note_wall(self, t: float) -> None:
        """A line of this run was written at wall-clock time `t` (epoch seconds)."""
        if self.first_wall is None:
            self.first_wall = t
        self.last_wall = t

    def _kv_section(self, e: ev.KVCacheSection, lineno: int, line: str) -> None:
        self.kv_swa_section = e.swa
        if e.swa:
            self.memory.swa_cells = e.cells
        else:
            self.memory.full_cells = e.cells

    def _kv_size(self, e: ev.KVCacheSize, lineno: int, line: str) -> None:
        self.memory.attention = True
        if self.kv_swa_section:
            self.kv_swa_mib += e.k_mib + e.v_mib
        elif e.cells is not None:
            self.kv_full = e

    def _note_demand(self, lineno: int, line: str) -> None:
        """Remember the first line at which the prompts in flight needed more than the pool; forget it when they fit."""
        st = self.state
        capacity, _ = st.pool_capacity()
        # Cheap first: no slot's prompt demand exceeds what it holds or its prompt's size, so while
        # those fit the pool the forecast (the costly part, on every new prompt) need not be made.
        if not capacity or sum(max(s.tokens, s.prompt_size or 0) for s in st.run.slots.values()) <= capacity:
            self.predictable = None
            return
        f = forecast(st)
        ratio = f.ratio("prompt")
        if ratio is None or ratio <= 1:
            self.predictable = None
        elif self.predictable is None:
            sources = [name for name, n in f.sources().items() if n and name != "held"]
            self.predictable = _Predictable(lineno, elapsed_seconds(line), f.prompt_demand, sources)

    def note_first_stamp(self, lines: Iterable[str]) -> None:
        """The run's first time stamp, where one of `lines` (none with an event) carries it."""
        for line in lines:
            if line[:1] in STAMP_FIRST:
                self.note_stamp(line)
                if self.first_elapsed is not None:
                    return

    def note_stamp(self, line: str) -> None:
        """Remember the last line that may carry a time stamp (for the run's duration)."""
        self.last_stamped_line = line
        if self.first_elapsed is None:
            self.first_elapsed = elapsed_seconds(line)

    def _cascade(self) -> _Cascade:
        if self.cascade is None:
            self.cascade = _Cascade()
        return self.cascade

    def _equal_share(self) -> int | None:
        pool, _ = self.state.pool_capacity()
        n = self.state.run.slot_count
        return pool // n if pool and n else None

    # -- failures

    def _close_abort(self) -> None:
        a = self.abort
        if a is None:
            return
        self.abort = None
        errored = set(a.errored_tasks)
        # b6925+ aborts only processing slots (send_error then release); older builds release first and
        # also address errors to idle slots' stale task ids: a release counts when its task got an error.
        aborted = [r for r in a.releases if r.task in errored] if errored else list(a.releases)
        pool, _ = self.state.pool_capacity()
        unified = self.state.run.kv_unified
        n_slots = self.state.run.slot_count
        total = sum(r.n_tokens for r in aborted)
        slots = [
            SlotAtAbort(r.slot, r.task, r.n_tokens, r.n_tokens / pool if pool else None)
            for r in sorted(aborted, key=lambda r: r.slot)
        ]
        failed_batch = a.cascade.failed_batch(a.offset)
        self._series_failure(a, aborted)
        overflow = total - pool if pool and unified is not False and aborted else None
        heaviest = max(slots, key=lambda s: (s.tokens, -s.slot)).slot if slots else None
        share = pool // n_slots if pool and n_slots else None
        victims = [s.slot for s in slots if share is not None and s.slot != heaviest and s.tokens <= share]
        f = Failure(
            number=self.summary.total + 1,
            line=a.line,
            elapsed_s=a.elapsed_s,
            reason=a.reason,
            retries=a.cascade.retries,
            memory_slot_failures=a.cascade.failures,
            idle_slots_purged=a.cascade.purges,
            smallest_batch=a.cascade.smallest_batch,
            failed_offset=a.offset,
            failed_batch=failed_batch,
            aborted_requests=len(errored),
            slots=slots,
            tokens_sum=total,
            share_sum=total / pool if pool else None,
            pool_cells=pool,
            overflow=overflow,
            overflow_is_failed_batch=(overflow == failed_batch) if overflow is not None and failed_batch else None,
            heaviest_slot=heaviest,
            equal_share=share,
            victims=victims,
        )
        if a.predictable is not None:
            p = a.predictable
            f.predictable_line, f.predictable_elapsed_s = p.line, p.elapsed_s
            f.predictable_demand, f.predictable_from = p.demand, p.sources
            if p.elapsed_s is not None and a.elapsed_s is not None:
                f.predictable_lead_s = round(a.elapsed_s - p.elapsed_s, 6)
        s = self.summary
        s.total += 1
        s.aborted_requests += f.aborted_requests
        s.victims += len(victims)
        s.overflow_is_failed_batch += bool(f.overflow_is_failed_batch)
        s.max_tokens_at_abort = max([s.max_tokens_at_abort, *(x.tokens for x in slots)])
        if overflow is not None and total > s.max_held_together:  # a pool the aborted slots shared
            s.max_held_together, s.max_held_failure, s.max_held_line, s.max_held_pool = total, f.number, f.line, pool
        if self.head_max is None or len(self.head) < self.head_max:
            self.head.append(f)
        else:
            self.tail.append(f)

    # -- report

    def finish(self, *, next_start: bool) -> RunReport:
        """The run's report; `next_start`: closed because another start followed, not by the end of the log."""
        self._close_abort()
        st = self.state
        pool, source = st.pool_capacity()
        overcommit = st.overcommit_ratio()
        failures = [*self.head, *self.tail]
        self.summary.shown = len(failures)
        config = self._configuration(pool, source, overcommit)
        counts = Counts(
            requests_started=self.tasks_started,
            requests_finished=self.releases,
            retries=st.kv_retries,
            memory_slot_failures=st.memory_slot_failures,
            idle_slots_purged=st.slots_purged,
            cascades_recovered=st.cascades["recovered"],
            cascades_failed=st.cascades["failed"],
            cascade_unfinished=st.run.in_cascade,
            aborts=st.decode_failures["context_exceeded"],
            decode_failures=dict(sorted(st.decode_failures.items())),
            aborted_requests=sum(st.requests_aborted[r] for r in ev.FATAL_REASONS),
            request_errors=dict(sorted(st.requests_aborted.items())),
            largest_request_tokens=self.largest_request,
            requests_over_equal_share=self.over_share if self.over_share_known else None,
        )
        recommendations, verdict, unknowns = advise(config, counts)
        self.memory.recurrent = st.run.recurrent_cells is not None
        duration = None
        if self.first_elapsed is not None and self.last_stamped_line:
            end = elapsed_seconds(self.last_stamped_line)
            if end is not None and end >= self.first_elapsed:
                duration = round(end - self.first_elapsed, 6)
        return RunReport(
            index=self.index,
            source=self.source,
            model=self.model,
            file=self.file,
            first_line=self.first_line,
            last_line=self.last_line,
            started=self.started,
            duration_s=duration,
            configuration=config,
            counts=counts,
            failures=failures,
            failure_summary=self.summary,
            recommendations=recommendations,
            verdict=verdict,
            cannot_know=unknowns,
            ending=self._ending(next_start, pool),
            first_tokens=first_tokens(st, self.memory),
        )

    def _ending(self, next_start: bool, pool: int | None) -> Ending:
        st = self.state
        in_flight = [
            InFlight(slot, s.task, s.prompt_size, s.tokens)
            for slot, s in sorted(st.run.slots.items())
            if s.processing and not st.run.exiting
        ]
        if self.started and not st.run.ready:
            how = "failed_start" if next_start or st.run.exiting else "log_ends_starting"
        elif st.run.exiting:
            how = "clean"
        elif next_start:
            how = "died_mid_request" if in_flight else "died_idle"
        else:
            how = "log_ends_mid_request" if in_flight else "log_ends_idle"
        m = st.run.memory_projection
        memory = MemoryFigures(m.kind, m.used_mib, m.available_mib) if m is not None else None
        crash = st.run.crash_cause
        cause, message = (crash.cause, crash.message) if crash is not None else (None, None)
        return Ending(how, st.run.start_error, in_flight, st.run.pool_used(), pool, memory, cause, message)

    def _configuration(self, pool: int | None, source: str, overcommit: float | None) -> Configuration:
        st = self.state
        full = self.kv_full
        k_pc = v_pc = rel = None
        if full is not None and full.cells:
            cells = full.cells * (full.streams or 1)
            k_pc, v_pc = full.k_mib * MIB / cells, full.v_mib * MIB / cells
            if full.k_mib + full.v_mib > 0:
                rel = 0.01 / (full.k_mib + full.v_mib)  # two values, each rounded to ±0.005 MiB
        kv_bytes = round(st.run.kv_k_bytes + st.run.kv_v_bytes) if (st.run.kv_k_bytes or st.run.kv_v_bytes) else None
        return Configuration(
            build=st.run.build,
            model=st.run.model,
            verbosity=st.run.verbosity,
            n_slots=st.run.slot_count,
            n_ctx_slot=st.run.n_ctx_slot,
            kv_unified=st.run.kv_unified,
            pool_cells=pool,
            pool_source=source,
            per_slot_cap=st.run.per_slot_cap.cap if st.run.per_slot_cap else None,
            overcommit=overcommit,
            type_k=st.run.type_k,
            type_v=st.run.type_v,
            kv_bytes=kv_bytes,
            kv_bytes_per_cell=(k_pc + v_pc) if k_pc is not None and v_pc is not None else None,
            k_bytes_per_cell=k_pc,
            v_bytes_per_cell=v_pc,
            kv_bytes_rel_error=rel,
            swa_kv_bytes=round(self.kv_swa_mib * MIB) if self.kv_swa_mib else None,
        )


_RUN_HANDLERS: dict[type, Callable[[Run, Any, int, str], None]] = {
    ev.SlotReleased: Run._released,
    ev.TaskStarted: Run._task_started,
    ev.NewPrompt: Run._new_prompt,
    ev.RequestError: Run._request_error,
    ev.MemorySlotFailure: Run._memory_slot_failure,
    ev.KVRetry: Run._retry,
    ev.SlotPurged: Run._purged,
    ev.DecodeFatal: Run._decode_fatal,
    ev.ServerReady: Run._ready,
    ev.KVCacheSection: Run._kv_section,
    ev.KVCacheSize: Run._kv_size,
}
