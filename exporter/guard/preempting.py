"""The guard's preemption loop, an object the guard is given: while requests run it reads `/slots`, learns
what the slots say of each request (its speed, a budget it overran), counts unknown budgets as whole windows
while it cannot see in time, and stops one request when the slots are about to outgrow the pool (the choice
is `exporter.guard.preempt`'s). I/O.

Two narrow interfaces join it to the guard: `Preemptor`, what the guard asks of preemption (watch a request
from its send to its end, the measured speed of a pool), and `PreemptionHost`, what preemption asks of the
guard (a pool's books and limit, and what follows when they change).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import aiohttp

from exporter.guard.accounting import Accounting
from exporter.guard.admission import Admission, Pool, Speed, Ticket
from exporter.guard.books import GuardBooks
from exporter.guard.preempt import LastRead, Running, Sight, SlotView, choose_victim, match, projected, slot_views

log = logging.getLogger("exporter.guard.proxy")


@dataclass
class Run:
    """A request being forwarded: the guard may stop it (`stop`), and closes `upstream` to do so."""

    ticket: Ticket
    stop: asyncio.Event
    anthropic: bool = False
    upstream: aiohttp.ClientResponse | None = None
    streaming: bool = False  # its answer is an event stream that has begun
    sending: asyncio.Future[aiohttp.ClientResponse] | None = None  # until the answer's headers arrive


def placeable(runs: Iterable[Run]) -> list[Running]:
    """The requests of `runs` that a slot of `/slots` can be matched to: those of one task (`n` > 1 runs several
    tasks on one prompt, which no single slot shows)."""
    return [
        Running(t.id, t.prompt, t.n_predict, t.admitted_at or 0.0) for t in (r.ticket for r in runs) if t.tasks == 1
    ]


class Preemptor(Protocol):
    """What the guard asks of preemption."""

    def start(self, run: Run) -> None:
        """`run` was sent upstream: watch it (and the slots) until `end`."""

    def end(self, ticket_id: int) -> None:
        """The request `ticket_id` is no longer upstream (answered, failed, stopped or gone)."""

    def speed(self, key: str | None) -> Speed | None:
        """How fast the requests of pool `key` generate, as last measured (None: not yet)."""

    def counted(self, key: str | None) -> None:
        """A prompt of pool `key` admitted on its bound was counted exactly: place it now, from the last read."""

    async def close(self) -> None:
        """Stop watching."""


class PreemptionHost(Protocol):
    """What preemption asks of the guard: the books and limit of a pool, and what follows when they change."""

    @property
    def session(self) -> aiohttp.ClientSession: ...

    @property
    def admissions(self) -> Mapping[str | None, Admission]: ...

    def admission(self, key: str | None) -> Admission: ...

    def pool(self, key: str | None = None) -> Pool: ...

    def refine_if_tight(self, key: str | None, used: int | None = None) -> None:
        """Count exactly the prompts admitted on their bound, if the books (or `used`) come near the limit."""

    def refine_all(self, key: str | None) -> None:
        """Count exactly every prompt of pool `key` admitted on its bound."""

    def wake(self, admitted: Ticket) -> None:
        """`admitted` left the queue for the pool: its handler sends it."""


class PreemptSettings(Protocol):
    """The guard's settings that preemption reads (`GuardSettings` has them)."""

    @property
    def upstream(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def poll_interval(self) -> float: ...
    @property
    def quiet(self) -> float: ...
    @property
    def horizon(self) -> float: ...
    @property
    def blind_after(self) -> float: ...
    @property
    def admission(self) -> bool: ...


class Preemption:
    """The preemption loop of one guard (a `Preemptor`): reads `/slots` while requests run."""

    def __init__(
        self, host: PreemptionHost, settings: PreemptSettings, books: GuardBooks, accounting: Accounting
    ) -> None:
        self.host = host
        self.settings = settings
        self.books = books
        self.accounting = accounting
        self.sight = Sight(settings.horizon, settings.blind_after)
        self.runs: dict[int, Run] = {}  # the requests upstream, by ticket id
        self._monitor: asyncio.Task[None] | None = None
        # No second stop until the first one has taken effect (llama-server's polling second, then a batch).
        self._quiet_until = 0.0
        self._speeds: dict[str | None, dict[int, LastRead]] = {}
        self._speed: dict[str | None, Speed] = {}  # pool → how fast its requests generate, last measured
        self._pending: dict[str | None, tuple[int, float]] = {}  # pool → (slots running, when) at its last stop
        self._slots_refused = False  # said once: /slots wants a key the guard does not have
        # Pool → its slots at the last read: a request counted exactly after that read is placed from it at
        # once, not a poll later (a request shorter than two polls would never be placed).
        self._last: dict[str | None, list[SlotView]] = {}

    # ------------------------------------------------------------------ the guard's side (`Preemptor`)

    def start(self, run: Run) -> None:
        self.runs[run.ticket.id] = run
        self._ensure_monitor()

    def end(self, ticket_id: int) -> None:
        self.runs.pop(ticket_id, None)

    def speed(self, key: str | None) -> Speed | None:
        return self._speed.get(key)

    def counted(self, key: str | None) -> None:
        if (slots := self._last.get(key)) is not None and self.runs:
            self._account(key, slots)

    async def close(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor

    # ------------------------------------------------------------------ the loop

    def _ensure_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            # In a context of its own: what it counts is no request's that happened to start it (accounting).
            self._monitor = contextvars.Context().run(asyncio.create_task, self._watch(), name="guard preemption")

    async def _watch(self) -> None:
        """While requests run: read `/slots`, stop one request when the slots are about to outgrow the pool."""
        headers = {"Authorization": f"Bearer {self.settings.api_key}"} if self.settings.api_key else {}
        timeout = aiohttp.ClientTimeout(total=10 * self.settings.poll_interval)
        while self.runs:
            now = time.monotonic()
            due = now + max(self.settings.poll_interval, self._quiet_until - now)
            await asyncio.sleep(due - now)
            for key in {r.ticket.key for r in self.runs.values()}:
                # A router's model: its own /slots, without waking a model that is not loaded.
                query = "" if key is None else "?" + urlencode({"model": key, "autoload": "false"})
                url = self.settings.upstream + "/slots" + query
                try:
                    async with self.host.session.get(url, headers=headers, timeout=timeout) as resp:
                        body = await resp.json(content_type=None) if resp.status == 200 else None
                        if resp.status in (401, 403) and not self._slots_refused:
                            self._slots_refused = True
                            log.warning(
                                "guard: llama-server's /slots answered %d: preemption needs its API key "
                                "(--api-key or --api-key-file)",
                                resp.status,
                            )
                except (aiohttp.ClientError, ValueError, asyncio.TimeoutError, TimeoutError):
                    self.sight.saw(time.monotonic() - due)
                    continue
                # How late this look at the slots is: the guard's own wake-up and llama-server's answer.
                seen = time.monotonic()
                self.sight.saw(seen - due)
                self._consider(key, body, seen)
            self._caution()
        self._speeds.clear()
        self._last.clear()

    def _caution(self) -> None:
        """Unknown budgets count as whole windows while the slots cannot be observed in time, as given after."""
        if not self.settings.admission:
            return  # admission off: nothing is held back, so there is nothing to count more cautiously
        blind = self.sight.blind
        for key, books in self.host.admissions.items():
            if books.cautious != blind:
                log.warning(
                    "guard: its reads of /slots lag %.1f s: %s",
                    self.sight.lag,
                    "requests without max_tokens count as whole windows until they are timely"
                    if blind
                    else "they are timely again; requests without max_tokens count as their default budget",
                )
            for admitted in books.set_cautious(blind, self.host.pool(key), time.monotonic()):
                self.host.wake(admitted)

    def _consider(self, key: str | None, body: Any, now: float) -> None:
        speeds = self._speeds.setdefault(key, {})
        slots = slot_views(body, speeds, now)
        limit = self.host.pool(key).limit
        runs = [r for r in self.runs.values() if not r.stop.is_set() and r.ticket.key == key]
        # A stream's closed connection is noticed at its next token; a request that waits for its whole
        # answer only after a second in which no result came for anyone, which never comes while a stream
        # runs. So while streams run, only a stream is stopped.
        if any(r.streaming for r in runs):
            runs = [r for r in runs if r.streaming]
        running = placeable(runs)
        horizon = self.sight.horizon
        self.host.refine_if_tight(key, projected(slots, horizon))
        self._learn(key, slots, horizon)
        self._last[key] = slots
        self._account(key, slots)
        if limit is None or now < self._quiet_until or not self.settings.admission:
            return
        pending = self._pending.get(key)
        if pending is not None:
            # The last stop has not taken effect while as many slots still run: llama-server has not
            # noticed yet (a loaded host). A second stop would not be noticed sooner; wait for the first.
            if len(slots) >= pending[0] and now - pending[1] < 10 * self.settings.quiet:
                return
            del self._pending[key]
        chosen = choose_victim(slots, running, limit, horizon)
        if chosen is None:
            return
        victim, why = chosen
        run = self.runs[victim]
        self._quiet_until = now + self.settings.quiet + self.sight.lag
        self._pending[key] = (len(slots), now)
        run.stop.set()
        if run.sending is not None:
            run.sending.cancel()
        elif run.upstream is not None and run.streaming:
            run.upstream.close()
        self.books.count("preempted")
        self.accounting.count_for(victim, "preempted")
        log.warning("guard: stopped one request so that the others can finish: %s", why)

    def _account(self, key: str | None, slots: list[SlotView]) -> None:
        """Tell the books by client where each request of pool `key` runs now (all of them, streams or not)."""
        runs = [r for r in self.runs.values() if r.ticket.key == key]
        matched = match(slots, placeable(runs), self.accounting.known())
        self.accounting.placed([r.ticket.id for r in runs], matched)
        if len(matched) < len(slots):
            # A slot runs a request the guard cannot place: one admitted on its prompt's byte bound. It has run
            # for a read of /slots already (a short one never gets here): count it exactly; once counted, it is
            # placed from this read (`counted`).
            self.host.refine_all(key)

    def _learn(self, key: str | None, slots: list[SlotView], horizon: float) -> None:
        """What the slots say of the requests: a request past its budget counts its window from now on, and
        what it will hold; how fast they generate, and when each would end at its whole budget."""
        books, pool = self.host.admission(key), self.host.pool(key)
        running = placeable(r for r in self.runs.values() if r.ticket.key == key and not r.stop.is_set())
        ends_in: dict[int, float] = {}
        for rid, slot in match(slots, running).items():
            t = self.runs[rid].ticket
            generated = slot.held - (slot.prompt or slot.held)
            if generated > t.budget:
                books.overran(t, pool)
            t.demand = max(t.demand, slot.ahead(horizon))
            if slot.remaining is not None:
                left = slot.remaining
            elif t.overran:  # it runs to its window
                left = max(0, (slot.window or pool.slot_window or slot.held) - slot.held)
            else:
                left = max(0, t.budget - generated)
            if slot.rate > 0 and slot.steady:
                ends_in[rid] = left / slot.rate
        # Only speeds measured while generating: a wait predicted from the prompt's span would refuse in vain.
        rates = [s.rate for s in slots if s.rate > 0 and s.steady]
        before = self._speed.get(key)
        rate = sum(rates) / len(rates) if rates else (before.rate if before is not None else 0.0)
        self._speed[key] = Speed(rate, ends_in)
