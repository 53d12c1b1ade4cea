"""Golden tests: each captured real llama-server log yields the state the log itself states.

Ground truth comes from the log's own lines (`stop processing: n_tokens = N`, `clearing prompt`,
retry/abort line counts) and from the server's `/slots` snapshot taken after the run
(`n_prompt_tokens` is the slot's live token count on b9276+).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
from paths import B11434

from exporter.logs import events as ev
from exporter.logs.parse import normalize, parse_message
from exporter.model.run import ServerRun
from exporter.model.state import ServerState

FIXTURES = B11434

_RELEASE = re.compile(r"^slot\s+\S+: id\s+(\d+) \| task (\d+) \| stop processing: n_tokens = (\d+)")
_CLEAR = re.compile(r"^slot\s+\S+: id\s+(\d+) \| task -?\d+ \| clearing prompt with (\d+) tokens")
_SEND_ERROR = re.compile(r"send_error: task id = (\d+), error: Context size has been exceeded")


@dataclass(frozen=True)
class Expected:
    slots: int
    pool: int
    overcommit: float
    cascades_failed: int
    cascades_recovered: int
    capacity_source: str


CAPTURES = {
    "exhaust-lv4": Expected(4, 512, 4.0, 1, 0, "log_kv_cache"),
    "exhaust-default-verbosity": Expected(4, 512, 4.0, 1, 0, "log_slots"),
    "exhaust-jsonl": Expected(4, 512, 4.0, 1, 0, "log_kv_cache"),
    "exhaust-no-prefix": Expected(4, 512, 4.0, 1, 0, "log_kv_cache"),
    "exhaust-long-lv4": Expected(4, 32768, 4.0, 1, 0, "log_kv_cache"),
    "recover-purge-lv4": Expected(3, 1024, 3.0, 0, 1, "log_kv_cache"),
    "checkpoints-swa-lv4": Expected(2, 4096, 2.0, 0, 0, "log_kv_cache"),
    "longprompt-lv4": Expected(1, 65536, 1.0, 0, 0, "log_kv_cache"),
}


def _lines(name: str) -> list[str]:
    return (FIXTURES / name / "llama-server.log").read_text(encoding="utf-8").splitlines()


def _messages(name: str) -> list[str]:
    return [normalize(line) for line in _lines(name)]


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_line_by_line_slot_tokens_follow_the_log(name: str) -> None:
    """After each release the slot holds N (0 if its request was aborted); after each clear it holds 0."""
    state = ServerState()
    aborted: set[int] = set()
    checked = 0
    for msg in _messages(name):
        event = parse_message(msg)
        if event is not None:
            state.apply(event)
        if m := _SEND_ERROR.search(msg):
            aborted.add(int(m[1]))
        if m := _RELEASE.match(msg):
            slot, task, n = int(m[1]), int(m[2]), int(m[3])
            # llama-server (b7078+) clears the slot of an aborted request right after releasing it.
            assert state.run.slots[slot].tokens == (0 if task in aborted else n), msg
            assert not state.run.slots[slot].processing
            checked += 1
        elif m := _CLEAR.match(msg):
            assert state.run.slots[int(m[1])].tokens == 0, msg
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_final_state_matches_capture(name: str) -> None:
    exp = CAPTURES[name]
    messages = _messages(name)
    state = ServerState()
    for msg in messages:
        event = parse_message(msg)
        if event is not None:
            state.apply(event)

    assert state.run.slot_count == exp.slots
    capacity, source = state.pool_capacity()
    assert capacity == exp.pool
    assert source == exp.capacity_source
    assert state.overcommit_ratio() == pytest.approx(exp.overcommit)
    assert state.server_starts == 1

    retries = sum("retrying with smaller batch size" in m for m in messages)
    exceeded = sum(m.startswith("srv        decode: Context size has been exceeded.") for m in messages)
    send_errors = sum("send_error: task id" in m for m in messages)
    assert state.kv_retries == retries
    assert state.context_exceeded == exceeded
    assert sum(state.requests_aborted.values()) == send_errors
    assert state.cascades["failed"] == exp.cascades_failed
    assert state.cascades["recovered"] == exp.cascades_recovered
    assert not state.run.in_cascade

    # The server's own /slots after the run: n_prompt_tokens is what each slot holds.
    slots_file = FIXTURES / name / "post_slots.json"
    if slots_file.exists():
        live = {s["id"]: s.get("n_prompt_tokens", 0) for s in json.loads(slots_file.read_text())}
        assert {i: s.tokens for i, s in state.run.slots.items()} == live
        assert state.run.pool_used() == sum(live.values())


def test_exhaust_counts_are_the_line_counts() -> None:
    """The seed incident in numbers: 26 retries, 1 context-exceeded, 4 aborted requests (exhaust-lv4)."""
    state = ServerState()
    for line in _lines("exhaust-lv4"):
        event = parse_message(normalize(line))
        if event is not None:
            state.apply(event)
    assert (state.kv_retries, state.context_exceeded, state.requests_aborted["context_exceeded"]) == (
        26,
        1,
        4,
    )
    assert state.run.type_k == state.run.type_v == "f16"
    assert state.run.kv_k_bytes == pytest.approx(0.06 * 1024 * 1024)


def test_replay_rebuilds_gauges_without_counting() -> None:
    """The exporter's start-up replay: same gauges as a live read, every counter still zero."""
    live, replay = ServerState(), ServerState(counting=False)
    for line in _lines("exhaust-long-lv4"):
        event = parse_message(normalize(line))
        if event is not None:
            live.apply(event)
            replay.apply(event)
    assert {i: s.tokens for i, s in replay.run.slots.items()} == {i: s.tokens for i, s in live.run.slots.items()}
    assert replay.pool_capacity() == live.pool_capacity()
    assert live.kv_retries > 0 and live.server_starts == 1
    assert (replay.kv_retries, replay.context_exceeded, replay.server_starts) == (0, 0, 0)
    assert not replay.requests_aborted and not replay.cascades


