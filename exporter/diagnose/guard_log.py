"""`diagnose LOG --guard-log ACCESS_LOG`: the guard's access log joined to the aborts, to name each slot's client.

llama-server's log never names a client; the guard's access log has one JSON line per request with its
client and, where the guard saw it in `/slots`, its slot and task (`id_task`). An aborted slot's release
line gives the same slot and task. Task ids start again at every server start, so one slot and task can
be in the access log more than once; an abort ends all its requests at the same moment, so for each
failure the join takes, of the lines with its slots and tasks, those that ended together (within
`TOGETHER_S` of one another), preferring lines the server answered with an error:

    Failure 1 …
      slot  task  client        tokens at abort  share of pool
         0    24  orchestrator          159,069         60.7 %
         3    31  claude-cli              3,212          1.2 %
      caused by orchestrator: its request in slot 0 held 159,069 tokens (60.7 % of the pool) …

Memory stays bounded: only the lines of the aborted slots' (slot, task) pairs are kept.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from exporter.diagnose.read import InputError
from exporter.diagnose.report import Failure, Report
from exporter.model.clients import CLIENT_NAME as _NAME  # what the guard writes as a client name or request id

#: Lines of one abort end within this many seconds of one another (the server errors them all at once;
#: the guard writes each when its answer has ended).
TOGETHER_S = 5.0
_MAX_LINE = 64 * 1024


@dataclass(frozen=True)
class _Entry:
    """One access log line of an aborted slot's (slot, task)."""

    end: float  # epoch seconds: its time plus its duration
    client: str
    request: str | None
    errored: bool  # the server answered an error status (a stream's error comes inside a 200)
    order: int  # its place in the files read


@dataclass
class GuardLogSummary:
    """What the access log added to the report."""

    files: list[str]
    lines: int = 0
    unreadable: int = 0  # lines that are not an access log line (skipped)
    aborted_slots: int = 0  # in the failures shown
    named: int = 0  # of those, the slots whose client the access log gave
    causes: dict[str, int] = field(default_factory=dict)  # client → overflows where it held the largest slot
    advice: list[str] = field(default_factory=list)


