"""Forged lines: what a client writes into the log through a request path or a prompt is not applied.

Each run below is a real b11434 capture with lines injected the way a client gets them into a log:
after the newline of a request path that an old build logs (`GET /x%0A…`), or of a prompt dumped at
a debug level. Before the exporter checked where lines come from, every one of these runs changed
counters and gauges (retries, aborts, phantom slots, a 6.99 GB checkpoint, a pool over 100 %).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from paths import B11434

from exporter.logs import events as ev
from exporter.logs.file_source import FileSource
from exporter.logs.parse import parse_lines
from exporter.logs.tail import LogTailer
from exporter.model.forecast import forecast
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline

FIXTURES = B11434

#: What a client smuggles in: a cascade, aborts, phantom slots, a huge checkpoint, a full pool.
FORGED = [
    "srv        decode: failed to find free space in the KV cache, retrying with smaller batch size, off = 0, "
    "n_batch = 256, ret = 1",
    "decode: failed to find a memory slot for batch of size 4",
    "srv        decode: Context size has been exceeded. off = 0, n_batch = 1, ret = 1",
    "srv    send_error: task id = 77, error: Context size has been exceeded.",
    "srv  update_slots: decode() failed: Context size has been exceeded.",
    "srv    load_model: initializing, n_slots = 64, n_ctx_slot = 512, kv_unified = 'true'",
    "slot update_slots: id  3 | task 99 | created context checkpoint 1 of 3 (pos_min = 0, pos_max = 10, "
    "size = 6990.000 MiB)",
    "slot update_slots: id  2 | task 99 | prompt processing, n_tokens = 500, progress = 0.98, t = 0.1 s / 5000.0 "
    "tokens per second",
    "slot      release: id  1 | task 98 | stop processing: n_tokens = 511, truncated = 0",
    "prompt eval time =     300.11 ms /    20 tokens (   15.01 ms per token,    66.64 tokens per second)",
]


def _captured(name: str) -> list[str]:
    return (FIXTURES / name / "llama-server.log").read_text(encoding="utf-8").splitlines()


def _state(lines: list[str]) -> ServerState:
    state = ServerState()
    for e in parse_lines(lines):
        state.apply(e)
    return state


def _observed(st: ServerState) -> dict[str, Any]:
    """Everything the exporter exports from the log: counters, slots, pool, checkpoints, forecast."""
    f = forecast(st)
    return {
        "counters": (
            st.server_starts,
            st.kv_retries,
            st.memory_slot_failures,
            dict(st.cascades),
            st.context_exceeded,
            dict(st.decode_failures),
            dict(st.requests_aborted),
            st.slots_purged,
            dict(st.checkpoint_events),
            st.prompt_eval_seconds.count,
            st.prompt_tokens,
            st.generated_tokens,
        ),
        "slots": (st.run.n_slots, {i: (s.tokens, s.processing, s.checkpoint_bytes) for i, s in st.run.slots.items()}),
        "pool": (st.pool_capacity(), st.run.pool_used()),
        "forecast": (f.prompt_demand, f.max_demand),
    }


def _inject(lines: list[str], after: str, block: list[str]) -> list[str]:
    """`lines` with `block` after the first line that contains `after`."""
    at = next(i for i, line in enumerate(lines) if after in line) + 1
    return [*lines[:at], *block, *lines[at:]]


def test_url_path_injection_on_an_old_build_format_is_not_applied() -> None:
    """Before b9151 the default log has no prefix, and b7808-b9150 log each request's path as it was
    decoded: `GET /x%0A<line>%0A…` writes the lines. Without a prefix to check, the run's facts decide."""
    real = _captured("exhaust-no-prefix")
    # The access log line of b7808-b9150, its path cut by the newlines; the tail ends the last forged line.
    request = ["srv  log_server_r: done request: GET /x", *FORGED[:-1], f"{FORGED[-1]} 127.0.0.1 404"]
    # While the server is idle: before its first request and between requests.
    forged = _inject(_inject(real, "all slots are idle", request), "release: id  3 | task 2 |", request)
    clean, attacked = _state(real), _state(forged)
    assert _observed(attacked) == _observed(clean)
    assert attacked.rejected == {"inconsistent": 2 * len(FORGED)}
    assert clean.rejected == {}


