"""`/api/status`: each server now, as one JSON document (schema `SCHEMA`), made from the views a scrape renders.

Every figure that `/metrics` also exports is computed here from the same `ServerView` with the same model
functions the collectors call (`ServerState.pool_capacity`, `ServerRun.pool_used`, `overcommit_ratio`,
`forecast`), so the page and a scrape made from one view cannot disagree (tests/unit/test_status.py checks
it on every capture of the log goldens). Pure: the time comes in as an argument. The page (`status.page`)
renders this document, nothing else. Schema, in docs/status.md:

    {"schema": 1, "version": "…", "time": 1764000000.0, "demo": false,
     "servers": [{"name": "…", "labels": {…}, "state": "up", "severity": 0, "pool": {…}, "slots": […],
                  "incidents": […], "memory": {…}, "counters": {…}, "log": {…}, "sources": {…},
                  "guard": null, "history": {…}}, …]}    # the worst first
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from exporter.model.forecast import HORIZONS, forecast
from exporter.model.incidents import KINDS, Incident
from exporter.model.view import ServerView
from exporter.status.history import HistorySnapshot

#: The document's schema version: raised when a field changes meaning or goes away (new fields may come).
SCHEMA = 1
#: Usage above this share of the pool is the page's red line (LlamaCppKVPoolSaturated's threshold).
SATURATED = 0.9

Json = dict[str, object]


@dataclass(frozen=True)
class LogStatus:
    """The log source of a server: what `/healthz` says of it, and its tailer's figures."""

    description: str  # its path (shown only to a caller with credentials), or the source in words
    up: bool
    understood: bool | None = None
    problem: str | None = None
    truncations: int = 0
    rotations: int = 0
    lost_bytes: int = 0
    long_lines: int = 0


@dataclass(frozen=True)
class UnitStatus:
    """One unit as the document shows it: its labels, this scrape's view, its log, its history."""

    labels: Mapping[str, str]
    view: ServerView
    log: LogStatus | None = None
    history: HistorySnapshot | None = None
    extra: Mapping[str, object] = field(default_factory=dict)  # e.g. the guard's figures


def _num(v: float | None) -> float | None:
    """A JSON number: None for unknown, infinite or NaN (JSON has none of them)."""
    return None if v is None or math.isnan(v) or math.isinf(v) else v


def unit_name(labels: Mapping[str, str]) -> str:
    """`server NAME, model NAME`, or `llama-server` for the one unlabelled server."""
    return ", ".join(f"{k} {v}" for k, v in labels.items()) or "llama-server"


def server_state(view: ServerView) -> tuple[str, str]:
    """(`up`, `loading`, `down` or `unknown`, where it comes from: `http` (/health), `proc` (the process the
    exporter had found has exited, and none took its place: a crash or a kill writes no line) or `log`)."""
    http = view.http
    if http is not None and "/health" in http.status:
        return ("up" if http.up else "loading" if http.loading else "down"), "http"
    run = view.state.run
    if run.exiting or run.start_error:
        return "down", "log"
    if view.proc is not None and view.proc.process is None and view.proc.exited is not None:
        return "down", "proc"
    if run.ready:
        return "up", "log"
    if run.in_startup or run.n_slots is not None:
        return "loading", "log"
    return "unknown", "log"


def pool(view: ServerView) -> Json:
    """The KV pool: what `ServerLogCollector` and `KVForecastCollector` export, from the same view."""
    st = view.state
    capacity, source = st.pool_capacity()
    used = st.run.pool_used()
    out: Json = {
        "capacity": capacity,
        "capacity_source": source,
        "used": used,
        "usage_ratio": used / capacity if capacity else None,
        "overcommit_ratio": _num(st.overcommit_ratio()),
        "saturated_ratio": SATURATED,
        "in_cascade": st.run.in_cascade,
        "active_tokens": view.active_tokens,
    }
    if st.run.slot_count is not None:
        f = forecast(st, view.measured)
        out["demand"] = {h: f.demand(h) for h in HORIZONS}
        out["demand_ratio"] = {h: f.ratio(h) for h in HORIZONS} if f.capacity else None
        out["full_eta_seconds"] = _num(f.eta_seconds)
        out["fill_rate"] = f.fill_rate
    return out


def slots(view: ServerView) -> list[Json]:
    """Each slot: cells held, processing or idle, its context (as `llamacpp_slot_*`)."""
    run = view.state.run
    count = run.slot_count or 0
    out: list[Json] = []
    for i in range(count):
        s = run.slots.get(i)
        out.append(
            {
                "slot": i,
                "tokens": s.tokens if s else 0,
                "processing": bool(s and s.processing),
                "context": run.slot_context(i),
                "checkpoint_bytes": s.checkpoint_bytes if s else 0.0,
            }
        )
    return out


def incident(inc: Incident) -> Json:
    """One incident, with its words (`summary`) and its figures."""
    largest = inc.largest
    return {
        "seq": inc.seq,
        "kind": inc.kind,
        "what": KINDS.get(inc.kind, inc.kind),
        "time": inc.time,
        "open": inc.open,
        "aborted": inc.aborted,
        "reason": inc.reason,
        "retries": inc.retries,
        "slots": [{"slot": s, "cells": n} for s, n in inc.slots],
        "held": inc.held,
        "pool": inc.pool,
        "largest": {"slot": largest[0], "cells": largest[1]} if largest else None,
        "summary": inc.summary(),
    }


