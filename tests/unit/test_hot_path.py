"""The fast paths give the same results as the one-line ones.

`parse_lines` scans a batch as one string; `parse_line` and `parse_message` are the contract. The
tailer decodes and splits whole blocks; per line it must give what decoding each line gives. Every
event type has its handler in `ServerState.apply`, and a batch applied at once (`apply_events`) leaves
the state as applying each event does.
"""

from __future__ import annotations

import json
import random
import re
import typing
from pathlib import Path

import pytest
from expositions import log_registry
from hostile_lines import POISON, mutate
from paths import B11434
from prometheus_client import generate_latest
from test_parse import CASES  # tests/ is on sys.path (pytest's rootdir-less "prepend" import mode)

from exporter.logs import events as ev
from exporter.logs.parse import (
    find_line_start,
    normalize,
    parse_line,
    parse_line_events,
    parse_lines,
    parse_message,
)
from exporter.logs.rules import SHARED_EVENTS, shared
from exporter.logs.tail import LogTailer
from exporter.model.handlers import DISPATCH, HANDLERS
from exporter.model.router import ROUTER_EVENTS
from exporter.model.state import ServerState

FIXTURES = B11434
LOGS = sorted(FIXTURES.glob("*/llama-server.log"))


def one_by_one(lines: list[str]) -> list[ev.Event]:
    """The events of each line on its own, with a `LineFormat` only where the format changes (as a batch has)."""
    return collapsed([e for line in lines for e in parse_line_events(line)])


def collapsed(events: list[ev.Event]) -> list[ev.Event]:
    """`events` without a `LineFormat` that repeats the one before it."""
    out: list[ev.Event] = []
    last: ev.Event | None = None
    for e in events:
        if isinstance(e, ev.LineFormat):
            if e == last:
                continue
            last = e
        out.append(e)
    return out


def without_formats(events: list[ev.Event]) -> list[ev.Event]:
    return [e for e in events if not isinstance(e, ev.LineFormat)]


@pytest.mark.parametrize("log", LOGS, ids=[p.parent.name for p in LOGS])
def test_batch_parse_equals_line_by_line_on_real_logs(log: Path) -> None:
    lines = log.read_text(encoding="utf-8").splitlines()
    events = one_by_one(lines)
    assert events, "a capture without events"
    assert parse_lines(lines) == events
    bare = without_formats(events)
    assert [e for e in (parse_message(normalize(line)) for line in lines) if e is not None] == bare
    assert [e for e in map(parse_line, lines) if e is not None] == bare
    # Batch boundaries do not matter.
    assert collapsed([e for i in range(0, len(lines), 7) for e in parse_lines(lines[i : i + 7])]) == events


def test_batch_parse_equals_line_by_line_on_every_wording() -> None:
    lines = [line for line, _ in CASES]
    assert without_formats(parse_lines(lines)) == [expected for _, expected in CASES]


def test_mixed_batch_of_wrappers() -> None:
    """JSONL, colours, CRLF, router prefixes and plain lines in one batch: each line as on its own."""
    msg = "srv        decode: Context size has been exceeded. off = 3, n_batch = 1, ret = 1"
    lines = [
        "0.00.064.190 E " + msg,
        json.dumps({"type": "log", "level": "error", "msg": msg + "\n"}),
        "\x1b[34m0.00.064.190\x1b[0m \x1b[31mE " + msg,
        "[39045] 0.01.234.567 E " + msg,
        "0.00.064.190 E " + msg + "\r",
        "0.00.064.191 I srv  update_slots: all slots are idle",
        "{not json",
        "",
    ]
    assert parse_lines(lines) == one_by_one(lines)
    assert len(without_formats(parse_lines(lines))) == 6
    formats = [e.describe() for e in parse_lines(lines) if isinstance(e, ev.LineFormat)]
    assert formats == ["timestamp+level", "jsonl", "colours+timestamp+level", "timestamp+level"]


@pytest.mark.parametrize(
    "text",
    [
        "\n[1] x",
        "\nx\n[1] x",
        "\nx [1]\ny [2]",
        "\n" + "a [b] " * 100 + "\n[9] tail",  # more than 64 brackets before the line that starts with one
        "\n" + "a [b] " * 100 + "\nno bracket first",
        "\n" + "\n".join("[" * i for i in range(1, 70)),
        "\n",
        "\n[",
        "{x\n{a\nb{\n{b",  # a block as diagnose reads it: its first line is not after a "\\n"
        "{\n" + "a{[" * 300 + "\n{z\n[y",  # the fallback search, for both characters
    ],
)
def test_find_line_start_equals_the_plain_search(text: str) -> None:
    """The memchr walk over a rare character agrees with searching for a newline and that character, from
    every start."""
    for char in "[{":
        for start in range(1, len(text) + 2):
            assert find_line_start(text, char, start) == (text.find("\n" + char, start - 1) + 1 or -1), (char, start)


