"""Who fills the pool, in-process: client names and their bound, the books by client, the access log, and
`diagnose --guard-log` naming the aborted slots of a real b11434 log."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from paths import FIXTURES
from prometheus_client import CollectorRegistry, generate_latest

from exporter.diagnose import diagnose_file, render_text
from exporter.diagnose.guard_log import join_guard_log
from exporter.guard.access_log import AccessLog
from exporter.guard.accounting import Accounting, Record, handling
from exporter.guard.admission import Ticket
from exporter.guard.books import GuardBooks
from exporter.guard.client_metrics import ClientCollector
from exporter.guard.clients import ClientNamer, KeysFileError, key_digest, parse_keys_file, user_agent_product
from exporter.guard.preempt import SlotView
from exporter.metrics.catalogue.guard import Outcome
from exporter.model.live import LiveSlot

# ---------------------------------------------------------------------------------------------- names


def test_the_sources_are_tried_in_their_order_of_preference() -> None:
    keys = {key_digest("sk-orchestrator"): "orchestrator"}
    namer = ClientNamer(header="X-Client-Name", keys=keys)
    both = {"X-Client-Name": "chat-window", "Authorization": "Bearer sk-orchestrator", "User-Agent": "curl/8.5"}
    assert namer.name(both, "10.0.0.1") == "chat-window"
    assert namer.name({**both, "X-Client-Name": "bad name"}, "10.0.0.1") == "orchestrator"
    assert namer.name({"X-Api-Key": "sk-orchestrator"}, "10.0.0.1") == "orchestrator"
    assert namer.name({"Authorization": "Bearer sk-unknown", "User-Agent": "curl/8.5"}, "10.0.0.1") == "curl"
    assert namer.name({}, "10.0.0.1") == "10.0.0.1"
    assert ClientNamer(sources=["header"], header="X-Client-Name").name({}, "10.0.0.1") == "unknown"


@pytest.mark.parametrize(
    ("agent", "product"),
    [
        ("claude-cli/1.0.61 (external, cli)", "claude-cli"),
        ("OpenAI/Python 1.99.1", "openai-python"),
        ("OpenAI/JS 5.10.2", "openai-js"),
        ("opencode/0.3.110 ai-sdk/provider-utils/3.0.3 runtime/bun/1.2.19", "opencode"),
        ("python-requests/2.32.3", "python-requests"),
        ('"quoted"/1', None),
        ("", None),
    ],
)
def test_the_user_agents_product(agent: str, product: str | None) -> None:
    assert user_agent_product(agent) == product


def test_at_most_max_clients_names_then_other_and_hostile_values_never_become_names() -> None:
    namer = ClientNamer(header="X-Client-Name", sources=["header"], max_clients=16)
    names = {namer.name({"X-Client-Name": f"client-{i}"}, None) for i in range(100)}
    assert len(names) == 17 and "other" in names
    fresh = ClientNamer(header="X-Client-Name", sources=["header", "user-agent"])
    for hostile in ['a"b', "a\nb", "x" * 10_240, "a\\b", "ä"]:
        assert fresh.name({"X-Client-Name": hostile, "User-Agent": "curl/8"}, None) == "curl"


def test_a_keys_file_holds_digests_never_keys() -> None:
    digest = key_digest("sk-1")
    assert parse_keys_file(f"# names\n{digest.upper()} orchestrator  # the big one\n") == {digest: "orchestrator"}
    with pytest.raises(KeysFileError, match=r"keys:1: not a SHA-256 digest"):
        parse_keys_file("sk-1 orchestrator\n", "keys")
    with pytest.raises(KeysFileError, match=r"keys:2: the name must be"):
        parse_keys_file(f"{digest} ok\n{digest} 'bad'\n", "keys")


# ---------------------------------------------------------------------------------------------- books


def _handled(accounting: Accounting, client: str, ticket: Ticket, outcomes: list[Outcome]) -> Record:
    """A request handled to its end, its counts made from inside its handler's context (as the proxy does)."""
    record = Record(f"r{ticket.id}", client, "/completion", 0.0, 0.0)
    books = GuardBooks(clients=accounting)

    async def run() -> None:
        handling(record)
        accounting.bind(ticket, None, 64)
        for outcome in outcomes:
            books.count(outcome)
        books.waited(0.5)

    asyncio.run(run())
    return record