def memory(view: ServerView) -> Json:
    """VRAM per GPU (and llama-server's own on it), its RSS, the host's available RAM, host RAM of checkpoints
    and of the prompt cache, the KV cache's size (as the GPU, process and checkpoint collectors export)."""
    run = view.state.run
    gpus: list[Json] = []
    pid = view.pid
    nvml = view.nvml
    if nvml is not None:
        seen = pid is not None and any(g.processes and pid in g.processes for g in nvml.gpus)
        for g in nvml.gpus:
            own = g.processes.get(pid, 0) if seen and pid is not None and g.processes is not None else None
            gpus.append(
                {
                    "gpu": g.index,
                    "name": g.name,
                    "uuid": g.uuid,
                    "total_bytes": g.total_bytes,
                    "free_bytes": g.free_bytes,
                    "server_bytes": own,
                }
            )
    proc = view.proc
    visible = run.checkpoint_lines_visible()
    limit = run.prompt_cache_limit_bytes
    return {
        "gpus": gpus,
        "server_rss_bytes": proc.process.rss_bytes if proc is not None and proc.process is not None else None,
        "host_available_bytes": proc.host.available_bytes if proc is not None and proc.host is not None else None,
        "checkpoint_bytes": sum(s.checkpoint_bytes for s in run.slots.values()) if visible is not False else None,
        "prompt_cache_bytes": run.prompt_cache_bytes if visible is not False else None,
        "prompt_cache_limit_bytes": _num(limit),
        "prompt_cache_unlimited": limit is not None and math.isinf(limit),
        "kv_cache_bytes": (run.kv_k_bytes + run.kv_v_bytes) or None,
    }


def counters(view: ServerView) -> Json:
    """The counters a person asks about first (as `llamacpp_*_total` since the exporter started)."""
    st = view.state
    return {
        "requests_aborted": sum(st.requests_aborted.values()),
        "kv_retries": st.kv_retries,
        "cascades_recovered": st.cascades["recovered"],
        "cascades_failed": st.cascades["failed"],
        "context_exceeded": st.context_exceeded,
        "server_starts": st.server_starts,
        "server_crashes": sum(st.server_crashes.values()),
        "lines_rejected": sum(st.rejected.values()),
    }


def history(h: HistorySnapshot | None) -> Json | None:
    if h is None:
        return None
    return {"step_seconds": h.step_seconds, "t": list(h.t), **{k: list(v) for k, v in h.series.items()}}


def severity(server: Json) -> int:
    """How bad it looks, for the order of the page (the worst first): 3 down or requests just aborted, 2 the
    pool past the red line or the log not followed, 1 loading or a cascade in progress, 0 fine."""
    p = server["pool"]
    assert isinstance(p, dict)
    incidents = server["incidents"]
    assert isinstance(incidents, list)
    log = server.get("log")
    log_bad = isinstance(log, dict) and (not log.get("up") or log.get("understood") is False)
    if server["state"] == "down" or any(i["open"] for i in incidents):
        return 3
    if (p.get("usage_ratio") or 0) > SATURATED or log_bad:
        return 2
    if server["state"] == "loading" or p.get("in_cascade"):
        return 1
    return 0


def server(unit: UnitStatus, *, authorized: bool = True) -> Json:
    """One unit's part of the document."""
    view = unit.view
    run = view.state.run
    state, state_source = server_state(view)
    proc = view.proc.process if view.proc is not None else None
    out: Json = {
        "name": unit_name(unit.labels),
        "labels": dict(unit.labels),
        "state": state,
        "state_source": state_source,
        "build": run.build,
        "commit": run.commit,
        "model": run.model,
        "since": proc.start_time_seconds if proc is not None else None,
        "kv_unified": run.kv_unified,
        "type_k": run.type_k,
        "type_v": run.type_v,
        "start_error": run.start_error,
        "pool": pool(view),
        "slots": slots(view),
        "incidents": [incident(i) for i in reversed(view.incidents)],  # the newest first
        "memory": memory(view),
        "counters": counters(view),
        "sources": {name: {"up": r.up, "error": r.error} for name, r in view.sources.items()},
        "guard": dict(unit.extra.get("guard", {})) or None,  # type: ignore[call-overload]
        "history": history(unit.history),
    }
    if unit.log is not None:
        lg = unit.log
        out["log"] = {
            "path": lg.description if authorized else None,
            "up": lg.up,
            "understood": lg.understood,
            "problem": lg.problem if authorized else None,
            "truncations": lg.truncations,
            "rotations": lg.rotations,
            "lost_bytes": lg.lost_bytes,
            "long_lines": lg.long_lines,
        }
    out["severity"] = severity(out)
    return out


def document(
    units: Sequence[UnitStatus], *, version: str, time: float, demo: bool = False, authorized: bool = True
) -> Json:
    """The whole document: every unit, the worst first (then by name)."""
    servers = [server(u, authorized=authorized) for u in units]
    servers.sort(key=lambda s: (-int(s["severity"]), str(s["name"])))  # type: ignore[call-overload]
    return {"schema": SCHEMA, "version": version, "time": time, "demo": demo, "servers": servers}
