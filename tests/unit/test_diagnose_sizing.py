"""`diagnose`'s pool verdict and statistics over every real log: a run that overflowed is never "enough",
the recommended pool holds what was held together at every failure, and every printed quantile is the
exact one over the log's own values (its release lines)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from exporter.diagnose import analyze, render_text
from exporter.diagnose.advice import history_advice
from exporter.diagnose.sizing import size_pool
from exporter.model.request_sizes import ExactValues, summarize

REPO = Path(__file__).resolve().parents[2]
LOGS = sorted(
    [p for p in (REPO / "tests" / "fixtures").rglob("*.log") if "proc" not in p.parts]
    + sorted((REPO / "exporter" / "data").glob("*.log")),
)
_RELEASE = re.compile(r"stop processing: n_tokens = (\d+)")


def _nearest_rank(values: list[int], q: float) -> int:
    """The textbook nearest-rank quantile over the expanded, sorted list (independent of the code's)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


@pytest.mark.parametrize("path", LOGS, ids=[str(p.relative_to(REPO)) for p in LOGS])
def test_verdict_and_quantiles_match_the_log(path: Path) -> None:
    lines = path.read_text(errors="replace").splitlines(keepends=True)
    report = analyze(lines, str(path), max_runs=0, max_failures=0)
    text = render_text(report)
    releases = [int(m[1]) for line in lines for m in _RELEASE.finditer(line)]
    r = report.requests
    if releases:
        assert r is not None and r.requests == len(releases)
        assert (r.tokens_p50, r.tokens_p90, r.tokens_p99) == tuple(_nearest_rank(releases, q) for q in (0.5, 0.9, 0.99))
        assert f"tokens each p50 {r.tokens_p50:,}, p90 {r.tokens_p90:,}, p99 {r.tokens_p99:,}" in text
        assert r.tokens_p99 is not None and r.concurrency_p99 is not None
        assert r.pool_needed == r.tokens_p99 * r.concurrency_p99
        assert "(exact, over every request)" in text.replace("\n  ", " ")
    held = [f.tokens_sum for run in report.runs for f in run.failures if f.overflow is not None]
    z = report.sizing
    if report.failures_total:
        assert z is not None and z.verdict == "too_small" and z.overflowed
        assert "Pool: too small: it overflowed." in text and ": enough" not in text
        assert z.recommended is not None and z.recommended >= max(held, default=0)
        if held:
            assert z.held_at_failure == max(held)
            assert f"Recommended pool: {z.recommended:,} cells (-c {z.recommended})" in text
    elif z is not None:
        assert z.verdict in ("enough", "too_small", "unknown")


def _values(tokens: dict[int, int], concurrency: dict[int, int]) -> ExactValues:
    v = ExactValues()
    v.tokens.update(tokens)
    v.concurrency.update(concurrency)
    return v


def test_three_requests_give_their_exact_median() -> None:
    """16,500 + 45,000 + 70,000: the median is 45,000 (a histogram gave 49,152); p99 x p99 multiplies
    exactly the printed figures."""
    s = summarize(_values({16_500: 1, 45_000: 1, 70_000: 1}, {1: 1, 2: 1, 3: 1}), 70_000, 131_072)
    assert (s.tokens_p50, s.tokens_p99, s.concurrency_p99, s.pool_needed) == (45_000, 70_000, 3, 210_000)


def test_a_pool_that_held_every_peak_is_enough_and_gets_no_advice() -> None:
    lines = (REPO / "tests" / "fixtures" / "b11434" / "per-slot-pool" / "llama-server.log").read_text()
    report = analyze(lines.splitlines(keepends=True))
    assert report.failures_total == 0
    assert report.sizing is not None and report.sizing.verdict == "enough" and report.sizing.recommended is None
    assert "Pool: enough: nothing overflowed" in render_text(report)
    assert history_advice(report.history, report.requests, size_pool(report.history, report.requests)) == []
