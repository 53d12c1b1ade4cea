"""Admission: which sized request may go to llama-server now, which waits, which is refused. Pure.

The books hold the demand of every request the guard has sent and not yet seen end: its prompt tokens
plus its generation budget, capped at its slot's window (llama-server stops a generation there). A
request is admitted when the books plus its demand fit the pool. Idle slots' cells are never in the
books: llama-server purges an idle slot when a batch needs room, so counting them would only deadlock
a pool that idle slots fill.

The queue is first in, first out: the head waits until it fits, and nothing behind it overtakes it
(a small request that always fits must not starve a large one forever). It is bounded by length
(past it: 429) and by wait (past it: 503), each with a `Retry-After` of at most a minute (the `openai`
SDK honours no longer one). A request whose wait is predicted to outlast the timeout (every running
request using its whole budget at the measured speed) is told so at once, not after the wait.

While the guard cannot see the slots in time (`cautious`), a budget it does not know counts as the
slot's whole window; a request that has shown it generates past its budget (`overran`) always does.

    >>> a = Admission(max_queue=2, max_wait=60.0)
    >>> pool = Pool(capacity=1000, slot_window=1000, unified=True)
    >>> a.offer(Ticket(1, prompt=400, budget=100), pool, now=0.0).kind
    'admit'
    >>> a.offer(Ticket(2, prompt=450, budget=100), pool, now=0.0).kind
    'queue'
    >>> [t.id for t in a.release(1, pool, now=2.0)]
    [2]
"""

from __future__ import annotations

import math
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, NoReturn

#: The longest `Retry-After` the guard suggests: the `openai` SDK ignores longer ones and comes back sooner.
RETRY_AFTER_MAX = 60


@dataclass(frozen=True)
class Pool:
    """What the server offers: cells in the shared pool, the window of one slot, whether the pool is shared.

    `capacity` None: not known yet (the guard then admits against the slot window alone, which a shared
    pool is never smaller than). `unified` False: each slot has its own cells and no request can push
    another one out, so only a request larger than its window is a concern.
    """

    capacity: int | None
    slot_window: int | None
    unified: bool | None

    @property
    def limit(self) -> int | None:
        """Cells the books may hold at most (None: no shared limit)."""
        if self.unified is False:
            return None
        if self.capacity is not None:
            return self.capacity
        return self.slot_window


