"""`llamacpp-exporter diagnose LOG`: explain KV-pool incidents from a llama-server log.

Reads a whole log once, streaming (bounded memory, any size), and tells, for each server run in it:
how it ended (cleanly, a failed start, a crash or kill with what was in flight, or the log stops),
the configuration in words (slots, per-slot window, unified pool, K/V types, bytes per KV cell), how
far the slots' promises exceed the pool, how often the server retried, cascaded and aborted, and for
each failure the tokens every aborted slot held, their share of the pool, how far the sum overflowed
it and which small requests died with the big ones. Then it says what to change, with numbers from
this log::

    $ llamacpp-exporter diagnose llama-server.log
    ...
      Failure 1 at line 354 (0:00:00.064 after start): Context size has been exceeded
        slot  task  tokens at abort  share of pool
           0    24              128         25.0 %
        ...
        sum                     513        100.2 %
        overflow: 513 - 512 = 1 token, exactly the batch of 1 token that found no room (off = 3)

Exit status: 0 no failure found, 1 at least one failure, 2 the input is not a llama-server log.

Layers: `Diagnoser` is the pure core (parsed events in, `Report` dataclasses out; lines are parsed
with `exporter.logs.parse`, and server state/counters come from `exporter.state.ServerState`
so the counts are the exporter's counters); `read_lines` and `read_blocks` are the only I/O;
`render_text`/`to_json` format the report.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import glob
import gzip
import hashlib
import heapq
import io
import json
import math
import os
import re
import stat
import sys
import textwrap
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, NoReturn, cast

from exporter.forecast import forecast
from exporter.logs import events as ev
from exporter.logs.parse import parse_line_events, parse_text_indexed, unwrap_marked
from exporter.state import ServerState

SCHEMA = "llamacpp-exporter/diagnose/v3"
PROG = "llamacpp-exporter diagnose"
MIB = 1024 * 1024
#: Lines longer than this are cut (the rest is read and dropped), as the tailer does.
MAX_LINE_BYTES = 1024 * 1024
#: If the first bytes of a file hold no llama-server line and look binary, stop reading there.
SNIFF_BYTES = 1024 * 1024
_BLOCK_BYTES = 256 * 1024  # what diagnose reads and scans at once after the first MiB
_DECODE_MESSAGES = {
    "context_exceeded": "Context size has been exceeded",
    "invalid_batch": "Invalid input batch",
    "compute_error": "Compute error",
}
# Bytes per element of the GGML cache types llama-server accepts for -ctk/-ctv.
_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
# `--kv-unified-per-slot` landed after b9928 (PR #24124; the exact build is not verified).
_PER_SLOT_FLAG_AFTER = 9928

# Parsed locally because the events do not carry them (exporter.logs.events.DecodeFatal has only the
# reason): the offset and n_batch of the fatal decode line, and the elapsed-time stamp of a line.
_FATAL_POS = re.compile(r"\b(?:off|i) = (\d+), n_batch = (\d+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STAMP = re.compile(r"^(?:\[\s*\d+\] )?(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")
_JSONL_TIME = re.compile(r'^\{.*?"time":\s*(\d+)')
_ROUTER = re.compile(r"^\[\s*(\d+)\] ")
# An abort has one release per slot; a bound keeps memory fixed even for a malformed log.
_MAX_ABORT_LINES = 4096
_STAMP_FIRST = frozenset("0123456789{[\x1b")  # first characters of a line that may carry a time stamp
# Lines that feed_lines unwraps before its scan: JSONL, colours, CR.
_ODD_LINES = re.compile(r"\n\{|[\x1b\r]")
# A run of whole lines that are none of those and have no router prefix ("[ port] ").
_PLAIN_RUN = re.compile(r"^(?:[^\n\[{\x1b\r][^\n\x1b\r]*\n|\n)+", re.M)

# Sets of event types, tested with `type(e) in …`: events are final classes, and a set lookup is
# cheaper than isinstance() on a tuple, for every event of a log that may hold millions.
_PROGRESS = frozenset(
    {
        ev.GenerationProgress,
        ev.PromptProgress,
        ev.CachedTokens,
        ev.SlotReleased,
        ev.TaskStarted,
        ev.NewPrompt,
        ev.AllSlotsIdle,
    }
)
# Events after which the forecast of the requests in flight may grow, or shrink.
_DEMAND_GROWS = frozenset({ev.NewPrompt, ev.PromptProgress, ev.TaskStarted})
_DEMAND_SHRINKS = frozenset({ev.SlotReleased, ev.DecodeFailed, ev.AllSlotsIdle})
_BANNER = frozenset({ev.ServerStarting, ev.BuildInfo, ev.Verbosity})
# What does not end an abort's trail of lines (the aborted requests' errors and releases).
_ABORT_TRAIL = frozenset({ev.RequestError, ev.SlotReleased, ev.SlotCleared})


# ---------------------------------------------------------------------------------------------- report


@dataclass
class SlotAtAbort:
    """One aborted slot: what its `stop processing: n_tokens = N` release line said."""

    slot: int
    task: int
    tokens: int
    share_of_pool: float | None  # tokens / pool cells (0-1)


@dataclass
class Failure:
    """One fatal decode (`Context size has been exceeded` and relatives) and the requests it took down."""

    number: int  # 1 = the run's first failure
    line: int
    elapsed_s: float | None  # since the server started (the log's own timestamp), if the line has one
    reason: str
    # The retry cascade that ended here.
    retries: int
    memory_slot_failures: int
    idle_slots_purged: int
    smallest_batch: int | None  # n_batch the halving reached (1 = the pool was full)
    failed_offset: int | None
    failed_batch: int | None  # tokens of the batch (from `off`) that found no room
    # The abort.
    aborted_requests: int
    slots: list[SlotAtAbort]
    tokens_sum: int
    share_sum: float | None
    pool_cells: int | None
    overflow: int | None  # tokens_sum - pool_cells (unified pool only)
    overflow_is_failed_batch: bool | None
    heaviest_slot: int | None
    equal_share: int | None  # pool cells / slots: what a private pool per slot would hold
    victims: list[int]  # aborted slots that held no more than an equal share
    # When the overflow became certain from the prompts in flight (their prompt demand passed the pool,
    # as the exporter's LlamaCppKVPoolOverflowAhead sees it), and from which lines their sizes came.
    predictable_line: int | None = None
    predictable_elapsed_s: float | None = None
    predictable_lead_s: float | None = None  # seconds from that line to the failure line
    predictable_demand: int | None = None  # the prompt demand at that line (cells)
    predictable_from: list[str] = field(default_factory=list)  # new_prompt | progress (how the sizes were known)


@dataclass
class InFlight:
    """A request a run was processing when its log ended."""

    slot: int
    task: int
    prompt_tokens: int | None  # the prompt's size, where the log gave it
    tokens: int  # KV cells the slot held


#: How a run ended, from its last lines (see `Ending`).
ENDINGS = {
    "clean": "shut down cleanly (its exit line)",
    "failed_start": "failed to start (never listening)",
    "died_mid_request": "crashed or was killed mid-request (no exit line; the next start follows)",
    "died_idle": "crashed or was killed while idle (no exit line; the next start follows)",
    "log_ends_mid_request": "the log ends mid-request (killed, crashed, or still running)",
    "log_ends_idle": "the log ends while idle (still running, or stopped without its exit line)",
    "log_ends_starting": "the log ends during start-up (still loading, or stopped before listening)",
}


@dataclass
class Ending:
    """How a run ended. A run whose next start follows without an exit line died; one at the end of
    the log may still be running."""

    how: str  # a key of ENDINGS
    reason: str | None  # why a start failed, where the log says
    in_flight: list[InFlight]
    pool_used_tokens: int
    pool_capacity_tokens: int | None


@dataclass
class FailureSummary:
    """All failures of a run, including those not kept in detail."""

    total: int = 0
    shown: int = 0
    aborted_requests: int = 0
    victims: int = 0  # aborted requests that held no more than an equal share
    overflow_is_failed_batch: int = 0  # failures where the overflow was exactly the failed batch
    max_tokens_at_abort: int = 0


@dataclass
class Configuration:
    """The server's configuration as far as the log tells."""

    build: int | None
    model: str | None
    verbosity: int | None
    n_slots: int | None
    n_ctx_slot: int | None  # every slot's window (what each slot is promised)
    kv_unified: bool | None
    pool_cells: int | None  # KV cells in all (sum of streams)
    pool_source: str  # log_kv_cache | log_context | log_slots | unknown (as the exporter's metric)
    per_slot_cap: int | None  # --kv-unified-per-slot, when the capping line was logged
    overcommit: float | None  # slots x window / pool: 1 = every promise can be kept
    type_k: str | None
    type_v: str | None
    kv_bytes: int | None  # whole KV cache (all sub-caches) from the size line(s)
    kv_bytes_per_cell: float | None  # K+V bytes per cell of the full-attention cache, measured
    k_bytes_per_cell: float | None
    v_bytes_per_cell: float | None
    kv_bytes_rel_error: float | None  # the size line prints MiB with 2 decimals: relative uncertainty
    swa_kv_bytes: int | None  # sliding-window sub-cache (does not scale with the window)


