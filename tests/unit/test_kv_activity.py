"""The cells of the conversations in flight or coming back (`exporter.model.activity`) on real b11434 logs, and
their gauges through the server unit: a slot's turns seen processing or by its task id between two scrapes, the
window after its last turn, a cleared slot still counted, a restart forgetting the old server's turns."""

from __future__ import annotations

from paths import FIXTURES
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.logs.parse import parse_line
from exporter.metrics.forecast import KVForecastCollector
from exporter.model.activity import Activity
from exporter.model.state import ServerState
from exporter.settings import HostArea
from exporter.sources.live import LiveSources
from exporter.unit import ServerUnit

WINDOW = HostArea.kv_pool_active_window


class Replay:
    """A capture's lines applied to one state, a range at a time."""

    def __init__(self, capture: str) -> None:
        self.lines = (FIXTURES / "b11434" / capture / "llama-server.log").read_text(encoding="utf-8").splitlines()
        self.state = ServerState()
        self.done = 0

    def until(self, line: int) -> ServerState:
        """The state after the first `line` lines (1-based, as grep -n counts)."""
        for text in self.lines[self.done : line]:
            event = parse_line(text)
            if event is not None:
                self.state.apply(event)
        self.done = line
        return self.state


def test_a_conversation_counts_while_it_runs_its_tools_and_not_after_the_window() -> None:
    # checkpoints-swa-lv4: slot 0 runs one conversation, turn after turn (tasks 2, 14, 25, 35); slot 1 stays idle.
    log, a = Replay("checkpoints-swa-lv4"), Activity()
    st = log.until(195)  # task 2 processing
    assert st.run.slots[0].processing
    assert a.observe(0.0, st.run.slots, WINDOW, st.run) == st.run.slots[0].tokens
    st = log.until(202)  # released: 'stop processing: n_tokens = 247'
    assert not st.run.slots[0].processing and st.run.slots[0].tokens == 247
    assert a.observe(10.0, st.run.slots, WINDOW, st.run) == 247
    assert a.observe(10.0 + WINDOW, st.run.slots, WINDOW, st.run) == 247  # the window counts from its end
    assert a.observe(10.0 + WINDOW + 1, st.run.slots, WINDOW, st.run) == 0
    # Task 14 starts and ends between two scrapes: the slot's count of released tasks moved.
    st = log.until(228)
    assert st.run.slots[0].turns == 2 and st.run.slots[0].tokens == 267
    t = 10.0 + 10 * WINDOW
    assert a.observe(t, st.run.slots, WINDOW, st.run) == 267
    assert a.observe(t + WINDOW + 1, st.run.slots, WINDOW, st.run) == 0


def test_a_cleared_slot_of_a_recent_conversation_still_counts() -> None:
    log, a = Replay("checkpoints-swa-lv4"), Activity()
    st = log.until(195)
    a.observe(0.0, st.run.slots, WINDOW, st.run)
    st = log.until(202)
    assert a.observe(5.0, st.run.slots, WINDOW, st.run) == 247
    st.run.slots[0].clear()  # another task's start saved it to the prompt cache and cleared it
    assert a.observe(20.0, st.run.slots, WINDOW, st.run) == 247
    assert a.observe(5.0 + WINDOW + 1, st.run.slots, WINDOW, st.run) == 0


def test_slots_never_seen_in_a_turn_do_not_count_and_a_restart_forgets() -> None:
    # exhaust-default-verbosity (-lv 3): four slots launched together, then the overflow aborts them all.
    log, a = Replay("exhaust-default-verbosity"), Activity()
    st = log.until(15)  # slot 3 ran task 2 and released it before the first scrape: seen idle, never in a turn
    assert a.observe(0.0, st.run.slots, WINDOW, st.run) == 0
    st = log.until(23)  # all four processing (-lv 3 tells no cells until the release; /slots would)
    assert all(s.processing for s in st.run.slots.values())
    assert a.observe(1.0, st.run.slots, WINDOW, st.run) == sum(s.tokens for s in st.run.slots.values())
    # Aborted and released: their conversations come back (the clients retry). b11434 cleared the aborted slots,
    # so what each held is the release line's n_tokens (slot 0 ran a retry since: its 41 cells).
    st = log.until(len(log.lines))
    assert not any(s.processing for s in st.run.slots.values())
    held = {i: s.last_turn for i, s in st.run.slots.items()}
    assert held == {0: 41, 1: 129, 2: 130, 3: 128} and sum(s.tokens for s in st.run.slots.values()) == 41
    assert a.observe(2.0, st.run.slots, WINDOW, st.run) == sum(held.values())
    fresh = ServerState()  # a new server process: its run replaces the old one's
    assert a.observe(3.0, st.run.slots, WINDOW, fresh.run) == 0


