"""The KV pool forecast (exporter.model.forecast) against real b11434 logs and /slots snapshots.

Ground truth is the log's own `new prompt … task.n_tokens = N` lines: the prompt demand of the
requests in flight is the sum of their prompt sizes; at the default verbosity (those lines hidden)
the progress lines must estimate each size within 3 % from a slot's first progress line on.
"""

from __future__ import annotations

import json
import re

import pytest
from paths import B11434

from exporter.logs import events as ev
from exporter.logs.parse import normalize, parse_message
from exporter.model.forecast import forecast
from exporter.model.live import HttpSnapshot, parse_slots
from exporter.model.run import ServerRun
from exporter.model.slot import SlotState
from exporter.model.state import ServerState
from exporter.model.view import merge_view

FIXTURES = B11434
LV4_CAPTURES = sorted(p.name for p in FIXTURES.iterdir() if "lv4" in p.name)

_NEW_PROMPT = re.compile(r"^slot\s+\S+: id\s+(\d+) \| task (\d+) \| new prompt, .*task\.n_tokens = (\d+)")
_RELEASE = re.compile(r"^slot\s+\S+: id\s+(\d+) \| task \d+ \| stop processing")
_GENERATION = re.compile(r"^slot\s+\S+: id\s+(\d+) \| task \d+ \| n_gen =")
_LV4_ONLY = re.compile(r"\| (?:new prompt,|cached n_tokens =)")


def _messages(name: str) -> list[str]:
    return [normalize(line) for line in (FIXTURES / name / "llama-server.log").read_text().splitlines()]


@pytest.mark.parametrize("name", LV4_CAPTURES)
def test_prompt_demand_is_the_sum_of_the_prompts_in_flight(name: str) -> None:
    """After every `new prompt` line, prompt demand = the sum of task.n_tokens of the requests in flight."""
    state = ServerState()
    in_flight: dict[int, int] = {}  # slot -> task.n_tokens
    generating: set[int] = set()
    checked = 0
    for msg in _messages(name):
        e = parse_message(msg)
        if e is not None:
            state.apply(e)
        if m := _NEW_PROMPT.match(msg):
            in_flight[int(m[1])] = int(m[3])
            generating.discard(int(m[1]))
            if not generating:  # generated tokens would add to a slot's demand
                assert forecast(state).prompt_demand == sum(in_flight.values()), msg
                checked += 1
        elif m := _RELEASE.match(msg):
            in_flight.pop(int(m[1]), None)
            generating.discard(int(m[1]))
        elif m := _GENERATION.match(msg):
            generating.add(int(m[1]))
        if isinstance(e, ev.DecodeFailed):
            in_flight.clear()
        f = forecast(state)
        assert f.prompt_demand >= sum(in_flight.values()), msg
        assert f.max_demand >= max(f.prompt_demand, f.held)
    assert checked >= 1
    assert forecast(state).prompt_demand == sum(in_flight.values())


def test_a_generation_driven_overflow_shows_in_the_max_horizon_only() -> None:
    """exhaust-lv4: four 103-token prompts fit a 512-cell pool; their generation overflows it.

    The prompt horizon stays below the pool (no certain overflow: no page), the max horizon (no budget
    known: each slot's whole window) passes it before the first retry.
    """
    state = ServerState()
    first_over = first_retry = None
    for i, msg in enumerate(_messages("exhaust-lv4")):
        e = parse_message(msg)
        if e is None:
            continue
        state.apply(e)
        f = forecast(state)
        if first_retry is None:
            assert (f.ratio("prompt") or 0) <= 1, msg
        if first_over is None and (f.ratio("max") or 0) > 1:
            first_over = i
        if first_retry is None and isinstance(e, ev.KVRetry):
            first_retry = i
    assert first_over is not None and first_retry is not None
    assert first_over < first_retry


def test_progress_lines_size_a_prompt_within_3_percent_from_the_first_line() -> None:
    """longprompt-lv4 read as at the default verbosity (no `new prompt`/`cached` lines): X / P ≈ 47,729."""
    true_size = 47729
    state = ServerState()
    estimates = []
    for msg in _messages("longprompt-lv4"):
        if _LV4_ONLY.search(msg):
            continue
        e = parse_message(msg)
        if e is None:
            continue
        state.apply(e)
        if isinstance(e, ev.PromptProgress) and e.progress is not None:
            d = forecast(state)
            estimates.append(d.prompt_demand)
            assert d.sources()["progress"] == 1
    assert len(estimates) >= 5
    for est in estimates:
        assert abs(est - true_size) / true_size <= 0.03, estimates
    # Narrowed by every further line: the last estimate is the closest.
    assert abs(estimates[-1] - true_size) <= abs(estimates[0] - true_size)


