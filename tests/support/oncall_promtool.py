"""The on-call table of a simulated incident (oncall_sim), measured by the real promtool on the real rules.

promtool has no way to print an alert's timeline, but it prints what a `promql_expr_test` got when that
differs from what it expected. So each measurement is a probe that expects nothing: the critical alerts
firing (and since when: ALERTS_FOR_STATE is the alert's activeAt) at the first evaluation that can see each
abort, the capacity warning at the first abort, and the number of times a critical alert started firing
(a page) between incidents, counted by a recording rule on ALERTS evaluated after the alerts. A run passes
when every failure promtool lists is one of the probes; the table is what they got.

    table = measure(sim, rules_file, promtool, tmp_path, horizon_s=86_400)
    table.rows        # one per abort: when, the page (name, lead in seconds), the incident it belongs to
    table.pages       # pages per incident, and pages outside any incident (last)
    table.false_pages # pages outside any incident that no abort followed (times in s)
"""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from oncall_sim import Simulation

CRITICAL_FIRING = (
    'ALERTS_FOR_STATE{severity="critical"} and ignoring (alertstate) ALERTS{alertstate="firing", severity="critical"}'
)
CAPACITY_FIRING = (
    'ALERTS_FOR_STATE{alertname="LlamaCppKVPoolUndersized"}'
    ' and ignoring (alertstate) ALERTS{alertstate="firing", alertname="LlamaCppKVPoolUndersized"}'
)
ONSETS = "probe:critical_onsets"
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


@dataclass
class Row:
    """One abort: when (s), how many requests, its incident, the pages firing when it showed (name, lead s)."""

    at: int
    requests: int
    incident: int
    pages: list[tuple[str, float]]


@dataclass
class Table:
    rows: list[Row] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)  # per incident, then the pages after the last one
    capacity_warning_at: float | None = None  # when LlamaCppKVPoolUndersized started firing (s)
    first_abort: int | None = None
    false_pages: list[int] = field(default_factory=list)  # pages (s) that no abort followed within the gap

    @property
    def capacity_lead_s(self) -> float | None:
        if self.capacity_warning_at is None or self.first_abort is None:
            return None
        return self.first_abort - self.capacity_warning_at

    def render(self, title: str) -> str:
        lines = [title]
        for r in self.rows:
            page = ", ".join(f"{name} lead {lead:+.0f}s" for name, lead in r.pages) or "NO PAGE"
            lines.append(f"  abort at {_hms(r.at)} ({r.requests} requests) incident {r.incident}: {page}")
        lines.append(
            f"  pages per incident: {self.pages[:-1]}, pages outside incidents: {self.pages[-1]} "
            f"(false: {len(self.false_pages)}{''.join(f', at {_hms(t)}' for t in self.false_pages)})"
        )
        lead = self.capacity_lead_s
        lines.append(
            f"  capacity warning lead over the first abort: {'none' if lead is None else f'{lead / 60:.1f} min'}"
        )
        return "\n".join(lines)


def _hms(s: float) -> str:
    s = int(s)
    return f"d{s // 86400 + 1} {s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def _parse_duration(text: str) -> float:
    return sum(int(n) * _UNITS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text))


def incidents(aborts: list[tuple[int, int]], gap_s: int) -> list[list[tuple[int, int]]]:
    """Aborts less than ``gap_s`` apart are one incident."""
    out: list[list[tuple[int, int]]] = []
    for abort in aborts:
        if out and abort[0] - out[-1][-1][0] < gap_s:
            out[-1].append(abort)
        else:
            out.append([abort])
    return out