def test_every_event_type_has_a_state_handler() -> None:
    """All but the two the state reads itself (a line's format, a rejected line) and a router's own lines
    (`ServerLog`); a kind that is only counted (`Traits.counted`) needs none of its own."""
    kinds = set(typing.get_args(ev.Event)) - {ev.LineFormat, ev.Rejected, *ROUTER_EVENTS}
    assert set(DISPATCH) == kinds
    assert set(HANDLERS) | ev.COUNTED == kinds


def test_tailer_block_decoding_equals_per_line_decoding(tmp_path: Path) -> None:
    """Invalid UTF-8, CRLF and a character split across reads, in blocks of many lines."""
    raw = [
        b"plain line",
        b"crlf line\r",
        b"two cr\r\r",
        b"bad \xff\xfe bytes",
        b"cut multibyte \xe2\x82",
        b"euro \xe2\x82\xac sign",
        b"",
        b"lone \r inside",
    ] * 50
    p = tmp_path / "log"
    p.write_bytes(b"\n".join(raw) + b"\n")
    t = LogTailer(p, chunk_bytes=997)  # chunks end inside lines and inside the euro sign
    got: list[str] = []
    while lines := t.poll():
        got += lines
    want = [(r[:-1] if r.endswith(b"\r") else r).decode("utf-8", errors="replace") for r in raw]
    assert got == want


def test_events_compare_hash_and_print_as_dataclasses_do() -> None:
    """The shared __eq__, __hash__ and __repr__ of event classes behave as dataclass's own would."""
    assert ev.KVRetry(0, 512) == ev.KVRetry(0, 512) and hash(ev.KVRetry(0, 512)) == hash(ev.KVRetry(0, 512))
    assert ev.KVRetry(0, 512) != ev.KVRetry(0, 256)
    another: object = ev.KVRetry(512, 512)
    assert ev.MemorySlotFailure(512) != another  # another class: never equal
    assert repr(ev.KVRetry(0, 512)) == "KVRetry(offset=0, n_batch=512)"
    assert repr(ev.ServerStarting()) == "ServerStarting(build=None)"
    # A field with compare=False is left out of both, as dataclass does.
    first = ev.PromptEvalTiming(12.5, 100)
    again = ev.PromptEvalTiming(12.5, 100, continuation=True)
    assert first == again and hash(first) == hash(again) and repr(again).endswith("continuation=True)")
    assert len({ev.KVRetry(0, 512), ev.KVRetry(0, 512), ev.KVRetry(1, 512)}) == 2


def _applied(state: ServerState, events: list[ev.Event], batch: bool) -> bytes:
    """`events` applied one by one (`apply`) or as one batch (`apply_events`); what the state then says."""
    if batch:
        assert state.apply_events(events) == len(events)
    else:
        for e in events:
            state.apply(e)
    said = [state.rejected, state.counted, state.last_unexpected, state.server_starts, state.incidents.changes]
    return generate_latest(log_registry(state)) + repr(said).encode()


@pytest.mark.parametrize("counting", [True, False])
def test_apply_events_equals_apply_one_by_one(counting: bool) -> None:
    """Every capture, the poison lines and seeded mutations of them all (rejected lines of each reason among
    them): a batch applied at once leaves the state as applying each event does."""
    rng = random.Random(48)
    for log in [*LOGS, None]:
        lines = log.read_text(encoding="utf-8").splitlines() if log is not None else [p for p, _ in POISON]
        lines += [mutate(rng, rng.choice(lines)) for _ in range(len(lines))]
        events = parse_lines(lines)
        states = [ServerState(counting=counting) for _ in range(2)]
        assert _applied(states[0], events, batch=False) == _applied(states[1], events, batch=True), log


def test_apply_events_stops_at_a_kind_it_is_told() -> None:
    events: list[ev.Event] = [ev.AllSlotsIdle(), ev.RouterMode(), ev.AllSlotsIdle(), ev.LineFormat(0)]
    state = ServerState()
    assert state.apply_events(events, 0, ROUTER_EVENTS) == 1
    assert state.apply_events(events, 2, ROUTER_EVENTS) == 4
    assert not ROUTER_EVENTS & DISPATCH.keys()  # a kind to stop at has no handler of the state's


def test_shared_events_equal_the_events_built() -> None:
    """`rules.shared`: an event equal to the one its build gives, one object per value, at most
    `SHARED_EVENTS` values kept; a number that cannot be read raises and is not kept."""
    rx = re.compile(r"(?P<a>\d+) (?P<b>\d+)")

    def build(m: re.Match[str]) -> ev.Event:
        return ev.KVRetry(int(m["a"]), int(m["b"]))

    built = shared(build, "a", "b")
    lines = [f"{i % 100} 512" for i in range(300)]
    events = [built(typing.cast(re.Match[str], rx.match(line))) for line in lines]
    assert events == [build(typing.cast(re.Match[str], rx.match(line))) for line in lines]
    assert SHARED_EVENTS == 64
    assert events[0] is events[100] and events[99] is not events[199]  # the first 64 values kept, not the later
    huge = f"{'9' * 5000} 1"
    for _ in range(2):
        with pytest.raises(ValueError):
            built(typing.cast(re.Match[str], rx.match(huge)))