@dataclass
class Counts:
    """Line counts for the run (each equals the number of such lines in the log)."""

    requests_started: int  # `processing task`
    requests_finished: int  # `stop processing` (aborted ones included)
    retries: int  # `retrying with smaller batch size`
    memory_slot_failures: int  # `failed to find a memory slot for batch of size N`
    idle_slots_purged: int  # `purging slot S with N tokens`
    cascades_recovered: int
    cascades_failed: int
    cascade_unfinished: bool  # the log ends inside a cascade
    aborts: int  # `Context size has been exceeded.` decode lines
    decode_failures: dict[str, int]  # every fatal decode line, by reason
    aborted_requests: int  # `send_error` after a fatal decode (each an HTTP 500 at a client)
    request_errors: dict[str, int]  # every `send_error` line, by reason
    largest_request_tokens: int  # the most tokens a slot held (release lines, new prompts)
    requests_over_equal_share: int | None  # releases above pool / slots


@dataclass
class MemoryCost:
    """KV memory of a configuration at given cache types (from the measured bytes per cell)."""

    type_k: str
    type_v: str
    flags: str  # what to add to llama-server's command line for these types ('' = as now)
    kv_bytes: int
    delta_bytes: int  # versus the KV cache of this run


@dataclass
class Recommendation:
    """A change to llama-server's command line and what it costs."""

    kind: str  # kv_unified_per_slot | no_kv_unified
    flags: str
    pool_cells: int
    window_per_slot: int
    memory: list[MemoryCost]
    requests_over_window: int | None  # requests in this log that would not fit the window
    supported_by_log: bool
    summary: str


@dataclass
class RunReport:
    """One server run (one process) in the log."""

    index: int
    source: str | None  # router child `[port]`, when the log came through `llama-server` router mode
    file: str  # the input it was read from (its line numbers are that file's)
    first_line: int
    last_line: int
    started: bool  # the run's start-up banner is in the log
    duration_s: float | None
    configuration: Configuration
    counts: Counts
    failures: list[Failure]
    failure_summary: FailureSummary
    recommendations: list[Recommendation]
    verdict: str | None
    cannot_know: list[str]
    ending: Ending


@dataclass
class FileSummary:
    """One input's runs, for the timeline of a history of files."""

    file: str
    modified: float | None = None  # its modification time (epoch seconds): about when its last run ended
    runs: int = 0
    failures: int = 0
    aborted_requests: int = 0
    endings: dict[str, int] = field(default_factory=dict)


@dataclass
class LargeRequest:
    """One of the largest requests of the whole history."""

    tokens: int
    run: int
    file: str


@dataclass
class OmittedRuns:
    """Runs not kept in detail (all but the last --max-runs)."""

    runs: int = 0
    failures: int = 0
    aborted_requests: int = 0
    retries: int = 0


@dataclass
class Report:
    """Everything `diagnose` found in one log."""

    schema: str
    file: str
    files: list[str]  # every input read, in the order read
    files_order: str | None  # how several inputs were ordered
    skipped: list[str]  # inputs not read, each with why (a copy of one read before, not a log)
    lines: int
    long_lines: int
    runs_total: int
    failures_total: int
    aborted_requests_total: int
    runs: list[RunReport]
    omitted_runs: OmittedRuns
    endings: dict[str, int]  # every run (shown or not) by how it ended (keys of ENDINGS)
    failed_starts_in_a_row: int  # the longest streak of consecutive failed starts
    by_file: list[FileSummary]  # per input, in the order read
    largest_requests: list[LargeRequest]  # the 3 largest of the whole history, largest first

    @property
    def exit_status(self) -> int:
        """0 when no failure was found, 1 when one was."""
        return 1 if self.failures_total else 0


# ------------------------------------------------------------------------------------- analysis core


def elapsed_seconds(line: str) -> float | None:
    """Seconds since the server started, from a line's `m.ss.mmm.uuu` stamp or JSONL `time` (µs).

    >>> elapsed_seconds("62.05.123.500 I srv  update_slots: all slots are idle")
    3725.1235
    """
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    m = _STAMP.match(line)
    if m is not None:
        return int(m[1]) * 60 + int(m[2]) + int(m[3]) / 1e3 + int(m[4]) / 1e6
    j = _JSONL_TIME.match(line)
    if j is not None:
        return int(j[1]) / 1e6
    return None


def router_source(line: str) -> str | None:
    """The router prefix `[ port] ` of a line forwarded by llama-server's router mode, if any."""
    if line.startswith("["):
        m = _ROUTER.match(line)
        if m is not None:
            return m[1]
    return None


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


@dataclass
class _Predictable:
    """The line at which the prompts in flight first needed more than the pool (since they last fitted)."""

    line: int
    elapsed_s: float | None
    demand: int
    sources: list[str]


