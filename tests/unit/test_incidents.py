"""The incident record (`exporter.model.incidents`) against real captures, and the exporter's one WARNING per
incident (`LogPipeline.report_incidents`).

Ground truth is the log's own lines: each aborted request's `send_error: task id = T` and the release line
of task T (`release: id S | task T | stop processing: n_tokens = N`): the overflow's cells per slot.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from assembly import assembled
from log_goldens import CAPTURES
from paths import REPO

from exporter.logs.router_split import split_parse
from exporter.model.incidents import MAX_INCIDENTS, Incidents
from exporter.model.router import ServerLog
from exporter.model.state import ServerState

DEMO = REPO / "exporter" / "data" / "demo-exhaust-long-lv4.log"
_SEND_ERROR = re.compile(r"send_error: task id = (\d+), error: Context size has been exceeded")
_RELEASE = re.compile(r"release: id\s+(\d+) \| task (\d+) \| stop processing: n_tokens = (\d+)")


def _released_by_aborted(text: str) -> dict[int, int]:
    """slot → cells of each aborted task's release line, as the log writes them."""
    aborted: set[str] = set()
    out: dict[int, int] = {}
    for line in text.splitlines():
        if m := _SEND_ERROR.search(line):
            aborted.add(m[1])
        elif (m := _RELEASE.search(line)) and m[2] in aborted:
            out[int(m[1])] = int(m[3])
    return out


def _state(text: str) -> ServerState:
    state = ServerState()
    ServerLog(state).apply(split_parse(text.splitlines()))
    return state


@pytest.mark.parametrize("capture", [c for c in CAPTURES if not c.replayed and c.folder.name != "router"], ids=str)
def test_overflow_incident_holds_the_release_lines_cells(capture: object) -> None:
    folder: Path = capture.folder  # type: ignore[attr-defined]
    text = (folder / capture.logs[-1]).read_text(encoding="utf-8", errors="replace")  # type: ignore[attr-defined]
    state = _state(text)
    overflows = [i for i in state.incidents.all() if i.kind == "overflow"]
    aborted = sum(state.requests_aborted.values())
    assert sum(i.aborted for i in overflows) == aborted  # the record and the counter agree
    expected = _released_by_aborted(text)
    if not expected:
        assert not overflows or all(not i.slots for i in overflows)
        return
    assert len(overflows) == 1
    inc = overflows[0]
    assert dict(inc.slots) == expected
    assert not inc.open  # settled by the lines that follow (decode failed for all, all slots idle)
    assert inc.largest == max(expected.items(), key=lambda kv: (kv[1], -kv[0]))
    assert inc.pool == state.pool_capacity()[0]


def test_demo_overflow_in_words() -> None:
    state = _state(DEMO.read_text(encoding="utf-8"))
    (inc,) = state.incidents.all()
    assert inc.summary() == (
        "pool overflow: 4 requests aborted; 32 retries; slots released 0: 8192, 1: 8192, 2: 8193, 3: 8192 "
        "(32769 cells, pool 32768); largest holder slot 2 (8193 cells)"
    )


def test_recovered_cascade_and_crash_are_incidents() -> None:
    purge = _state((REPO / "exporter" / "data" / "demo-recover-purge-lv4.log").read_text(encoding="utf-8"))
    (inc,) = purge.incidents.all()
    assert inc.kind == "cascade_recovered" and sum(purge.cascades.values()) == 1
    folder = REPO / "tests" / "fixtures" / "xllamacpp-2026.10.11549" / "restart-kill9"
    crash = _state((folder / "llama-server.log").read_text(encoding="utf-8", errors="replace"))
    assert [(i.kind, i.reason) for i in crash.incidents.all()] == [("crash", "unknown")]


def test_the_replay_records_nothing() -> None:
    state = ServerState(counting=False)
    ServerLog(state).apply(split_parse(DEMO.read_text(encoding="utf-8").splitlines()))
    assert not state.incidents.all()


def test_the_record_is_bounded_and_stamped_once() -> None:
    record = Incidents()
    for _ in range(MAX_INCIDENTS + 5):
        record.restart()
    assert len(record) == MAX_INCIDENTS and record.seq == MAX_INCIDENTS + 5
    assert record.stamp(100.0) == MAX_INCIDENTS
    assert record.stamp(200.0) == 0
    assert {i.time for i in record.all()} == {100.0}


def test_the_demo_logs_its_overflow_once_with_its_slots_cells(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "llama-server.log"
    log.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="exporter.pipeline"), assembled(log) as exporter:
        # Line by line in small batches, as the demo writes it: the overflow settles several batches later.
        lines = DEMO.read_bytes().splitlines(keepends=True)
        for i in range(0, len(lines), 7):
            exporter.write(b"".join(lines[i : i + 7]))
        exporter.write(DEMO.read_bytes(), truncate=True)  # a second run, at once: left out (rate limit)
    warned = [r.getMessage() for r in caplog.records if "pool overflow" in r.getMessage()]
    assert len(warned) == 1, warned
    assert "4 requests aborted" in warned[0]
    assert "slots released 0: 8192, 1: 8192, 2: 8193, 3: 8192 (32769 cells, pool 32768)" in warned[0]
    assert "largest holder slot 2 (8193 cells)" in warned[0]
    assert warned[0].endswith("(llamacpp_requests_aborted_total)")
