"""Where the KV pool is heading: what the requests in flight will hold, and when the pool is full. Pure.

The usage ratio moves in whole batches (`-b`, 2,048 cells by default) and says nothing about the
prompts still being read, so a page on it alone comes one or two batches before the abort. The
requests in flight tell much more, and earlier:

- **prompt demand**: the cells every processing slot will hold once its prompt is processed. A
  slot's prompt size comes from `new prompt … task.n_tokens = N` (`-lv 4`), else from its progress
  lines (`prompt processing, n_tokens = X, progress = P` at the default verbosity: X / P, narrowed
  by every further line), else it counts what it holds now (`held`). Above the capacity the
  overflow is certain unless a request finishes or is cancelled first.
- **max demand**: prompt demand plus each slot's remaining generation budget (`/slots`
  `next_token.n_remain`, `params.n_predict`), each slot capped at its own window (`n_ctx`); a slot
  whose budget is unknown or unlimited counts its whole window (the bound it really has).
- **limits demand**: the same, but a slot whose budget is unknown or unlimited counts what it will
  hold once its prompt is read (or holds now, if more): what the requests in flight need at the
  limits their clients set. Chat clients rarely set one, and counting each of their requests at a
  whole window would say "may overflow" whenever two of them overlap on an overcommitted pool.
- **time to full**: at the current fill speed (each slot's latest prompt-processing or generation
  speed as llama-server printed it), the seconds until the requests in flight fill the pool; None
  when nothing fills or when the requests in flight cannot fill it even at their limits.
- **the fill model** (`cells_ahead`, `seconds_to_fill`): a slot adds its speed's worth of cells a second,
  up to what it may hold at most. The forecast's time to full and the guard's projection of the slots
  (`exporter.guard.preempt`, with its own speeds from `/slots` and its own horizon) are both this model.

- **measured at arrival**: a proxy in front of the server (the guard) counts each prompt with the
  server's own tokenizer before sending it, long before the default verbosity's log says it (with the
  prompt's second batch). `forecast(state, measured)` takes those requests: one whose size a slot's
  `new prompt` line already gives is that slot; for the others, the slots the log has not sized count
  the larger of what the log estimates and what was measured (see `_beyond_the_log`).

Idle slots are left out: with unified KV (b6925+) llama-server frees idle slots before it fails a
batch (`try_clear_idle_slots`), and `--cache-idle-slots` clears them when a task starts. On older
unified builds their cells stay and are counted as held.

    >>> from exporter.model.slot import SlotState
    >>> from exporter.model.run import ServerRun
    >>> from exporter.model.state import ServerState
    >>> st = ServerState(run=ServerRun(n_slots=2, n_ctx_slot=1000, kv_cells=1000, kv_unified=True))
    >>> st.run.slots = {0: SlotState(n_ctx=1000, tokens=300, processing=True, prompt_size=700,
    ...                          phase="prompt", prompt_size_source="new_prompt", prompt_rate=100.0)}
    >>> f = forecast(st)
    >>> f.prompt_demand, f.max_demand, f.eta_seconds
    (700, 1000, 7.0)
    >>> st.run.slots[0] = SlotState(n_ctx=1000, tokens=200, processing=True, phase="prompt")  # default verbosity
    >>> forecast(st).prompt_demand, forecast(st, [Measured(prompt=700, budget=50)]).prompt_demand
    (200, 700)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from exporter.model.slot import SlotState
from exporter.model.state import ServerState

HORIZONS = ("prompt", "limits", "max")
#: How a processing slot's prompt size is known: the `new prompt` line, its progress lines, or not
#: at all (it counts what it holds).
SIZE_SOURCES = ("new_prompt", "progress", "held")
# Unified KV builds that free idle slots before failing a batch (try_purge_idle_slots, #16302).
_FREES_IDLE_SLOTS_SINCE = 6925


def cells_ahead(held: int, rate: float, seconds: float, most: int | None = None) -> int:
    """The fill model: the cells a slot holding `held` and adding `rate` a second holds `seconds` from now,
    never past `most` (what it may hold at most: its budget, its window).

    >>> cells_ahead(300, 20.0, 2.0), cells_ahead(300, 20.0, 2.0, most=320)
    (340, 320)
    """
    cells = held + int(rate * seconds + 0.5)
    return min(cells, most) if most is not None else cells


def seconds_to_fill(cells: int, held: int, rate: float) -> float | None:
    """The fill model backwards: seconds until slots holding `held` and adding `rate` a second hold `cells`
    (0 when they already do); None when nothing fills.

    >>> seconds_to_fill(1000, 300, 100.0), seconds_to_fill(1000, 300, 0.0)
    (7.0, None)
    """
    if rate <= 0:
        return None
    return max(0.0, (cells - held) / rate)


@dataclass(frozen=True)
class SlotDemand:
    """One processing slot's part of the forecast."""

    slot: int
    held: int  # cells the slot holds now
    prompt: int  # cells it will hold once its prompt is processed
    max: int  # cells it may hold at most (prompt + remaining generation budget, capped at its window)
    limits: int  # as max where the budget is known; else what it will hold after its prompt or holds now
    size_source: str  # new_prompt | progress | held
    budget_known: bool  # the remaining generation budget is known (/slots) and finite
    rate: float  # tokens/s it is adding now (0 = not known or not filling)