class _Run:
    """Accumulates one server run. Memory is bounded: counters, the slots, and at most N failures."""

    def __init__(self, index: int, source: str | None, first_line: int, max_failures: int, file: str = "") -> None:
        self.index = index
        self.source = source
        self.file = file
        self.first_line = first_line
        self.last_line = first_line
        self.state = ServerState()
        self.started = False
        self.in_startup = False
        self.banner_seen: set[type] = set()
        self.events = 0
        self.first_elapsed: float | None = None
        self.last_stamped_line = ""
        self.tasks_started = 0
        self.releases = 0
        self.largest_request = 0
        self.over_share = 0
        self.over_share_known = False
        self.kv_swa_section = False
        self.kv_full: ev.KVCacheSize | None = None
        self.kv_swa_mib = 0.0
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
            predictable=self.predictable,
        )
        self.cascade = None
        self.predictable = None

    def _ready(self, e: ev.ServerReady, lineno: int, line: str) -> None:
        self.in_startup = False

    def _kv_section(self, e: ev.KVCacheSection, lineno: int, line: str) -> None:
        self.kv_swa_section = e.swa

    def _kv_size(self, e: ev.KVCacheSize, lineno: int, line: str) -> None:
        if self.kv_swa_section:
            self.kv_swa_mib += e.k_mib + e.v_mib
        elif e.cells is not None:
            self.kv_full = e

    def _note_demand(self, lineno: int, line: str) -> None:
        """Remember the first line at which the prompts in flight needed more than the pool; forget it when they fit."""
        f = forecast(self.state)
        ratio = f.ratio("prompt")
        if ratio is None or ratio <= 1:
            self.predictable = None
        elif self.predictable is None:
            sources = [name for name, n in f.sources().items() if n and name != "held"]
            self.predictable = _Predictable(lineno, elapsed_seconds(line), f.prompt_demand, sources)

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
        n = self.state.slot_count
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
        unified = self.state.kv_unified
        n_slots = self.state.slot_count
        total = sum(r.n_tokens for r in aborted)
        slots = [
            SlotAtAbort(r.slot, r.task, r.n_tokens, r.n_tokens / pool if pool else None)
            for r in sorted(aborted, key=lambda r: r.slot)
        ]
        failed_batch = a.cascade.failed_batch(a.offset)
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
            cascade_unfinished=st.in_cascade,
            aborts=st.decode_failures["context_exceeded"],
            decode_failures=dict(sorted(st.decode_failures.items())),
            aborted_requests=sum(st.requests_aborted[r] for r in ev.FATAL_REASONS),
            request_errors=dict(sorted(st.requests_aborted.items())),
            largest_request_tokens=self.largest_request,
            requests_over_equal_share=self.over_share if self.over_share_known else None,
        )
        recommendations, verdict, unknowns = _advise(config, counts)
        duration = None
        if self.first_elapsed is not None and self.last_stamped_line:
            end = elapsed_seconds(self.last_stamped_line)
            if end is not None and end >= self.first_elapsed:
                duration = round(end - self.first_elapsed, 6)
        return RunReport(
            index=self.index,
            source=self.source,
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
        )

    def _ending(self, next_start: bool, pool: int | None) -> Ending:
        st = self.state
        in_flight = [
            InFlight(slot, s.task, s.prompt_size, s.tokens)
            for slot, s in sorted(st.slots.items())
            if s.processing and not st.exiting
        ]
        if self.started and not st.ready:
            how = "failed_start" if next_start or st.exiting else "log_ends_starting"
        elif st.exiting:
            how = "clean"
        elif next_start:
            how = "died_mid_request" if in_flight else "died_idle"
        else:
            how = "log_ends_mid_request" if in_flight else "log_ends_idle"
        return Ending(how, st.start_error, in_flight, st.pool_used(), pool)

    def _configuration(self, pool: int | None, source: str, overcommit: float | None) -> Configuration:
        st = self.state
        full = self.kv_full
        k_pc = v_pc = rel = None
        if full is not None and full.cells:
            cells = full.cells * (full.streams or 1)
            k_pc, v_pc = full.k_mib * MIB / cells, full.v_mib * MIB / cells
            if full.k_mib + full.v_mib > 0:
                rel = 0.01 / (full.k_mib + full.v_mib)  # two values, each rounded to ±0.005 MiB
        kv_bytes = round(st.kv_k_bytes + st.kv_v_bytes) if (st.kv_k_bytes or st.kv_v_bytes) else None
        return Configuration(
            build=st.build,
            model=st.model,
            verbosity=st.verbosity,
            n_slots=st.slot_count,
            n_ctx_slot=st.n_ctx_slot,
            kv_unified=st.kv_unified,
            pool_cells=pool,
            pool_source=source,
            per_slot_cap=st.per_slot_cap.cap if st.per_slot_cap else None,
            overcommit=overcommit,
            type_k=st.type_k,
            type_v=st.type_v,
            kv_bytes=kv_bytes,
            kv_bytes_per_cell=(k_pc + v_pc) if k_pc is not None and v_pc is not None else None,
            k_bytes_per_cell=k_pc,
            v_bytes_per_cell=v_pc,
            kv_bytes_rel_error=rel,
            swa_kv_bytes=round(self.kv_swa_mib * MIB) if self.kv_swa_mib else None,
        )


_RUN_HANDLERS: dict[type, Callable[[_Run, Any, int, str], None]] = {
    ev.SlotReleased: _Run._released,
    ev.TaskStarted: _Run._task_started,
    ev.NewPrompt: _Run._new_prompt,
    ev.RequestError: _Run._request_error,
    ev.MemorySlotFailure: _Run._memory_slot_failure,
    ev.KVRetry: _Run._retry,
    ev.SlotPurged: _Run._purged,
    ev.DecodeFatal: _Run._decode_fatal,
    ev.ServerReady: _Run._ready,
    ev.KVCacheSection: _Run._kv_section,
    ev.KVCacheSize: _Run._kv_size,
}


def _convert(bytes_per_cell: float, from_type: str | None, to_type: str) -> float | None:
    """Bytes per cell of a K or V cache in another type (same elements per cell)."""
    if from_type is None or from_type not in _TYPE_BYTES:
        return None
    return bytes_per_cell / _TYPE_BYTES[from_type] * _TYPE_BYTES[to_type]


def _memory_costs(c: Configuration, pool_cells: int) -> list[MemoryCost]:
    """KV memory of a pool of `pool_cells` at the current types and at q8_0, from the measured bytes per cell."""
    if c.k_bytes_per_cell is None or c.v_bytes_per_cell is None or c.type_k is None or c.type_v is None:
        return []
    current = c.kv_bytes or 0
    costs = [
        MemoryCost(
            c.type_k,
            c.type_v,
            "",
            round((c.k_bytes_per_cell + c.v_bytes_per_cell) * pool_cells + (c.swa_kv_bytes or 0)),
            0,
        )
    ]
    k8, v8 = _convert(c.k_bytes_per_cell, c.type_k, "q8_0"), _convert(c.v_bytes_per_cell, c.type_v, "q8_0")
    if (c.type_k, c.type_v) != ("q8_0", "q8_0") and k8 is not None and v8 is not None:
        swa = c.swa_kv_bytes or 0
        if swa:
            swa_rate = (_TYPE_BYTES["q8_0"] * 2) / (_TYPE_BYTES[c.type_k] + _TYPE_BYTES[c.type_v])
            swa = round(swa * swa_rate)
        costs.append(MemoryCost("q8_0", "q8_0", "-ctk q8_0 -ctv q8_0", round((k8 + v8) * pool_cells + swa), 0))
    for m in costs:
        delta = m.kv_bytes - current
        m.delta_bytes = 0 if abs(delta) < 1024 else delta  # the same size, up to the size line's rounding
    return costs


