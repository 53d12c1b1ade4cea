"""Router mode in the log: one state per child, from a real router run (tests/fixtures/router), and the bounds.

The capture: a b11434 router with two tiny models (alpha, beta; `-c 1024 -np 4 -kvu -lv 4`). Alpha
overflows its pool (four 500-token prompts: 10 retries, 4 requests aborted) while beta serves one
request; then beta is unloaded and alpha's child is killed with SIGKILL. Its README has the line numbers.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from expositions import ROUTER, ROUTER_LINES, SNAPSHOT_AT, router_exposition

from exporter.logs import events as ev
from exporter.logs.parse import parse_lines
from exporter.logs.router_split import split_parse
from exporter.logs.tail import LogTailer
from exporter.model.router import MAX_CHILDREN, ServerLog
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline

OVERFLOW_FROM = 597  # alpha's first "failed to find free space" line is line 598
PORTS = {"alpha": 44847, "beta": 40593}


def feed(log: ServerLog, lines: list[str]) -> None:
    """What the pipeline does with a batch: split and parse it (`logs`), apply the parts (`model`)."""
    log.apply(split_parse(lines))


def _log(lines: list[str], *, counting: bool = True) -> ServerLog:
    log = ServerLog(ServerState())
    log.set_counting(counting)
    feed(log, lines)
    log.set_counting(True)
    return log


def _slots(name: str) -> dict[int, int]:
    """Tokens per slot from the /slots snapshot (a slot that never had a task lists no n_prompt_tokens: 0)."""
    return {s["id"]: s.get("n_prompt_tokens") or 0 for s in json.loads((ROUTER / f"slots-{name}.json").read_text())}


def test_the_capture_is_what_its_readme_says() -> None:
    assert "spawning server instance with name=alpha on port 44847" in ROUTER_LINES[17]
    assert "spawning server instance with name=beta on port 40593" in ROUTER_LINES[240]
    assert "failed to find free space" in ROUTER_LINES[OVERFLOW_FROM]
    assert "stopping model instance name=beta" in ROUTER_LINES[SNAPSHOT_AT]


def test_each_child_has_its_own_slots_and_pool_equal_to_its_slots_endpoint() -> None:
    log = _log(ROUTER_LINES[:SNAPSHOT_AT])
    children = {c.name: c for c in log.router.children.values()}
    assert sorted(children) == ["alpha", "beta"]
    for name, child in children.items():
        assert child.port == PORTS[name]
        st = child.state
        assert st.run.slot_count == 4
        assert st.pool_capacity() == (1024, "log_kv_cache")
        assert {i: s.tokens for i, s in st.run.slots.items()} == _slots(name), name
    assert children["beta"].state.run.pool_used() == 50  # beta's one request: slot 2
    assert log.main.run.slot_count is None  # the router itself has no slot
    assert log.main.server_starts == 1


def test_an_overflow_in_one_child_moves_none_of_the_others_series() -> None:
    before = _log(ROUTER_LINES[:OVERFLOW_FROM])
    after = _log(ROUTER_LINES[:SNAPSHOT_AT])
    a = {c.name: c.state for c in after.router.children.values()}
    b = {c.name: c.state for c in before.router.children.values()}
    assert a["alpha"].kv_retries == 10
    assert a["alpha"].context_exceeded == 1
    assert dict(a["alpha"].requests_aborted) == {"context_exceeded": 4}
    assert b["alpha"].kv_retries == b["alpha"].context_exceeded == 0
    beta = a["beta"]
    assert beta.kv_retries == beta.context_exceeded == 0
    assert not beta.requests_aborted and not beta.cascades and not beta.rejected
    assert beta.server_starts == 1 and beta.run.n_slots == 4


def test_an_unload_and_a_crash_end_their_children() -> None:
    log = _log(ROUTER_LINES)
    assert log.router.children == {}
    assert log.router.starts == 2
    assert dict(log.router.exits) == {"unloaded": 1, "crashed": 1}  # beta after its stop line; alpha killed
    replayed = _log(ROUTER_LINES, counting=False)  # the exporter's start-up replay counts nothing
    assert replayed.router.starts == 0 and not replayed.router.exits


def test_a_new_router_start_ends_every_child() -> None:
    log = _log(ROUTER_LINES[:SNAPSHOT_AT])
    assert len(log.router.children) == 2
    feed(log, ROUTER_LINES[:1])  # the router's own "initializing ..." again: a new router process
    assert log.router.children == {} and not log.router.active
    assert not log.router.exits  # they died with the old router: no exit of their own


def test_lines_of_children_cannot_speak_for_the_router_and_unknown_ports_are_rejected() -> None:
    log = _log(ROUTER_LINES[:SNAPSHOT_AT])
    stamp = "0.01.000.000 I srv          load: "
    feed(
        log,
        [
            f"[44847] {stamp}spawning server instance with name=evil on port 1234",  # alpha cannot spawn
            f"[44847] {stamp}instance name=beta exited with status 0",  # nor end beta
            "[ 1234] 0.00.002.135 I srv  llama_server: initializing ...",  # a port no spawn line announced
            "[ 1234] 0.00.017.332 I srv    load_model: initializing, n_slots = 9, n_ctx_slot = 9, kv_unified = 'true'",
        ],
    )
    assert sorted(c.name for c in log.router.children.values()) == ["alpha", "beta"]
    assert log.main.rejected["unfollowed"] == 2
    assert all(c.state.run.n_slots == 4 for c in log.router.children.values())


def _many_children(n: int) -> list[str]:
    """A router log with `n` children: the capture's spawn line and alpha's start-up lines, once per child."""
    spawn = ROUTER_LINES[17]
    alpha = [line for line in ROUTER_LINES[:240] if line.startswith("[44847] ")]
    lines = ROUTER_LINES[:17]
    for i in range(n):
        port = 20000 + i
        lines.append(spawn.replace("name=alpha on port 44847", f"name=m{i:02d} on port {port}"))
        lines += [line.replace("[44847] ", f"[{port}] ", 1) for line in alpha]
    return lines


def test_the_65th_child_is_refused_with_one_log_line_and_a_counter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "router.log"
    path.write_text("\n".join(_many_children(MAX_CHILDREN + 1)) + "\n")
    state = ServerState()
    pipeline = LogPipeline(state, LogTailer(path))
    with caplog.at_level(logging.WARNING, logger="exporter.pipeline"):
        pipeline.replay_existing()
    router = pipeline.log.router
    assert len(router.children) == MAX_CHILDREN == 64
    assert router.refused == 0  # the replay counts nothing; the refusal is still said
    refused = [r.getMessage() for r in caplog.records if "not followed" in r.getMessage()]
    assert refused == [
        "router child m64 not followed: the exporter follows at most 64 children per router; its lines are "
        "rejected (llamacpp_router_children_refused_total)"
    ]
    spawn = ROUTER_LINES[17].replace("name=alpha on port 44847", "name=m65 on port 30000")
    pipeline.feed([spawn, "[30000] 0.00.002.135 I srv  llama_server: initializing ..."])  # live: counted
    assert router.refused == 1 and state.rejected["unfollowed"] == 1

    text = router_exposition(pipeline)
    models = set(re.findall(r'[{,]model="([^"]+)"', text))
    assert len(models) == 64 and "m64" not in models and "m65" not in models
    assert "llamacpp_router_children_refused_total 1.0" in text
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    per_child = [s for s in samples if 'model="m00"' in s]
    # The documented bound (docs/many-servers.md): a server or child exports at most 320 series (55 of them
    # the request-size histograms, 162 the latency ones), plus 7 per slot and 1 per GPU; the router and the
    # host add fewer than 100.
    assert len(per_child) <= 320 + 7 * 4, len(per_child)
    assert len(samples) <= 64 * (320 + 7 * 4) + 100


def test_forged_router_lines_are_rejected_like_any_other() -> None:
    """Lines without the run's time stamp and level (a request path, a prompt) cannot end, create or reset
    children; a child's own line cannot act for the router, even before router mode is known."""
    log = _log(ROUTER_LINES[:SNAPSHOT_AT])
    feed(
        log,
        [
            "srv           run: instance name=alpha exited with status 1",
            "srv          load: spawning server instance with name=ghost on port 1234",
            "srv  llama_server: initializing ...",
        ],
    )
    assert sorted(c.name for c in log.router.children.values()) == ["alpha", "beta"]
    assert log.main.rejected["format"] == 3 and not log.router.exits and log.router.active

    plain = _log(
        [line for line in ROUTER_LINES[:17] if "router mode" not in line]
    )  # the router's start, as a plain server's
    assert not plain.router.active
    stamp = ROUTER_LINES[12].split(" I ")[0]  # a well-formed line after the server listens: not a router's start
    feed(plain, [f"{stamp} I srv  llama_server: starting server in router mode. models will be loaded on demand"])
    assert not plain.router.active

    one_child = _log([f"[44847] {line}" for line in ROUTER_LINES[18:24]])  # a log of one child: no router line in it
    feed(one_child, [f"[44847] {ROUTER_LINES[17]}".replace("name=alpha", "name=evil")])
    assert not one_child.router.active and one_child.router.children == {}