def _gauges(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_unit_exports_the_active_cells_their_ratio_and_the_window() -> None:
    log = Replay("checkpoints-swa-lv4")
    st = log.until(195)
    unit = ServerUnit(st, LiveSources(st), active_window=30.0)
    registry = CollectorRegistry()
    registry.register(KVForecastCollector(unit.view))
    first = _gauges(generate_latest(registry).decode())
    unit.scraped()
    capacity, _ = st.pool_capacity()
    assert capacity
    assert first["llamacpp_kv_pool_active_tokens"] == st.run.slots[0].tokens
    assert first["llamacpp_kv_pool_active_ratio"] == st.run.slots[0].tokens / capacity
    assert first["llamacpp_kv_pool_active_window_seconds"] == 30.0
    log.until(202)  # released: still counted in the next scrape, while the prompt demand drops to 0
    second = _gauges(generate_latest(registry).decode())
    assert second["llamacpp_kv_pool_active_tokens"] == 247
    assert second["llamacpp_kv_pool_demand_tokens"] == 0


def test_a_conversation_whose_slot_another_task_took_counts_once_until_it_comes_back() -> None:
    from exporter.model.slot import SlotState

    a = Activity()
    # Slot 0 runs an agent's 6,000-cell turn; slot 1 idles.
    assert a.observe(0.0, {0: SlotState(tokens=6000, processing=True), 1: SlotState()}, WINDOW) == 6000
    # The agent runs its tools; a chat request takes slot 0 (its conversation saved to the prompt cache).
    both = a.observe(10.0, {0: SlotState(tokens=300, processing=True, turns=1), 1: SlotState()}, WINDOW)
    assert both == 6000 + 300
    # The agent comes back on slot 1, restored from the cache and 500 cells longer: counted there, once.
    back = {0: SlotState(tokens=300, turns=2), 1: SlotState(tokens=6500, processing=True)}
    assert a.observe(20.0, back, WINDOW) == 300 + 6500
    # A small task on slot 1 instead would not have been the conversation: it would still count on its own.
    b = Activity()
    b.observe(0.0, {0: SlotState(tokens=6000, processing=True), 1: SlotState()}, WINDOW)
    b.observe(10.0, {0: SlotState(tokens=300, processing=True, turns=1), 1: SlotState()}, WINDOW)
    other = {0: SlotState(tokens=300, turns=2), 1: SlotState(tokens=800, processing=True)}
    assert b.observe(20.0, other, WINDOW) == 300 + 800 + 6000
    assert b.observe(10.0 + WINDOW + 1, other, WINDOW) == 300 + 800  # its window passed


def _scraped_every_second(capture: str) -> dict[int, int]:
    """The active cells a 1 s scrape would have read through a capture, by the log's time stamps (s)."""
    state, a, seen, due = ServerState(), Activity(), {}, 1
    for text in (FIXTURES / "b11434" / capture / "llama-server.log").read_text(encoding="utf-8").splitlines():
        minutes, seconds, ms = (int(x) for x in text.split(" ", 1)[0].split(".")[:3])
        while minutes * 60 + seconds + ms / 1000 >= due:
            seen[due] = a.observe(float(due), state.run.slots, WINDOW, state.run)
            due += 1
        if (event := parse_line(text)) is not None:
            state.apply(event)
    return seen


def test_agents_whose_turns_hop_between_slots_count_once_each_at_their_latest_size() -> None:
    # agent-loop-lv3: three agents on -np 3; every launch saves the idle slots to the prompt cache and clears
    # them, so each turn takes the least recently used slot, restores its conversation there, and mostly starts
    # and ends between two scrapes. Each conversation grows by ~170 cells a turn; the release lines give, per
    # agent: X 2415 (0:42.5), 2599, 2769 (0:51.5), 2955, 3131, 3308, 3493 (1:15.4); Y 2109 (0:44.7), 2272
    # (0:53.2), 2443, 2614, 2791 (1:14.3); Z 2398 (0:44.8), 2578 (0:53.2), 2763, 2930, 3103, 3272 (1:16.7).
    seen = _scraped_every_second("agent-loop-lv3")
    assert seen[45] == 2415 + 2109 + 2398
    assert seen[54] == 2769 + 2272 + 2578
    assert seen[77] == 3493 + 2791 + 3272  # 1.17 of the 8,192-cell pool: the overlap that follows overflows it
    # Counted once each: never more than the three conversations at their largest.
    assert max(seen.values()) <= 3664 + 2946 + 3272