def test_generation_progress_estimates_slot_tokens() -> None:
    """During the long run each slot holds about its prompt plus the tokens generated so far."""
    state = ServerState()
    seen = 0
    for msg in _messages("exhaust-long-lv4"):
        event = parse_message(msg)
        if event is not None:
            state.apply(event)
        if m := re.search(r"id\s+(\d+) \| task \d+ \| n_gen = +(\d+)", msg):
            slot = state.run.slots[int(m[1])]
            assert slot.processing
            assert slot.tokens == slot.prompt_tokens + int(m[2])
            seen += 1
    assert seen == 32


def test_server_restart_resets_slots_and_counts_once() -> None:
    """Two runs in one stream (e.g. stdin or journald): the second banner is a new start."""
    state = ServerState()
    lines = _lines("exhaust-lv4")
    for line in lines + lines[:150]:
        event = parse_message(normalize(line))
        if event is not None:
            state.apply(event)
    assert state.server_starts == 2
    assert state.run.pool_used() == 0
    assert state.kv_retries == 26  # counters survive a server restart


def test_a_start_forgets_the_whole_run_and_keeps_the_counters() -> None:
    """Everything the previous run said is gone at the next start banner; what the exporter counted stays."""
    state = ServerState()
    for line in _lines("checkpoints-swa-lv4"):
        event = parse_message(normalize(line))
        if event is not None:
            state.apply(event)
    old = state.run
    assert old.slots and old.n_slots and old.build and old.kv_cells  # the run had said a lot
    counted = (state.server_starts, sum(state.checkpoint_events.values()), state.request_tokens.count)
    assert state.apply(ev.ServerStarting())
    assert state.run is not old
    assert state.run == ServerRun(in_startup=True, banners_seen={ev.ServerStarting})
    assert (state.server_starts, sum(state.checkpoint_events.values()), state.request_tokens.count) == (
        counted[0] + 1,
        *counted[1:],
    )