def test_counts_reach_the_client_whose_handler_makes_them_and_no_other() -> None:
    accounting = Accounting(ClientNamer())
    books = GuardBooks(clients=accounting)
    _handled(accounting, "orchestrator", Ticket(1, 100, 64), ["queued", "admitted"])
    _handled(accounting, "claude-cli", Ticket(2, 100, 64), ["admitted", "retried"])
    books.count("preempted")  # outside any handler (the monitor's own context): no client's
    accounting.count_for(1, "preempted")
    assert accounting.clients["orchestrator"].outcomes == {"queued": 1, "admitted": 1, "preempted": 1}
    assert accounting.clients["claude-cli"].outcomes == {"admitted": 1, "retried": 1}
    assert accounting.clients["orchestrator"].waits.count == 1 and books.outcomes["preempted"] == 1


def test_cells_by_client_come_from_the_matched_slots_fresher_from_the_exporters_read() -> None:
    accounting = Accounting(ClientNamer())
    for tid, client in ((1, "orchestrator"), (2, "orchestrator"), (3, "claude-cli"), (4, "claude-cli")):
        _handled(accounting, client, Ticket(tid, 100, 64), ["admitted"])
    matched = {
        1: SlotView(0, held=300, prompt=200, n_predict=-1, task=11),
        2: SlotView(1, held=150, prompt=100, n_predict=-1, task=12),
        3: SlotView(2, held=40, prompt=30, n_predict=-1, task=13),
    }
    accounting.placed([1, 2, 3, 4], matched)
    assert accounting.pool_tokens() == {"orchestrator": 450, "claude-cli": 40}
    live = [
        LiveSlot(0, 512, True, 320, None, task=11),  # the same task, 20 tokens later
        LiveSlot(1, 512, True, 999, None, task=99),  # another task now: the monitor's figure stands
        LiveSlot(2, 512, False, 40, None, task=13),  # idle: likewise
    ]
    assert accounting.pool_tokens(live) == {"orchestrator": 470, "claude-cli": 40}
    assert accounting.records[1].generated == 100


def test_the_exposition_is_bounded_and_labels_are_safe() -> None:
    accounting = Accounting(ClientNamer(header="X-Client-Name", sources=["header"], max_clients=16))
    for i in range(100):
        name = accounting.namer.name({"X-Client-Name": f"c{i}" if i % 2 else 'x"\n' * 3000}, None)
        _handled(accounting, name, Ticket(i, 10, 10), ["admitted"])
    registry = CollectorRegistry()
    registry.register(ClientCollector(accounting))
    text = generate_latest(registry).decode()
    cells = [line for line in text.splitlines() if line.startswith("llamacpp_guard_client_pool_tokens{")]
    assert len(cells) == 17  # 16 names (unknown among them: the hostile values) and other
    assert 'client="other"' in text and "x\\" not in text


# ---------------------------------------------------------------------------------------------- the log


