"""The last incidents of one server, as a person reads them: what happened, and the figures to act on. Pure.

An incident is one of:

- `overflow`: the pool overflowed (`Context size has been exceeded`, or another fatal decode error) and llama-server
  aborted every request in flight; the cells each aborted slot held come from its release line
  (`stop processing: n_tokens = N`), the largest holder is the slot that held most;
- `cascade_recovered`: a retry cascade (batch halving) that ended with work going on;
- `crash`: a server run that ended without its exit line, with the cause its log named (`unknown`: none);
- `restart`: a new server process after one that had started.

The handlers (`exporter.model.handlers`) and `ServerState` feed the record while they count (the replay of an
existing log counts nothing, and records nothing either: the record and the counters agree). The model has no
clock: `stamp(now)` gives the incidents recorded since the last call the time the caller read (the pipeline
calls it after each batch it applied). An incident is `open` while its figures may still grow (an overflow's
aborted slots not all released yet: it settles when the server says the decode failed for all, every slot is
idle, or new work starts). Bounded: the last `MAX_INCIDENTS`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

#: Incidents kept per server (older ones are dropped; the counters still count them).
MAX_INCIDENTS = 20

#: The kinds of incident, in the words a person reads.
KINDS = {
    "overflow": "pool overflow",
    "cascade_recovered": "retry cascade recovered",
    "crash": "crash",
    "restart": "restart",
}


@dataclass(frozen=True)
class Incident:
    """One incident and its figures (frozen: a view holds a tuple of them)."""

    seq: int  # 1, 2, … per server, in order
    kind: str  # a key of KINDS
    time: float | None = None  # seconds since the epoch when the exporter read it (`Incidents.stamp`)
    open: bool = False  # its figures may still grow
    aborted: int = 0  # requests aborted (`send_error` lines)
    reason: str | None = None  # an overflow's decode failure reason; a crash's cause
    retries: int = 0  # `retrying with smaller batch size` lines in its cascade
    slots: tuple[tuple[int, int], ...] = ()  # (slot, cells held): released cells for an overflow, else held
    pool: int | None = None  # the pool's cells
    used: int | None = None  # cells held by all slots when it began

    @property
    def largest(self) -> tuple[int, int] | None:
        """(slot, cells) of the slot that held most, if any held cells."""
        held = [s for s in self.slots if s[1] > 0]
        return max(held, key=lambda s: (s[1], -s[0])) if held else None

    @property
    def held(self) -> int:
        """Cells the incident's slots held together."""
        return sum(cells for _, cells in self.slots)

    def summary(self) -> str:
        """The incident in one line with its figures, e.g. `pool overflow: 4 requests aborted; slots held 0: 8192,
        1: 8192, 2: 8193, 3: 8192 (32769 cells, pool 32768); largest holder slot 2 (8193 cells)`."""
        words = KINDS.get(self.kind, self.kind)
        parts: list[str] = []
        if self.kind == "overflow":
            parts.append(f"{self.aborted} request{'s' if self.aborted != 1 else ''} aborted")
            if self.reason and self.reason != "context_exceeded":
                parts.append(self.reason.replace("_", " "))
        elif self.kind == "crash":
            parts.append(f"cause {self.reason or 'unknown'}")
        if self.retries:
            parts.append(f"{self.retries} retr{'ies' if self.retries != 1 else 'y'}")
        if self.slots:
            cells = ", ".join(f"{slot}: {n}" for slot, n in self.slots)
            pool = f", pool {self.pool}" if self.pool else ""
            what = "released" if self.kind == "overflow" else "held"
            parts.append(f"slots {what} {cells} ({self.held} cells{pool})")
        elif self.pool:
            parts.append(f"pool {self.pool} cells")
        largest = self.largest
        if largest is not None and len(self.slots) > 1:
            parts.append(f"largest holder slot {largest[0]} ({largest[1]} cells)")
        return words + (": " + "; ".join(parts) if parts else "")


class _Entry:
    """An incident while the record holds it: mutable, so a line that adds to it costs an attribute's update."""

    __slots__ = ("aborted", "kind", "open", "pool", "reason", "retries", "seq", "slots", "time", "used")

    def __init__(
        self,
        seq: int,
        kind: str,
        *,
        open: bool = False,
        reason: str | None = None,
        retries: int = 0,
        slots: dict[int, int] | None = None,
        pool: int | None = None,
        used: int | None = None,
    ) -> None:
        self.seq, self.kind, self.open, self.reason, self.retries = seq, kind, open, reason, retries
        self.slots: dict[int, int] = slots or {}
        self.pool, self.used = pool, used
        self.time: float | None = None
        self.aborted = 0

    def frozen(self) -> Incident:
        slots = tuple(sorted(self.slots.items()))
        return Incident(
            self.seq,
            self.kind,
            self.time,
            self.open,
            self.aborted,
            self.reason,
            self.retries,
            slots,
            self.pool,
            self.used,
        )


