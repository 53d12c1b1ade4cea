"""Checkpoints and the prompt cache from the real b11434 capture (tiny gemma2, -ctxcp 3, -lv 4).

After every line, each slot's live checkpoints must be what the log implies: the create lines say
"N of M" (the slot's count after the append), each erase names the checkpoint it drops, and a
cleared prompt drops them all. Sizes are checked to the log's 0.001 MiB precision.
"""

from __future__ import annotations

import re

import pytest
from paths import B11434

from exporter.logs.parse import normalize, parse_message
from exporter.model.bounds import MIB
from exporter.model.state import ServerState

LOG = B11434 / "checkpoints-swa-lv4" / "llama-server.log"

_SLOT = re.compile(r"^slot\s+\S+: id\s+(\d+) \| task -?\d+ \| (.*)$")
_CREATED = re.compile(
    r"created context checkpoint (\d+) of (\d+) \(pos_min = (-?\d+), pos_max = (-?\d+).*size = ([\d.]+) MiB"
)
_ERASED = re.compile(
    r"(?:erasing|erased) .*context checkpoint.*\(pos_min = (-?\d+), pos_max = (-?\d+),.*size = ([\d.]+) MiB"
)
_CACHE_STATE = re.compile(r"cache state: (\d+) prompts, ([\d.]+) MiB")


def _run() -> tuple[ServerState, int]:
    state = ServerState()
    implied: dict[int, dict[tuple[int, int], float]] = {}
    checked = 0
    last_cache: tuple[int, float] | None = None
    for msg in (normalize(line) for line in LOG.read_text(encoding="utf-8").splitlines()):
        event = parse_message(msg)
        if event is not None:
            state.apply(event)
        if m := _CACHE_STATE.search(msg):
            last_cache = (int(m[1]), float(m[2]))
        sm = _SLOT.match(msg)
        if not sm:
            continue
        slot, rest = int(sm[1]), sm[2]
        live = implied.setdefault(slot, {})
        if m := _CREATED.search(rest):
            live[(int(m[3]), int(m[4]))] = float(m[5])
            assert len(state.run.slots[slot].checkpoints) == int(m[1]), msg  # "N of M"
        elif m := _ERASED.search(rest):
            del live[(int(m[1]), int(m[2]))]
        elif rest.startswith("clearing prompt with"):
            live.clear()
        else:
            continue
        s = state.run.slots[slot]
        assert len(s.checkpoints) == len(live), msg
        assert s.checkpoint_bytes / MIB == pytest.approx(sum(live.values()), abs=0.0005), msg
        checked += 1
    assert last_cache is not None
    assert state.run.prompt_cache_prompts == last_cache[0]
    assert state.run.prompt_cache_bytes == pytest.approx(last_cache[1] * MIB)
    return state, checked


def test_live_checkpoints_follow_the_log_after_every_line() -> None:
    state, checked = _run()
    assert checked >= 20
    assert len(state.run.slots[0].checkpoints) == 3  # created 2 and 3 of 3 after the restore in task 46
    assert state.run.checkpoint_limit == 3


def test_checkpoint_counters_equal_line_counts() -> None:
    state, _ = _run()
    text = LOG.read_text(encoding="utf-8")
    assert state.checkpoint_events["created"] == text.count("created context checkpoint") == 9
    assert state.checkpoint_events["evicted"] == text.count("erasing old context checkpoint") + text.count(
        "erasing context checkpoint too close"
    )
    assert state.checkpoint_events["invalidated"] == text.count("erased invalidated context checkpoint") == 3
    assert state.checkpoint_events["restored"] == text.count("restored context checkpoint") == 1
    assert state.full_reprocess == text.count("forcing full prompt re-processing")


def test_prompt_eval_histogram_matches_timing_lines() -> None:
    state, _ = _run()
    times = [float(m) for m in re.findall(r"prompt eval time = +([\d.]+) ms", LOG.read_text(encoding="utf-8"))]
    assert state.prompt_eval_seconds.count == len(times) == 5
    assert state.prompt_eval_seconds.sum == pytest.approx(sum(times) / 1000, abs=1e-9)
    assert sum(state.prompt_eval_seconds.counts) == 5
    assert state.prompt_tokens == 240 + 20 + 4 + 104 + 41
    assert state.generated_tokens == 5 * 8


def test_server_restart_drops_checkpoints_and_cache() -> None:
    state, _ = _run()
    for line in LOG.read_text(encoding="utf-8").splitlines()[:3]:
        event = parse_message(normalize(line))
        if event is not None:
            state.apply(event)
    assert state.server_starts == 2
    assert all(not s.checkpoints for s in state.run.slots.values())
    assert state.run.prompt_cache_bytes is None and state.run.checkpoint_limit is None  # until the new start-up lines
    assert state.checkpoint_events["created"] == 9  # counters survive


def test_cache_load_moves_the_entrys_checkpoints_into_the_slot() -> None:
    """`found better prompt`: llama-server moves the cached prompt, checkpoints included, into the slot."""
    lines = [
        "slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = 5",
        "slot create_check: id  0 | task 2 | created context checkpoint 1 of 3 (pos_min = 0, pos_max = 99, n_tokens = 100, size = 250.000 MiB)",
        "slot create_check: id  0 | task 2 | created context checkpoint 2 of 3 (pos_min = 0, pos_max = 199, n_tokens = 200, size = 250.000 MiB)",
        "slot get_availabl: id  0 | task -1 | selected slot by LRU, t_last = 9",
        "srv   prompt_save:  - saving prompt with length 210, total state size = 0.041 MiB (draft: 0.000 MiB)",
        "slot prompt_clear: id  0 | task -1 | clearing prompt with 210 tokens",
        "slot get_availabl: id  1 | task -1 | selected slot by LCP similarity, sim_best = 0.9 (> 0.1 thold), f_keep = 0.9",
        "srv          load:    - prompt with length     210, lcp =     200, f_keep = 0.952, f_sim = 0.990",
        "srv          load:  - found better prompt with f_keep = 0.952, f_sim = 0.990",
    ]
    state = ServerState()
    for line in lines:
        event = parse_message(normalize(line))
        if event is not None:
            state.apply(event)
    assert state.run.slots[0].checkpoints == []
    assert [c.pos_max for c in state.run.slots[1].checkpoints] == [99, 199]
    assert state.run.slots[1].checkpoint_bytes == 500 * MIB
