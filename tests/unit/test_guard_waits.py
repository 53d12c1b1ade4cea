"""The guard's pure rules for waiting and seeing: the queue's one clock, the predicted wait, the retry budget,
unknown budgets counted as windows while the slots cannot be seen in time, and the horizon that follows the lag."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from exporter.guard import preempt
from exporter.guard.admission import RETRY_AFTER_MAX, Admission, Pool, RetryBudget, Speed, Ticket
from exporter.guard.preempt import Sight
from exporter.guard.proxy import GuardSettings

SHARED = Pool(capacity=1000, slot_window=1000, unified=True)


def unknown(i: int, prompt: int = 100, budget: int = 100) -> Ticket:
    t = Ticket(i, prompt=prompt, budget=budget)
    t.budget_known = False
    return t


def test_cautious_books_count_unknown_budgets_as_windows_and_let_them_in_again_after() -> None:
    a = Admission(max_queue=10, max_wait=60)
    pool = Pool(capacity=1000, slot_window=500, unified=True)
    assert a.offer(unknown(1), pool, 0).kind == "admit"
    assert a.offer(Ticket(2, prompt=100, budget=100), pool, 0).kind == "admit"
    assert a.demand == 400
    assert a.set_cautious(True, pool, 1) == []
    assert a.in_flight[1].demand == 500 and a.in_flight[2].demand == 200  # a known budget stays as given
    # A third unknown one would fit as given (600), not as its window (900 + 500): it waits.
    assert a.offer(unknown(3), pool, 1).kind == "queue"
    assert [t.id for t in a.set_cautious(False, pool, 2)] == [3]
    assert a.demand == 600


def test_a_request_that_overran_its_budget_counts_its_window_for_good() -> None:
    a = Admission(max_queue=10, max_wait=60)
    pool = Pool(capacity=1000, slot_window=600, unified=True)
    a.offer(Ticket(1, prompt=100, budget=50), pool, 0)
    a.overran(a.in_flight[1], pool)
    assert a.in_flight[1].demand == 600
    assert a.offer(Ticket(2, prompt=300, budget=200), pool, 0).kind == "queue"
    a.set_cautious(True, pool, 1)
    a.set_cautious(False, pool, 2)
    assert a.in_flight[1].demand == 600


def test_the_queue_has_one_clock_from_the_first_wait_and_a_fresh_one_after_admission() -> None:
    a = Admission(max_queue=10, max_wait=30)
    t = Ticket(2, prompt=900, budget=100)
    assert a.deadline(t, now=5.0) == 35.0  # it began waiting (for llama-server to be ready) at 5
    a.offer(Ticket(1, prompt=900, budget=100), SHARED, 6.0)
    assert a.offer(t, SHARED, 10.0).kind == "queue"
    assert a.deadline(t, now=11.0) == 35.0  # the queue's wait continues the same clock
    assert not a.timed_out(t, 34.9) and a.timed_out(t, 35.0)  # what the guard's waits for the server read
    assert a.expired(34.9) == [] and a.expired(35.0) == [t]
    a.offer(t, SHARED, 40.0)
    a.release(1, SHARED, 41.0)
    assert t.id in a.in_flight and t.queued_at is None
    assert a.deadline(t, now=50.0) == 80.0


def test_a_wait_predicted_past_the_timeout_is_refused_at_once_with_a_short_retry_after() -> None:
    a = Admission(max_queue=10, max_wait=60)
    a.offer(Ticket(1, prompt=500, budget=400), SHARED, 0)  # generates 400 tokens at 4/s: ends in 100 s
    speed = Speed(rate=4.0, ends_in={1: 100.0})
    d = a.offer(Ticket(2, prompt=500, budget=100), SHARED, 0, speed)
    assert (d.kind, d.status, d.retry_after) == ("refuse", 503, 40)  # back when its wait would fit the timeout
    assert "about 100 s" in d.reason and "60 s" in d.reason
    assert not a.queue
    # Within the timeout, or without a measured speed, it waits as before.
    assert a.offer(Ticket(3, prompt=500, budget=100), SHARED, 0, Speed(rate=4.0, ends_in={1: 50.0})).kind == "queue"
    assert a.offer(Ticket(4, prompt=500, budget=100), SHARED, 0, Speed(rate=0.0)).kind == "queue"


def test_the_predicted_wait_follows_the_queue_first_in_first_out() -> None:
    a = Admission(max_queue=10, max_wait=1e9)
    a.offer(Ticket(1, prompt=300, budget=200), SHARED, 0)  # 500 cells
    a.offer(Ticket(2, prompt=300, budget=100), SHARED, 0)  # 400 cells
    a.offer(Ticket(3, prompt=500, budget=100), SHARED, 0)  # waits: 600 cells
    speed = Speed(rate=10.0, ends_in={1: 20.0, 2: 5.0})
    # Ticket 3 goes in when 2 ends (5 s: 500 + 600 > 1000, so when 1 ends too: 20 s); it then runs 10 s.
    assert a.predicted_wait(Ticket(4, prompt=100, budget=0), SHARED, 0, speed) == 20.0
    assert a.predicted_wait(Ticket(5, prompt=300, budget=100), SHARED, 0, speed) == 20.0  # 600 + 400 fit
    assert a.predicted_wait(Ticket(6, prompt=450, budget=100), SHARED, 0, speed) == 30.0  # then 3 must end too
    # A request the slots do not show yet: its whole budget at the measured speed, from its admission.
    b = Admission(max_queue=10, max_wait=1e9)
    b.offer(Ticket(1, prompt=500, budget=400), SHARED, 10.0)
    assert b.predicted_wait(Ticket(2, prompt=600, budget=0), SHARED, 30.0, Speed(rate=10.0)) == 20.0


def test_retry_after_never_passes_a_minute() -> None:
    a = Admission(max_queue=0, max_wait=300)
    a.offer(Ticket(1, prompt=900, budget=100), SHARED, 0)
    d = a.offer(Ticket(2, prompt=900, budget=100), SHARED, 0)
    assert (d.status, d.retry_after) == (429, RETRY_AFTER_MAX) and RETRY_AFTER_MAX == 60
    assert Admission(max_queue=1, max_wait=5).retry_after() == 5


def test_the_retry_budget_is_a_floor_plus_a_share_of_the_requests_sent() -> None:
    b = RetryBudget(ratio=0.2, floor=3, window=60.0)
    assert [b.allow(0.0) for _ in range(4)] == [True, True, True, False]  # a crash loop with no traffic: the floor
    for _ in range(20):
        b.sent(1.0)
    assert [b.allow(2.0) for _ in range(5)] == [True] * 4 + [False]  # 3 + 20 % of 20 = 7 in all
    assert [b.allow(61.0) for _ in range(4)] == [True] * 3 + [False]  # the first 3 left the window, the 20 did not
    assert [b.allow(130.0) for _ in range(4)] == [True, True, True, False]  # all left: the floor again


@pytest.mark.parametrize(
    ("lags", "horizon", "blind"), [([], 3.5, False), ([0.05, 0.2], 3.9, False), ([2.0], 7.5, True)]
)
def test_the_horizon_follows_the_observation_lag(lags: list[float], horizon: float, blind: bool) -> None:
    s = Sight(horizon_base=3.5, blind_after=1.0)
    for lag in lags:
        s.saw(lag)
    assert (round(s.horizon, 3), s.blind) == (horizon, blind)


def test_the_docs_give_preemptions_own_figures() -> None:
    """docs/guard.md's preemption section states how often the guard reads `/slots`, how far ahead and at what
    multiple of the speed it projects, when it is blind and how long it stays silent: the settings' own values."""
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "guard.md").read_text(encoding="utf-8").split())
    defaults = {f.name: f.default for f in dataclasses.fields(GuardSettings)}
    figures = {
        r"reads `/slots` about every ([\d.]+) s": defaults["poll_interval"],
        r"projects each slot ([\d.]+) s ahead": defaults["horizon"],
        r"a slot that generates at (\d+) times the speed measured": preempt.SURGE,
        r"\*\*(\w+) times the measured speed\*\*": preempt.SURGE,
        r"within the horizon \(([\d.]+) s plus twice the lag": defaults["horizon"],
        r"at (\d+) times the generation speed it last measured": preempt.SURGE,
        r"While its reads lag ([\d.]+) s or more": defaults["blind_after"],
        r"stays silent for ([\d.]+) s after a stop": defaults["quiet"],
    }
    words = {"Three": 3.0}
    for pattern, value in figures.items():
        found = re.findall(pattern, text)
        assert found, pattern
        assert all(float(words.get(x, x)) == value for x in found), (pattern, found, value)