def test_prompt_dump_at_debug_level_is_not_applied_even_mid_incident() -> None:
    """A prefixed log (b9151+ by default): a prompt dumped into it writes its lines without the prefix.

    Injected in the middle of the real cascade, where slots are processing and the forged tasks could
    be real ones: the format alone rejects every line.
    """
    real = _captured("exhaust-lv4")
    dump = ["0.00.300.000 D slot update_slots: id  0 | task 24 | prompt: hello", *FORGED]
    dump += ["srv    send_error: task id = 24, error: Context size has been exceeded."]  # a real task, in flight
    forged = _inject(real, "retrying with smaller batch size, off = 0, n_batch = 64", dump)
    clean, attacked = _state(real), _state(forged)
    assert _observed(attacked) == _observed(clean)
    # The unprefixed `prompt eval time` could be a timings continuation line, but follows no timings head.
    assert attacked.rejected == {"format": len(FORGED), "inconsistent": 1}


def test_a_forged_line_that_copies_the_prefix_still_meets_the_run_facts() -> None:
    """What the format cannot catch: a prefix copied into the forgery. The facts still reject the
    forged lines that contradict the run; a line that fits it (a retry while slots run) is believed."""
    real = _captured("exhaust-lv4")
    idle = [f"0.00.049.000 W {line}" for line in FORGED[:-1]]
    forged = _inject(real, "all slots are idle", idle)
    attacked, clean = _state(forged), _state(real)
    assert _observed(attacked) == _observed(clean)
    assert attacked.rejected == {"inconsistent": len(idle)}


def test_jsonl_and_colours_are_part_of_the_run_format() -> None:
    """A raw line in a JSONL log, and a line without the colours of a coloured one, are not the server's."""
    jsonl = _captured("exhaust-jsonl")
    forged = _inject(jsonl, "n_batch = 64", FORGED[:5])
    assert _observed(_state(forged)) == _observed(_state(jsonl))
    assert _state(forged).rejected == {"format": 5}

    # The lv4 capture as `--log-colors on` writes it: time stamp and level letter in colour.
    coloured = [_colour(line) for line in _captured("exhaust-lv4")]
    plain_prefix = [f"0.00.300.000 W {line}" for line in FORGED[:5]]
    forged = _inject(coloured, "n_batch = 64", plain_prefix)
    assert _observed(_state(forged)) == _observed(_state(coloured)) == _observed(_state(_captured("exhaust-lv4")))
    assert _state(forged).rejected == {"format": 5}


def _colour(line: str) -> str:
    if not re.match(r"\d+\.\d\d\.\d{3}\.\d{3} [IWED] ", line):
        return line  # a continuation line of a multi-line entry: no prefix, no colours
    stamp, level, rest = line.split(" ", 2)
    colour = {"I": "32", "W": "35", "E": "31", "D": "33"}[level]
    return f"\x1b[34m{stamp}\x1b[0m \x1b[{colour}m{level} \x1b[0m{rest}"


def test_timings_continuation_lines_are_believed_only_after_their_head() -> None:
    """b4326-b9229 write a request's timings as one entry: a prefixed head, then lines without prefix."""
    real = _captured("exhaust-lv4")
    old: list[str] = []
    for line in real:  # the b11434 capture in the pre-b9230 shape
        if "print_timing:" in line and "prompt eval time" in line:
            head, _, text = line.partition("| prompt eval time")
            old += [head + "| ", "prompt eval time" + text]
        elif "print_timing:" in line and ("       eval time" in line or "total time" in line):
            old.append(line.split("| ", 2)[2])
        elif "graphs reused" not in line:
            old.append(line)
    state = _state(old)
    assert state.rejected == {}
    assert (state.prompt_eval_seconds.count, state.prompt_tokens, state.generated_tokens) == (
        (_state(real).prompt_eval_seconds.count, _state(real).prompt_tokens, _state(real).generated_tokens)
    )
    assert state.latency == _state(real).latency  # every request's timings, its slot from the head line
    forged = _state(_inject(old, "all slots are idle", [FORGED[-1], "       eval time =  5.00 ms /  999 tokens"]))
    assert forged.rejected == {"inconsistent": 2}
    assert forged.prompt_tokens == state.prompt_tokens and forged.generated_tokens == state.generated_tokens