def _advise(c: Configuration, n: Counts) -> tuple[list[Recommendation], str | None, list[str]]:
    """Recommendations with numbers from this run, which one the log supports, and what it cannot know."""
    if not (c.n_slots and c.n_ctx_slot and c.pool_cells and c.overcommit is not None):
        return [], None, []
    if c.kv_unified is not True or c.overcommit <= 1.0:
        return [], None, []
    n_slots, window, pool = c.n_slots, c.n_ctx_slot, c.pool_cells
    guaranteed_pool = n_slots * window
    share = pool // n_slots
    largest = n.largest_request_tokens
    needs_newer = c.build is not None and c.build <= _PER_SLOT_FLAG_AFTER
    per_slot = Recommendation(
        kind="kv_unified_per_slot",
        flags=f"--kv-unified-per-slot {window}",
        pool_cells=guaranteed_pool,
        window_per_slot=window,
        memory=_memory_costs(c, guaranteed_pool),
        requests_over_window=0,
        supported_by_log=False,
        summary=(
            f"keep -np {n_slots} -kvu, add --kv-unified-per-slot {window} and drop -c (or set -c {guaranteed_pool}): "
            f"the pool grows to {n_slots} x {window:,} = {guaranteed_pool:,} cells, so every slot keeps its "
            f"{window:,}-token window and no request can abort another"
            + (f" (needs a llama-server newer than b{_PER_SLOT_FLAG_AFTER}; this is b{c.build})" if needs_newer else "")
        ),
    )
    private = Recommendation(
        kind="no_kv_unified",
        flags=f"-np {n_slots} -c {pool} --no-kv-unified",
        pool_cells=pool,
        window_per_slot=share,
        memory=_memory_costs(c, pool)[:1],
        requests_over_window=n.requests_over_equal_share,
        supported_by_log=False,
        summary=(
            f"drop -kvu (run -np {n_slots} -c {pool} --no-kv-unified): the same {pool:,} cells split into "
            f"{n_slots} private pools of {share:,} cells; no extra memory, but each slot's window shrinks from "
            f"{window:,} to {share:,} tokens: a longer request is cut or refused (HTTP 400) instead of aborting "
            "the others" + (" (llama.cpp may round the per-slot size to a multiple of 256)" if share % 256 else "")
        ),
    )
    over = n.requests_over_equal_share
    failed = n.aborted_requests or n.aborts or n.retries or n.memory_slot_failures or n.cascades_failed
    if not failed:
        # Nothing failed: a change is worth its cost only if this log's own requests could not run together.
        if not largest or largest * n_slots <= pool:
            return [], None, []
        cheaper_first = [private, per_slot]
        (private if largest <= share else per_slot).supported_by_log = True
        verdict = (
            f"No request failed in this log, but the pool is a risk: requests here held up to {largest:,} tokens, "
            f"and {n_slots} of them at once need {largest * n_slots:,} cells of the {pool:,} the slots share; "
            "then llama-server aborts every request in flight. Each fix has a cost: the first shrinks the "
            "windows, the second takes more KV memory."
        )
        return cheaper_first, verdict, [*_UNKNOWNS] if c.kv_bytes_per_cell is not None else [_HIDDEN_SIZE, *_UNKNOWNS]
    if not largest:
        verdict = (
            "No request finished in this log, so it cannot tell which windows the clients need: "
            f"--kv-unified-per-slot {window} keeps today's windows."
        )
    elif largest <= share:
        private.supported_by_log = True
        verdict = (
            f"The log supports dropping -kvu: its largest request held {largest:,} tokens, within the {share:,} "
            f"cells each slot would get, so the fix costs no memory. --kv-unified-per-slot {window} also works "
            "but buys windows no request in this log used."
        )
    else:
        per_slot.supported_by_log = True
        over_text = f"{over:,} of {n.requests_finished:,} requests" if over is not None else "some requests"
        verdict = (
            f"The log supports --kv-unified-per-slot {window}: requests here held up to {largest:,} tokens, and "
            f"{over_text} held more than the {share:,} tokens a private slot would get without -kvu."
        )
    unknowns = [*_UNKNOWNS] if c.kv_bytes_per_cell is not None else [_HIDDEN_SIZE, *_UNKNOWNS]
    return [per_slot, private], verdict, unknowns


_UNKNOWNS = [
    "free GPU and host memory: the log does not show whether the larger KV cache fits "
    "(check llamacpp_gpu_memory_free_bytes or nvidia-smi before restarting)",
    "compute buffers and other per-context memory also grow with the pool; the figures above are the KV "
    "cache alone (from the size line), so measure after the change",
    "future requests: the windows above are sized from this log's requests",
]
_HIDDEN_SIZE = "KV memory: the `llama_kv_cache: size` line is hidden at this verbosity (run with -lv 4)"


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
        self._endings: dict[str, int] = {}
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
            for line in _lines_of(text[start:end]):
                if line[:1] in _STAMP_FIRST:
                    run.note_stamp(line)
                    if run.first_elapsed is not None:
                        break
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
            for line in lines[start:end]:
                if line[:1] in _STAMP_FIRST:
                    run.note_stamp(line)
                    if run.first_elapsed is not None:
                        break
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
        self._endings[how] = self._endings.get(how, 0) + 1
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
            endings={how: self._endings[how] for how in ENDINGS if how in self._endings},
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


# ------------------------------------------------------------------------------------------------- I/O


class InputError(Exception):
    """The input cannot be diagnosed (missing, unreadable, empty, binary, not a llama-server log)."""


@dataclass
class ReadStats:
    bytes: int = 0
    lines: int = 0
    long_lines: int = 0
    nul_bytes: int = 0  # in the first SNIFF_BYTES
    replaced: int = 0  # undecodable bytes in the first SNIFF_BYTES


