"""Which KV cells belong to conversations that are coming back: the slots processing now, and the idle slots
whose conversation ran a turn within the last window. Pure: the time comes in with each observation.

A coding agent's conversation is idle between its turns while the agent runs its tools (seconds to a minute),
then comes back with a longer prompt. Its slot stays idle meanwhile, so the requests in flight
(`exporter.model.forecast`'s demand) read 0.9, 0.4, 0.0, 0.9 ... of the pool while the conversations hold 95 %
of it: an overflow is as near as when they all process. Idle cells that no conversation has touched for
longer than the window (a prompt cache of yesterday's chats) are not at risk: llama-server frees idle slots
when it needs room. When another task's start clears an idle slot (`--cache-idle-slots`: saved to the host
prompt cache), its conversation still comes back and restores it, so the slot keeps counting the most it
held during its turn until the window has passed. When another task takes the slot, the conversation still
counts, on its own, until the window has passed or a slot whose task began since holds 90 % of it (it came
back, restored from the cache: counted there, not twice).

A turn is seen at a scrape either as the slot processing, or as its count of released tasks moved since the
previous scrape (a turn that began and ended between two scrapes). A slot seen for the first time while idle
has no known last turn and does not count.

    >>> from exporter.model.slot import SlotState
    >>> a = Activity()
    >>> a.observe(0.0, {0: SlotState(tokens=900, processing=True), 1: SlotState(tokens=500)}, 60)
    900
    >>> a.observe(30.0, {0: SlotState(tokens=1000, turns=1), 1: SlotState(tokens=500)}, 60)  # 0 runs its tools
    1000
    >>> a.observe(45.0, {0: SlotState(tokens=0, turns=1), 1: SlotState(tokens=700, turns=1)}, 60)  # 0 cleared, 1 ran
    1700
    >>> a.observe(100.0, {0: SlotState(tokens=0, turns=1), 1: SlotState(tokens=700, turns=1)}, 60)  # 0 gone quiet
    700
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.model.slot import SlotState

#: A conversation that left its slot is taken to be back when a slot whose task began since holds this share of it.
RETURNED = 0.9


@dataclass(frozen=True)
class _Turn:
    turns: int  # the slot's released tasks at the observation
    at: float | None  # when its last turn was seen running or ending (None: never)
    held: int  # the most it held since that turn began
    processing: bool = False
    since: float = 0.0  # when its current task was first seen


@dataclass(frozen=True)
class _Away:
    """A recent conversation whose slot another task took: it comes back to some slot, restored from the cache."""

    held: int
    at: float  # when its last turn ended
    left: float  # when its slot was seen running another task


class Activity:
    """Per server: each slot's last turn, and the recent conversations that lost their slot, kept across
    observations (one per scrape)."""

    def __init__(self) -> None:
        self._turns: dict[int, _Turn] = {}
        self._away: list[_Away] = []
        self._run: object | None = None

    def observe(self, now: float, slots: Mapping[int, SlotState], window: float, run: object | None = None) -> int:
        """The cells of the conversations in flight or coming back at `now` (seconds, any monotonic origin).

        `run` identifies the server process (`ServerState.run`, replaced at every start): a new one forgets the
        old process's turns."""
        if run is not self._run:
            self._turns.clear()
            self._away = []
            self._run = run
        total = 0
        turns: dict[int, _Turn] = {}
        away = [a for a in self._away if now - a.at <= window]
        for slot_id, s in slots.items():
            last = self._turns.get(slot_id)
            recent = last is not None and not last.processing and last.at is not None and now - last.at <= window
            if s.processing:
                started = last is None or not last.processing or s.turns != last.turns
                if started and recent and last is not None and last.held and last.at is not None:
                    away.append(_Away(last.held, last.at, now))  # the idle conversation lost its slot
                elif started and last is not None and last.processing and last.held and s.turns != last.turns:
                    away.append(_Away(last.held, now, now))  # its turn ended and another task took the slot
                since = now if started or last is None else last.since
                turn = _Turn(s.turns, now, s.tokens, processing=True, since=since)
                total += s.tokens
            elif last is not None and (last.processing or s.turns != last.turns):
                if not last.processing and recent and last.held and last.at is not None:
                    away.append(_Away(last.held, last.at, now))  # another turn ran in its slot between scrapes
                # A turn ended since the previous observation: it counts from now.
                held = max(s.tokens, last.held) if last.processing else s.tokens
                turn = _Turn(s.turns, now, held)
                total += held
            elif recent and last is not None:
                turn = _Turn(s.turns, last.at, max(s.tokens, last.held))
                total += turn.held
            else:
                turn = _Turn(s.turns, None if last is None else last.at, 0)
            turns[slot_id] = turn
        # A conversation that lost its slot and runs again in one (restored from the prompt cache) counts there.
        fresh = sorted((t for t in turns.values() if t.processing), key=lambda t: -t.held)
        kept: list[_Away] = []
        for a in sorted(away, key=lambda a: -a.held):
            back = next((t for t in fresh if t.since >= a.left and t.held >= RETURNED * a.held), None)
            if back is not None:
                fresh.remove(back)
            else:
                kept.append(a)
                total += a.held
        self._turns, self._away = turns, kept
        return total