def test_the_split_keeps_each_child_in_order_around_the_routers_own_lines() -> None:
    """`split_parse`: a run of the router's lines is one part; between two of them each child's lines are one
    part, children in the order they first spoke; and a batch without a prefix is one part, one scan."""
    idle = "0.00.001.000 I srv  update_slots: all slots are idle"
    exited = "0.00.002.000 I srv           run: instance name=beta exited with status 0"
    parts = split_parse([idle, f"[2] {idle}", f"[1] {idle}", f"[2] {idle}", exited, idle, f"[1] {idle}"])
    assert [
        (port, [type(e).__name__ for e in events if not isinstance(e, ev.LineFormat)]) for port, events in parts
    ] == [
        (None, ["AllSlotsIdle"]),
        (2, ["AllSlotsIdle", "AllSlotsIdle"]),
        (1, ["AllSlotsIdle"]),
        (None, ["ChildExited", "AllSlotsIdle"]),
        (1, ["AllSlotsIdle"]),
    ]
    assert split_parse([idle, exited]) == [(None, parse_lines([idle, exited]))]
    # A child's lines that carry no event give every part the same events as one scan does: one part.
    quiet = ["[2] 0.00.001.500 I srv  params_from_: Chat format: Content-only", "[1] ", "[1]x"]
    assert split_parse([idle, *quiet, exited]) == [(None, parse_lines([idle, *quiet, exited]))]
    split = split_parse([idle, *quiet, f"[1] {idle}"])  # one that does: split
    assert [(port, events) for port, events in split if events] == [
        (None, parse_lines([idle])),
        (1, parse_lines([idle])),
    ]