_NOT_LOGS = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def _open(path: str) -> IO[bytes]:
    if path == "-":
        if sys.stdin is None:  # started with standard input closed (`<&-`)
            raise InputError("-: standard input is closed")
        return sys.stdin.buffer
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path}: is a directory, not a log file")
    with contextlib.suppress(OSError):  # a file that cannot be stat'ed fails to open below, with the reason
        mode = p.stat().st_mode
        # /dev/zero and /dev/urandom never end; a pipe is a stream like standard input and is read.
        kind = next((k for test, k in _NOT_LOGS if test(mode)), None)
        if kind is not None:
            raise InputError(f"{path}: is a {kind}, not a log file (give a file, or - for standard input)")
    try:
        f: IO[bytes] = p.open("rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    if isinstance(f, io.BufferedReader) and f.peek(2)[:2] == b"\x1f\x8b":
        return cast(IO[bytes], gzip.GzipFile(fileobj=f, mode="rb"))  # rotated logs are often gzipped
    return f


def read_lines(f: IO[bytes], stats: ReadStats, max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Lines of a binary stream as text, each at most `max_line` bytes (the rest of a longer one is dropped).

    Bytes that are not UTF-8 become U+FFFD. Memory is bounded by `max_line`, whatever the file size.
    """
    readline = f.readline
    raw = _first_text(f, stats, max_line)
    while raw:
        n = len(raw)
        if n == max_line and not raw.endswith(b"\n"):
            stats.long_lines += 1
            while True:  # drop the rest of the over-long line
                more = readline(max_line)
                n += len(more)
                if not more or more.endswith(b"\n"):
                    break
        if stats.bytes < SNIFF_BYTES:
            stats.nul_bytes += raw.count(b"\x00")
        stats.bytes += n
        stats.lines += 1
        text = raw.decode("utf-8", "replace")
        if stats.bytes <= SNIFF_BYTES + n and "\ufffd" in text:
            stats.replaced += text.count("\ufffd")
        yield text
        raw = readline(max_line)


def _lines_of(text: str) -> list[str]:
    """`text` split after each "\\n" only (str.splitlines also splits at \\r, \\x1c, U+2028 ...)."""
    parts = text.split("\n")
    last = parts.pop()
    lines = [part + "\n" for part in parts]
    if last:
        lines.append(last)
    return lines


def read_blocks(f: IO[bytes], stats: ReadStats, max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The rest of a binary stream as blocks of whole lines of text: `read_lines` without the split.

    Each block ends in "\\n", but a line cut at `max_line` bytes (the rest of it is dropped) and the
    stream's last line, which each come as a block of their own. Counts lines and bytes in `stats`
    as `read_lines` does. Memory is bounded by a block (at most `max_line`, at most 256 KiB).
    """
    size = max(1, min(max_line, _BLOCK_BYTES))
    pending = b""  # the start of a line that goes on in the next block (shorter than max_line)
    dropping = False  # in the rest of a cut line, up to its newline
    while chunk := f.read(size):
        stats.bytes += len(chunk)
        start = 0
        if dropping:
            nl = chunk.find(b"\n")
            if nl < 0:
                continue
            dropping, start = False, nl + 1
        elif pending:
            nl = chunk.find(b"\n")
            head = pending + chunk[: nl + 1 if nl >= 0 else len(chunk)]
            if len(head) >= max_line and not head[:max_line].endswith(b"\n"):
                stats.lines += 1
                stats.long_lines += 1
                yield head[:max_line].decode("utf-8", "replace")
                pending, dropping = b"", nl < 0
                if nl < 0:
                    continue
                start = nl + 1
            elif nl < 0:
                pending = head
                continue
            else:
                pending, start = b"", nl + 1
                stats.lines += 1
                yield head.decode("utf-8", "replace")
        end = chunk.rfind(b"\n", start) + 1
        if end > start:
            text = chunk[start:end].decode("utf-8", "replace")
            stats.lines += text.count("\n")
            yield text
        else:
            end = start
        pending = chunk[end:]
        if len(pending) >= max_line:  # a whole block with no newline: a line to cut
            stats.lines += 1
            stats.long_lines += 1
            yield pending[:max_line].decode("utf-8", "replace")
            pending, dropping = b"", True
    if pending:
        stats.lines += 1
        yield pending.decode("utf-8", "replace")


def _first_text(f: IO[bytes], stats: ReadStats, max_line: int) -> bytes:
    """What `readline(max_line)` would give after the NUL bytes at the start of the stream (counted in
    `stats.bytes`): the hole a copytruncate leaves (see logs/tail.py) is skipped, not called binary."""
    while raw := f.readline(max_line):
        text = raw.lstrip(b"\0")
        stats.bytes += len(raw) - len(text)
        if text:
            if len(raw) == max_line and not text.endswith(b"\n"):
                text += f.readline(max_line - len(text))
            return text
    return b""


def _looks_binary(stats: ReadStats) -> bool:
    sniffed = min(stats.bytes, SNIFF_BYTES) or 1
    return stats.nul_bytes > 0 or stats.replaced / sniffed > 0.05


def diagnose_file(path: str, *, max_runs: int = 10, max_failures: int = 10) -> Report:
    """Stream `path` (or `-` for standard input) through a `Diagnoser`; raise `InputError` for bad input."""
    return diagnose_files([path], max_runs=max_runs, max_failures=max_failures)


def input_files(args: Sequence[str]) -> tuple[list[str], str | None]:
    """The files to read for `diagnose LOG...`, and how they were ordered (None for one input).

    An argument that names no file is taken as a glob pattern (`'llama-server.log*'`). Several files
    are read oldest first by modification time: llama-server's own time stamps count from its start,
    so a file's time is what orders its runs. `-` (standard input) must be the only input.
    """
    paths: list[str] = []
    for arg in args:
        if arg == "-" or os.path.lexists(arg) or not glob.has_magic(arg):
            paths.append(arg)
            continue
        matches = sorted(glob.glob(arg))  # noqa: PTH207 (Path.glob takes no absolute pattern)
        if not matches:
            raise InputError(f"{arg}: no such file (and no file matches it as a pattern)")
        paths.extend(matches)
    unique = list(dict.fromkeys(paths))
    if "-" in unique and len(unique) > 1:
        raise InputError("-: standard input cannot be read together with files (give one or the other)")
    if len(unique) == 1:
        return unique, None

    def mtime(path: str) -> float:
        try:
            return Path(path).stat().st_mtime
        except OSError:
            return math.inf  # opening it fails with the reason, in its place at the end

    return sorted(unique, key=mtime), "by modification time, oldest first"


def diagnose_files(paths: Sequence[str], *, max_runs: int = 10, max_failures: int = 10) -> Report:
    """`diagnose_file` over several files in the order given, one report; runs restart at each file.

    A file whose content equals an earlier one's (a `.prev-*` copy of a rotated file) is read once.
    With one file, bad input raises `InputError`; with several, a file that is not a log is skipped
    and said in the report, unless none is one.
    """
    d = Diagnoser(paths[0], max_runs=max_runs, max_failures=max_failures)
    seen: dict[str, str] = {}  # content digest -> the file read with it
    long_lines = 0
    first_error: InputError | None = None
    read_any = False
    for path in paths:
        try:
            if len(paths) > 1:
                key = _content_digest(path)
                if key in seen:
                    d.skipped.append(f"{path}: the same content as {seen[key]}, read once")
                    continue
                seen[key] = path
            if read_any:
                d.next_file(path)
            else:
                d.files[-1] = path
            stats = ReadStats()
            _feed_file(d, path, stats)
        except InputError as exc:
            if len(paths) == 1:
                raise
            first_error = first_error or exc
            d.skipped.append(str(exc))
            if read_any and d.files[-1] == path:
                d.files.pop()
            d.lines = 0  # none of its lines count
            continue
        read_any = True
        long_lines += stats.long_lines
    if not read_any:
        raise first_error or InputError("no input")
    d.long_lines = long_lines
    report = d.finish()
    for fs in report.by_file:
        if fs.file != "-":
            with contextlib.suppress(OSError):
                fs.modified = Path(fs.file).stat().st_mtime
    return report


def _content_digest(path: str) -> str:
    """SHA-256 of a file's content (decompressed); raises `InputError` when it cannot be read."""
    digest = hashlib.sha256()
    f = _open(path)
    try:
        while chunk := f.read(_BLOCK_BYTES):
            digest.update(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: read error: {exc}") from None
    finally:
        f.close()
    return digest.hexdigest()


def _feed_file(d: Diagnoser, path: str, stats: ReadStats) -> None:
    """Read one input into `d`; raise `InputError` when it is not a llama-server log."""
    before = d.specific_events
    f = _open(path)
    try:
        # Line by line while the first MiB decides whether this is a log at all, then in blocks.
        for line in read_lines(f, stats):
            d.feed_line(line, stats.lines)
            if stats.bytes >= SNIFF_BYTES:
                break
        if stats.bytes >= SNIFF_BYTES and (d.specific_events > before or not _looks_binary(stats)):
            for text in read_blocks(f, stats):
                first = stats.lines - text.count("\n", 0, len(text) - 1)
                d.feed_text(text, first)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(f"{path}: read error after {stats.lines:,} lines: {exc}") from None
    finally:
        if f is not sys.stdin.buffer:
            f.close()
    if stats.bytes == 0:
        raise InputError(f"{path}: empty file, nothing to diagnose")
    if stats.lines == 0:
        raise InputError(f"{path}: only NUL bytes, no text")
    if d.specific_events == before:
        if _looks_binary(stats):
            raise InputError(f"{path}: binary data, not a text log (expected llama-server's --log-file)")
        raise InputError(
            f"{path}: no llama-server log lines in {stats.lines:,} lines "
            "(expected llama-server's --log-file output, plain, prefixed, coloured or --log-jsonl)"
        )


# ------------------------------------------------------------------------------------------- rendering


def to_json(report: Report) -> str:
    """The report as JSON (stable keys; see `SCHEMA`)."""
    data: dict[str, Any] = dataclasses.asdict(report)
    data["exit_status"] = report.exit_status
    return json.dumps(data, indent=2)


def _n(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _pct(ratio: float | None) -> str:
    return "?" if ratio is None else f"{ratio * 100:.1f} %"


def _bytes(b: float | None) -> str:
    if b is None:
        return "?"
    a = abs(b)
    if a >= 1024**3:
        return f"{b / 1024**3:,.2f} GiB"
    if a >= MIB:
        return f"{b / MIB:,.1f} MiB"
    if a >= 1024:
        return f"{b / 1024:,.1f} KiB"
    return f"{b:,.0f} bytes"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    ms = round(seconds * 1000)
    d, ms = divmod(ms, 86_400_000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return (f"{d}d " if d else "") + f"{h}:{m:02d}:{s:02d}.{ms:03d}"


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (plural or word + 's')}"


def _slots_list(slots: Sequence[int]) -> str:
    if not slots:
        return "none"
    return ("slot " if len(slots) == 1 else "slots ") + ", ".join(str(s) for s in slots)


def _config_lines(c: Configuration) -> list[str]:
    out: list[str] = []
    if c.n_slots is not None:
        window = f", each promised {_n(c.n_ctx_slot)} tokens (n_ctx_slot)" if c.n_ctx_slot else ""
        cap = f", capped by --kv-unified-per-slot {c.per_slot_cap:,}" if c.per_slot_cap else ""
        out.append(f"slots        {c.n_slots}{window}{cap}")
    source = {
        "log_kv_cache": "the llama_kv_cache size line",
        "log_context": "the llama_context n_ctx line",
        "log_slots": "the slot lines; -lv 4 shows the pool itself",
        "unknown": "no line",
    }.get(c.pool_source, c.pool_source)
    if c.pool_cells is not None:
        if c.kv_unified is True:
            layout = "one unified pool (-kvu) shared by all slots"
        elif c.kv_unified is False and c.n_slots == 1:
            layout = "one slot, one pool"
        elif c.kv_unified is False:
            layout = f"{c.n_slots or '?'} private pools, one per slot (no -kvu)"
        else:
            layout = "layout unknown"
        out.append(f"KV pool      {c.pool_cells:,} cells, {layout} [from {source}]")
    else:
        out.append("KV pool      unknown (no start-up lines for this run in the log)")
    if c.overcommit is not None and c.n_slots and c.n_ctx_slot and c.pool_cells:
        promised = c.n_slots * c.n_ctx_slot
        if c.overcommit > 1.0:
            what = f"{c.n_slots} slots x {c.n_ctx_slot:,} = {promised:,} tokens promised"
            what += f" to a pool of {c.pool_cells:,} cells"
        else:
            what = "every slot's window fits at once"
        out.append(f"overcommit   {c.overcommit:.1f} ({what})")
    if c.type_k is not None:
        per_cell = ""
        if c.kv_bytes_per_cell is not None:
            rel = c.kv_bytes_rel_error or 0.0
            err = f", +/-{rel * 100:.1f} % from rounding" if rel > 0.001 else ""
            per_cell = f", {c.kv_bytes_per_cell:,.0f} bytes per cell (measured from the size line{err})"
        swa = f", of which {_bytes(c.swa_kv_bytes)} sliding-window cache" if c.swa_kv_bytes else ""
        out.append(f"KV cache     K {c.type_k}, V {c.type_v}: {_bytes(c.kv_bytes)}{swa}{per_cell}")
    return out


def _count_lines(n: Counts) -> list[str]:
    total = n.cascades_recovered + n.cascades_failed
    cascades = f"{total:,} ({n.cascades_recovered:,} recovered, {n.cascades_failed:,} failed)"
    if n.cascade_unfinished:
        cascades += ", one still running at the end of the log"
    out = [
        f"requests          {n.requests_started:,} started, {n.requests_finished:,} finished or aborted",
        f"retries           {n.retries:,} (`retrying with smaller batch size`)",
        f"memory warnings   {n.memory_slot_failures:,} (`failed to find a memory slot for batch`)",
        f"idle slots purged {n.idle_slots_purged:,}",
        f"cascades          {cascades}",
        f"aborts            {n.aborts:,} (`Context size has been exceeded`)",
        f"aborted requests  {n.aborted_requests:,} (`send_error`, each an HTTP 500 at a client)",
    ]
    other_fatal = {k: v for k, v in n.decode_failures.items() if k != "context_exceeded"}
    if other_fatal:
        out.append("other decode failures " + ", ".join(f"{k} {v:,}" for k, v in other_fatal.items()))
    other_err = {k: v for k, v in n.request_errors.items() if k not in ev.FATAL_REASONS}
    if other_err:
        out.append("other request errors " + ", ".join(f"{k} {v:,}" for k, v in other_err.items()))
    if n.largest_request_tokens:
        out.append(f"largest request   {n.largest_request_tokens:,} tokens")
    return out


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)) for r in [header, *rows]]


def _failure_lines(i: int, f: Failure) -> list[str]:
    when = f" ({_duration(f.elapsed_s)} after start)" if f.elapsed_s is not None else ""
    out = [f"Failure {i} at line {f.line:,}{when}: {_DECODE_MESSAGES.get(f.reason, f.reason)}"]
    body: list[str] = []
    if f.predictable_line is not None:
        how = {"new_prompt": "'new prompt' lines", "progress": "progress lines"}
        lead = f", {_duration(f.predictable_lead_s)} before the abort" if f.predictable_lead_s is not None else ""
        pool = f" of {f.pool_cells:,}" if f.pool_cells else ""
        text = (
            f"predictable from line {f.predictable_line:,}{lead}: the prompts in flight needed "
            f"{f.predictable_demand or 0:,} cells{pool} (sizes from "
            f"{' and '.join(how.get(x, x) for x in f.predictable_from) or 'the cells held'})"
        )
        body.extend(_wrap(text, "", "  ", width=92))
    elif f.reason == "context_exceeded":
        body.append("not predictable from the prompts: they fitted; generation (or unknown sizes) filled the pool")
    if f.retries or f.memory_slot_failures:
        cascade = f"cascade: {_plural(f.retries, 'retry', 'retries')}"
        if f.idle_slots_purged:
            cascade += f", {_plural(f.idle_slots_purged, 'idle slot')} purged"
        if f.smallest_batch is not None:
            cascade += f", batch halved down to {f.smallest_batch:,}"
            if f.smallest_batch == 1:
                cascade += ": the pool was full, not one prompt too long"
        body.append(cascade)
    if f.slots:
        rows = [[str(s.slot), str(s.task), f"{s.tokens:,}", _pct(s.share_of_pool)] for s in f.slots]
        rows.append(["sum", "", f"{f.tokens_sum:,}", _pct(f.share_sum)])
        body.extend(_table(rows, ["slot", "task", "tokens at abort", "share of pool"]))
    else:
        body.append("no release lines after the abort (aborted slots unknown)")
    if f.overflow is not None and f.pool_cells is not None:
        text = f"overflow: {f.tokens_sum:,} - {f.pool_cells:,} = {_plural(f.overflow, 'token')}"
        at = f" (off = {f.failed_offset:,})" if f.failed_offset is not None else ""
        if f.failed_batch is not None:
            if f.overflow_is_failed_batch:
                text += f", exactly the batch of {_plural(f.failed_batch, 'token')} that found no room{at}"
            elif f.overflow < f.failed_batch:
                held = f.failed_batch - f.overflow
                text += (
                    f"; the batch that found no room had {_plural(f.failed_batch, 'token')}{at}: "
                    f"{held:,} cells were free or held by slots that were not aborted"
                )
            else:
                text += f"; the batch that found no room had {_plural(f.failed_batch, 'token')}{at}"
        body.extend(_wrap(text, "", "  ", width=92))
    if f.heaviest_slot is not None:
        heavy = next(s for s in f.slots if s.slot == f.heaviest_slot)
        tied = [s.slot for s in f.slots if s.tokens == heavy.tokens]
        who = f"slot {heavy.slot}" if len(tied) == 1 else f"{_slots_list(tied)} (tied)"
        body.append(f"heaviest: {who}, {heavy.tokens:,} tokens ({_pct(heavy.share_of_pool)} of the pool)")
    if f.equal_share is not None and f.slots:
        if f.victims:
            each = " each" if len(f.victims) > 1 else ""
            text = (
                f"collateral victims: {_slots_list(f.victims)}{each} held at most {f.equal_share:,} tokens "
                "(pool / slots) and would have fit in a private pool"
            )
            body.extend(_wrap(text, "", "  ", width=92))
        else:
            body.append(f"collateral victims: none (every other aborted slot held more than {f.equal_share:,} tokens)")
    out.extend("  " + b for b in body)
    return out


def _recommendation_lines(r: RunReport) -> list[str]:
    out: list[str] = []
    for i, rec in enumerate(r.recommendations, 1):
        mark = " (supported by this log)" if rec.supported_by_log else ""
        out.append(f"{i}. {rec.flags}{mark}")
        out.extend(_wrap(rec.summary, "   ", "   "))
        for m in rec.memory:
            with_flags = f" with {m.flags}" if m.flags else ""
            if m.delta_bytes:
                delta = f", {_bytes(abs(m.delta_bytes))} {'more' if m.delta_bytes > 0 else 'less'} than now"
            else:
                delta = " (as now)"
            out.append(f"   KV cache K {m.type_k}, V {m.type_v}{with_flags}: {_bytes(m.kv_bytes)}{delta}")
        if any(m.type_v == "q8_0" and m.flags for m in rec.memory):
            out.append("   (a quantized V cache needs flash attention: -fa on)")
        if rec.requests_over_window:
            over = _plural(rec.requests_over_window, "request")
            out.append(f"   {over} in this log held more than {rec.window_per_slot:,} tokens")
    if r.verdict:
        out.extend(_wrap(r.verdict, "", ""))
    if r.cannot_know:
        out.append("What the log cannot tell:")
        for u in r.cannot_know:
            out.extend(_wrap(u, "- ", "  "))
    return out


def _wrap(text: str, first: str, rest: str, width: int = 96) -> list[str]:
    """Wrap prose for a terminal; flags and numbers are never split."""
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_long_words=False, break_on_hyphens=False
    )


