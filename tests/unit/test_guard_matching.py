"""Every request matched to its slot, whatever the order in which prompts start and end: the guard's own
path (`slot_views`, `match` with what it knew, `Accounting.placed`) over `/slots` answers shaped as b11434
gives them while three prompts overflow a shared pool together, the first still reading its prompt when the
others start.

b11434's `/slots` while a prompt is read (seen on a real server, -c 24576 -np 3 -kvu, 2,048-token batches):
`n_prompt_tokens` is the part read, `n_prompt_tokens_processed` trails it by a batch (0 during the first,
equal to it when the slot waited a turn), `next_token.n_decoded` is 0; once the prompt is whole, `processed`
is the prompt and `n_decoded` counts what was generated.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest

from exporter.guard.accounting import Accounting, Record, line
from exporter.guard.admission import Ticket
from exporter.guard.clients import ClientNamer
from exporter.guard.preempt import LastRead, Running, SlotView, match, slot_views

POOL, BATCH = 24_576, 2_048
BURST = {"planner": 9_500, "coder": 8_000, "reviewer": 8_500}  # 26,000 > 24,576
ORDERS = {
    "largest-first": ("planner", "coder", "reviewer"),
    "largest-last": ("coder", "reviewer", "planner"),
    "largest-middle": ("coder", "planner", "reviewer"),
}


@dataclass
class Slot:
    """One slot of the simulated server: its task, its prompt and what it has read and generated."""

    id: int
    task: int
    prompt: int
    read: int = 0
    trail: int = 0  # n_prompt_tokens_processed: the part read as of the batch before
    decoded: int = 0
    shown: bool = False  # the last prompt batch has been shown once (the first token comes at the next update)

    def entry(self) -> dict[str, Any]:
        held = self.read + self.decoded
        return {
            "id": self.id, "n_ctx": POOL, "is_processing": True, "id_task": self.task, "n_prompt_tokens": held,
            "n_prompt_tokens_processed": self.trail, "n_prompt_tokens_cache": 0, "params": {"n_predict": 16},
            "next_token": [{"has_next_token": True, "n_remain": 16 - self.decoded, "n_decoded": self.decoded}],
        }  # fmt: skip


@dataclass
class Server:
    """llama-server b11434 reading prompts the way it was seen to: each update fills one batch slot by slot, in
    the order of their ids; a slot whose prompt is whole generates a token an update; past the pool, it aborts."""

    slots: dict[int, Slot] = field(default_factory=dict)
    tasks: itertools.count[int] = field(default_factory=lambda: itertools.count(3))
    aborted: bool = False

    def start(self, slot: int, prompt: int) -> int:
        task = next(self.tasks)
        self.slots[slot] = Slot(slot, task, prompt)
        return task

    def update(self) -> None:
        room = BATCH
        for s in sorted(self.slots.values(), key=lambda s: s.id):
            if s.read == s.prompt:
                s.trail = s.prompt
                s.decoded += 1 if s.shown else 0
                s.shown = True
                continue
            s.trail = s.read
            step = min(room, s.prompt - s.read)
            s.read, room = s.read + step, room - step
        if sum(s.read + s.decoded for s in self.slots.values()) > POOL:
            self.aborted, self.slots = True, {}

    def body(self) -> list[dict[str, Any]]:
        idle = [{"id": k, "n_ctx": POOL, "is_processing": False} for k in range(3) if k not in self.slots]
        return idle + [s.entry() for s in self.slots.values()]


class Guard:
    """The guard's side, as its monitor runs it: each read of /slots matched with what it knew, then placed."""

    def __init__(self) -> None:
        self.accounting = Accounting(ClientNamer())
        self.running: list[Running] = []
        self.speeds: dict[int, LastRead] = {}
        self.now = 0.0
        self.reading: list[int] = []  # how many slots each read of the three at work found reading a prompt

    def admit(self, client: str, prompt: int) -> None:
        tid = len(self.running) + 1
        self.now += 0.001
        self.running.append(Running(tid, prompt, 16, admitted_at=self.now))
        record = Record(f"r{tid}", client, "/completion", 0.0, 0.0, ticket=Ticket(tid, prompt, 16))
        self.accounting.records[tid] = record

    def read(self, body: list[dict[str, Any]]) -> dict[int, SlotView]:
        self.now += 1.25
        views = slot_views(body, self.speeds, self.now)
        if len(views) == 3:
            self.reading.append(sum(v.reading for v in views))
        matched = match(views, self.running, self.accounting.known())
        self.accounting.placed([r.id for r in self.running], matched)
        return matched


def burst(
    order: tuple[str, ...], first_slot: int, swapped: bool, every: int, phase: int
) -> tuple[Guard, dict[str, tuple[int, int]]]:
    """The burst: the first request alone for two batches, then the other two at once (reaching the server in
    the order admitted, or `swapped`); the guard reads /slots every `every` updates from `phase`. Returns the
    guard and each client's true (slot, task)."""
    server, guard = Server(), Guard()
    truth: dict[str, tuple[int, int]] = {}
    guard.admit(order[0], BURST[order[0]])
    truth[order[0]] = (first_slot, server.start(first_slot, BURST[order[0]]))
    others = [k for k in range(3) if k != first_slot]
    for n in range(1, 10_000):
        server.update()
        if server.aborted:
            break
        if n == 2:
            for name in order[1:]:
                guard.admit(name, BURST[name])
            for name, slot in zip(order[:0:-1] if swapped else order[1:], others, strict=True):
                truth[name] = (slot, server.start(slot, BURST[name]))
        if n >= phase and (n - phase) % every == 0:
            guard.read(server.body())
    return guard, truth


@pytest.mark.parametrize("order", ORDERS.values(), ids=ORDERS.keys())
@pytest.mark.parametrize("first_slot", [0, 1, 2])
@pytest.mark.parametrize("swapped", [False, True], ids=["in-order", "swapped"])
@pytest.mark.parametrize(("every", "phase"), [(1, 1), (2, 1), (2, 2), (3, 1), (3, 2), (3, 3)])
def test_every_holder_of_an_overflow_is_matched_to_its_slot_whatever_the_order(
    order: tuple[str, ...], first_slot: int, swapped: bool, every: int, phase: int
) -> None:
    """The three requests end aborted; each one's access-log line names the slot and task the server gave it,
    whichever slot the first got, however often the guard read /slots. The two sent at once reach the server
    in the order the guard sent them (their tasks in that order), or the other way round: then they are named
    right once a read found at most one prompt still being read (the others' sizes shown whole); while two
    are still being read at its last read, what tells them apart is the part read (at most the prompt) and
    their tasks' order."""
    guard, truth = burst(order, first_slot, swapped, every, phase)
    named = {}
    for tid, record in guard.accounting.records.items():
        entry = line(record, 500, guard.running[tid - 1].prompt)
        named[record.client] = (entry["slot"], entry["task"])
        assert 0 < entry["cells"] <= BURST[record.client] + 16, entry
    if not swapped or min(guard.reading, default=3) <= 1:
        assert named == truth
    else:  # the first, sent a batch before the others, is named whatever they show
        assert named[order[0]] == truth[order[0]]