def test_the_access_log_writes_json_lines_rotates_and_counts_what_it_drops(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    log = AccessLog(str(path), max_bytes=400)
    for i in range(6):
        log.write({"id": f"r{i}", "client": "c", "pad": "x" * 100})
    log.close()
    lines = [json.loads(x) for p in (path.with_name("access.log.1"), path) for x in p.read_text().splitlines()]
    assert [x["id"] for x in lines][-2:] == ["r4", "r5"] and log.rotations >= 1 and log.written == 6
    assert path.stat().st_size <= 400

    blocked, release = threading.Event(), threading.Event()
    slow = AccessLog(str(tmp_path / "slow.log"), queue_lines=1)
    original = slow._write

    def stuck(lines: list[dict[str, object]]) -> None:
        blocked.set()
        release.wait(10)
        original(lines)

    slow._write = stuck  # type: ignore[method-assign]
    slow.write({"id": "first"})
    assert blocked.wait(10)  # the writer holds the first line: the queue (one line) takes one more
    slow.write({"id": "second"})
    slow.write({"id": "third"})
    assert slow.dropped["queue_full"] == 1
    release.set()
    slow.close()
    assert [json.loads(x)["id"] for x in (tmp_path / "slow.log").read_text().splitlines()] == ["first", "second"]


def test_diagnose_names_every_aborted_slots_client_from_the_lines_that_ended_together(tmp_path: Path) -> None:
    report = diagnose_file(str(FIXTURES / "b11434" / "exhaust-lv4" / "llama-server.log"))
    f = report.runs[0].failures[0]
    clients = {0: "claude-cli", 1: "opencode", 2: "orchestrator", 3: "chat"}
    lines = [
        # The same slot and task in an earlier run (task ids start again at each start): ended alone, long before.
        {"time": "2026-12-03T07:00:00.000Z", "id": "old", "client": "someone", "slot": 2, "task": 20, "status": 200},
        *(
            {
                "time": "2026-12-03T08:00:00.000Z",
                "id": f"r{s.slot}",
                "client": clients[s.slot],
                "slot": s.slot,
                "task": s.task,
                "status": 500,
                "duration_s": 9.0 + s.slot / 10,
            }
            for s in f.slots
        ),
        {"time": "2026-12-03T08:00:01.000Z", "id": "unplaced", "client": "x", "slot": None, "task": None},
    ]
    log = tmp_path / "access.log"
    log.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    report.guard = join_guard_log(report, [str(log)])
    assert [(s.slot, s.client, s.tokens) for s in f.slots] == [
        (0, "claude-cli", 128),
        (1, "opencode", 128),
        (2, "orchestrator", 129),
        (3, "chat", 128),
    ]
    assert report.guard.named == report.guard.aborted_slots == 4 and report.guard.unreadable == 1
    text = render_text(report)
    assert "caused by orchestrator: its request in slot 2 held 129 tokens (25.2 % of the pool)" in text
    assert "orchestrator held the largest slot in 1 of the 1 overflows named" in text


def test_an_overflow_no_request_outgrew_its_share_of_names_no_culprit(tmp_path: Path) -> None:
    """When every aborted request held no more than pool / slots, the slots together filled the pool: the
    failure says so and counts no client as its cause."""
    report = diagnose_file(str(FIXTURES / "b11434" / "exhaust-lv4" / "llama-server.log"))
    f = report.runs[0].failures[0]
    f.equal_share = 130  # as if the pool were a little larger per slot than the heaviest request
    log = tmp_path / "access.log"
    log.write_text(
        "".join(
            json.dumps({"time": "2026-12-03T08:00:00Z", "client": f"c{s.slot}", "slot": s.slot, "task": s.task}) + "\n"
            for s in f.slots
        )
    )
    summary = join_guard_log(report, [str(log)])
    assert f.cause is not None and f.cause.startswith("no one client's size: every aborted request held at most 130")
    assert summary.named == 4 and summary.causes == {}


def test_a_forged_access_log_line_never_puts_an_escape_in_the_report(tmp_path: Path) -> None:
    report = diagnose_file(str(FIXTURES / "b11434" / "exhaust-lv4" / "llama-server.log"))
    f = report.runs[0].failures[0]
    forged = {
        "time": "2026-12-03T08:00:00Z",
        "client": "\x1b[31mred\nline",
        "id": "x\ny",
        "slot": 0,
        "task": f.slots[0].task,
    }
    log = tmp_path / "access.log"
    log.write_text(json.dumps(forged) + "\n" + "\x00" * 100 + "\n")
    summary = join_guard_log(report, [str(log)])
    assert (f.slots[0].client, f.slots[0].guard_request) == ("?", None) and summary.unreadable == 1
    assert "\x1b" not in render_text(report)