_ENDING_SHORT = {
    "clean": "clean",
    "failed_start": "failed start",
    "died_mid_request": "died mid-request",
    "died_idle": "died while idle",
    "log_ends_mid_request": "log ends mid-request",
    "log_ends_idle": "log ends while idle",
    "log_ends_starting": "log ends during start-up",
}


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def _history_lines(report: Report) -> list[str]:
    """The whole period of a history of files: a timeline, aborted requests per day, restart loops,
    the largest requests. Times are the files' modification times (llama-server's own count from
    its start), so each is about when that file's last run ended."""
    out: list[str] = []
    timed = [fs for fs in report.by_file if fs.modified is not None]
    if len(report.by_file) > 1:
        out.append("Timeline (UTC; each file's modification time, about when its last run ended):")
        width = max(len(Path(fs.file).name) for fs in report.by_file)
        for fs in report.by_file:
            when = _utc(fs.modified) if fs.modified is not None else "?" * 19
            ended = ", ".join(f"{n} {_ENDING_SHORT[how]}" for how, n in fs.endings.items())
            failed = f"; {_plural(fs.failures, 'failure')}, {fs.aborted_requests:,} aborted" if fs.failures else ""
            out.append(f"  {when}  {Path(fs.file).name:<{width}}  {_plural(fs.runs, 'run')}: {ended}{failed}")
        per_day: dict[str, int] = {}
        for fs in timed:
            if fs.aborted_requests:
                day = _utc(fs.modified or 0)[:10]
                per_day[day] = per_day.get(day, 0) + fs.aborted_requests
        if per_day:
            out.append("Aborted requests per day: " + ", ".join(f"{d} {n:,}" for d, n in sorted(per_day.items())))
        times = sorted(fs.modified or 0 for fs in timed for _ in range(fs.runs))
        most = max((bisect.bisect_right(times, t + 60) - i for i, t in enumerate(times)), default=0)
        if most >= 3:
            out.append(f"Restart loop: {most} starts within one minute.")
    if report.largest_requests:
        several = len(report.by_file) > 1
        largest = [
            f"{r.tokens:,} tokens (run {r.run}" + (f" in {Path(r.file).name})" if several else ")")
            for r in report.largest_requests
        ]
        out.append("Largest requests: " + ", ".join(largest) + ".")
    return out


