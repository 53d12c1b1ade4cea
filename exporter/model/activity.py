"""Which KV cells belong to conversations that are coming back: the slots processing now, and the idle slots
whose conversation ran a turn within the last window. Pure: the time comes in with each observation.

A coding agent's conversation is idle between its turns while the agent runs its tools (seconds to a minute),
then comes back with a longer prompt. Its slot stays idle meanwhile, so the requests in flight
(`exporter.model.forecast`'s demand) read 0.9, 0.4, 0.0, 0.9 ... of the pool while the conversations hold 95 %
of it: an overflow is as near as when they all process. Idle cells that no conversation has touched for
longer than the window (a prompt cache of yesterday's chats) are not at risk: llama-server frees idle slots
when it needs room. When another task's start saves an idle slot to the prompt cache and clears it
(`--cache-idle-slots`), or another task takes the slot, its conversation counts on its own until the window
has passed or it comes back: in whichever slot llama-server gives it (at the default verbosity each turn
takes the least recently used one), restored from the cache. A turn that began since took it back when the
cells it reused are the conversation's (90-100 % of it: the release line's n_tokens less what its timings
counted); where that is not told, when it holds 90 % of it. Each conversation counts once, at its latest
size: agents whose turns hop from slot to slot are neither counted twice nor left at an old size.

A turn is seen at a scrape either as the slot processing, or as its count of released tasks moved since the
previous scrape (a turn that began and ended between two scrapes, its size from its release line). A slot seen
for the first time while idle has no known last turn and does not count.

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
from dataclasses import dataclass, replace

from exporter.model.slot import SlotState

#: A conversation that left its slot is taken to be back when a turn that began since reused between this share
#: of it and all of it, or (where the log does not tell what a turn reused) holds this share of it.
RETURNED = 0.9


@dataclass(frozen=True)
class _Turn:
    turns: int  # the slot's released tasks at the observation
    at: float | None = None  # when its last turn was seen running or ending (None: never)
    held: int = 0  # the most it held since that turn began
    processing: bool = False
    since: float = 0.0  # when its current task was first seen
    back: bool = False  # the turn took the place of a conversation that had lost its slot
    reused: int | None = None  # the cells its task found in place or restored from the cache, when told


@dataclass(frozen=True)
class _Away:
    """A recent conversation gone from its slot (another task took it, or a start cleared it to the prompt cache):
    it comes back to some slot, restored from the cache."""

    held: int
    at: float  # when its last turn ended
    left: float  # when it was seen gone


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
        ran: list[int] = []  # slots whose turn ran since the previous observation: where a conversation comes back
        for slot_id, s in slots.items():
            last = self._turns.get(slot_id)
            if last is None:  # first seen: only a turn running now is known to be a conversation's
                turn = _Turn(s.turns, now, s.tokens, processing=True, since=now) if s.processing else _Turn(s.turns)
            else:
                turn = self._next(now, s, last, window, away)
            if turn.processing or turn.at == now:
                ran.append(slot_id)
            total += turn.held
            turns[slot_id] = turn
        # A conversation that lost its slot and runs again in one (restored from the prompt cache) counts there;
        # a turn takes the place of one such conversation at most.
        fresh = sorted((i for i in ran if not turns[i].back), key=lambda i: -turns[i].held)
        for i in [i for i in fresh if turns[i].reused]:
            # The cells it reused are the conversation it continues: the one that held them, or just more.
            t, reused = turns[i], turns[i].reused or 0
            fits = [a for a in away if a.left <= t.since and a.held >= reused >= RETURNED * a.held]
            if fits:
                away.remove(min(fits, key=lambda a: a.held))
                fresh.remove(i)
                turns[i] = replace(t, back=True)
        kept: list[_Away] = []
        for a in sorted(away, key=lambda a: -a.held):
            back = next((i for i in fresh if turns[i].since >= a.left and turns[i].held >= RETURNED * a.held), None)
            if back is not None:
                fresh.remove(back)
                turns[back] = replace(turns[back], back=True)
            else:
                kept.append(a)
                total += a.held
        self._turns, self._away = turns, kept
        return total

    @staticmethod
    def _next(now: float, s: SlotState, last: _Turn, window: float, away: list[_Away]) -> _Turn:
        """The slot's turn at `now` after `last`; the conversations that left the slot since are added to `away`."""
        ended = s.turns - last.turns  # turns released since the previous observation
        # The turn seen running then is the one running now, or the one that ended since, alone.
        same = last.processing and ended == (0 if s.processing else 1)
        if not same:
            if last.processing and last.held:  # its turn ended and another ran in the slot since
                away.append(_Away(max(last.held, s.last_turn) if ended == 1 else last.held, now, now))
            elif last.held and last.at is not None and now - last.at <= window and (ended or s.processing):
                away.append(_Away(last.held, last.at, now))  # the idle conversation's slot went to another turn
            between = ended - 1 if last.processing else ended  # turns that began and ended between the two
            if s.processing and between and s.last_turn:
                away.append(_Away(s.last_turn, now, now))  # the last of them lost the slot to the turn running now
        since, back = (last.since, last.back) if same else (now, False)
        if s.processing:
            return _Turn(s.turns, now, s.tokens, processing=True, since=since, back=back, reused=s.cache_base)
        if ended:  # a turn ended since the previous observation: it counts from now
            held = max(s.tokens, s.last_turn, last.held if same else 0)
            return _Turn(s.turns, now, held, since=since, back=back, reused=s.last_reused)
        if last.at is None or now - last.at > window:
            return _Turn(s.turns, last.at)
        if last.held and not s.tokens:
            # Another task's start saved the idle slot to the prompt cache and cleared it: its conversation comes
            # back to whichever slot llama-server gives it, restored from the cache.
            away.append(_Away(last.held, last.at, now))
            return _Turn(s.turns, last.at, 0, since=last.since)
        return _Turn(s.turns, last.at, max(s.tokens, last.held), since=last.since, back=last.back)
