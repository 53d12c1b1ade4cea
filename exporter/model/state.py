"""What the log says about llama-server right now: configuration, slots, KV pool, and event counters.

`ServerState.apply(event)` is the only way in (`apply_events` applies a batch the same way). No I/O, no
clock, no prometheus_client: feed it the events of a captured log and compare the result with what the
log (or the server's own `/slots`) says. Slot semantics (as the README explains them):

- `new prompt … task.n_tokens = C` then `cached n_tokens = N`: the slot keeps N and will grow to ~C;
  prompt and generation progress lines move the estimate; `stop processing: n_tokens = N` leaves the
  slot idle but still holding N cells; `clearing prompt` / `purging slot` empty it.
- A request aborted by a fatal decode error (`send_error` after `Context size has been exceeded`) has
  its slot cleared by llama-server (b7078+), even when `-lv 3` hides the `clearing prompt` line.
- With unified KV and `--cache-idle-slots` (default on since b8852), starting a task saves and clears
  every idle slot; at `-lv 3` that is hidden too, so it is inferred.

Counters live as long as the exporter. They are counted only while `counting` is True: the exporter
replays the existing log with counting off to rebuild gauges without re-counting the past, so a
restart of the exporter can never make a counter jump and fire an alert.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

from exporter.logs import events as ev
from exporter.model.handlers import DISPATCH
from exporter.model.histogram import Histogram
from exporter.model.incidents import Incidents
from exporter.model.latency import RequestLatency
from exporter.model.provenance import NotOwnLine, Provenance
from exporter.model.request_sizes import (
    CONCURRENCY_BUCKETS,
    PROMPT_EVAL_BUCKETS,
    REQUEST_TOKEN_BUCKETS,
    ExactValues,
)
from exporter.model.run import ServerRun
from exporter.model.server_cmdline import ServerCommandLine


@dataclass
class ServerState:
    """Server configuration, slot occupancy and event counters, built from log events."""

    counting: bool = True

    # What the running server process said about itself; replaced whole at every start (`start_run`).
    run: ServerRun = field(default_factory=ServerRun)

    # Counters (exporter lifetime; never reset by a server restart).
    rejected: Counter[str] = field(default_factory=Counter)  # lines not applied, by bounded reason
    provenance: Provenance = field(default_factory=Provenance)  # which lines are the server's own
    last_unexpected: str | None = None  # the last error of an `unexpected` rejection (for the exporter's log)
    server_starts: int = 0
    server_crashes: Counter[str] = field(default_factory=Counter)  # runs ended without their exit line, by cause
    counted: Counter[type] = field(default_factory=Counter)  # events of the kinds that declare `counted`, by kind
    cascades: Counter[str] = field(default_factory=Counter)
    context_exceeded: int = 0
    decode_failures: Counter[str] = field(default_factory=Counter)
    requests_aborted: Counter[str] = field(default_factory=Counter)
    slots_purged: int = 0
    checkpoint_events: Counter[str] = field(default_factory=Counter)
    full_reprocess: int = 0
    prompt_eval_seconds: Histogram = field(default_factory=lambda: Histogram(PROMPT_EVAL_BUCKETS))
    prompt_tokens: int = 0
    generated_tokens: int = 0
    # Each finished request's time to first token, per token, end to end, and its prompt's reuse (print_timing).
    latency: RequestLatency = field(default_factory=RequestLatency)
    # What requests ask of the pool (exporter.model.request_sizes): at each release, and at each start.
    request_tokens: Histogram = field(default_factory=lambda: Histogram(REQUEST_TOKEN_BUCKETS))
    request_prompt_tokens: Histogram = field(default_factory=lambda: Histogram(REQUEST_TOKEN_BUCKETS))
    request_concurrency: Histogram = field(default_factory=lambda: Histogram(CONCURRENCY_BUCKETS))
    # The same values exactly, where the reader keeps them (diagnose; None in the exporter: unbounded).
    request_values: ExactValues | None = None
    # The last incidents (overflows, recovered cascades, crashes, restarts), recorded while counting.
    incidents: Incidents = field(default_factory=Incidents)

    # The operator's word on the pool's size (--kv-pool-capacity), given at construction: a fallback of
    # `pool_capacity` where neither the log nor the command line states it.
    capacity_override: int | None = None
    # llama-server's command line and process, applied by the process source like events (they count starts
    # and give the pool's size); still no I/O here.
    command_line: ServerCommandLine | None = None
    _process: tuple[int, int] | None = None  # (pid, start time in clock ticks) last seen
    _unmatched_log_starts: int = 0
    _unmatched_process_starts: int = 0

    # ------------------------------------------------------------------ derived values

    @property
    def kv_retries(self) -> int:
        """`retrying with smaller batch size` lines counted."""
        return self.counted[ev.KVRetry]

    @property
    def memory_slot_failures(self) -> int:
        """`failed to find a memory slot for batch` warnings counted."""
        return self.counted[ev.MemorySlotFailure]

    def pool_capacity(self) -> tuple[int | None, str]:
        """KV cells in the pool (all streams) and where the figure came from.

        The `llama_kv_cache: size` line is authoritative; `llama_context: n_ctx` is next; at `-lv 3`
        (both hidden on b9151+) the b9829+ `initializing … kv_unified` line still gives it, because with
        unified KV every slot is promised the whole pool, and the `--kv-unified-per-slot` capping line
        names the pool size it capped.
        """
        run = self.run
        if run.kv_cells is not None:
            return run.kv_cells * (run.kv_streams or 1), "log_kv_cache"
        n_ctx = run.context.get("n_ctx")
        if n_ctx is not None:
            unified = run.kv_unified if run.kv_unified is not None else bool(run.context.get("kv_unified", 1))
            seq, n_seq = run.context.get("n_ctx_seq"), run.context.get("n_seq_max")
            if not unified and seq and n_seq:
                return seq * n_seq, "log_context"
            return n_ctx, "log_context"
        # Below: no log line states the pool. The command line computes it exactly; the flag is the
        # operator's word; the n_ctx_slot inference is wrong when the slot was capped at n_ctx_train.
        cmdline = self.command_line.pool_capacity() if self.command_line is not None else None
        if cmdline is not None:
            return cmdline, "command_line"
        if self.capacity_override is not None:
            return self.capacity_override, "flag"
        if run.per_slot_cap is not None and run.kv_unified:
            return run.per_slot_cap.requested, "log_slots"
        if run.n_ctx_slot is not None and run.kv_unified is not None:
            if run.kv_unified:
                return run.n_ctx_slot, "log_slots"
            if run.n_slots:
                return run.n_ctx_slot * run.n_slots, "log_slots"
        return None, "unknown"

    def overcommit_ratio(self) -> float | None:
        """Slots × per-slot promise / pool capacity; 1.0 means every slot can get its full window."""
        capacity, _ = self.pool_capacity()
        n, per_slot = self.run.slot_count, self.run.n_ctx_slot
        if per_slot is None and self.run.slots:
            known = [s.n_ctx for s in self.run.slots.values() if s.n_ctx is not None]
            per_slot = max(known) if known else None
        if not capacity or n is None or per_slot is None:
            return None
        return n * per_slot / capacity

    # ------------------------------------------------------------------ applying events

    def start_run(self, banner: object | None = None) -> None:
        """A new server process: a fresh `ServerRun` replaces its predecessor's; counters stay.

        Several banner lines belong to one start; one that this start already printed, or the first
        one in a new file (llama-server truncates its log as it starts), is the next start: a server
        that died while it started and was started again.
        """
        run = self.run
        if (
            run.in_startup
            and banner is not None
            and banner not in run.banners_seen
            and not self.provenance.new_file  # the first start in a new file is a new run
        ):
            run.banners_seen.add(banner)
            return
        if self.counting:
            counted = self._count_log_start()
            if not self._count_crash() and counted and self._had_started():
                self.incidents.restart()  # a clean one (a crash is its own incident)
        self.run = ServerRun(in_startup=True, banners_seen={banner} if banner is not None else set())
        self.provenance.start()

    def apply(self, e: ev.Event) -> bool:
        """Apply one event (a dict lookup by the event's type, not a chain of isinstance checks).

        Never raises: an event whose values the running server cannot have written is rejected and
        counted (`rejected`), and so is one that trips a bug here (`unexpected`), so that no line can
        stop the pipeline. Returns False for a rejected event.
        """
        kind = type(e)
        entry = DISPATCH.get(kind)
        if entry is None:
            if isinstance(e, ev.LineFormat):
                self.provenance.line_format = e.code
            elif isinstance(e, ev.Rejected):
                self.reject(e.reason)
                return False
            return True
        handler, check, checked, _, counted = entry
        if check is not None and not check(self.run, e):
            self.reject("out_of_range")
            return False
        provenance = self.provenance
        if checked or provenance.line_format != provenance.run_format:
            reason = provenance.admit(self.run, kind, e)
            if reason is not None:
                self.reject(reason)
                return False
        try:
            handler(self, e)
        except NotOwnLine:
            self.reject("inconsistent")
            return False
        except Exception as exc:  # a bug must cost one line, not the pipeline
            self.last_unexpected = f"{kind.__name__}: {type(exc).__name__}: {exc}"[:200]
            self.reject("unexpected")
            return False
        if counted and self.counting:
            self.counted[kind] += 1
        return True

    def apply_events(self, events: Sequence[ev.Event], start: int = 0, stop: Container[type] = ()) -> int:
        """Apply `events[start:]` in order, each as `apply` does, up to the first of a kind in `stop` (kinds
        without a `DISPATCH` entry: the caller's own); returns its index, or `len(events)` when none.

        `apply`'s body again, for a batch: the loop's names are looked up once and an event costs no call of
        its own (the bulk of a log's events go this way; `apply` stays the way in for one). The handlers never
        change `counting` or replace `provenance`; `run` is read per event (a start replaces it).
        """
        provenance, counting, counted = self.provenance, self.counting, self.counted
        dispatch = DISPATCH
        for i in range(start, len(events)):
            e = events[i]
            kind = type(e)
            entry = dispatch.get(kind)
            if entry is None:
                if isinstance(e, ev.LineFormat):
                    provenance.line_format = e.code
                elif isinstance(e, ev.Rejected):
                    self.reject(e.reason)
                elif kind in stop:
                    return i
                continue
            handler, check, checked, fits, is_counted = entry
            if check is not None and not check(self.run, e):
                self.reject("out_of_range")
                continue
            if checked or provenance.line_format != provenance.run_format:
                if fits is not None and provenance.line_format == provenance.run_format:
                    # What `admit` does with such a line, without its call (`FITS_ONLY`).
                    fit = not provenance.from_start or fits(provenance, self.run, e)
                    reason = None if fit else "inconsistent"
                else:
                    reason = provenance.admit(self.run, kind, e)
                if reason is not None:
                    self.reject(reason)
                    continue
            try:
                handler(self, e)
            except NotOwnLine:
                self.reject("inconsistent")
                continue
            except Exception as exc:  # a bug must cost one line, not the pipeline
                self.last_unexpected = f"{kind.__name__}: {type(exc).__name__}: {exc}"[:200]
                self.reject("unexpected")
                continue
            if is_counted and counting:
                counted[kind] += 1
        return len(events)

    def accepts(self, e: ev.Event) -> bool:
        """Whether `apply` would apply `e` rather than reject it (for readers that act on events themselves)."""
        kind = type(e)
        if kind not in DISPATCH:
            return kind is not ev.Rejected
        check = DISPATCH[kind][1]
        return (check is None or check(self.run, e)) and self.provenance.check(self.run, kind, e) is None

    def reject(self, reason: str) -> None:
        """Count a line that is not applied, by its (bounded) reason."""
        if self.counting:
            self.rejected[reason] += 1

    def apply_command_line(self, cfg: ServerCommandLine | None) -> None:
        """The running server's argv/environment (from /proc): a pool-capacity fallback when the log hides it."""
        self.command_line = cfg

    def observe_process(self, pid: int, start_ticks: int) -> None:
        """llama-server's process as /proc shows it now; a new process is a server start.

        The log reports the same start with its banner, in either order. Each start is counted once:
        a new process that the log already announced (or the other way round) matches it instead of
        counting again, so the counter follows whichever source sees a start first. The first process
        seen is the one already running when the exporter started: remembered, not counted.
        """
        ident = (pid, start_ticks)
        if ident == self._process:
            return
        first, self._process = self._process is None, ident
        if first:
            self._unmatched_log_starts = 0  # the banner(s) seen so far belong to this process or older ones
            return
        if self._unmatched_log_starts:
            self._unmatched_log_starts -= 1
            return
        if self.counting:
            self.server_starts += 1
            self._unmatched_process_starts += 1
            if not self._count_crash() and self._had_started():
                self.incidents.restart()
        # The new process has empty slots; its banner (when it comes) resets again and matches this start.
        counting, self.counting = self.counting, False
        self.run.in_startup = False
        try:
            self.start_run()
            self.provenance.from_start = False  # the log has not shown this start yet: nothing to check against
        finally:
            self.counting = counting
            self.run.in_startup = False

    def _count_crash(self) -> bool:
        """A new server replaces the running one: if that one had started and never said it exits, it
        crashed (or was killed, or failed to start), by the cause its log named last (`unknown`: none).
        Returns whether it counted a crash."""
        run = self.run
        if run.exiting or not self._had_started():
            return False
        cause = run.crash_cause.cause if run.crash_cause is not None else "unknown"
        self.server_crashes[cause] += 1
        self.incidents.crash(cause, self.pool_capacity()[0])
        return True

    def _had_started(self) -> bool:
        """The running server had started (a banner, its slots, or ready): a new one replaces it."""
        run = self.run
        return bool(run.banners_seen or run.ready or run.n_slots is not None)

    def _count_log_start(self) -> bool:
        """A start banner in the log: count it unless a new process already counted this start (False)."""
        if self._unmatched_process_starts:
            self._unmatched_process_starts -= 1
            return False
        self.server_starts += 1
        if self._process is not None:
            self._unmatched_log_starts += 1
        return True
