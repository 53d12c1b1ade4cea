"""`diagnose`'s pool verdict and statistics over every real log: a run that overflowed is never "enough",
the recommended pool holds what was held together at every failure, and every printed quantile is the
exact one over the log's own values (its release lines)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
from big_log import later_start
from paths import B11434
from sudden_overflow import sudden_overflow_lines
from swa_reprocess import SWA_RUN, first_tokens_of

from exporter.diagnose import Diagnoser, analyze, render_text, to_json
from exporter.diagnose.advice import (
    RULES,
    advise,
    history_advice,
    memory_costs,
    pool_advice,
    quantized,
    reprocess_advice,
)
from exporter.diagnose.report import Configuration, PoolSizing, Report
from exporter.diagnose.sizing import size_pool
from exporter.model.request_sizes import ExactValues, summarize

REPO = Path(__file__).resolve().parents[2]
LOGS = sorted(
    [p for p in (REPO / "tests" / "fixtures").rglob("*.log") if "proc" not in p.parts]
    + sorted((REPO / "exporter" / "data").glob("*.log")),
)
_RELEASE = re.compile(r"stop processing: n_tokens = (\d+)")


def diagnose_lines(lines: list[str], name: str, *, series: bool) -> Report:
    d = Diagnoser(name, max_runs=0, max_failures=0, series=series)
    for i, line in enumerate(lines, 1):
        d.feed_line(line, i)
    return d.finish()


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


# -- the advice table: each rule with and without its precondition, on the demo log's real configuration


def _demo() -> tuple[Report, Configuration, PoolSizing]:
    lines = (REPO / "exporter" / "data" / "demo-exhaust-long-lv4.log").read_text().splitlines(keepends=True)
    report = analyze(lines)
    assert report.sizing is not None
    return report, report.runs[0].configuration, report.sizing


def _advice(c: Configuration, z: PoolSizing) -> str:
    (text,) = pool_advice(z, c)
    return text


def test_the_docs_table_is_the_code_table() -> None:
    doc = (REPO / "docs" / "diagnose.md").read_text()
    rows = re.findall(r"^\| (.+?) \| (.+?) \| (.+?) \|$", doc.split("<!-- advice-rules:")[1].split("\n\n")[0], re.M)
    assert rows[0] == ("advice", "given only when", "evidence in the log")
    assert [tuple(r) for r in rows[1:]] == list(RULES)


def test_raise_the_pool_only_when_it_was_too_small() -> None:
    _, c, z = _demo()
    assert _advice(c, z).startswith("Raise the pool to 32,772 cells (-c 32772)")
    assert pool_advice(dataclasses.replace(z, verdict="enough", recommended=None), c) == []


def test_q8_0_only_when_the_cache_is_larger() -> None:
    _, c, z = _demo()
    assert (z.type_k, z.type_v) == ("f16", "f16") and "-ctk q8_0 -ctv q8_0" in _advice(c, z)
    for small in ("q8_0", "q4_0"):
        assert "q8_0 cache" not in _advice(c, dataclasses.replace(z, type_k=small, type_v=small))
    # The run's own recommendations: a q8_0 alternative only beside a larger cache.
    assert any(m.type_k == "q8_0" for m in memory_costs(c, 4096))
    quant = dataclasses.replace(c, type_k="q8_0", type_v="q8_0")
    assert [m.type_k for m in memory_costs(quant, 4096)] == ["q8_0"]
    # And the crash advice.
    assert quantized("q8_0", "q4_0") is True and quantized("f16", "q8_0") is False and quantized(None, "f16") is None


def test_per_slot_windows_only_on_a_unified_pool_not_already_capped() -> None:
    report, c, z = _demo()
    assert "--kv-unified-per-slot 32768" in _advice(c, z)
    assert "--kv-unified-per-slot" not in _advice(dataclasses.replace(c, per_slot_cap=8192), z)
    assert "--kv-unified-per-slot" not in _advice(dataclasses.replace(c, kv_unified=False), z)
    kinds = [r.kind for r in advise(c, report.runs[0].counts)[0]]
    assert kinds == ["kv_unified_per_slot", "no_kv_unified"]
    assert advise(dataclasses.replace(c, per_slot_cap=32768), report.runs[0].counts)[0] == []


def test_drop_kvu_only_when_it_is_on() -> None:
    report, c, _ = _demo()
    assert "no_kv_unified" in [r.kind for r in advise(c, report.runs[0].counts)[0]]
    assert advise(dataclasses.replace(c, kv_unified=False), report.runs[0].counts)[0] == []


def test_fewer_slots_only_with_more_than_one() -> None:
    report, c, z = _demo()
    assert "serve fewer requests at once (now -np 4)" in _advice(c, z)
    one = dataclasses.replace(c, n_slots=1)
    assert "-np" not in _advice(one, z) and "--kv-unified-per-slot" not in _advice(one, z)
    assert advise(one, report.runs[0].counts)[0] == []


def test_crash_advice_names_q8_0_only_beside_a_larger_cache() -> None:
    """Two runs killed mid-prompt with little memory left: the headroom advice offers a q8_0 cache only
    where the crashed runs' size line says the cache is larger."""
    clean = (B11434 / "exhaust-lv4" / "llama-server.log").read_text()
    cut = "".join((B11434 / "exhaust-long-lv4" / "llama-server.log").read_text().splitlines(keepends=True)[:400])
    little = re.sub(
        r"projected to use \d+ MiB of host memory vs\. \d+ MiB of total host memory",
        "projected to use 23668 MiB of device memory vs. 24080 MiB of free device memory",
        cut,
    )

    def crash_advice(crashed: str) -> str:
        runs = [clean, crashed, crashed, clean]
        report = analyze("".join(later_start(r, k) for k, r in enumerate(runs)).splitlines(keepends=True))
        (text,) = [a for a in report.history_advice if "crash" in a]
        return text

    assert "-ctk q8_0 -ctv q8_0" in crash_advice(little)
    q8 = little.replace("K (f16):", "K (q8_0):").replace("V (f16):", "V (q8_0):")
    assert q8 != little and "q8_0" not in crash_advice(q8)


