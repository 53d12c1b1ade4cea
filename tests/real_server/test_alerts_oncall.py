"""The alerts read as the on-call engineer would, on a simulated incident, by the real promtool.

The incident (tests/support/oncall_sim.py, seeded): one llama-server `-c 262144 -np 4 -kvu` at the default
verbosity, three coding agents whose conversations grow to 150k-162k tokens, two or three requests at once,
overflows a few times an hour in busy hours, three days; with and without a chat front-end beside them
(long requests under 1 % of the traffic). Its series carry the exporter's real names, labels and buckets.

What the on-call engineer needs, asserted per run:
- the capacity warning (LlamaCppKVPoolUndersized) fires before the first abort;
- at a 5 or 15 s scrape, the page comes before the first abort of most incidents (the share is asserted over
  all runs, and printed with each lead);
- the first abort of each incident (aborts less than 30 minutes apart) has a critical page at the first
  evaluation that can see it at the latest;
- no incident gives more than one page;
and the same at a 1 m scrape with 15 s evaluation. Each run prints its table (pytest -s shows it).
LLAMACPP_ONCALL_FULL=1 runs every seed (1-5), with and without chat, at 5, 15 and 60 s.

promtool's cost grows with the square of the horizon (the capacity rules look back a day at every
evaluation): a 3-day run at 15 s evaluation takes minutes. Each run here covers the first busy day from
08:00 to 14:30 at 15 s evaluation: the first abort and the capacity warning's lead over it (traffic starts at
08:30, before it there is nothing to see), and the morning's incidents, where the page rules (which look
back at most 15 minutes) meet every case they meet later. The three days' abort counts come from the
simulation itself. The healthy runs (a pool that holds its load, a server nobody uses) do cover three days.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from oncall_promtool import Row, Table, measure
from oncall_sim import DAY, LABELS, Scenario, Simulation, simulate
from paths import REPO

RULES = REPO / "alerts" / "llamacpp-rules.yml"
#: Aborts less than this apart are one incident: the page's window (15m) plus its keep_firing_for (15m).
INCIDENT_GAP_S = 30 * 60
#: 08:00 to 14:30 of the first day.
SPAN = (8 * 3600, 14 * 3600 + 1800)

#: (seed, chat front-end, scrape interval s)
RUNS = [(1, False, 15), (2, False, 15), (3, False, 15), (1, True, 15), (2, True, 15), (3, True, 15)]
RUNS_5S = [(4, False, 5), (5, True, 5)]
RUNS_1M = [(4, False, 60), (5, True, 60)]
#: LLAMACPP_ONCALL_FULL=1: every seed, with and without chat, at every scrape interval (about 20 minutes on 2 cores).
if os.environ.get("LLAMACPP_ONCALL_FULL") == "1":
    RUNS = [(seed, chat, scrape) for scrape in (5, 15) for chat in (False, True) for seed in range(1, 6)]
    RUNS_5S = []
    RUNS_1M = [(seed, chat, 60) for chat in (False, True) for seed in range(1, 6)]
ALL_RUNS = RUNS + RUNS_5S + RUNS_1M
#: The share of incidents at a 5 or 15 s scrape whose first abort a page came before (the rest are paged at
#: the first evaluation that sees the abort).
PAGED_AHEAD = 0.9
#: The least lead of the page where the pool was past 90 % for the whole minute before the first abort (s).
FULL_LEAD_S = 30


def _measure(run: tuple[int, bool, int], workdir: Path, promtool: Path) -> tuple[Simulation, Table]:
    seed, chat, scrape = run
    sim = simulate(Scenario(seed=seed, chat=chat, scrape_s=scrape))
    workdir.mkdir()
    return sim, measure(sim, RULES, promtool, workdir, SPAN, INCIDENT_GAP_S)


@pytest.fixture(scope="module")
def tables(
    promtool_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[int, bool, int], tuple[Simulation, Table]]:
    """Every run's table, two promtool processes at a time."""
    tmp = tmp_path_factory.mktemp("oncall")
    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        futures = {
            run: pool.submit(_measure, run, tmp / f"seed{run[0]}-chat{int(run[1])}-{run[2]}s", promtool_bin)
            for run in ALL_RUNS
        }
        return {run: f.result() for run, f in futures.items()}


def _report(run: tuple[int, bool, int], sim: Simulation, table: Table) -> str:
    seed, chat, scrape = run
    days = sim.scenario.days
    title = (
        f"seed {seed}, {'agents and chat' if chat else 'agents'}, scrape {scrape}s / evaluation 15s: "
        f"{len(sim.aborts)} overflows ({sum(n for _, n in sim.aborts)} requests aborted) in {days} days, "
        f"{sim.requests} requests, {sim.long_requests / max(sim.requests, 1):.2%} longer than half the pool"
    )
    return table.render(title)


