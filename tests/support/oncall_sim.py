"""A seeded simulation of the on-call incident: one llama-server, coding agents, a shared KV pool.

The shape of the incident that started the project: one server `-c 262144 -np 4 -kvu` at the default
verbosity, coding agents whose conversations grow to 150k-162k tokens, two or three requests at once,
overflows a few times an hour in busy hours, three days; optionally a chat front-end beside the agents
(many short requests: the long ones are under 1 % of the traffic). It is simulated second by second and
sampled every scrape as the exporter would export it, with the exporter's real metric names, labels and
histogram buckets, and written as promtool ``input_series``.

    sim = simulate(Scenario(seed=1, chat=True))
    sim.aborts           # [(second, requests aborted)], one per overflow
    sim.input_series()   # [{"series": 'llamacpp_slot_tokens{job="llamacpp", ...}', "values": "0x5 1200 ..."}]

What it models of llama-server (b11434, unified KV, `--cache-idle-slots` on: its default): a request takes an
idle slot (its client's own slot when idle, for the prompt cache; else the idle slot that holds the least);
starting it saves every other idle slot to the host prompt cache and clears it, so the pool's usage dips and
comes back when each conversation returns and restores its cells from the cache (fast, like a cached
prefix); it processes the rest of its prompt (whole batches, ~1800 tokens/s), then generates (~30
tokens/s); a finished slot keeps its cells until the next task's start clears it or it is purged to make
room; when the slots in flight together need more cells than the pool, every request in flight is aborted
(a failed retry cascade, 'Context size has been exceeded'). An agent runs its tools for 5-40 s between turns.
Agents retry an aborted request after a few seconds; after two aborts in a row the agent's user compacts the
conversation. At the default verbosity the exporter learns a prompt's size from its second progress line
(3 s in); until then the forecast counts what the slot holds. `llamacpp_kv_pool_active_tokens` is the
exporter's own `exporter.model.activity.Activity` over the slots as each scrape sees them.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from exporter.model.activity import Activity
from exporter.model.request_sizes import CONCURRENCY_BUCKETS, REQUEST_TOKEN_BUCKETS
from exporter.model.slot import SlotState
from exporter.settings import HostArea

CAPACITY = 262_144
SLOTS = 4
LABELS = 'job="llamacpp", instance="gpu-node:9778"'
PP_RATE = 1800  # prompt tokens per second (a 150k prompt from scratch: ~80 s)
TG_RATE = 30  # generated tokens per second
AGENT_MAX_TOKENS = 8192  # what the agents send as max_tokens
RETRIES_PER_CASCADE = 11  # -b 2048 halved down to 1
DAY = 86_400
GPU = 'gpu="0", uuid="GPU-5d7a0c4e", name="NVIDIA GeForce RTX 4090"'
ACTIVE_WINDOW = HostArea.kv_pool_active_window
TOOL_GAP_S = (5, 40)  # an agent runs its tools between two turns
BYTES_PER_CELL = 65_536  # a 70B-class model's f16 K and V per cell (what the size line gives over the cells)


@dataclass(frozen=True)
class Scenario:
    """One simulated run. ``conversation``: the sizes at which an agent's user compacts its conversation."""

    seed: int
    days: int = 3
    agents: int = 3
    conversation: tuple[int, int] = (150_000, 162_000)
    chat: bool = False
    chat_per_second: float = 0.6
    scrape_s: int = 15
    traffic: bool = True  # False: a healthy server that nobody uses
    growth: float = 0.0  # how much longer the conversations grow each day (0.1: 10 % a day)
    #: llama-server's --cache-idle-slots (its default): a start saves the other idle slots to the host prompt
    #: cache and clears them. False (--no-cache-idle-slots): idle slots keep their cells (the prompt cache is
    #: in the pool) until llama-server purges them to make room.
    cache_idle_slots: bool = True
    documents: tuple[int, int] | None = None  # the chat requests' prompt sizes (None: 200-2500 tokens)


@dataclass
class Agent:
    name: str
    conv: int = 0
    limit: int = 0
    next_at: float = 0.0
    failures: int = 0
    compacting: bool = False
    busy: bool = False
    saved: float = 0.0  # cells of its conversation in the host prompt cache (its slot cleared by another start)