def _ending_lines(e: Ending) -> list[str]:
    """How the run ended, and what was in flight when its log stopped."""
    lines = [f"Ended: {ENDINGS[e.how]}" + (f": {e.reason}" if e.reason else "")]
    if e.in_flight:
        pool = f" of {e.pool_capacity_tokens:,}" if e.pool_capacity_tokens else ""
        fill = f" ({_pct(e.pool_used_tokens / e.pool_capacity_tokens)})" if e.pool_capacity_tokens else ""
        held = f"the pool held {e.pool_used_tokens:,}{pool} tokens{fill}"
        lines[0] += f"; in flight: {_plural(len(e.in_flight), 'request')}, {held}"
        rows = [[str(f.slot), str(f.task), _n(f.prompt_tokens), f"{f.tokens:,}"] for f in e.in_flight]
        lines.extend("  " + x for x in _table(rows, ["slot", "task", "prompt tokens", "tokens held"]))
    return lines


def render_text(report: Report) -> str:
    """The report for people: aligned tables, thousands separators."""
    if len(report.files) == 1:
        out: list[str] = [f"llama-server log: {report.file}"]
    else:
        order = f", {report.files_order}" if report.files_order else ""
        out = [f"llama-server logs: {len(report.files)} files{order}: {', '.join(report.files)}"]
    out.extend(f"Not read: {why}" for why in report.skipped)
    runs = _plural(report.runs_total, "server run")
    if report.failures_total:
        verdict = (
            f"{_plural(report.failures_total, 'failure')}, {_plural(report.aborted_requests_total, 'request')} aborted"
        )
    else:
        verdict = "no failure found"
    long = f" ({_plural(report.long_lines, 'line')} over 1 MiB cut)" if report.long_lines else ""
    out.append(f"{report.lines:,} lines{long}, {runs}: {verdict}.")
    if report.endings:
        ended = [f"{n:,} {_ENDING_SHORT[how]}" for how, n in report.endings.items()]
        streak = report.failed_starts_in_a_row
        if streak > 1:
            ended.append(f"{streak} failed starts in a row")
        out.append("How runs ended: " + ", ".join(ended) + ".")
    out.extend(_history_lines(report))
    om = report.omitted_runs
    if om.runs:
        out.append(
            f"The first {_plural(om.runs, 'run')} are summarized, not shown: {_plural(om.failures, 'failure')}, "
            f"{_plural(om.aborted_requests, 'aborted request')}, {_plural(om.retries, 'retry', 'retries')} "
            "(--max-runs 0 shows all)."
        )
    for r in report.runs:
        c = r.configuration
        out.append("")
        where = f"{r.file}, " if len(report.files) > 1 else ""
        head = f"Run {r.index} ({where}lines {r.first_line:,}-{r.last_line:,}"
        if r.duration_s is not None:
            head += f", {_duration(r.duration_s)}"
        head += ")"
        if r.source:
            head += f" [router child {r.source}]"
        what = []
        if c.build is not None:
            what.append(f"llama-server b{c.build}")
        if c.model:
            what.append(f"model '{c.model}'")
        if c.verbosity is not None:
            what.append(f"-lv {c.verbosity}")
        if not r.started:
            what.append("its start-up is not in the log")
        out.append(head + (": " + ", ".join(what) if what else ""))
        out.extend("  " + x for x in _ending_lines(r.ending))
        out.append("  Configuration")
        out.extend("    " + x for x in _config_lines(c))
        out.append("  Activity")
        out.extend("    " + x for x in _count_lines(r.counts))
        s = r.failure_summary
        if s.total:
            out.append("  Failures")
            if s.total > s.shown:
                out.append(
                    f"    {s.total:,} failures; the first and last {s.shown:,} are shown (--max-failures 0 shows all). "
                    f"All of them: {s.aborted_requests:,} requests aborted, {s.victims:,} of them collateral victims; "
                    f"overflow = the failed batch in {s.overflow_is_failed_batch:,}; most tokens in one slot "
                    f"{s.max_tokens_at_abort:,}"
                )
            for f in r.failures:
                out.extend("    " + x for x in _failure_lines(f.number, f))
        if r.recommendations:
            out.append("  Recommendations")
            out.extend("    " + x for x in _recommendation_lines(r))
        elif c.overcommit is not None and c.overcommit <= 1.0 and s.total:
            out.append("  The pool is not overcommitted: these failures have another cause than slots sharing a pool.")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------- CLI