def test_a_childs_part_never_speaks_for_the_router() -> None:
    """The model's own rule, whatever parts it is given: a router event in a child's part changes nothing."""
    log = _log(ROUTER_LINES[:SNAPSHOT_AT])
    before = sorted(log.router.children)
    log.apply([(44847, [ev.ChildSpawned("evil", 1234), ev.ChildExited("beta", 0)]), (1234, [ev.RouterMode()])])
    assert sorted(log.router.children) == before and not log.router.exits
    fresh = ServerLog(ServerState())  # before router mode a child's part goes to main: still no router event
    fresh.apply([(44847, [ev.RouterMode(), ev.ChildSpawned("evil", 1234)])])
    assert not fresh.router.active and fresh.router.children == {}


def test_diagnose_follows_a_model_respawned_on_another_port() -> None:
    from exporter.diagnose import analyze

    spawn, exit_line = ROUTER_LINES[17], ROUTER_LINES[654]  # alpha's spawn line, alpha's exit line (status 1)
    alpha = [line for line in ROUTER_LINES[:240] if line.startswith("[44847] ")]
    second = [line.replace("[44847] ", "[45000] ", 1) for line in alpha]
    lines = [
        *ROUTER_LINES[:17],
        spawn,
        *alpha,
        exit_line,
        spawn.replace("port 44847", "port 45000"),
        *second,
        exit_line,
    ]
    report = analyze(lines, "router.log")
    children = [r for r in report.history if r.source is not None]
    assert [(r.source, r.model, r.ending) for r in children] == [
        ("44847", "alpha", "died_idle"),
        ("45000", "alpha", "died_idle"),
    ]


def test_diagnose_and_the_live_exporter_agree_on_each_child() -> None:
    """The same lines, read live (`ServerLog`) and post mortem (`diagnose`): each model's figures match."""
    from exporter.diagnose import analyze

    live = {c.name: c.state for c in _log(ROUTER_LINES[:SNAPSHOT_AT]).router.children.values()}
    report = analyze(ROUTER_LINES[:SNAPSHOT_AT], "router.log")
    runs = {r.model: r for r in report.runs if r.model is not None}
    assert sorted(runs) == sorted(live) == ["alpha", "beta"]
    for name, st in live.items():
        counts = runs[name].counts
        assert counts.retries == st.kv_retries, name
        assert counts.aborts == st.context_exceeded, name
        assert counts.aborted_requests == sum(st.requests_aborted.values()), name
        assert runs[name].configuration.pool_cells == st.pool_capacity()[0], name
        assert runs[name].configuration.n_slots == st.run.slot_count, name
