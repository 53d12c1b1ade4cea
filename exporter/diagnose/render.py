"""The report for people (aligned text) and for tools (JSON)."""

from __future__ import annotations

import bisect
import dataclasses
import json
import textwrap
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from exporter.diagnose.first_tokens import first_token_lines
from exporter.diagnose.report import (
    CAUSES,
    ENDINGS,
    Configuration,
    Counts,
    Ending,
    Failure,
    MemoryFigures,
    Report,
    RunReport,
    RunSummary,
)
from exporter.logs import events as ev
from exporter.model.bounds import MIB

_DECODE_MESSAGES = {
    "context_exceeded": "Context size has been exceeded",
    "invalid_batch": "Invalid input batch",
    "compute_error": "Compute error",
}


# ------------------------------------------------------------------------------------------- rendering


def to_json(report: Report) -> str:
    """The report as JSON (stable keys; see `SCHEMA`)."""
    return "".join(json_chunks(report))


def json_chunks(report: Report) -> Iterator[str]:
    """`to_json` in pieces: the history (a line per run, tens of thousands in a long one) is written
    one run at a time, so that memory does not hold it twice more as dicts and as one string."""
    data: dict[str, Any] = dataclasses.asdict(dataclasses.replace(report, series={}, history=[]))
    # The series each run's chart plots (--html), by run index.
    data["series"] = {str(i): s.as_json() for i, s in sorted(report.series.items())}
    data["exit_status"] = report.exit_status
    # Inside a JSON string a quote is escaped, so the key, written out, occurs only as the key.
    head, key, tail = json.dumps(data, indent=2).partition('"history": []')
    assert key and '"history": []' not in tail
    yield head + '"history": ['
    for i, run in enumerate(report.history):
        yield ("," if i else "") + "\n    " + json.dumps(history_entry(run))
    yield ("\n  ]" if report.history else "]") + tail


# RunSummary's fields in the history, in order: not its request sizes (the history's sum is the report's
# `requests`) nor its configuration (the run's own report has it).
_HISTORY_FIELDS = tuple(
    f.name for f in dataclasses.fields(RunSummary) if f.name not in ("request_sizes", "configuration")
)

_MEMORY_FIELDS = tuple(f.name for f in dataclasses.fields(MemoryFigures))


