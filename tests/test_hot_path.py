"""The fast paths give the same results as the one-line ones.

`parse_lines` scans a batch as one string; `parse_line` and `parse_message` are the contract. The
tailer decodes and splits whole blocks; per line it must give what decoding each line gives. And
every event type has its handler in `ServerState.apply`.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from test_parse import CASES  # tests/ is on sys.path (pytest's rootdir-less "prepend" import mode)

from exporter.logs import events as ev
from exporter.logs.parse import normalize, parse_line, parse_lines, parse_message
from exporter.logs.tail import LogTailer
from exporter.state import _HANDLERS

FIXTURES = Path(__file__).parent / "fixtures" / "b11434"
LOGS = sorted(FIXTURES.glob("*/llama-server.log"))


def one_by_one(lines: list[str]) -> list[ev.Event]:
    return [e for e in map(parse_line, lines) if e is not None]


@pytest.mark.parametrize("log", LOGS, ids=[p.parent.name for p in LOGS])
def test_batch_parse_equals_line_by_line_on_real_logs(log: Path) -> None:
    lines = log.read_text(encoding="utf-8").splitlines()
    events = one_by_one(lines)
    assert events, "a capture without events"
    assert parse_lines(lines) == events
    assert [e for e in (parse_message(normalize(line)) for line in lines) if e is not None] == events
    # Batch boundaries do not matter.
    assert [e for i in range(0, len(lines), 7) for e in parse_lines(lines[i : i + 7])] == events


def test_batch_parse_equals_line_by_line_on_every_wording() -> None:
    lines = [line for line, _ in CASES]
    assert parse_lines(lines) == [expected for _, expected in CASES]


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
    assert len(parse_lines(lines)) == 6


def test_every_event_type_has_a_state_handler() -> None:
    assert set(_HANDLERS) == set(typing.get_args(ev.Event))


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