@pytest.mark.promtool
@pytest.mark.parametrize("run", ALL_RUNS, ids=lambda r: f"seed{r[0]}-{'chat' if r[1] else 'agents'}-{r[2]}s")
def test_the_on_call_table(
    run: tuple[int, bool, int], tables: dict[tuple[int, bool, int], tuple[Simulation, Table]]
) -> None:
    sim, table = tables[run]
    report = _report(run, sim, table)
    print(report)
    assert table.rows, report  # the span holds aborts: the test is not vacuous
    lead = table.capacity_lead_s
    assert lead is not None and lead > 0, f"the capacity warning does not lead the first abort\n{report}"
    for row in _first_rows(table):
        assert row.pages, f"incident {row.incident}: no page at its first abort\n{report}"
    assert all(n <= 1 for n in table.pages[:-1]), f"an incident paged more than once\n{report}"
    if run[1]:  # the chat front-end makes long requests rare: the quantiles cannot see them
        assert sim.long_requests / sim.requests < 0.01, report


def _first_rows(table: Table) -> list[Row]:
    return [r for r in table.rows if r.at == min(x.at for x in table.rows if x.incident == r.incident)]


@pytest.mark.promtool
def test_pages_come_before_the_first_abort_of_most_incidents(
    tables: dict[tuple[int, bool, int], tuple[Simulation, Table]],
) -> None:
    """At a 5 or 15 s scrape the page (LlamaCppKVPoolSaturated: the conversations in flight or coming back past
    90 %) comes before the first abort of most incidents; the table of leads is printed."""
    ahead, total, leads, full_leads = 0, 0, [], []
    for run, (sim, table) in tables.items():
        if run[2] > 15:
            continue
        for row in _first_rows(table):
            total += 1
            lead = max((lead for _, lead in row.pages), default=None)
            leads.append(lead)
            ahead += lead is not None and lead > 0
            if _full_for_a_minute(sim, row.at):
                full_leads.append(lead)
    print(f"paged before the first abort: {ahead} of {total} incidents; leads (s): {leads}")
    print(f"incidents whose pool was past 90 % at every scrape of the minute before: leads (s) {full_leads}")
    assert total and ahead / total >= PAGED_AHEAD, (ahead, total, leads)
    # A pool past 90 % for a whole minute was paged at least 30 s before the abort.
    assert all(lead is not None and lead >= FULL_LEAD_S for lead in full_leads), full_leads


def _full_for_a_minute(sim: Simulation, at: int) -> bool:
    """The pool's usage was past 90 % at every scrape of the minute before ``at`` (s)."""
    step = sim.scenario.scrape_s
    usage = sim.series[f"llamacpp_kv_pool_usage_ratio{{{LABELS}}}"]
    scrapes = range(-(-(at - 60) // step), -(-at // step))  # the scrapes in [at - 60, at)
    return all(usage[i] > 0.9 for i in scrapes)


@pytest.mark.promtool
def test_demand_growing_10_percent_a_day_warns_a_day_before_its_first_overflow(
    promtool_bin: Path, tmp_path: Path
) -> None:
    """Conversations that grow 10 % a day (68k-76k tokens on day 1; seed 2 overflows first on day 3): the
    capacity warning fires at least a day before the first abort."""
    sim = simulate(Scenario(seed=2, growth=0.1, conversation=(68_000, 76_000), scrape_s=60))
    assert sim.aborts and sim.aborts[0][0] >= 2 * DAY, sim.aborts[:1]
    ahead = (sim.aborts[0][0] - DAY) // 300 * 300
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "300s",
        "tests": [
            {
                "interval": "60s",
                "input_series": sim.input_series(),
                "promql_expr_test": [
                    {
                        "expr": 'count(ALERTS{alertname="LlamaCppKVPoolUndersized", alertstate="firing"})',
                        "eval_time": f"{ahead}s",
                        "exp_samples": [{"labels": "{}", "value": 1}],
                    }
                ],
            }
        ],
    }
    _promtool_test(promtool_bin, tmp_path, tests)


def _promtool_test(promtool: Path, workdir: Path, tests: Mapping[str, object]) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "rules.yml").write_text(RULES.read_text(encoding="utf-8"), encoding="utf-8")
    (workdir / "t.test.yml").write_text(yaml.safe_dump(tests, width=1 << 30, sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [str(promtool), "test", "rules", "t.test.yml"], capture_output=True, text=True, timeout=900, cwd=workdir
    )
    assert out.returncode == 0 and "SUCCESS" in out.stdout, (out.stdout + out.stderr)[-6000:]


QUIET = 'ALERTS{alertname!="LlamaCppWatchdog"}'


@pytest.mark.promtool
@pytest.mark.parametrize(
    ("traffic", "evaluation"),
    [(True, 60), (False, 300)],
    ids=["a pool that holds its load", "a server nobody uses"],
)
def test_three_healthy_days_leave_every_alert_quiet(
    promtool_bin: Path, tmp_path: Path, traffic: bool, evaluation: int
) -> None:
    """Three days of agents and chat on a pool that holds them (conversations up to 40k tokens; idle
    nights), and a server nobody uses: no alert is even pending at any evaluation (ALERTS holds pending
    alerts too), and the Watchdog fires. At a 1 m scrape (a day's look-back at every 15 s evaluation for
    three days takes promtool minutes; the next test runs the busy morning at 15 s); the idle server's
    series are constant, so its evaluation every 5 m sees all there is."""
    scrape = 60
    sim = simulate(Scenario(seed=7, chat=traffic, traffic=traffic, conversation=(30_000, 40_000), scrape_s=scrape))
    assert not sim.aborts and (sim.requests > 1000) == traffic
    end = 3 * DAY - evaluation
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": f"{evaluation}s",
        "tests": [
            {
                "interval": f"{scrape}s",
                "input_series": sim.input_series(),
                "promql_expr_test": [
                    {"expr": f"count_over_time({QUIET}[{end}s])", "eval_time": f"{end}s", "exp_samples": []},
                    {
                        "expr": 'ALERTS{alertname="LlamaCppWatchdog"}',
                        "eval_time": f"{end}s",
                        "exp_samples": [
                            {
                                "labels": 'ALERTS{alertname="LlamaCppWatchdog", alertstate="firing", severity="none"}',
                                "value": 1,
                            }
                        ],
                    },
                ],
            }
        ],
    }
    _promtool_test(promtool_bin, tmp_path, tests)