def _lines(path: str) -> Iterator[bytes]:
    try:
        with gzip.open(path, "rb") if path.endswith(".gz") else Path(path).open("rb") as f:
            for raw in f:
                yield raw[:_MAX_LINE]
    except (OSError, EOFError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise InputError(f"{path}: cannot read the guard's access log: {why}") from None


def _entry(d: dict[str, object], order: int) -> tuple[int, int, _Entry] | None:
    """(slot, task, entry) of an access log line, or None when the guard did not see its slot and task."""
    slot, task, client, stamp = d.get("slot"), d.get("task"), d.get("client"), d.get("time")
    if not (isinstance(slot, int) and isinstance(task, int) and isinstance(client, str) and isinstance(stamp, str)):
        return None
    try:
        start = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    duration = d.get("duration_s")
    status = d.get("status")
    end = start + (duration if isinstance(duration, (int, float)) else 0.0)
    errored = isinstance(status, int) and status >= 500
    if not _NAME.fullmatch(client):
        client = "?"  # not a name the guard writes (the file is not trusted: no escape reaches a terminal)
    request = d.get("id")
    request = request if isinstance(request, str) and _NAME.fullmatch(request) else None
    return slot, task, _Entry(end, client, request, errored, order)


def _failures(report: Report) -> list[Failure]:
    return [f for r in report.runs for f in r.failures]


def join_guard_log(report: Report, paths: Sequence[str]) -> GuardLogSummary:
    """Name the client of each aborted slot of `report` from the access logs `paths` (in place)."""
    summary = GuardLogSummary(files=list(paths))
    failures = _failures(report)
    wanted = {(s.slot, s.task) for f in failures for s in f.slots}
    found: dict[tuple[int, int], list[_Entry]] = {}
    order = 0
    for path in paths:
        for raw in _lines(path):
            if not raw.strip():
                continue
            summary.lines += 1
            order += 1
            try:
                d = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                d = None
            if not isinstance(d, dict) or "client" not in d:
                summary.unreadable += 1
                continue
            parsed = _entry(d, order)
            if parsed is None:
                continue
            slot, task, entry = parsed
            if (slot, task) in wanted:
                found.setdefault((slot, task), []).append(entry)
    after = float("-inf")
    used: set[int] = set()
    for f in failures:
        summary.aborted_slots += len(f.slots)
        chosen = _together(f, found, used, after)
        for s in f.slots:
            e = chosen.get((s.slot, s.task))
            if e is not None:
                s.client, s.guard_request = e.client, e.request
                summary.named += 1
                used.add(e.order)
        if chosen:
            after = min(e.end for e in chosen.values()) - TOGETHER_S
        _cause(f, summary)
    summary.advice = _advice(summary)
    return summary


def _together(
    f: Failure, found: dict[tuple[int, int], list[_Entry]], used: set[int], after: float
) -> dict[tuple[int, int], _Entry]:
    """For each of the failure's slots, its access log line: of the candidates, those that ended together."""
    candidates = {
        (s.slot, s.task): [e for e in found.get((s.slot, s.task), []) if e.order not in used and e.end >= after]
        for s in f.slots
    }
    anchors = sorted({e.end for es in candidates.values() for e in es})
    best: tuple[int, int, float] | None = None  # (slots named, errored lines, -anchor): most, then most errors, first
    pick: dict[tuple[int, int], _Entry] = {}
    for anchor in anchors:
        chosen: dict[tuple[int, int], _Entry] = {}
        for key, es in candidates.items():
            near = [e for e in es if abs(e.end - anchor) <= TOGETHER_S]
            if near:
                chosen[key] = min(near, key=lambda e: (not e.errored, abs(e.end - anchor)))
        score = (len(chosen), sum(e.errored for e in chosen.values()), -anchor)
        if best is None or score > best:
            best, pick = score, chosen
    return pick


def _cause(f: Failure, summary: GuardLogSummary) -> None:
    """Whose size caused the overflow: the client of the heaviest aborted slot, with the others it took down."""
    heavy = next((s for s in f.slots if s.slot == f.heaviest_slot), None)
    if heavy is None or heavy.client is None:
        return
    share = f" ({heavy.share_of_pool * 100:.1f} % of the pool)" if heavy.share_of_pool is not None else ""
    others = [s for s in f.slots if s is not heavy]
    died = ", ".join(f"{s.client or 'not in the access log'} (slot {s.slot}, {s.tokens:,})" for s in others)
    tail = f"; aborted with it: {died}" if died else ""
    if f.equal_share is not None and heavy.tokens <= f.equal_share:
        # No request held more than a private pool would have given it: the slots together filled the pool.
        f.cause = (
            f"no one client's size: every aborted request held at most {f.equal_share:,} tokens (pool / slots); "
            f"the largest, {heavy.client}'s in slot {heavy.slot}, held {heavy.tokens:,}{share}{tail}"
        )
        return
    f.cause = f"caused by {heavy.client}: its request in slot {heavy.slot} held {heavy.tokens:,} tokens{share}{tail}"
    summary.causes[heavy.client] = summary.causes.get(heavy.client, 0) + 1


def _advice(summary: GuardLogSummary) -> list[str]:
    out: list[str] = []
    if summary.aborted_slots:
        out.append(
            f"The access log names the client of {summary.named:,} of the {summary.aborted_slots:,} aborted slots "
            f"shown ({summary.lines:,} lines read"
            + (f", {summary.unreadable:,} not access log lines" if summary.unreadable else "")
            + ")."
        )
    total = sum(summary.causes.values())
    for client, n in Counter(summary.causes).most_common():
        out.append(
            f"{client} held the largest slot in {n:,} of the {total:,} overflows named: its requests' size filled "
            f"the pool. Have it send max_tokens (n_predict), give it a server of its own, or run the guard with "
            "--guard.admission on, which holds back the request that would overflow instead of letting the server "
            "abort every one in flight."
        )
    return out
