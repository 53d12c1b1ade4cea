"""Preemption: when generation runs the pool toward overflow anyway, which one request to stop. Pure.

Admission counts a request's budget, but a budget can be unknown (the guard's default stands in) or
not the server's (its `-n`). Then the slots can still outgrow the pool while they generate, and
llama-server would abort every one of them. The guard reads `/slots` while requests run, projects
each slot's cells a little ahead (what it holds, its prompt if still being read, plus its measured
speed over `horizon` seconds: the poll interval, the time llama-server takes to notice a closed
connection, and a batch; a generation speed measured over two reads counts `SURGE` times), and when the
projection reaches the pool it stops exactly one request by closing its upstream connection.

**Which one: the request whose slot holds the most cells** (ties: the one admitted last). Its cells are
what the others need: stopping it frees the most room with one stop, where stopping a small one might
free too little and lead to a second stop. It also tends to be the one that grew past its budget.
**Among the slots that generate**: a request still reading its prompt was admitted on its exact prompt
and has generated nothing, so it is not what outgrows the pool, and it is not stopped.
A stopped request that has had no byte of its answer is replayed when it fits (the client sees only
latency), counted at its slot's whole window this time, since it has shown it generates past its budget.

Requests are matched to slots by what `/slots` shows of each task: its prompt size (`n_prompt_tokens_processed`
plus `n_prompt_tokens_cache`, the server's own count, which the guard measured with the same tokenizer) and its
`n_predict`. Two requests alike in both are interchangeable for this purpose; the one admitted first is
given the fuller slot. A slot still reading its prompt (`next_token.n_decoded` 0) shows only the part read
(`n_prompt_tokens`; `n_prompt_tokens_processed` trails it by a batch): it is the one request left whose
prompt is at least that part, or, several being read at once, the one forwarded in its task's turn.

    >>> slots = [SlotView(0, 300, 40, -1, rate=20.0, steady=True), SlotView(1, 200, 50, -1, rate=20.0, steady=True)]
    >>> running = [Running(1, prompt=40, n_predict=-1, admitted_at=0.0), Running(2, 50, n_predict=-1, admitted_at=1.0)]
    >>> choose_victim(slots, running, limit=512, horizon=2.0)
    (1, 'slot 0 holds 300 of the 740 cells projected 2.0s ahead (generation at 3x its speed) in a pool of 512')
    >>> choose_victim(slots, running, limit=1024, horizon=2.0) is None
    True
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.model.forecast import cells_ahead
from exporter.model.live import LiveSlot, parse_slots

#: How much faster than measured a generating slot may go before the guard's stop takes effect. On a CPU host
#: shared with other work, llama-server's speed jumps when the other processes leave its cores (measured on
#: 2 cores with a busy loop on each: 25-40 tokens a second per slot, then 73-91 from one read to the next).
#: At the measured speed alone the stop came 0.4-0.9 s before such a jump overflowed the pool, about one burst
#: in ten; a stop too early costs one request a replay (a stream that has begun, its answer), one too late every
#: request in flight. Only a generation speed measured over two reads (`SlotView.steady`) counts this many
#: times: a prompt being read ends at its size, counted exactly at admission, and the first read after a
#: prompt mixes the prompt's tokens into its speed.
SURGE = 3.0


@dataclass
class Sight:
    """How late the guard sees the slots, and what follows from it.

    An observation's lag is the time from when a `/slots` read was due to when its answer was read: the
    guard's own scheduling (a starved process wakes late) plus llama-server's answer (it answers between
    two batches, slower on a saturated host). The projection must cover the next observation and the time
    a stop takes to be noticed, both of which grow with the lag: `horizon` is the configured one plus twice
    the worst recent lag. Past `blind_after` seconds of lag the guard cannot see in time (`blind`), and
    admission counts unknown budgets as whole windows until it can.

    >>> s = Sight(horizon_base=3.5, blind_after=1.0)
    >>> s.horizon, s.blind
    (3.5, False)
    >>> s.saw(0.1); s.saw(1.5); s.horizon, s.blind
    (6.5, True)
    >>> for _ in range(4):
    ...     s.saw(0.1)
    >>> round(s.horizon, 2), s.blind  # four timely reads in a row: it sees again
    (3.7, False)
    """

    horizon_base: float
    blind_after: float
    lags: deque[float] = field(default_factory=lambda: deque(maxlen=4))

    def saw(self, lag: float) -> None:
        """One observation (or a failed one) `lag` seconds after it was due."""
        self.lags.append(max(0.0, lag))

    @property
    def lag(self) -> float:
        """The worst lag of the last few observations."""
        return max(self.lags, default=0.0)

    @property
    def horizon(self) -> float:
        """How far ahead to project the slots."""
        return self.horizon_base + 2 * self.lag

    @property
    def blind(self) -> bool:
        """Whether the slots cannot be observed in time."""
        return self.lag >= self.blind_after


@dataclass(frozen=True)
class SlotView:
    """One processing slot as `/slots` shows it."""

    id: int
    held: int  # n_prompt_tokens: the cells it holds now
    prompt: int | None  # its task's prompt size, when /slots gives it
    n_predict: int | None  # its task's n_predict (-1: none)
    rate: float = 0.0  # tokens per second it adds (measured between two reads)
    remaining: int | None = None  # tokens it may still generate (next_token.n_remain; None: no limit)
    window: int | None = None  # its n_ctx
    task: int | None = None  # id_task: its task now
    # Its task was generating at the last read too: `rate` is a generation speed. The first read after
    # the prompt divides a few tokens by a span spent mostly reading the prompt, far below the speed.
    steady: bool = False
    # Its prompt is still being read (nothing generated yet: `next_token.n_decoded` 0): `held` is the part read,
    # and `prompt` is None, since /slots gives no whole size then (b11434: n_prompt_tokens_processed trails
    # n_prompt_tokens by a batch, 0 during the first).
    reading: bool = False

    def ahead(self, horizon: float) -> int:
        """The cells it may hold `horizon` seconds from now: its speed (`SURGE` times a generation speed
        measured over two reads), within its budget and window (the forecast's fill model, `cells_ahead`)."""
        most = self.window
        if self.remaining is not None:
            budget = self.held + self.remaining
            most = budget if most is None else min(most, budget)
        return cells_ahead(self.held, SURGE * self.rate if self.steady else self.rate, horizon, most)


@dataclass(frozen=True)
class Running:
    """One request the guard has in flight."""

    id: int
    prompt: int
    n_predict: int  # what the request asked for (-1: nothing)
    admitted_at: float


#: What the last read of a slot saw: (cells held, when, its task while it was generating, else None).
LastRead = tuple[int, float, int | None]


def slot_views(body: Any, before: dict[int, LastRead], now: float) -> list[SlotView]:
    """The processing slots of a `/slots` answer (read by the model's one parser, `parse_slots`; nothing from an
    answer that is no list of slots); `before` (slot → its last read) gives their speed and is updated."""
    try:
        read = parse_slots(body)
    except ValueError:
        return []
    return [view for s in read if (view := _view(s, before, now)) is not None]


def _view(s: LiveSlot, before: dict[int, LastRead], now: float) -> SlotView | None:
    """One slot of a read, if it is processing; its speed from its last read in `before` (updated)."""
    held = s.tokens
    if not s.processing or held is None:
        return None
    processed = s.n_processed
    # Nothing generated yet: the prompt is still being read (a build without n_decoded: processed still 0).
    reading = s.n_decoded == 0 if s.n_decoded is not None else processed == 0 and held > 0
    prompt = None
    if processed is not None and s.n_cached is not None and not reading:
        prompt = processed + s.n_cached
    last = before.get(s.id)
    rate = (held - last[0]) / (now - last[1]) if last is not None and now > last[1] and held >= last[0] else 0.0
    generating = s.task if prompt is not None and held > prompt else None
    steady = generating is not None and last is not None and last[2] == generating
    before[s.id] = (held, now, generating)
    remain, window = s.n_remain, s.n_ctx
    return SlotView(
        s.id,
        held,
        prompt,
        s.n_predict,
        rate,
        remain if remain is not None and remain >= 0 else None,
        window if window is not None and window > 0 else None,
        s.task,
        steady,
        reading=reading,
    )


def match(
    slots: list[SlotView], running: list[Running], known: Mapping[int, tuple[int, int]] | None = None
) -> dict[int, SlotView]:
    """Request id → its slot, where what the slot shows says which request it runs.

    A slot whose prompt is read whole shows its size: the request of that size (and n_predict). A slot still
    reading its prompt shows only the part read so far, at most its prompt: it is matched by elimination,
    when one request alone is left whose prompt is at least that part (the first request of a burst, still
    reading its prompt when the others have theirs, is named too). `known` (request id → the slot and task it
    was matched to before) keeps a match while the slot runs that task and shows nothing against it; what a
    slot shows always comes first, so an earlier guess is corrected as soon as a prompt is read whole.

    >>> a, b = SlotView(0, 3000, None, -1, task=7, reading=True), SlotView(1, 8000, 8000, -1, task=8)
    >>> sorted((r, x.id) for r, x in match([a, b], [Running(1, 9500, -1, 0.0), Running(2, 8000, -1, 1.0)]).items())
    [(1, 0), (2, 1)]
    >>> match([a], [Running(1, 9500, -1, 0.0), Running(2, 8000, -1, 1.0)])  # 3,000 read: either one
    {}
    >>> c = SlotView(1, 2000, None, -1, task=9, reading=True)  # two prompts being read: by the order of their tasks
    >>> {r: x.id for r, x in match([c, a], [Running(1, 9500, -1, 0.0), Running(2, 8000, -1, 1.0)]).items()}
    {1: 0, 2: 1}
    """
    free = sorted(slots, key=lambda s: -s.held)
    out: dict[int, SlotView] = {}
    runs = sorted(running, key=lambda r: r.admitted_at)
    was = dict(known or {})

    def take(r: Running, s: SlotView) -> None:
        out[r.id] = s
        free.remove(s)

    def keep(reading: bool) -> None:
        """Known matches whose slot (reading or not) still runs the same task and shows nothing against them."""
        for r in runs:
            s = next((x for x in free if (x.id, x.task) == was.get(r.id) and x.reading == reading), None)
            if r.id not in out and s is not None and s.task is not None and _fits(s, r):
                take(r, s)

    def eliminate() -> None:
        """Slots still reading their prompt: the one request left whose prompt is at least the part read."""
        progress = True
        while progress:
            progress = False
            for s in [x for x in free if x.reading]:
                fits = [r for r in runs if r.id not in out and _fits(s, r)]
                if len(fits) == 1:
                    take(fits[0], s)
                    progress = True
                    break

    # Prompts read whole, where two requests alike keep the slots they had (else the first admitted, the fuller).
    keep(reading=False)
    for r in runs:
        s = next((x for x in free if not x.reading and x.prompt == r.prompt and _predicts(x, r)), None)
        if r.id not in out and s is not None:
            take(r, s)
    eliminate()
    keep(reading=True)
    eliminate()
    # Still ambiguous (several prompts being read at once): llama-server numbers tasks in the order the
    # requests reach it, mostly the order the guard forwarded them; pair the oldest task with the
    # request admitted first, where every pair is possible (each part read is at most its prompt).
    left = [r for r in runs if r.id not in out]
    reading = sorted((x for x in free if x.reading and x.task is not None), key=lambda x: x.task or 0)
    if left and len(left) == len(reading):
        pairs = list(zip(left, reading, strict=True))
        if all(_fits(s, r) for r, s in pairs):
            out.update({r.id: s for r, s in pairs})
    return out


def _fits(s: SlotView, r: Running) -> bool:
    """Whether slot `s` may run request `r`, by what it shows: the part of a prompt read so far is at most the
    prompt; a prompt read whole is its size (a slot that shows no size contradicts nothing)."""
    if not _predicts(s, r):
        return False
    if s.reading:
        return s.held <= r.prompt
    return s.prompt is None or s.prompt == r.prompt


def _predicts(s: SlotView, r: Running) -> bool:
    """A request without n_predict runs with the server's -n, which /slots shows: any value matches."""
    return s.n_predict is None or r.n_predict < 0 or s.n_predict == r.n_predict


def projected(slots: list[SlotView], horizon: float) -> int:
    """Cells the processing slots may hold `horizon` seconds from now (`SlotView.ahead`)."""
    return sum(s.ahead(horizon) for s in slots)


def choose_victim(slots: list[SlotView], running: list[Running], limit: int, horizon: float) -> tuple[int, str] | None:
    """The request to stop, and why in words; None while the projection stays within the pool."""
    total = projected(slots, horizon)
    if total < limit or len(slots) < 2:
        return None  # a request alone never outgrows the pool: its slot's window is at most the pool
    # A request still reading its prompt is not stopped: its prompt was counted exactly when it was admitted,
    # it has generated nothing, so it is not what outgrows the pool (a slot generating past its budget is).
    matched = {rid: s for rid, s in match(slots, running).items() if not s.reading}
    if not matched:
        return None  # the slots that fill the pool are not the guard's requests: nothing it may stop
    admitted = {r.id: r.admitted_at for r in running}
    victim = max(matched, key=lambda rid: (matched[rid].held, admitted[rid]))
    s = matched[victim]
    return (
        victim,
        f"slot {s.id} holds {s.held} of the {total} cells projected {horizon:.1f}s ahead (generation at "
        f"{SURGE:g}x its speed) in a pool of {limit}",
    )
