"""Event kinds declare what they are once (`TRAITS`, and a `slot` field); the sets the model and `diagnose`
test are derived from that, and every kind that names a slot is bounded."""

from __future__ import annotations

import pytest

from exporter.logs import events as ev
from exporter.logs.event_class import NO_TRAITS, Traits, carries_slot, event, traits
from exporter.model.bounds import CHECKS, MAX_SLOTS
from exporter.model.run import ServerRun


def test_every_kind_that_names_a_slot_is_bounded_by_the_runs_slots() -> None:
    run = ServerRun()
    run.n_slots = 2
    assert ev.SLOT_KINDS and set(CHECKS) >= ev.SLOT_KINDS
    # TimingsHead has no bound of its own: it gets the slot bound all the same.
    check = CHECKS[ev.TimingsHead]
    assert check(run, ev.TimingsHead(slot=1, task=7)) and not check(run, ev.TimingsHead(slot=2, task=7))
    run.n_slots = None
    assert check(run, ev.TimingsHead(slot=MAX_SLOTS - 1, task=7)) and not check(run, ev.TimingsHead(MAX_SLOTS, 7))


def test_a_new_kind_that_names_a_slot_is_a_slot_kind_without_saying_so() -> None:
    @event
    class Hypothetical:
        slot: int

    assert traits(Hypothetical) is NO_TRAITS
    assert carries_slot(Hypothetical) and not carries_slot(ev.KVRetry)


def test_the_derived_sets_hold_together() -> None:
    assert ev.TASK_LINES <= ev.PROGRESS  # a task's progress line keeps diagnose's run current too
    assert not ev.DEMAND_GROWS & ev.DEMAND_SHRINKS
    assert {ev.SlotReleased, ev.RequestError} <= ev.ABORT_TRAIL and ev.DecodeFatal not in ev.ABORT_TRAIL
    assert ev.SlotReleased in ev.DEMAND_SHRINKS and ev.NewPrompt in ev.DEMAND_GROWS
    assert all(isinstance(traits(k), Traits) for k in ev.KINDS) and len(ev.KINDS) == len(
        set(ev.__all__) & {k.__name__ for k in ev.KINDS}
    )


def test_every_event_class_of_a_family_is_a_kind_and_exported() -> None:
    """A class written in a family's module is in that family's union (so in `Event` and `KINDS`, and in
    the sets derived from its traits) and in its `__all__` (so `ev.` names it): forgetting either fails here."""
    families = (ev.lifecycle, ev.slot, ev.cache, ev.errors, ev.router)
    written = {
        obj
        for family in families
        for obj in vars(family).values()
        if isinstance(obj, type) and obj.__module__ == family.__name__ and "TRAITS" in obj.__dict__
    }
    assert len(written) > 50 and written == ev.KINDS
    for family in families:
        mine = {k for k in written if k.__module__ == family.__name__}
        assert {k.__name__ for k in mine} <= set(family.__all__), family.__name__
        assert all(getattr(ev, k.__name__) is k for k in mine)


def test_traits_must_be_traits() -> None:
    with pytest.raises(TypeError, match="TRAITS must be a Traits"):

        @event
        class Wrong:
            TRAITS = ("series", True)