def test_prompt_rate_is_the_current_speed_between_two_lines() -> None:
    s = SlotState(processing=True, task=1)
    line = "slot print_timing: id  0 | task 1 | prompt processing, n_tokens = {n}, progress = {p}, t = {t} s / {r} tokens per second"
    for n, p, t, r in ((2048, "0.10", "3.00", "682.67"), (4096, "0.20", "5.00", "819.20")):
        e = parse_message(line.format(n=n, p=p, t=t, r=r))
        assert isinstance(e, ev.PromptProgress)
        s.note_prompt_progress(e, n)
    assert s.prompt_rate == pytest.approx(2048 / 2.0)


def _pool(**slots: SlotState) -> ServerState:
    st = ServerState(
        run=ServerRun(n_slots=4, n_ctx_slot=1000, kv_cells=1000, kv_streams=1, kv_unified=True, build=11434)
    )
    st.run.slots = {int(k[1:]): v for k, v in slots.items()}
    return st


def test_idle_slots_are_left_out_and_unknown_sizes_count_what_they_hold() -> None:
    st = _pool(
        s0=SlotState(n_ctx=1000, tokens=600),  # idle, holding cached tokens: freed before a failure
        s1=SlotState(n_ctx=1000, tokens=100, processing=True, phase="prompt"),
    )
    f = forecast(st)
    assert (f.prompt_demand, f.held) == (100, 100)
    assert f.sources() == {"new_prompt": 0, "progress": 0, "held": 1}
    assert f.max_demand == 1000  # no budget known: the slot's whole window
    assert f.limits_demand == 100  # ... and at the limits clients set: only what it will hold after its prompt
    assert f.eta_seconds is None  # no speed known


def test_the_limits_horizon_counts_known_budgets_and_the_prompt_of_requests_without_one() -> None:
    """A default server (-np 4 -kvu: every slot's window is the whole pool) with two chat requests without
    max_tokens: at most they could fill two windows (max 2.0), at their limits they need their prompts; a
    request with a budget counts it, capped at its window; one generating past its prompt counts what it holds."""

    def chat(tokens: int) -> SlotState:
        return SlotState(
            n_ctx=1000, tokens=tokens, processing=True, phase="generation", prompt_size=150,
            prompt_size_source="new_prompt",
        )  # fmt: skip

    st = _pool(s0=chat(150), s1=chat(400))
    f = forecast(st)
    assert (f.prompt_demand, f.limits_demand, f.max_demand, f.unknown_budgets) == (150 + 400, 150 + 400, 2000, 2)
    st.run.slots[0].generation_budget = 300
    f = forecast(st)
    assert (f.limits_demand, f.max_demand) == (150 + 300 + 400, 450 + 1000)
    st.run.slots[0].generation_budget = 5000
    assert forecast(st).limits_demand == 1000 + 400


def test_old_unified_builds_keep_idle_cells() -> None:
    st = _pool(s0=SlotState(n_ctx=1000, tokens=600), s1=SlotState(n_ctx=1000, tokens=100, processing=True))
    st.run.build = 6000
    assert forecast(st).prompt_demand == 700


def test_eta_from_speeds_and_absent_when_the_requests_cannot_fill_the_pool() -> None:
    st = _pool(
        s0=SlotState(
            n_ctx=1000,
            tokens=200,
            processing=True,
            phase="prompt",
            prompt_size=500,
            prompt_size_source="new_prompt",
            prompt_rate=50.0,
            generation_budget=100,
        ),
        s1=SlotState(
            n_ctx=1000,
            tokens=300,
            processing=True,
            phase="generation",
            prompt_size=250,
            prompt_size_source="new_prompt",
            generation_rate=10.0,
            generation_budget=500,
        ),
    )
    f = forecast(st)
    assert (f.prompt_demand, f.max_demand) == (800, 500 + 100 + 300 + 500)
    assert f.fill_rate == 60.0
    assert f.eta_seconds == pytest.approx((1000 - 500) / 60.0)
    st.run.slots[1].generation_budget = 50  # now at most 600 + 350 = 950 < 1000: the pool never fills
    assert forecast(st).eta_seconds is None