class Incidents:
    """The last incidents of one server (bounded), the newest last."""

    def __init__(self, limit: int = MAX_INCIDENTS) -> None:
        self._items: deque[_Entry] = deque(maxlen=limit)
        self.seq = 0  # incidents recorded so far (also those dropped)
        self.changes = 0  # changes to the record so far: a reader that saw this many has nothing new to read
        self._unstamped = 0  # the newest this many have no time yet
        self._cascade_retries = 0
        self._frozen: tuple[int, tuple[Incident, ...]] = (0, ())  # `all()` at `changes`

    # -- what the handlers tell ---------------------------------------------------------------
    def retry(self) -> None:
        """A `retrying with smaller batch size` line: counted into the cascade's incident."""
        self._cascade_retries += 1

    def cascade_recovered(self, slots: Mapping[int, int], pool: int | None) -> None:
        """A cascade ended with work going on: the slots' cells (`slot → cells`) when it ended."""
        self._close_open()
        held = {s: n for s, n in slots.items() if n > 0}
        self._add("cascade_recovered", retries=self._cascade_retries, slots=held, pool=pool, used=sum(slots.values()))
        self._cascade_retries = 0

    def overflow(self, reason: str, slots: Mapping[int, int], pool: int | None) -> None:
        """A fatal decode error: every request in flight is aborted (their send_error and release lines follow)."""
        if self._last_open("overflow") is not None:  # b9752+ says it twice (`decode: …`, `decode() failed: …`)
            return
        self._close_open()
        self._add(
            "overflow", open=True, reason=reason, retries=self._cascade_retries, pool=pool, used=sum(slots.values())
        )
        self._cascade_retries = 0

    def aborted(self, reason: str, pool: int | None) -> None:
        """A `send_error` for a fatal reason: one more request aborted (an overflow opened if none is)."""
        last = self._last_open("overflow")
        if last is None:
            self.overflow(reason, {}, pool)
            last = self._items[-1]
        last.aborted += 1
        self.changes += 1

    def released(self, slot: int, cells: int) -> None:
        """An aborted request's slot released `cells` (its release line)."""
        last = self._last_open("overflow")
        if last is not None:
            last.slots[slot] = cells
            self.changes += 1

    def crash(self, cause: str, pool: int | None) -> None:
        """A run ended without its exit line, with the cause its log named."""
        self._close_open()
        self._add("crash", reason=cause, pool=pool)

    def restart(self) -> None:
        """A new server process replaced one that had started."""
        self._close_open()
        self._cascade_retries = 0
        self._add("restart")

    def settle(self) -> None:
        """New work started, every slot is idle, or the server said the decode failed for all: an overflow's
        figures are final."""
        if self._items and self._items[-1].open:
            self._close_open()

    # -- what readers see ---------------------------------------------------------------------
    def stamp(self, now: float) -> int:
        """Give the incidents recorded since the last call the time `now`; returns how many."""
        n = min(self._unstamped, len(self._items))
        if n:
            self._unstamped = 0
            for k in range(1, n + 1):
                self._items[-k].time = now
            self.changes += 1
        return n

    def settled_after(self, seq: int) -> list[Incident]:
        """The settled incidents after the one numbered `seq`, up to the first still open, oldest first."""
        out: list[Incident] = []
        for e in reversed(self._items):
            if e.seq <= seq:
                break
            if e.open:
                out.clear()  # a later one waits for this one: in order
                continue
            out.append(e.frozen())
        out.reverse()
        return out

    def all(self) -> tuple[Incident, ...]:
        """The incidents kept, oldest first (made once per change to the record)."""
        at, out = self._frozen
        if at != self.changes or len(out) != len(self._items):
            out = tuple(e.frozen() for e in self._items)
            self._frozen = (self.changes, out)
        return out

    def __len__(self) -> int:
        return len(self._items)

    # -- inside -------------------------------------------------------------------------------
    def _add(
        self,
        kind: str,
        *,
        open: bool = False,
        reason: str | None = None,
        retries: int = 0,
        slots: dict[int, int] | None = None,
        pool: int | None = None,
        used: int | None = None,
    ) -> None:
        self.seq += 1
        entry = _Entry(self.seq, kind, open=open, reason=reason, retries=retries, slots=slots, pool=pool, used=used)
        self._items.append(entry)
        self.changes += 1
        self._unstamped += 1

    def _last_open(self, kind: str) -> _Entry | None:
        last = self._items[-1] if self._items else None
        return last if last is not None and last.open and last.kind == kind else None

    def _close_open(self) -> None:
        if self._items and self._items[-1].open:
            self._items[-1].open = False
            self.changes += 1