# -- the chart's series (--json) against the text, at every failure of every capture that has one


def _chart_cases() -> list[tuple[str, list[str]]]:
    cases = [("sudden-overflow (three slots, no progress lines)", sudden_overflow_lines())]
    for p in LOGS:
        lines = p.read_text(errors="replace").splitlines(keepends=True)
        if any("Context size has been exceeded" in line for line in lines):
            cases.append((str(p.relative_to(REPO)), lines))
    return cases


@pytest.mark.parametrize("name, lines", _chart_cases(), ids=[c[0] for c in _chart_cases()])
def test_the_chart_plots_what_the_text_counts(name: str, lines: list[str]) -> None:
    report = diagnose_lines(lines, name, series=True)
    data = json.loads(to_json(report))
    assert report.failures_total
    for run in report.runs:
        if not run.failures:
            continue
        s = data["series"][str(run.index)]
        by_line = s["x_unit"] == "line"
        # One time origin: the failures' x are the text's (its line, or its seconds after the start).
        assert s["failures"] == [f.line if by_line else f.elapsed_s for f in run.failures]
        for f in run.failures:
            at = max(i for i, x in enumerate(s["x"]) if x == (f.line if by_line else f.elapsed_s))
            cells = [slot[at] for slot in s["slots"]]
            # Every slot the text names is drawn, at the cells its release line says; the stack's top is
            # the table's sum (no slot outside the table held cells then).
            assert len(cells) > max(x.slot for x in f.slots)
            assert {x.slot: cells[x.slot] for x in f.slots} == {x.slot: x.tokens for x in f.slots}
            assert sum(cells) == f.tokens_sum
            assert f"{f.tokens_sum:,}" in render_text(report)


