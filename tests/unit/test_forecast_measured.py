"""The forecast with the requests the guard measured at arrival (exporter.model.forecast, `Measured`).

At the default verbosity the log sizes a prompt only with its second batch; the guard counted it with the
server's tokenizer before sending it. These tests pin how the two are combined: never counted twice,
never less than either says, requests that bypass the guard still counted.
"""

from __future__ import annotations

import random

from exporter.model.forecast import Measured, forecast
from exporter.model.run import ServerRun
from exporter.model.slot import SlotState
from exporter.model.state import ServerState


def _pool(slots: int = 4, **by_slot: SlotState) -> ServerState:
    """`slots` slots of a 4,096-cell shared pool, each one's window the whole pool."""
    st = ServerState(run=ServerRun(n_slots=slots, n_ctx_slot=4096, kv_cells=4096, kv_unified=True))
    st.run.slots = {int(k[1:]): v for k, v in by_slot.items()}
    return st


def reading(held: int) -> SlotState:
    """A slot reading its prompt at the default verbosity, before any progress line: only what it holds."""
    return SlotState(n_ctx=4096, tokens=held, processing=True, phase="prompt")


def test_a_measured_prompt_counts_at_once_where_the_log_knows_only_what_the_slot_holds() -> None:
    st = _pool(s0=reading(512))
    assert forecast(st).prompt_demand == 512
    f = forecast(st, [Measured(prompt=3000, budget=200)])
    # The slot's own budget is not known (no /slots here): at most it may fill its window, whoever runs in it.
    assert (f.prompt_demand, f.limits_demand, f.max_demand) == (3000, 3200, 4096)
    st.run.slots[0].generation_budget = 200  # /slots says it
    f = forecast(st, [Measured(prompt=3000, budget=200)])
    assert (f.prompt_demand, f.limits_demand, f.max_demand) == (3000, 3200, 3200)
    # Without a budget: at most its slot's window, at the clients' limits its prompt.
    f = forecast(st, [Measured(prompt=3000, budget=None)])
    assert (f.prompt_demand, f.limits_demand, f.max_demand) == (3000, 3000, 4096)
    assert f.ratio("prompt") == 3000 / 4096


def test_a_request_not_yet_in_a_slot_counts_too() -> None:
    """The log has not said the slot started (it is read a moment later): the measured request counts."""
    f = forecast(_pool(), [Measured(prompt=2500, budget=10)])
    assert (f.prompt_demand, f.max_demand) == (2500, 2510)


def test_a_size_the_log_gives_exactly_is_not_counted_twice() -> None:
    exact = SlotState(
        n_ctx=4096, tokens=100, processing=True, phase="prompt", prompt_size=3000, prompt_size_source="new_prompt"
    )
    st = _pool(s0=exact, s1=reading(40))
    f = forecast(st, [Measured(prompt=3000, budget=0), Measured(prompt=700, budget=0)])
    assert f.prompt_demand == 3000 + 700  # slot 0 is the 3,000 one; the 700 one runs in slot 1


def test_once_the_log_says_more_the_log_is_kept() -> None:
    """A slot generating past its prompt holds more than the measured prompt: the log's figure stands."""
    generating = SlotState(n_ctx=4096, tokens=3500, processing=True, phase="generation")
    f = forecast(_pool(s0=generating), [Measured(prompt=3000, budget=None)])
    assert f.prompt_demand == 3500 and f.beyond_log[0] == 0


def test_slots_that_bypass_the_guard_still_count() -> None:
    """Three slots the log has not sized, two measured requests: at least one slot runs a request that
    bypassed the guard; the smallest of the three counts on top of the two measured."""
    st = _pool(s0=reading(300), s1=reading(200), s2=reading(100))
    f = forecast(st, [Measured(prompt=1500, budget=0), Measured(prompt=1000, budget=0)])
    assert f.prompt_demand == 1500 + 1000 + 100


def test_no_more_measured_requests_count_than_slots_can_run() -> None:
    """Five measured requests and two slots: two run at once; the two largest count."""
    st = _pool(slots=2, s0=reading(10), s1=reading(10))
    measured = [Measured(prompt=p, budget=0) for p in (100, 900, 300, 700, 500)]
    assert forecast(st, measured).prompt_demand == 900 + 700


def test_several_prompts_in_one_request_take_as_many_slots() -> None:
    st = _pool(slots=2)
    f = forecast(st, [Measured(prompt=1000, budget=100, tasks=2), Measured(prompt=2000, budget=0)])
    assert f.prompt_demand == 2000  # the two-task request does not fit the one slot left: it waits
    f = forecast(_pool(slots=3), [Measured(prompt=1000, budget=100, tasks=2)])
    assert (f.prompt_demand, f.max_demand) == (1000, 1100)


def test_measured_requests_never_lower_the_demand_nor_raise_it_past_their_sum() -> None:
    rng = random.Random(7)
    for _ in range(500):
        slots: dict[str, SlotState] = {}
        for i in range(rng.randint(0, 4)):
            if rng.random() < 0.3:
                size = rng.randint(1, 3000)
                slots[f"s{i}"] = SlotState(
                    n_ctx=4096, tokens=rng.randint(0, size), processing=True, phase="prompt",
                    prompt_size=size, prompt_size_source="new_prompt",
                )  # fmt: skip
            else:
                slots[f"s{i}"] = reading(rng.randint(0, 3000))
        st = _pool(4, **slots)
        measured = [
            Measured(rng.randint(1, 3000), rng.choice([None, rng.randint(0, 500)])) for _ in range(rng.randint(0, 5))
        ]
        plain, with_measured = forecast(st), forecast(st, measured)
        for horizon in ("prompt", "limits", "max"):
            assert plain.demand(horizon) <= with_measured.demand(horizon)
            assert with_measured.demand(horizon) <= plain.demand(horizon) + sum(
                m.demand(horizon, 4096) for m in measured
            )
        assert with_measured.prompt_demand <= with_measured.limits_demand <= with_measured.max_demand


def test_docstring() -> None:
    import doctest

    from exporter.model import forecast as forecast_module

    assert doctest.testmod(forecast_module).failed == 0