class _OneLineParser(argparse.ArgumentParser):
    """One-line errors, as the exporter's own flags (exporter/config.py)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _non_negative(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(
        prog=PROG,
        description="Explain KV-pool incidents from a llama-server log: configuration, overcommit, retry "
        "cascades, and for each failure the tokens every aborted slot held, the overflow and the collateral "
        "victims; then what to change, with numbers from the log.",
        epilog="Exit status: 0 no failure found, 1 at least one failure, 2 the input is not a llama-server log. "
        "Reads plain, prefixed, coloured and --log-jsonl logs (gzip too), in bounded memory.",
    )
    p.add_argument(
        "logs",
        metavar="LOG",
        nargs="+",
        help="llama-server's --log-file, or several (rotated, gzipped, copies; a quoted pattern such as "
        "'llama-server.log*' is expanded), read oldest first; or - for standard input",
    )
    p.add_argument("--json", action="store_true", help=f"print the report as JSON (schema {SCHEMA})")
    p.add_argument(
        "--max-runs",
        type=_non_negative,
        default=10,
        metavar="N",
        help="show the last N server runs in detail, summarize earlier ones (default 10; 0 = all)",
    )
    p.add_argument(
        "--max-failures",
        type=_non_negative,
        default=10,
        metavar="N",
        help="per run, show the first and last failures up to N in detail (default 10; 0 = all)",
    )
    return p


def main(argv: Sequence[str]) -> int:
    """`llamacpp-exporter diagnose LOG... [--json]`; returns the exit status."""
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    try:
        paths, order = input_files(ns.logs)
        report = diagnose_files(paths, max_runs=ns.max_runs, max_failures=ns.max_failures)
        report.files_order = order
    except InputError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    out = sys.stdout
    try:
        if out is None:  # started with standard output closed (`>&-`)
            raise OSError("standard output is closed")
        out.write(to_json(report) + "\n" if ns.json else render_text(report))
        out.flush()
    except BrokenPipeError:  # `diagnose LOG | head`
        _discard_stdout()
        return report.exit_status
    except OSError as exc:  # e.g. ENOSPC: `diagnose LOG > /dev/full`
        _discard_stdout()
        print(f"{PROG}: error: cannot write the report: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return report.exit_status


def _discard_stdout() -> None:
    """Point standard output at /dev/null, so that Python's own flush at exit does not fail a second time."""
    if sys.stdout is not None:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = [
    "SCHEMA",
    "Configuration",
    "Counts",
    "Diagnoser",
    "Failure",
    "FailureSummary",
    "InputError",
    "MemoryCost",
    "Recommendation",
    "Report",
    "RunReport",
    "SlotAtAbort",
    "analyze",
    "diagnose_file",
    "main",
    "render_text",
    "to_json",
]