def test_the_sudden_overflow_reads_as_an_overflow() -> None:
    report = analyze(sudden_overflow_lines())
    text = render_text(report)
    (f,) = report.runs[0].failures
    assert [(x.slot, x.tokens) for x in f.slots] == [(0, 70_000), (1, 45_000), (2, 16_500)]
    assert f.elapsed_s == pytest.approx(56.8) and "Failure 1 at line 42 (0:00:56.800 after start)" in text
    assert f.tokens_sum == 131_500 and f.overflow == 428
    assert "collateral victims: slot 2 16,500 tokens" in text  # its own cells, not the pool / slots 43,690
    z = report.sizing
    assert z is not None and (z.verdict, z.held_at_failure, z.overflow) == ("too_small", 131_500, 428)
    assert report.requests is not None and (report.requests.tokens_p50, report.requests.concurrency_p99) == (16_500, 3)
    assert z.recommended == 210_000 and z.p99_x_p99 == 70_000 * 3 and z.promised == 3 * 131_072


# -- the re-processing advice (a real SWA run that re-processed a prompt whole, tests/support/swa_reprocess.py)


def test_swa_full_only_when_the_swa_cache_is_smaller() -> None:
    ft = first_tokens_of()
    assert "--swa-full" in " ".join(reprocess_advice(ft))
    assert "--swa-full" not in " ".join(reprocess_advice(dataclasses.replace(ft, swa_cells=4096)))
    hybrid = " ".join(reprocess_advice(dataclasses.replace(ft, model_memory="hybrid", swa_cells=None, full_cells=None)))
    assert "--swa-full" not in hybrid and "recurrent state cannot be rolled back" in hybrid


def test_more_checkpoints_only_when_disabled_or_erased_for_room() -> None:
    ft = first_tokens_of()
    assert "--ctx-checkpoints N turns context checkpoints on" in " ".join(reprocess_advice(ft))
    enough = dataclasses.replace(ft, checkpoint_limit=8, checkpoints_evicted=0)
    assert "--ctx-checkpoints" not in " ".join(reprocess_advice(enough))
    erased = " ".join(reprocess_advice(dataclasses.replace(enough, checkpoints_evicted=2)))
    assert "--ctx-checkpoints N keeps more checkpoints than 8 per slot (2 were erased to make room)" in erased


def test_a_prompt_cache_only_when_it_is_disabled() -> None:
    ft = first_tokens_of()
    assert "--cache-ram" in " ".join(reprocess_advice(ft))
    assert "--cache-ram" not in " ".join(reprocess_advice(dataclasses.replace(ft, prompt_cache_enabled=True)))
    assert "--cache-ram" not in " ".join(reprocess_advice(dataclasses.replace(ft, prompt_cache_enabled=None)))


def test_the_invalidated_checkpoints_are_said_only_where_the_log_counts_some() -> None:
    ft = first_tokens_of()
    assert ft.checkpoints_invalidated == 0 and "invalidated" not in " ".join(reprocess_advice(ft))
    said = " ".join(reprocess_advice(dataclasses.replace(ft, checkpoints_invalidated=3)))
    assert "no context checkpoint covered it; 3 context checkpoints were invalidated" in said


def test_no_advice_without_a_full_reprocessing() -> None:
    ft = first_tokens_of()
    assert reprocess_advice(dataclasses.replace(ft, full_reprocess_lines=0)) == []
    # Where the start-up lines are not in the log: the why in general, the fixes but --swa-full (no SWA cells).
    lines = [x for x in SWA_RUN.splitlines(keepends=True) if "llama_kv_cache_iswa" not in x]
    unnamed_ft = first_tokens_of("".join(lines))
    assert (unnamed_ft.model_memory, unnamed_ft.swa_cells) == (None, None)
    unnamed = " ".join(unnamed_ft.advice)
    assert "the log does not say which this is" in unnamed and "--swa-full" not in unnamed
    assert "--ctx-checkpoints N turns context checkpoints on" in unnamed and "--cache-ram N" in unnamed
    # The capture with checkpoints on (restored, invalidated) but no full re-processing: no advice.
    swa = (REPO / "tests" / "fixtures" / "b11434" / "checkpoints-swa-lv4" / "llama-server.log").read_text()
    quiet = first_tokens_of(swa)
    assert quiet.model_memory == "sliding_window" and quiet.full_reprocess_lines == 0 and quiet.advice == []
    assert quiet.checkpoints_invalidated == swa.count("erased invalidated context checkpoint") == 3