#: A prompt cache in the pool (--no-cache-idle-slots): long documents asked about every few minutes, each
#: left in its slot, so idle slots hold 90 % of the pool most of the day and the nights.
DOCUMENTS = Scenario(
    seed=7, agents=0, chat=True, chat_per_second=1 / 300, documents=(60_000, 64_000), cache_idle_slots=False
)


@pytest.mark.promtool
@pytest.mark.parametrize("scrape", [15, 60], ids=["15s scrape", "1m scrape"])
def test_idle_slots_that_fill_the_pool_leave_every_alert_quiet(promtool_bin: Path, tmp_path: Path, scrape: int) -> None:
    """Three days of a server whose idle slots (the prompt cache of earlier documents) hold more than 90 % of
    the pool most of the day and the night (00:00-06:00 of days 2 and 3, a few requests): no alert is even pending at any evaluation (every minute: the page's conditions hold for
    at least two samples and its `for:` is 0, so one pending at any evaluation would be caught at a minute's
    grain too; its keep_firing_for would leave it firing 15 minutes)."""
    sim = simulate(dataclasses.replace(DOCUMENTS, scrape_s=scrape))
    usage = sim.series[f"llamacpp_kv_pool_usage_ratio{{{LABELS}}}"]
    full = sum(u > 0.9 for u in usage) / len(usage)
    night = [u for i, u in enumerate(usage) if i * scrape >= DAY and i * scrape % DAY < 6 * 3600]
    full_nights = sum(u > 0.9 for u in night) / len(night)
    assert not sim.aborts and full > 0.8 and full_nights > 0.8, (sim.aborts, full, full_nights)
    evaluation, end = 60, 3 * DAY - 60
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": f"{evaluation}s",
        "tests": [
            {
                "interval": f"{scrape}s",
                "input_series": sim.input_series(),
                "promql_expr_test": [
                    {"expr": f"count_over_time({QUIET}[{end}s])", "eval_time": f"{end}s", "exp_samples": []},
                ],
            }
        ],
    }
    _promtool_test(promtool_bin, tmp_path, tests)


@pytest.mark.promtool
def test_a_busy_day_that_the_pool_holds_leaves_every_alert_quiet_at_15s(promtool_bin: Path, tmp_path: Path) -> None:
    """The first busy morning of the pool that holds its load (the incident runs' span), at a 15 s scrape and
    evaluation: nothing pending."""
    sim = simulate(Scenario(seed=8, chat=True, days=1, conversation=(30_000, 40_000)))
    begin, end = SPAN
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": sim.input_series(begin, end),
                "promql_expr_test": [
                    {
                        "expr": f"count_over_time({QUIET}[{end - begin}s])",
                        "eval_time": f"{end - begin}s",
                        "exp_samples": [],
                    }
                ],
            }
        ],
    }
    _promtool_test(promtool_bin, tmp_path, tests)