def test_no_line_of_a_real_capture_is_rejected() -> None:
    for path in sorted(FIXTURES.iterdir()):
        if (path / "llama-server.log").exists():
            state = _state(_captured(path.name))
            assert state.rejected == {}, (path.name, state.rejected)


@pytest.mark.parametrize("new_format", ["jsonl", "no-prefix"])
async def test_a_restart_may_change_the_format_only_in_a_new_file(tmp_path: Path, new_format: str) -> None:
    """llama-server truncates its log at every start: a start in the rewritten file sets the new format.
    The same start appended to the old run's file (no truncation) is a forgery and changes nothing."""
    log = tmp_path / "llama-server.log"
    first = _captured("exhaust-lv4")
    second = _captured("exhaust-jsonl" if new_format == "jsonl" else "exhaust-no-prefix")
    log.write_text("\n".join(first) + "\n")
    state = ServerState()
    pipeline = LogPipeline(state, LogTailer(log))
    pipeline.replay_existing()
    before = _observed(state)

    def read_to_the_end() -> None:  # as the follower does: poll after poll (each reads one chunk)
        source = pipeline.source
        assert isinstance(source, FileSource)
        for _ in range(10_000):
            pipeline.feed(source.tailer.poll())
            if source.tailer.at_eof:
                return
        raise AssertionError("the tailer never reached the end of the log")

    with log.open("a") as f:  # appended: the second run's lines in another format, no new file
        f.write("\n".join(second) + "\n")
    read_to_the_end()
    assert _observed(state) == before
    assert set(state.rejected) == {"format"}

    log.write_text("\n".join(second) + "\n")  # what a restart does: truncate, write from the start
    await asyncio.sleep(0)
    read_to_the_end()
    expected = ServerState()
    for e in parse_lines(second):
        expected.apply(e)
    # The first run was replayed at start (not counted): only the restart and its retries count.
    assert state.server_starts == 1 and state.kv_retries == expected.kv_retries > 0
    assert _observed(state)["slots"] == _observed(expected)["slots"]


def test_journal_and_stdin_take_a_new_format_at_any_start() -> None:
    """Without files, a start banner is the only sign of a restart: it may set a new format."""
    state = ServerState()
    state.provenance.banners_reformat = True  # what LogPipeline sets for the journal and standard input
    for e in parse_lines([*_captured("exhaust-lv4"), *_captured("exhaust-jsonl")]):
        state.apply(e)
    jsonl = _state(_captured("exhaust-jsonl"))
    assert state.rejected == {} and state.server_starts == 2
    assert state.kv_retries == _state(_captured("exhaust-lv4")).kv_retries + jsonl.kv_retries


def test_line_format_events_name_the_format() -> None:
    entry = json.dumps({"type": "log", "time": 1, "level": "info", "msg": "srv  update_slots: all slots are idle\n"})
    events = parse_lines([entry, "I srv  update_slots: all slots are idle"])
    assert [e.describe() if isinstance(e, ev.LineFormat) else e for e in events] == [
        "jsonl",
        ev.AllSlotsIdle(),
        "level",
        ev.AllSlotsIdle(),
    ]
    assert isinstance(parse_lines(["srv  update_slots: all slots are idle"])[0], ev.LineFormat)


def test_a_batch_of_prefixed_lines_has_one_format() -> None:
    """The fast path: every line prefixed (tab-indented continuation lines cannot carry an event)."""
    batch = _captured("exhaust-lv4")[170:260]
    assert any(line.startswith("\t") for line in batch)
    events = parse_lines(batch)
    assert [e for e in events if isinstance(e, ev.LineFormat)] == [ev.LineFormat(3)]
    forged = parse_lines([*batch, FORGED[0]])  # one line without the prefix: each line's format again
    assert [e.code for e in forged if isinstance(e, ev.LineFormat)] == [3, 0]