@dataclass(frozen=True)
class Measured:
    """A request in flight whose prompt a proxy in front of the server (the guard) counted at arrival.

    `prompt`: its prompt tokens, with the server's own tokenizer (all its tasks together); `budget`: the
    generation budget it gave (all tasks together; None: none given); `tasks`: the slots it takes.
    """

    prompt: int
    budget: int | None
    tasks: int = 1

    def demand(self, horizon: str, window: int | None) -> int:
        """Its cells at `horizon`, as `slot_demand` counts a slot: capped at its slots' windows."""
        cap = window * self.tasks if window is not None else None
        if horizon == "prompt" or (horizon == "limits" and self.budget is None):
            cells = self.prompt
        elif self.budget is not None:
            cells = self.prompt + self.budget
        else:
            cells = cap if cap is not None else self.prompt
        return min(cells, cap) if cap is not None else cells


@dataclass(frozen=True)
class Forecast:
    """Demand of the requests in flight against the pool.

    `beyond_log` holds, per horizon, the cells that requests measured at arrival add to what the log says of
    the slots (0 without measurements, and once the log has caught up).
    """

    capacity: int | None
    slots: tuple[SlotDemand, ...]
    idle_held: int  # cells of idle slots that llama-server would not free before failing (old builds)
    beyond_log: tuple[int, int, int] = (0, 0, 0)  # prompt, limits, max

    @property
    def held(self) -> int:
        """Cells held now by the requests in flight (and by idle slots that cannot be freed)."""
        return self.idle_held + sum(s.held for s in self.slots)

    @property
    def prompt_demand(self) -> int:
        """Cells held once every prompt in flight is processed."""
        return self.idle_held + sum(s.prompt for s in self.slots) + self.beyond_log[0]

    @property
    def max_demand(self) -> int:
        """Cells held at most, once every request in flight has used its generation budget."""
        return self.idle_held + sum(s.max for s in self.slots) + self.beyond_log[2]

    @property
    def limits_demand(self) -> int:
        """Cells held once every request in flight with a known budget has used it (the others: their prompt)."""
        return self.idle_held + sum(s.limits for s in self.slots) + self.beyond_log[1]

    def demand(self, horizon: str) -> int:
        """`prompt_demand`, `limits_demand` or `max_demand` by horizon name."""
        if horizon == "prompt":
            return self.prompt_demand
        return self.limits_demand if horizon == "limits" else self.max_demand

    def ratio(self, horizon: str) -> float | None:
        """Demand / capacity (above 1: the pool overflows unless a request ends first)."""
        return self.demand(horizon) / self.capacity if self.capacity else None

    @property
    def fill_rate(self) -> float:
        """Tokens per second the requests in flight add to the pool now."""
        return sum(s.rate for s in self.slots)

    @property
    def eta_seconds(self) -> float | None:
        """Seconds until the pool is full at the current fill speed; None when it is not filling towards full."""
        capacity = self.capacity
        if not capacity or self.max_demand < capacity:
            return None
        return seconds_to_fill(capacity, self.held, self.fill_rate)

    def sources(self) -> dict[str, int]:
        """Number of processing slots sized by each source."""
        out = dict.fromkeys(SIZE_SOURCES, 0)
        for s in self.slots:
            out[s.size_source] += 1
        return out

    @property
    def unknown_budgets(self) -> int:
        """Processing slots whose generation budget is not known (counted at their whole window)."""
        return sum(not s.budget_known for s in self.slots)