def history_entry(run: RunSummary) -> dict[str, Any]:
    """`dataclasses.asdict(run)` less the fields the history leaves out, without converting them first
    (they are most of its cost, and a long log's history has tens of thousands of runs)."""
    entry = {name: getattr(run, name) for name in _HISTORY_FIELDS}
    memory = run.memory
    if memory is not None:  # asdict's copy of its plain values, without its recursion
        entry["memory"] = {name: getattr(memory, name) for name in _MEMORY_FIELDS}
    return entry


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
    if f.slots and any(s.client for s in f.slots):  # named by the guard's access log (--guard-log)
        rows = [[str(s.slot), str(s.task), s.client or "?", f"{s.tokens:,}", _pct(s.share_of_pool)] for s in f.slots]
        rows.append(["sum", "", "", f"{f.tokens_sum:,}", _pct(f.share_sum)])
        body.extend(_table(rows, ["slot", "task", "client", "tokens at abort", "share of pool"]))
    elif f.slots:
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
    if f.cause:
        body.extend(_wrap(f.cause, "", "  ", width=92))
    if f.equal_share is not None and f.slots:
        if f.victims:
            cells = {x.slot: x.tokens for x in f.slots}
            each = ", ".join(f"slot {v} {cells[v]:,}" for v in f.victims)
            text = (
                f"collateral victims: {each} tokens: each no more than a private pool's {f.equal_share:,} cells "
                "(pool / slots), so each would have fit in one"
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


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


#: The timeline lists at most this many runs (the latest).
_TIMELINE_RUNS = 50


def _history_lines(report: Report) -> list[str]:
    """The whole period of a history: a timeline, aborted requests per day, restart loops, the largest
    requests, runs read twice, and what the history points at. Runs are dated by the journal's time
    stamps where the input has them; otherwise by their files' modification times (llama-server's own
    stamps count from its start), each about when that file's last run ended."""
    out: list[str] = []
    runs = [s for s in report.history if s.same_as is None]
    by_clock = bool(runs) and all(s.clock == "log" for s in runs)
    if by_clock and len(runs) > 1:
        out.extend(_run_timeline(runs))
    elif len(report.by_file) > 1:
        out.append("Timeline (UTC; each file's modification time, about when its last run ended):")
        width = max(len(Path(fs.file).name) for fs in report.by_file)
        for fs in report.by_file:
            when = _utc(fs.modified) if fs.modified is not None else "?" * 19
            ended = ", ".join(f"{n} {ENDINGS[how][0]}" for how, n in fs.endings.items())
            failed = f"; {_plural(fs.failures, 'failure')}, {fs.aborted_requests:,} aborted" if fs.failures else ""
            copies = f"{'; ' if fs.runs else ''}{_plural(fs.copies, 'run')} read twice" if fs.copies else ""
            counted = f"{_plural(fs.runs, 'run')}: {ended}" if fs.runs else ""
            out.append(f"  {when}  {Path(fs.file).name:<{width}}  {counted}{failed}{copies}")
    if by_clock or len(report.by_file) > 1:
        per_day: dict[str, int] = {}
        modified = {fs.file: fs.modified for fs in report.by_file}
        for s in runs:
            end = s.ended_at if by_clock else modified.get(s.file)
            if s.aborted_requests and end is not None:
                day = _utc(end)[:10]
                per_day[day] = per_day.get(day, 0) + s.aborted_requests
        if per_day:
            out.append("Aborted requests per day: " + ", ".join(f"{d} {n:,}" for d, n in sorted(per_day.items())))
        if by_clock:
            times = sorted(s.started_at for s in runs if s.started_at is not None)
        else:
            times = sorted(fs.modified for fs in report.by_file if fs.modified is not None for _ in range(fs.runs))
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
    out.extend(f"Read twice: {x}." for x in report.overlaps)
    out.extend(_request_lines(report))
    for advice in report.history_advice:
        out.extend(_wrap(advice, "Across the history: ", "  "))
    return out


def _request_lines(report: Report) -> list[str]:
    """The sizes of the requests and how many ran at once (exact), and whether the pool was big enough."""
    r, z = report.requests, report.sizing
    out: list[str] = []
    if r is not None:
        out.extend(
            _wrap(
                f"Requests: {r.requests:,}, tokens each p50 {_n(r.tokens_p50)}, p90 {_n(r.tokens_p90)}, "
                f"p99 {_n(r.tokens_p99)}, largest {r.tokens_max:,}; in flight together p50 {_n(r.concurrency_p50)}, "
                f"p99 {_n(r.concurrency_p99)}, most {_n(r.concurrency_max)} (exact, over every request).",
                "",
                "  ",
            )
        )
    if z is None:
        return out
    peak = None
    if r is not None and r.pool_needed is not None:
        peak = (
            f"the requests' p99 x p99 ({_n(r.tokens_p99)} tokens x {_n(r.concurrency_p99)} in flight) "
            f"is {r.pool_needed:,}"
        )
    if z.overflowed and z.held_at_failure is not None:
        where = f"run {z.held_run}, line {_n(z.held_line)}"
        over = (
            f", {z.overflow:,} more than its {z.pool_cells:,}"
            if z.overflow is not None and z.overflow > 0 and z.pool_cells
            else (f" of its {z.pool_cells:,} (the rest free or held by slots not aborted)" if z.pool_cells else "")
        )
        text = (
            f"Pool: too small: it overflowed. At its fullest failure ({where}) the aborted slots held "
            f"{z.held_at_failure:,} cells together{over}: a pool of {z.held_at_failure:,} cells is the floor that "
            "would have held what was held together at every failure."
        )
    elif z.overflowed:
        text = "Pool: too small: it overflowed (the log does not say what the slots held together)."
    elif z.verdict == "too_small":
        text = f"Pool: too small for the requests: {peak}; the pool had {_n(z.pool_cells)}. Nothing overflowed yet."
        peak = None
    elif z.verdict == "enough":
        text = f"Pool: enough: nothing overflowed, and {peak} of the {_n(z.pool_cells)} cells it had."
        peak = None
    else:
        text = "Pool: its size is not in the log."
    out.extend(_wrap(text, "", "  "))
    if z.recommended is not None:
        among = []
        if z.held_at_failure is not None:
            among.append(f"the floor ({z.held_at_failure:,})")
        if r is not None and r.pool_needed is not None:
            among.append(
                f"the requests' p99 x p99 ({_n(r.tokens_p99)} tokens x {_n(r.concurrency_p99)} in flight = "
                f"{r.pool_needed:,})"
            )
        if z.overflowed and z.pool_cells:
            among.append(f"one cell more than the pool that overflowed ({z.pool_cells + 1:,})")
        rec = f"Recommended pool: {z.recommended:,} cells (-c {z.recommended})"
        rec += ", the largest of " + ", ".join(among) if len(among) > 1 else f", {among[0]}" if among else ""
        if z.recommended_kv_bytes is not None and z.kv_bytes_per_cell is not None:
            rec += (
                f"; its KV cache at K {z.type_k}, V {z.type_v}: {_bytes(z.recommended_kv_bytes)} "
                f"({z.kv_bytes_per_cell:,.0f} bytes per cell measured"
                + (f", now {_bytes(z.kv_bytes_now)}" if z.kv_bytes_now else "")
                + ")"
            )
        if z.promised is not None:
            rec += (
                f". The slots' promises (slots x window = {z.promised:,} cells) are the pool where no request "
                "can abort another (--kv-unified-per-slot)"
            )
        out.extend(_wrap(rec + ".", "", "  "))
    return out


def _run_timeline(runs: Sequence[RunSummary]) -> list[str]:
    """One line per run, dated by the journal: when it started, how long it ran, how it ended."""
    out = ["Timeline (UTC; the journal's time stamps):"]
    if len(runs) > _TIMELINE_RUNS:
        out.append(f"  ({len(runs) - _TIMELINE_RUNS:,} earlier runs not listed)")
    for s in runs[-_TIMELINE_RUNS:]:
        when = _utc(s.started_at) if s.started_at is not None else "?" * 19
        took = s.duration_s  # its own time stamps, else the journal's
        if took is None and s.started_at is not None and s.ended_at is not None:
            took = s.ended_at - s.started_at
        took_text = _duration(took)
        line = f"  {when}  run {s.index:<4} {took_text:>12}  {ENDINGS[s.ending][0]}"
        if s.in_flight_prompt_tokens:
            line += f" ({s.in_flight_prompt_tokens:,}-token prompt in flight)"
        if s.failures:
            line += f"; {_plural(s.failures, 'failure')}, {s.aborted_requests:,} aborted"
        out.append(line)
    return out


def _ending_lines(e: Ending) -> list[str]:
    """How the run ended, and what was in flight when its log stopped."""
    lines = [f"Ended: {ENDINGS[e.how][1]}" + (f": {e.reason}" if e.reason else "")]
    if e.cause is not None:
        lines.append(f"Cause: {CAUSES[e.cause]}, in the log's words: {e.cause_message}")
    if e.in_flight:
        pool = f" of {e.pool_capacity_tokens:,}" if e.pool_capacity_tokens else ""
        fill = f" ({_pct(e.pool_used_tokens / e.pool_capacity_tokens)})" if e.pool_capacity_tokens else ""
        held = f"the pool held {e.pool_used_tokens:,}{pool} tokens{fill}"
        lines[0] += f"; in flight: {_plural(len(e.in_flight), 'request')}, {held}"
        rows = [[str(f.slot), str(f.task), _n(f.prompt_tokens), f"{f.tokens:,}"] for f in e.in_flight]
        lines.extend("  " + x for x in _table(rows, ["slot", "task", "prompt tokens", "tokens held"]))
    m = e.memory
    if m is not None:
        what = "free device memory" if m.kind == "device" else "host memory"
        lines.append(
            f"Memory at start: {m.used_mib:,} MiB projected of {m.available_mib:,} MiB {what} "
            f"({m.headroom_mib:,} MiB left)"
        )
    return lines


def _summary_lines(report: Report) -> list[str]:
    """The report's head: the files, how many lines and runs, the verdict, how runs ended, the history."""
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
        ended = [f"{n:,} {ENDINGS[how][0]}" for how, n in report.endings.items()]
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
    return out


def _run_lines(r: RunReport, *, several_files: bool) -> list[str]:
    """One run: its head, how it ended, its configuration, activity, first tokens, failures and advice."""
    out: list[str] = []
    c = r.configuration
    where = f"{r.file}, " if several_files else ""
    head = f"Run {r.index} ({where}lines {r.first_line:,}-{r.last_line:,}"
    if r.duration_s is not None:
        head += f", {_duration(r.duration_s)}"
    head += ")"
    if r.source:
        head += f" [router child {r.model}, port {r.source}]" if r.model else f" [router child {r.source}]"
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
    if r.first_tokens is not None:
        out.append("  First tokens by cache outcome (`prompt eval time`; the exporter's `cache` label)")
        out.extend("    " + x for line in first_token_lines(r.first_tokens) for x in _wrap(line, "", "  "))
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
    return out


def render_text(report: Report) -> str:
    """The report for people: aligned tables, thousands separators."""
    out = _summary_lines(report)
    for r in report.runs:
        out.append("")
        out.extend(_run_lines(r, several_files=len(report.files) > 1))
    if report.guard is not None:
        out.extend(["", f"Clients (the guard's access log: {', '.join(report.guard.files)})"])
        out.extend(x for advice in report.guard.advice for x in _wrap(advice, "  ", "    "))
    return "\n".join(out) + "\n"