@dataclass
class Ticket:
    """One sized generation request (several tasks when a `/completion` carries several prompts)."""

    id: int
    prompt: int  # prompt tokens, as the server's own tokenizer counts them (all tasks together)
    budget: int  # generation budget (all tasks together)
    tasks: int = 1
    copies: int = 1  # tasks per prompt (`n`): they share their prompt's cells
    budget_known: bool = True  # False: the default budget stands in for one the request did not give
    exact: bool = True  # False: `prompt` is a bound (admitted on its byte length), not yet the tokenizer's count
    n_predict: int = -1  # the request's own limit as llama-server reads it (-1: none)
    key: str | None = None  # its pool: None for a plain server, the model's name behind a router
    queued_at: float | None = None  # when its wait began (the queue's one clock: `Admission.deadline`)
    admitted_at: float | None = None
    demand: int = 0  # set on offer: prompt + budget, capped per task at the slot window
    overran: bool = False  # it generated past its budget: counted at its window from now on

    @property
    def per_prompt(self) -> int:
        """Prompt tokens per prompt: what one slot reads before it generates."""
        return math.ceil(self.prompt / max(self.tasks // max(self.copies, 1), 1))

    def size(self, pool: Pool, cautious: bool = False) -> int:
        """Cells this request may hold at most on `pool` (`cautious`: an unknown budget counts as the window)."""
        budget = self.budget
        if self.overran or (cautious and not self.budget_known):
            window = pool.slot_window or pool.limit
            budget = window * self.tasks if window is not None else budget
        total = self.prompt + budget
        if pool.slot_window is not None:
            total = min(total, pool.slot_window * self.tasks)
        return total


#: What admission does with a request: send it (`admit`), hold it (`queue`), pass it on for the server to
#: refuse in its own words (`forward`), or answer it itself (`refuse`). A caller matches every kind
#: (`assert_never` after the last one): mypy --strict then rejects a kind left unhandled or misspelt.
DecisionKind = Literal["admit", "queue", "forward", "refuse"]

if sys.version_info >= (3, 11):
    from typing import assert_never
else:  # pragma: no cover - the same check, for Python 3.10

    def assert_never(value: NoReturn) -> NoReturn:
        """A value mypy has narrowed to nothing: every case before this call has been handled."""
        raise AssertionError(f"unhandled: {value!r}")


@dataclass(frozen=True)
class Decision:
    """What to do with a request: `admit`, `queue`, `forward` (the server refuses it itself), `refuse`.

    `status`, `reason` and `retry_after` come with `refuse` (and with a `forward` whose `reason` says why).
    """

    kind: DecisionKind
    status: int = 200
    reason: str = ""
    retry_after: int | None = None
    error_type: str = ""


@dataclass
class Admission:
    """The books of what is in flight and the queue of what waits."""

    max_queue: int
    max_wait: float
    in_flight: dict[int, Ticket] = field(default_factory=dict)
    queue: deque[Ticket] = field(default_factory=deque)
    cautious: bool = False  # the slots cannot be observed in time: unknown budgets count as the window

    def deadline(self, ticket: Ticket, now: float) -> float:
        """When `ticket`'s wait runs out: `max_wait` after it began (now, when it has not begun yet).

        The queue's one clock: a wait for room (`expired`), for llama-server to be ready and for the
        tokenizer, and the predicted wait of `offer`, all run out here. A wait begins at the first of them
        and continues through the others; admission ends it, and a later wait (a replay, a retry, a
        restart) begins its own (`new_wait`)."""
        if ticket.queued_at is None:
            ticket.queued_at = now
        return ticket.queued_at + self.max_wait

    def timed_out(self, ticket: Ticket, now: float) -> bool:
        """Whether `ticket`'s wait has run out at `now` (its `deadline` has come)."""
        return now >= self.deadline(ticket, now)

    @staticmethod
    def new_wait(ticket: Ticket) -> None:
        """`ticket`'s next wait starts its own clock (admitted, or sent again after llama-server failed it)."""
        ticket.queued_at = None

    def set_cautious(self, cautious: bool, pool: Pool, now: float) -> list[Ticket]:
        """Count unknown budgets as the window (True) or as given (False); admit what fits now."""
        if cautious == self.cautious:
            return []
        self.cautious = cautious
        for t in self.in_flight.values():
            t.demand = t.size(pool, cautious)
        return self.pump(pool, now)

    def overran(self, ticket: Ticket, pool: Pool) -> None:
        """`ticket` generated past its budget: it holds its window's worth from now on."""
        if ticket.id in self.in_flight and not ticket.overran:
            ticket.overran = True
            ticket.demand = ticket.size(pool, self.cautious)

    @property
    def demand(self) -> int:
        """Cells the admitted requests may hold at most, together."""
        return sum(t.demand for t in self.in_flight.values())

    def fits(self, ticket: Ticket, pool: Pool) -> bool:
        """Whether `ticket` fits next to what is in flight (alone, anything the slot takes fits)."""
        limit = pool.limit
        if limit is None or not self.in_flight:
            return True
        return self.demand + ticket.demand <= limit

    def admits_now(self, ticket: Ticket, pool: Pool) -> bool:
        """Whether `offer` would admit `ticket` at once (nothing waits, it fits, it is no refusal)."""
        demand = ticket.size(pool, self.cautious)
        per_task = ticket.per_prompt
        if pool.slot_window is not None and per_task >= pool.slot_window:
            return False
        limit = pool.limit
        if limit is not None and ticket.prompt >= limit:
            return False
        return not self.queue and (limit is None or not self.in_flight or self.demand + demand <= limit)

    def resize(self, ticket: Ticket, prompt: int, pool: Pool, now: float) -> list[Ticket]:
        """The exact prompt size of an admitted request, known after it was admitted on a bound; admit what fits now."""
        ticket.prompt = prompt
        ticket.exact = True
        ticket.demand = ticket.size(pool, self.cautious)
        return self.pump(pool, now)

    def offer(self, ticket: Ticket, pool: Pool, now: float, speed: Speed | None = None) -> Decision:
        """A newly sized request: admit it, queue it, or say why not (`speed`: for the predicted wait)."""
        ticket.demand = ticket.size(pool, self.cautious)
        window = pool.slot_window
        per_task = ticket.per_prompt
        if window is not None and per_task >= window:
            # llama-server refuses it before reading it, with its own status and message, and no other
            # request is touched: let it say so.
            return Decision("forward", reason=f"prompt of {per_task} tokens does not fit a slot of {window}")
        limit = pool.limit
        if limit is not None and ticket.prompt >= limit:
            return Decision(
                "refuse",
                400,
                f"request ({ticket.prompt} tokens) exceeds the available context size ({limit} tokens), "
                "try increasing it",
                error_type="exceed_context_size_error",
            )
        if not self.queue and self.fits(ticket, pool):
            self._admit(ticket, now)
            return Decision("admit")
        if len(self.queue) >= self.max_queue:
            return Decision(
                "refuse",
                429,
                f"the guard's queue is full ({self.max_queue} requests wait for room in the KV pool); retry later",
                retry_after=self.retry_after(),
                error_type="unavailable_error",
            )
        left = self.deadline(ticket, now) - now
        wait = self.predicted_wait(ticket, pool, now, speed) if speed is not None else None
        if wait is not None and wait > left:
            return Decision(
                "refuse",
                503,
                f"no room in the KV pool for this request within the guard's queue timeout of {self.max_wait:g} s "
                f"(the requests ahead of it need about {wait:.0f} s at the measured speed); retry later",
                retry_after=min(RETRY_AFTER_MAX, max(1, math.ceil(wait - left))),
                error_type="unavailable_error",
            )
        self.queue.append(ticket)
        return Decision("queue")

    def predicted_wait(self, ticket: Ticket, pool: Pool, now: float, speed: Speed) -> float | None:
        """Seconds until `ticket` (not yet queued) would be admitted if every request ahead of it used its whole
        budget at the measured speed; None when the speed is not known. An upper bound: a request that ends
        early (an end-of-sequence token) frees its cells sooner."""
        limit = pool.limit
        if limit is None or speed.rate <= 0:
            return None
        ticket.demand = ticket.size(pool, self.cautious)

        def takes(t: Ticket) -> float:
            return t.budget / max(t.tasks, 1) / speed.rate

        ends = []
        for t in self.in_flight.values():
            left = speed.ends_in.get(t.id)
            if left is None:
                left = max(0.0, takes(t) - (now - (t.admitted_at if t.admitted_at is not None else now)))
            ends.append((left, t.demand))
        ends.sort()
        held = sum(d for _, d in ends)
        clock = 0.0
        for q in [*self.queue, ticket]:  # first in, first out: each is admitted once the ones before it are
            while ends and held + q.demand > limit:
                clock, freed = ends.pop(0)
                held -= freed
            if q is ticket:
                return clock
            ends.append((clock + takes(q), q.demand))
            ends.sort()
            held += q.demand
        return clock

    def take(self, ticket: Ticket, pool: Pool, now: float) -> Decision:
        """Admission off: the request is in the books at once, whatever it asks (llama-server refuses what it must)."""
        ticket.demand = ticket.size(pool, self.cautious)
        self._admit(ticket, now)
        return Decision("admit")

    def _admit(self, ticket: Ticket, now: float) -> None:
        ticket.admitted_at = now
        self.new_wait(ticket)  # a later wait (a replay, a restart) starts its own clock
        self.in_flight[ticket.id] = ticket

    def pump(self, pool: Pool, now: float) -> list[Ticket]:
        """Admit queued requests from the head for as long as they fit; return them in order."""
        out: list[Ticket] = []
        while self.queue:
            head = self.queue[0]
            head.demand = head.size(pool, self.cautious)  # the pool may have become known since
            if not self.fits(head, pool):
                break
            self.queue.popleft()
            self._admit(head, now)
            out.append(head)
        return out

    def release(self, ticket_id: int, pool: Pool, now: float) -> list[Ticket]:
        """A request ended (answered, failed or cancelled), or left the queue: free its demand; admit what fits now."""
        if self.in_flight.pop(ticket_id, None) is None:
            for t in self.queue:
                if t.id == ticket_id:
                    self.queue.remove(t)
                    break
        return self.pump(pool, now)

    def requeue(self, ticket: Ticket, pool: Pool, budget: int, now: float) -> None:
        """A stopped request goes back to the head of the queue with a new budget (it showed it needs more)."""
        self.in_flight.pop(ticket.id, None)
        ticket.budget = budget
        ticket.demand = ticket.size(pool, self.cautious)
        ticket.queued_at = now
        self.queue.appendleft(ticket)

    def expired(self, now: float) -> list[Ticket]:
        """Queued requests whose `deadline` has come: removed from the queue, to be answered 503 (the caller
        then `pump`s: the requests behind them may fit now)."""
        out = [t for t in self.queue if t.queued_at is not None and self.timed_out(t, now)]
        for t in out:
            self.queue.remove(t)
        return out

    def clear(self) -> None:
        """llama-server restarted: nothing it held is held any more."""
        self.in_flight.clear()

    def retry_after(self) -> int:
        """Seconds to suggest in `Retry-After`: the queue's longest wait, at least 1 and at most a minute."""
        return min(RETRY_AFTER_MAX, max(1, math.ceil(self.max_wait)))


@dataclass(frozen=True)
class Speed:
    """How fast the running requests generate: tokens per second per request (`rate`), and for the requests
    the slots show, the seconds until each would end at its whole budget (`ends_in`, by ticket id)."""

    rate: float
    ends_in: dict[int, float] = field(default_factory=dict)


@dataclass
class RetryBudget:
    """How many requests may be sent again after llama-server died under them (as Envoy's retry budget):
    at most `floor` plus `ratio` of the requests sent within the last `window` seconds. A crash loop
    then cannot multiply the load it is given.

    >>> b = RetryBudget(ratio=0.2, floor=1, window=60.0)
    >>> for _ in range(5):
    ...     b.sent(0.0)
    >>> [b.allow(1.0) for _ in range(3)]  # 1 + 20 % of 5
    [True, True, False]
    >>> b.allow(62.0)  # the window has passed
    True
    """

    ratio: float = 0.2
    floor: int = 3
    window: float = 60.0
    _sent: deque[float] = field(default_factory=deque)
    _retried: deque[float] = field(default_factory=deque)

    def sent(self, now: float) -> None:
        """A request was sent to llama-server (a first send)."""
        self._sent.append(now)

    def allow(self, now: float) -> bool:
        """Whether one more request may be sent again now; counts it when it may."""
        for times in (self._sent, self._retried):
            while times and now - times[0] > self.window:
                times.popleft()
        if len(self._retried) + 1 > self.floor + self.ratio * len(self._sent):
            return False  # counting this one, the retries would pass the budget
        self._retried.append(now)
        return True