@dataclass
class Request:
    agent: Agent | None  # None: a chat request
    prompt: int
    gen: int
    budget: int | None
    held: float = 0.0
    generated: float = 0.0
    started: int = 0

    @property
    def in_prompt(self) -> bool:
        return self.held < self.prompt


@dataclass
class Slot:
    tokens: float = 0.0
    owner: Agent | None = None
    req: Request | None = None
    turns: int = 0  # tasks released (stop processing), as the exporter counts them


@dataclass
class Simulation:
    """The run's events and the exporter's series, sampled every scrape."""

    scenario: Scenario
    aborts: list[tuple[int, int]] = field(default_factory=list)
    requests: int = 0
    long_requests: int = 0  # requests that held more than half the pool
    series: dict[str, list[float]] = field(default_factory=dict)

    def input_series(self, start_s: int = 0, end_s: int | None = None) -> list[dict[str, str]]:
        """promtool ``input_series`` of the samples from ``start_s`` to ``end_s`` (seconds), run-length coded."""
        step = self.scenario.scrape_s
        lo, hi = start_s // step, None if end_s is None else end_s // step + 1
        return [{"series": name, "values": _encode(values[lo:hi])} for name, values in self.series.items()]


def _encode(values: list[float]) -> str:
    """'0x3 5 7x1': promtool's expanding notation, runs of one value folded."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        v = values[i]
        text = str(int(v)) if float(v).is_integer() else f"{v:.6g}"
        out.append(text if j == i else f"{text}x{j - i}")
        i = j + 1
    return " ".join(out)


def _working(t: int, rng_offsets: tuple[float, float]) -> bool:
    """Agents work 08:30-12:00 and 13:00-18:30, each with its own start and end offset."""
    h = (t % DAY) / 3600
    start, end = 8.5 + rng_offsets[0], 18.5 + rng_offsets[1]
    return start <= h < 12 or 13 <= h < end


class _Server:
    def __init__(self, sc: Scenario, rng: random.Random, sim: Simulation) -> None:
        self.sc, self.rng, self.sim = sc, rng, sim
        self.slots = [Slot() for _ in range(SLOTS)]
        self.queue: deque[Request] = deque()
        self.counters = {"context_exceeded": 0, "aborted": 0, "retries": 0, "failed": 0, "purged": 0, "lines": 0}
        self.req_tokens = [0] * (len(REQUEST_TOKEN_BUCKETS) + 1)
        self.req_tokens_sum = 0.0
        self.conc = [0] * (len(CONCURRENCY_BUCKETS) + 1)
        self.conc_sum = 0.0
        self.day = 0

    def processing(self) -> list[Slot]:
        return [s for s in self.slots if s.req is not None]

    def admit(self, t: int) -> None:
        while self.queue:
            idle = [s for s in self.slots if s.req is None]
            if not idle:
                return
            req = self.queue.popleft()
            agent = req.agent
            own = [s for s in idle if agent is not None and s.owner is agent and s.tokens > 0]
            slot = own[0] if own else min(idle, key=lambda s: s.tokens)
            if own:
                cached = min(slot.tokens, req.prompt)
            elif agent is not None and agent.saved:  # restored from the host prompt cache
                cached = min(agent.saved, req.prompt)
            else:
                cached = 0.0
            if slot.owner is not None and slot.owner is not agent and slot.tokens:
                slot.owner.saved = slot.tokens  # another client's cells: saved to the prompt cache first
            if agent is not None:
                agent.saved = 0.0
            slot.req, slot.tokens, slot.owner = req, cached, agent
            req.held, req.started = cached, t
            # --cache-idle-slots: the new task's start saves every other idle slot and clears it.
            for other in self.slots if self.sc.cache_idle_slots else ():
                if other.req is None and other.tokens:
                    if other.owner is not None:
                        other.owner.saved = other.tokens
                    other.tokens, other.owner = 0.0, None
            n = len(self.processing())
            self.conc[next((i for i, b in enumerate(CONCURRENCY_BUCKETS) if n <= b), len(CONCURRENCY_BUCKETS))] += 1
            self.conc_sum += n
            self.counters["lines"] += 4

    def step(self, t: int) -> None:
        for slot in self.processing():
            req = slot.req
            assert req is not None
            if req.in_prompt:
                req.held = min(req.prompt, req.held + PP_RATE)
            else:
                req.generated += TG_RATE
                req.held = req.prompt + min(req.generated, req.gen)
            slot.tokens = req.held
            if t % 3 == 0:
                self.counters["lines"] += 1
        if sum(s.tokens for s in self.slots) > CAPACITY:
            for slot in sorted((s for s in self.slots if s.req is None and s.tokens), key=lambda s: s.tokens):
                slot.tokens, slot.owner = 0.0, None
                self.counters["purged"] += 1
                if sum(s.tokens for s in self.slots) <= CAPACITY:
                    break
        if sum(s.tokens for s in self.slots) > CAPACITY:
            self.overflow(t)
        for slot in self.processing():
            req = slot.req
            assert req is not None
            if not req.in_prompt and req.generated >= req.gen:
                self.finish(t, slot, req)

    def _observe_tokens(self, held: float) -> None:
        i = next((i for i, b in enumerate(REQUEST_TOKEN_BUCKETS) if held <= b), len(REQUEST_TOKEN_BUCKETS))
        self.req_tokens[i] += 1
        self.req_tokens_sum += held
        self.sim.requests += 1
        self.sim.long_requests += held > CAPACITY / 2

    def overflow(self, t: int) -> None:
        busy = self.processing()
        scale = CAPACITY / sum(s.tokens for s in self.slots)
        self.counters["context_exceeded"] += 1
        self.counters["failed"] += 1
        self.counters["retries"] += RETRIES_PER_CASCADE
        self.counters["aborted"] += len(busy)
        self.counters["lines"] += RETRIES_PER_CASCADE + 3 * len(busy)
        self.sim.aborts.append((t, len(busy)))
        for slot in busy:
            req = slot.req
            assert req is not None
            slot.tokens = int(slot.tokens * scale)
            slot.req = None
            slot.turns += 1
            self._observe_tokens(slot.tokens)
            agent = req.agent
            if agent is None:
                continue
            agent.busy = False
            agent.failures += 1
            if agent.failures >= 2:  # the user gives up on this conversation and compacts it
                self.new_conversation(agent)
                agent.next_at = t + self.rng.uniform(120, 600)
            else:
                agent.next_at = t + self.rng.uniform(5, 30)

    def finish(self, t: int, slot: Slot, req: Request) -> None:
        slot.req = None
        slot.turns += 1
        self._observe_tokens(req.held)
        self.counters["lines"] += 3
        agent = req.agent
        if agent is None:
            return
        agent.busy, agent.failures = False, 0
        if agent.compacting:
            self.new_conversation(agent)
            slot.owner = None
        else:  # the answer without its reasoning goes into the conversation
            agent.conv = req.prompt + req.gen // 5
        # The agent runs its tools: reads and edits, a build or the tests.
        agent.next_at = t + self.rng.uniform(*TOOL_GAP_S)

    def new_conversation(self, agent: Agent, resumed: bool = False) -> None:
        """A fresh (or compacted) conversation; ``resumed``: yesterday's work picked up at some length."""
        lo, hi = self.sc.conversation
        agent.limit = int(self.rng.randint(lo, hi) * (1 + self.sc.growth) ** self.day)
        agent.conv = self.rng.randint(14_000, agent.limit * 2 // 3 if resumed else 26_000)
        agent.compacting = False

    def agent_request(self, t: int, agent: Agent) -> None:
        if agent.failures == 0:
            agent.conv += self.rng.randint(200, 1800)  # tool output and the next instruction
        if agent.conv >= agent.limit:
            agent.compacting = True
            gen = self.rng.randint(1500, 3000)
        else:
            gen = self.rng.randint(300, 2000)  # reasoning and the answer
        agent.busy = True
        self.queue.append(Request(agent, agent.conv, gen, AGENT_MAX_TOKENS))

    def chat_request(self) -> None:
        lo, hi = self.sc.documents or (200, 2500)
        self.queue.append(Request(None, self.rng.randint(lo, hi), self.rng.randint(10, 90), None))


def _demand(req: Request, t: int, horizon: str) -> float:
    # At the default verbosity the prompt's size shows with its second progress line, 3 s in.
    known = not req.in_prompt or t - req.started >= 3
    prompt = req.prompt if known else req.held
    if horizon == "prompt":
        return max(prompt, req.held)
    left = (req.budget if req.budget is not None else 0) - req.generated
    if horizon == "limits":
        return max(prompt, req.held) + max(left, 0)
    return CAPACITY if req.budget is None else min(CAPACITY, prompt + max(left, 0))


def simulate(sc: Scenario) -> Simulation:
    """Run ``sc`` second by second; sample the exporter's series every ``sc.scrape_s`` seconds."""
    rng = random.Random(sc.seed)
    sim = Simulation(sc)
    srv = _Server(sc, rng, sim)
    agents = [Agent(f"agent{i}") for i in range(sc.agents if sc.traffic else 0)]
    for a in agents:
        srv.new_conversation(a)
    offsets = {a.name: [(rng.uniform(-0.5, 0.5), rng.uniform(-0.5, 0.5)) for _ in range(sc.days)] for a in agents}
    started_day = {a.name: -1 for a in agents}
    rows: dict[str, list[float]] = {}
    activity = Activity()

    def put(name: str, value: float) -> None:
        rows.setdefault(name, []).append(value)

    for t in range(sc.days * DAY):
        day = srv.day = t // DAY
        for a in agents:
            if a.busy or t < a.next_at or not _working(t, offsets[a.name][day]):
                continue
            if started_day[a.name] != day:  # a new day: yesterday's conversation resumed (day 1: new ones)
                started_day[a.name] = day
                srv.new_conversation(a, resumed=day > 0)
            srv.agent_request(t, a)
        if sc.chat and sc.traffic:
            busy_hours = _working(t, (0.0, 0.0))
            if rng.random() < (sc.chat_per_second if busy_hours else sc.chat_per_second / 20):
                srv.chat_request()
        srv.admit(t)
        srv.step(t)
        srv.admit(t)
        if t % sc.scrape_s:
            continue
        busy = srv.processing()
        used = sum(s.tokens for s in srv.slots)
        for i, s in enumerate(srv.slots):
            put(f'llamacpp_slot_tokens{{{LABELS}, slot="{i}"}}', int(s.tokens))
            put(f'llamacpp_slot_processing{{{LABELS}, slot="{i}"}}', int(s.req is not None))
            put(f'llamacpp_slot_context_tokens{{{LABELS}, slot="{i}"}}', CAPACITY)
        put(f"llamacpp_slots{{{LABELS}}}", SLOTS)
        put(
            f'llamacpp_server_info{{{LABELS}, build="11434", model="agent-70b", kv_unified="true", type_k="f16", type_v="f16", capacity_source="command_line"}}',
            1,
        )
        put(f"llamacpp_kv_pool_capacity_tokens{{{LABELS}}}", CAPACITY)
        put(f"llamacpp_kv_pool_used_tokens{{{LABELS}}}", int(used))
        put(f"llamacpp_kv_pool_usage_ratio{{{LABELS}}}", round(used / CAPACITY, 4))
        put(f"llamacpp_kv_pool_overcommit_ratio{{{LABELS}}}", SLOTS)
        for horizon in ("prompt", "limits", "max"):
            demand = sum(_demand(s.req, t, horizon) for s in busy if s.req is not None)
            put(f'llamacpp_kv_pool_demand_tokens{{{LABELS}, horizon="{horizon}"}}', int(demand))
            put(f'llamacpp_kv_pool_demand_ratio{{{LABELS}, horizon="{horizon}"}}', round(demand / CAPACITY, 4))
        seen = {
            i: SlotState(tokens=int(s.tokens), processing=s.req is not None, turns=s.turns)
            for i, s in enumerate(srv.slots)
        }
        active = activity.observe(float(t), seen, ACTIVE_WINDOW)
        put(f"llamacpp_kv_pool_active_tokens{{{LABELS}}}", active)
        put(f"llamacpp_kv_pool_active_ratio{{{LABELS}}}", round(active / CAPACITY, 4))
        put(f"llamacpp_kv_pool_active_window_seconds{{{LABELS}}}", ACTIVE_WINDOW)
        for kind in ("k", "v"):
            put(f'llamacpp_kv_cache_bytes{{{LABELS}, kind="{kind}"}}', CAPACITY * BYTES_PER_CELL // 2)
        unknown = sum(1 for s in busy if s.req is not None and s.req.budget is None)
        put(f"llamacpp_kv_pool_demand_unknown_budget_slots{{{LABELS}}}", unknown)
        put(f"llamacpp_requests_in_flight{{{LABELS}}}", len(busy))
        c = srv.counters
        put(f"llamacpp_context_exceeded_total{{{LABELS}}}", c["context_exceeded"])
        put(f'llamacpp_requests_aborted_total{{{LABELS}, reason="context_exceeded"}}', c["aborted"])
        put(f"llamacpp_kv_retries_total{{{LABELS}}}", c["retries"])
        put(f'llamacpp_kv_cascades_total{{{LABELS}, outcome="failed"}}', c["failed"])
        put(f'llamacpp_kv_cascades_total{{{LABELS}, outcome="recovered"}}', 0)
        put(f"llamacpp_slots_purged_total{{{LABELS}}}", c["purged"])
        put(f"llamacpp_exporter_log_lines_total{{{LABELS}}}", c["lines"])
        cum = 0
        token_bounds: list[float | str] = [*REQUEST_TOKEN_BUCKETS, "+Inf"]
        for bound, n in zip(token_bounds, srv.req_tokens, strict=True):
            cum += n
            put(f'llamacpp_request_tokens_bucket{{{LABELS}, le="{_le(bound)}"}}', cum)
        put(f"llamacpp_request_tokens_count{{{LABELS}}}", cum)
        put(f"llamacpp_request_tokens_sum{{{LABELS}}}", int(srv.req_tokens_sum))
        cum = 0
        conc_bounds: list[float | str] = [*CONCURRENCY_BUCKETS, "+Inf"]
        for bound, n in zip(conc_bounds, srv.conc, strict=True):
            cum += n
            put(f'llamacpp_request_concurrency_bucket{{{LABELS}, le="{_le(bound)}"}}', cum)
        put(f"llamacpp_request_concurrency_count{{{LABELS}}}", cum)
        put(f"llamacpp_request_concurrency_sum{{{LABELS}}}", int(srv.conc_sum))
        # A healthy host and exporter: everything up, memory to spare.
        put(f"up{{{LABELS}}}", 1)
        put(f"llamacpp_up{{{LABELS}}}", 1)
        put(f"llamacpp_server_loading{{{LABELS}}}", 0)
        put(f"llamacpp_server_starts_total{{{LABELS}}}", 1)
        put(f'llamacpp_exporter_build_info{{{LABELS}, version="0.1.0"}}', 1)
        put(f"llamacpp_exporter_log_understood{{{LABELS}}}", 1)
        for source in ("log", "http", "proc", "nvml"):
            put(f'llamacpp_exporter_source_up{{{LABELS}, source="{source}"}}', 1)
        put(f"llamacpp_host_memory_available_bytes{{{LABELS}}}", 40 << 30)
        put(f"llamacpp_host_memory_total_bytes{{{LABELS}}}", 64 << 30)
        put(f"llamacpp_gpu_memory_free_bytes{{{LABELS}, {GPU}}}", 3 << 30)
        put(f"llamacpp_gpu_memory_total_bytes{{{LABELS}, {GPU}}}", 24 << 30)
        put(f'llamacpp_process_gpu_memory_bytes{{{LABELS}, gpu="0", uuid="GPU-5d7a0c4e"}}', 21 << 30)
    sim.series = rows
    return sim


def _le(bound: float | str) -> str:
    return bound if isinstance(bound, str) else f"{float(bound)}"