def measure(
    sim: Simulation,
    rules_file: Path,
    promtool: Path,
    workdir: Path,
    span: tuple[int, int],
    incident_gap_s: int,
    eval_s: int = 15,
) -> Table:
    """Run the simulation's samples from ``span[0]`` to ``span[1]`` (seconds) through promtool with
    ``rules_file``; the table (times in the simulation's seconds)."""
    scrape, (begin, end) = sim.scenario.scrape_s, span
    aborts = [a for a in sim.aborts if begin <= a[0] <= end - incident_gap_s]
    groups = incidents(aborts, incident_gap_s)

    def seen_at(t: int) -> int:  # the first evaluation of the first sample that shows an event at t, in promtool time
        return math.ceil(math.ceil((t - begin) / scrape) * scrape / eval_s) * eval_s

    probes: dict[tuple[str, int], str] = {}
    for t, _ in aborts:
        probes[(CRITICAL_FIRING, seen_at(t))] = "page"
    if aborts:
        probes[(CAPACITY_FIRING, seen_at(aborts[0][0]))] = "capacity"
    # Pages (critical onsets) at every evaluation; empty (no failure to print) where there are none.
    for at in range(eval_s, end - begin + eval_s, eval_s):
        probes[(f"{ONSETS} > 0", at)] = "onsets"
    probe_rules = workdir / "probe-rules.yml"
    probe_rules.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "probe",
                        "rules": [
                            {
                                # A page: a critical alert firing now that was not at the previous evaluation.
                                "record": ONSETS,
                                "expr": f'count(ALERTS{{alertstate="firing", severity="critical"}} unless '
                                f'ALERTS{{alertstate="firing", severity="critical"}} offset {eval_s}s) or vector(0)',
                            }
                        ],
                    }
                ]
            }
        ),
        encoding="utf-8",
    )
    rules_copy = workdir / "rules.yml"
    rules_copy.write_text(rules_file.read_text(encoding="utf-8"), encoding="utf-8")
    tests: dict[str, Any] = {
        "rule_files": ["rules.yml", "probe-rules.yml"],
        "evaluation_interval": f"{eval_s}s",
        "group_eval_order": ["llamacpp.rules", "llamacpp.alerts", "probe"],
        "tests": [
            {
                "interval": f"{scrape}s",
                "input_series": sim.input_series(begin, end),
                "promql_expr_test": [
                    {"expr": expr, "eval_time": f"{at}s", "exp_samples": []}
                    for (expr, at) in sorted(probes, key=lambda p: p[1])
                ],
            }
        ],
    }
    (workdir / "oncall.test.yml").write_text(yaml.safe_dump(tests, width=1 << 30, sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [str(promtool), "test", "rules", "oncall.test.yml"],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=workdir,
    )
    got = _parse_failures(out.stdout + out.stderr)
    if set(got) - set(probes) or (out.returncode != 0 and not got):
        raise AssertionError(f"promtool failed beyond the probes: {out.stdout}\n{out.stderr}"[-4000:])
    table = Table(first_abort=aborts[0][0] if aborts else None)
    onsets = [(begin + at, int(samples[0][1])) for (expr, at), samples in got.items() if expr == f"{ONSETS} > 0"]
    counted: set[int] = set()
    for i, group in enumerate(groups):
        rows = []
        for t, n in group:
            firing = got.get((CRITICAL_FIRING, seen_at(t)), [])
            rows.append(Row(t, n, i, [(lab["alertname"], t - (begin + v)) for lab, v in firing]))
        table.rows += rows
        # The incident's pages: those that started from its first page (or abort) to its end.
        first_page = min([group[0][0]] + [group[0][0] - lead for _, lead in rows[0].pages])
        last = begin + seen_at(group[-1][0]) + incident_gap_s
        mine = [k for k, (at, _) in enumerate(onsets) if first_page <= at <= last and k not in counted]
        counted.update(mine)
        table.pages.append(sum(onsets[k][1] for k in mine))
    table.pages.append(sum(n for k, (_, n) in enumerate(onsets) if k not in counted))
    # A page outside the table's incidents is one ahead of an incident the table leaves out (its aborts in
    # the span's last incident gap) or a false page: no abort of the whole simulation follows it in time.
    table.false_pages = [
        at
        for k, (at, _) in enumerate(onsets)
        if k not in counted and not any(at <= t <= at + incident_gap_s for t, _ in sim.aborts)
    ]
    if aborts:
        cap = got.get((CAPACITY_FIRING, seen_at(aborts[0][0])), [])
        if cap:
            for_s = _parse_duration(_rule_for(rules_file, "LlamaCppKVPoolUndersized"))
            table.capacity_warning_at = begin + cap[0][1] + for_s
    return table


def _rule_for(rules_file: Path, alert: str) -> str:
    doc = yaml.safe_load(rules_file.read_text(encoding="utf-8"))
    return next(str(r["for"]) for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert)


_FAILURE = re.compile(r'expr: "((?:[^"\\]|\\.)*)", time: (\S+),\n\s+exp: .*\n\s+got: (.*)')
_SAMPLE = re.compile(r"\{([^}]*)\} (\S+?)(?:, |$)")


def _parse_failures(text: str) -> dict[tuple[str, int], list[tuple[dict[str, str], float]]]:
    """(expr, eval time) -> the samples promtool got, from its failure report."""
    out: dict[tuple[str, int], list[tuple[dict[str, str], float]]] = {}
    for expr, when, got in _FAILURE.findall(text):
        expr = expr.encode().decode("unicode_escape")
        samples = []
        if got.strip() != "nil":
            for labels, value in _SAMPLE.findall(got):
                samples.append((dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
        out[(expr, int(_parse_duration(when)))] = samples
    return out