def test_slots_endpoint_gives_the_generation_budget() -> None:
    """exhaust-long-lv4's /slots during the fill: n_remain per slot; max = held + n_remain, capped at n_ctx."""
    body = json.loads((FIXTURES / "exhaust-long-lv4" / "load-slots-04.json").read_text())
    live = parse_slots(body)
    state = ServerState(
        run=ServerRun(n_slots=4, n_ctx_slot=32768, kv_cells=32768, kv_streams=1, kv_unified=True, build=11434)
    )
    view = merge_view(state, HttpSnapshot(up=True, slots=live))
    f = forecast(view)
    assert f.unknown_budgets == 0
    expected = sum(min(32768, (s.tokens or 0) + (s.n_remain or 0)) for s in live if s.processing)
    assert f.max_demand == expected
    assert f.prompt_demand == sum(s.tokens or 0 for s in live if s.processing)


def test_a_cached_prefix_from_slots_corrects_the_progress_estimate() -> None:
    """P counts the cached prefix; at the default verbosity only /slots says how long it is."""
    state = ServerState(
        run=ServerRun(n_slots=1, n_ctx_slot=65536, kv_cells=65536, kv_streams=1, kv_unified=True, build=11434)
    )
    for line in (
        "slot launch_slot_: id  0 | task 7 | processing task, is_child = 0",
        "slot print_timing: id  0 | task 7 | prompt processing, n_tokens = 2048, progress = 0.61, "
        "t = 3.10 s / 660.65 tokens per second",
    ):
        e = parse_message(normalize(line))
        assert e is not None
        state.apply(e)
    assert forecast(state).prompt_demand == pytest.approx(2048 / 0.61, rel=0.01)  # the log alone: new tokens only
    live = parse_slots(
        [{"id": 0, "n_ctx": 65536, "is_processing": True, "id_task": 7, "n_prompt_tokens": 32000,
          "n_prompt_tokens_cache": 27904, "params": {"n_predict": 100},
          "next_token": [{"has_next_token": True, "n_remain": 100, "n_decoded": 0}]}]
    )  # fmt: skip
    f = forecast(merge_view(state, HttpSnapshot(up=True, slots=live)))
    assert f.prompt_demand == round((27904 + 2048) / 0.61)
    assert f.max_demand == f.prompt_demand + 100


def _stamp(line: str) -> float:
    minutes, seconds, ms, us = line.split(" ", 1)[0].split(".")
    return int(minutes) * 60 + int(seconds) + int(ms) / 1e3 + int(us) / 1e6


def test_a_real_prompt_driven_overflow_is_foreseen_with_a_right_eta() -> None:
    """prompt-overflow-lv4: four ~9,000-token prompts read one after another into a 32,768-cell pool.

    Each slot's `new prompt` line comes at its turn; the earlier prompts are then complete (their
    last batch is never printed), the demand passes the pool at the fourth, and the ETA from the
    server's own prompt speed matches the time that was really left to the abort.
    """
    lines = (FIXTURES / "prompt-overflow-lv4" / "llama-server.log").read_text().splitlines()
    abort = _stamp(next(line for line in lines if "Context size has been exceeded" in line))
    state = ServerState()
    sizes: list[int] = []
    over_at = eta_checked = None
    for line in lines:
        e = parse_message(normalize(line))
        if e is None:
            continue
        state.apply(e)
        f = forecast(state)
        if isinstance(e, ev.NewPrompt):
            sizes.append(e.n_prompt_tokens)
            assert f.prompt_demand == sum(sizes)  # the earlier prompts are complete
            assert f.held == sum(sizes[:-1])
        if over_at is None and (f.ratio("prompt") or 0) > 1:
            over_at = _stamp(line)
        eta = f.eta_seconds
        if eta_checked is None and f.held >= POOL_CELLS / 2 and eta is not None:
            left = abort - _stamp(line)
            assert abs(eta - left) <= 0.25 * left, (eta, left)
            eta_checked = left
    assert len(sizes) == 4 and sum(sizes) > POOL_CELLS
    assert over_at is not None
    assert abort - over_at >= 10, abort - over_at
    assert eta_checked is not None


POOL_CELLS = 32768