def slot_demand(slot_id: int, s: SlotState, window: int | None) -> SlotDemand:
    """The forecast for one processing slot. `window` caps it: the slot's n_ctx (else the pool)."""
    held = s.tokens
    if s.prompt_size is not None and s.prompt_size_source is not None:
        source = s.prompt_size_source
        # A new prompt's size is exact: cells left over from the slot's previous request are dropped
        # (`memory_seq_rm`) before it is processed. An estimate never goes below what the slot holds.
        exact = source == "new_prompt" and s.phase == "prompt"
        prompt = s.prompt_size if exact else max(held, s.prompt_size)
    else:
        prompt, source = held, "held"
    if window is not None:
        prompt = min(prompt, max(window, held))
    budget = s.generation_budget
    if budget is not None and budget >= 0:
        most = prompt + budget
        budget_known = True
    else:
        most = window if window is not None else prompt
        budget_known = False
    if window is not None:
        most = min(most, window)
    most = max(most, prompt)
    in_prompt = s.prompt_size is None or held < s.prompt_size
    if in_prompt and s.prompt_rate is not None and s.phase == "prompt":
        rate = s.prompt_rate
    elif s.phase == "generation" and s.generation_rate is not None and held < most:
        rate = s.generation_rate
    else:
        rate = 0.0
    limits = most if budget_known else max(prompt, held)
    return SlotDemand(slot_id, held, prompt, most, limits, source, budget_known, rate)


def forecast(state: ServerState, measured: Sequence[Measured] = ()) -> Forecast:
    """The forecast for a server state (the live view, with `/slots` merged in, where there is one), and the
    requests in flight that a proxy in front of the server measured at arrival."""
    capacity, _ = state.pool_capacity()
    run = state.run
    frees_idle = run.kv_unified is not True or run.build is None or run.build >= _FREES_IDLE_SLOTS_SINCE
    demands: list[SlotDemand] = []
    idle_held = 0
    for slot_id in sorted(run.slots):
        s = run.slots[slot_id]
        if s.processing:
            window = run.slot_context(slot_id) or capacity
            demands.append(slot_demand(slot_id, s, window))
        elif not frees_idle:
            idle_held += s.tokens
    beyond = _beyond_the_log(state, demands, measured, run.n_ctx_slot or capacity) if measured else (0, 0, 0)
    return Forecast(capacity, tuple(demands), idle_held, beyond)


def _beyond_the_log(
    state: ServerState, demands: list[SlotDemand], measured: Sequence[Measured], window: int | None
) -> tuple[int, int, int]:
    """What the measured requests add to the slots' demand, per horizon (prompt, limits, max).

    Nothing says which slot runs which request before the log sizes it, so the rule is about sums:

    - a slot whose `new prompt` line gives the size of a measured request runs it: the log has it;
    - the other measured requests run in the slots the log has not sized (or wait for one): those slots
      count the larger of what the log estimates for them and what was measured. Where there are more
      such slots than measured requests, the extra ones run requests that bypassed the proxy: the
      smallest of them count on top of the measured;
    - no more measured requests than there are slots left count at once (the others wait for a slot);
      the largest count, so the demand is not understated.
    """
    rest = sorted(measured, key=lambda m: -m.prompt)
    unsized: list[SlotDemand] = []
    for d in demands:
        size = state.run.slots[d.slot].prompt_size
        if d.size_source == "new_prompt":
            hit = next((m for m in rest if m.tasks == 1 and m.prompt == size), None)
            if hit is not None:
                rest.remove(hit)
                continue
        unsized.append(d)
    room = (state.run.slot_count or len(demands) + sum(m.tasks for m in rest)) - (len(demands) - len(unsized))
    counted: list[Measured] = []
    for m in rest:
        if m.tasks <= room:
            counted.append(m)
            room -= m.tasks
    bypass = max(0, len(unsized) - sum(m.tasks for m in counted))
    out: list[int] = []
    for horizon in HORIZONS:
        by_log = [d.prompt if horizon == "prompt" else d.limits if horizon == "limits" else d.max for d in unsized]
        by_measure = sum(m.demand(horizon, window) for m in counted) + sum(sorted(by_log)[:bypass])
        out.append(max(0, by_measure - sum(by_log)))
    return out[0], out[1], out[2]
