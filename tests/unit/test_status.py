"""The status page and `/api/status` (`exporter.status`): the same figures as `/metrics` on every capture of the log
goldens, the page's content and its escaping, the history ring, and the web app's routes and headers."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from log_goldens import CAPTURES, Capture
from paths import REPO
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.logs.router_split import split_parse
from exporter.model.router import ServerLog
from exporter.model.state import ServerState
from exporter.model.view import ServerView
from exporter.status.document import LogStatus, UnitStatus, document
from exporter.status.history import POINTS, RING_BYTES, History
from exporter.status.page import CSP, STYLE_HASH, civil_date, page
from exporter.statuses import StatusSource
from exporter.web.server import StatusPages, make_app

DEMO = REPO / "exporter" / "data" / "demo-exhaust-long-lv4.log"
UNIT_LABELS = ("server", "model")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _samples(exposition: str) -> dict[frozenset[tuple[str, str]], Samples]:
    """The exposition's samples by unit (its `server`/`model` labels), each keyed by name and its other labels."""
    out: dict[frozenset[tuple[str, str]], Samples] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            unit = frozenset((k, v) for k, v in s.labels.items() if k in UNIT_LABELS)
            rest = frozenset((k, v) for k, v in s.labels.items() if k not in UNIT_LABELS)
            out.setdefault(unit, {})[(s.name, rest)] = s.value
    return out


def _scrape_and_document(capture: Capture, tmp: Path) -> tuple[str, dict[str, object]]:
    """A scrape of the exporter that followed the capture (as its golden file is made), then the document."""
    with capture.followed(tmp) as exporter:
        exposition = exporter.scrape()
        source = StatusSource(exporter.servers, clock=lambda: 1_764_000_000.0)
        source.sample()
        exporter.refresh()  # what `StatusSource.document` does first: the same refresh as a scrape
        doc = document(source.statuses(), version="test", time=1_764_000_000.0)
    return exposition, doc


def _one(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def _sum(samples: Samples, name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c.id)
def test_status_and_metrics_agree_on_every_shared_figure(capture: Capture, tmp_path: Path) -> None:
    exposition, doc = _scrape_and_document(capture, tmp_path)
    json.dumps(doc, allow_nan=False)  # what /api/status sends: no NaN nor infinity on any capture
    assert "<script" not in page(doc)
    by_unit = _samples(exposition)
    servers = doc["servers"]
    assert isinstance(servers, list) and servers
    compared = 0
    for server in servers:
        samples = by_unit[frozenset(server["labels"].items())]
        pool, counters, memory = server["pool"], server["counters"], server["memory"]
        # The router's own unit exports no pool (its children do): compared where /metrics has it.
        if _one(samples, "llamacpp_kv_pool_used_tokens") is None:
            continue
        assert pool["used"] == _one(samples, "llamacpp_kv_pool_used_tokens")
        assert pool["capacity"] == _one(samples, "llamacpp_kv_pool_capacity_tokens")
        assert pool["usage_ratio"] == _one(samples, "llamacpp_kv_pool_usage_ratio")
        assert pool["overcommit_ratio"] == _one(samples, "llamacpp_kv_pool_overcommit_ratio")
        assert pool["active_tokens"] == _one(samples, "llamacpp_kv_pool_active_tokens")
        assert pool.get("full_eta_seconds") == _one(samples, "llamacpp_kv_pool_full_eta_seconds")
        for horizon, cells in (pool.get("demand") or {}).items():
            assert cells == _one(samples, "llamacpp_kv_pool_demand_tokens", horizon=horizon)
        assert len(server["slots"]) == (_one(samples, "llamacpp_slots") or 0)
        for slot in server["slots"]:
            assert slot["tokens"] == _one(samples, "llamacpp_slot_tokens", slot=str(slot["slot"]))
            assert slot["processing"] == bool(_one(samples, "llamacpp_slot_processing", slot=str(slot["slot"])))
        assert counters["requests_aborted"] == _sum(samples, "llamacpp_requests_aborted_total")
        assert counters["kv_retries"] == _one(samples, "llamacpp_kv_retries_total")
        assert counters["cascades_failed"] == _one(samples, "llamacpp_kv_cascades_total", outcome="failed")
        assert counters["cascades_recovered"] == _one(samples, "llamacpp_kv_cascades_total", outcome="recovered")
        assert counters["context_exceeded"] == _one(samples, "llamacpp_context_exceeded_total")
        assert counters["server_starts"] == _one(samples, "llamacpp_server_starts_total")
        assert counters["server_crashes"] == _sum(samples, "llamacpp_server_crashes_total")
        assert counters["lines_rejected"] == _sum(samples, "llamacpp_exporter_log_lines_rejected_total")
        assert (memory["kv_cache_bytes"] or 0.0) == _sum(samples, "llamacpp_kv_cache_bytes")
        assert memory["prompt_cache_bytes"] == _one(samples, "llamacpp_prompt_cache_bytes")
        if _one(samples, "llamacpp_checkpoint_lines_visible") != 0:
            assert memory["checkpoint_bytes"] == _sum(samples, "llamacpp_checkpoint_bytes")
        # The incidents' aborted requests are the counter's (both count live lines only).
        assert sum(i["aborted"] for i in server["incidents"]) == counters["requests_aborted"]
        # The ring's newest point is the pool's fill now.
        assert server["history"]["pool_usage_ratio"][-1] == pool["usage_ratio"]
        compared += 1
    # Every unit with a pool on /metrics is on the page (a router with no child running has none).
    assert compared == sum(1 for u in by_unit.values() if ("llamacpp_kv_pool_used_tokens", frozenset()) in u)


def _demo_state() -> ServerState:
    state = ServerState()
    ServerLog(state).apply(split_parse(DEMO.read_text(encoding="utf-8").splitlines()))
    state.incidents.stamp(1_764_000_000.0)
    return state


def test_the_page_shows_the_demo_overflow_and_nothing_runs() -> None:
    state = _demo_state()
    history = History()
    for k in range(30):
        history.add(1_764_000_000.0 - 300 + 10 * k, k / 30, 2e9, 0 if k < 20 else 4)
    unit = UnitStatus({}, ServerView(state, incidents=state.incidents.all()), LogStatus("/var/log/x.log", True, True))
    doc = document([unit], version="t", time=1_764_000_060.0)
    json.dumps(doc, allow_nan=False)  # valid JSON: no NaN nor infinity
    unit = UnitStatus({}, ServerView(state, incidents=state.incidents.all()), None, history.snapshot())
    html = page(document([unit], version="t", time=1_764_000_060.0))
    assert "pool overflow: 4 requests aborted" in html and "largest holder slot 2 (8193 cells)" in html
    assert "16:00:00 UTC (60 s ago)" in html
    assert html.count("<svg") == 4  # the pool bar, and the three charts of the last hour
    assert 'class="limit"' in html  # the 90 % line
    assert "<script" not in html and " style=" not in html and "http://" not in html and "https://" not in html
    style = re.search(r"<style>(.*?)</style>", html, re.S)
    assert style is not None and f"'sha256-{STYLE_HASH}'" in CSP and "script-src 'none'" in CSP
    import base64
    import hashlib

    assert base64.b64encode(hashlib.sha256(style[1].encode()).digest()).decode() == STYLE_HASH


HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"


def test_text_from_outside_is_escaped() -> None:
    state = _demo_state()
    state.run.model = HOSTILE
    state.run.start_error = HOSTILE
    log = LogStatus(f"/logs/{HOSTILE}.log", False, False, problem=HOSTILE)
    view = ServerView(state, incidents=state.incidents.all())
    guard = {"guard": {"queued": 1, "pool_by_client": {HOSTILE: 8192}}}
    html = page(document([UnitStatus({"server": HOSTILE}, view, log, None, guard)], version=HOSTILE, time=0.0))
    assert (
        "<script" not in html and "<img" not in html and "onerror=alert" not in html.replace("onerror=alert(2)&gt;", "")
    )
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 6  # name, model, error, path, problem, client


def test_the_ring_is_bounded_and_its_memory_is_what_the_docs_say() -> None:
    history = History()
    for k in range(POINTS + 17):
        history.add(float(k), None if k % 7 == 0 else 0.5, 1.0, float(k))
    snap = history.snapshot()
    assert len(snap.t) == POINTS and snap.t[0] == 17.0 and snap.t[-1] == POINTS + 16.0
    assert snap.series["pool_usage_ratio"][4] is None and snap.series["pool_usage_ratio"][3] == 0.5  # t=21: 3 x 7
    assert history.nbytes == RING_BYTES == 11_520
    assert "11,520 bytes" in (REPO / "docs" / "status.md").read_text(encoding="utf-8")


def test_civil_date() -> None:
    assert civil_date(0) == (1970, 1, 1) and civil_date(20_791) == (2026, 12, 4) and civil_date(11_016) == (2000, 2, 29)


def test_the_routes_and_their_headers() -> None:
    async def main() -> None:
        state = _demo_state()

        async def doc(authorized: bool) -> dict[str, object]:
            unit = UnitStatus({}, ServerView(state, incidents=state.incidents.all()), LogStatus("/secret/path", True))
            return document([unit], version="t", time=0.0, authorized=authorized)

        app = make_app(CollectorRegistry(), log_description="x", health=dict, status=StatusPages(doc, page, CSP))
        async with TestClient(TestServer(app)) as client:
            resp = await client.get("/")
            assert resp.status == 200 and resp.headers["Content-Security-Policy"] == CSP
            assert "pool overflow" in await resp.text()
            resp = await client.get("/api/status")
            body = await resp.json()
            assert body["schema"] == 1 and body["servers"][0]["pool"]["capacity"] == 32768
            assert body["servers"][0]["log"]["path"] == "/secret/path"
            assert resp.headers["X-Content-Type-Options"] == "nosniff"

    asyncio.run(main())


def test_several_servers_one_section_each_the_worst_first() -> None:
    lines = DEMO.read_text(encoding="utf-8").splitlines()
    calm = ServerState()
    ServerLog(calm).apply(split_parse(lines[:200]))  # up, the pool filling, nothing went wrong yet
    overflowed = ServerState()
    end = next(i for i, line in enumerate(lines) if "send_error" in line)  # mid-abort: the incident still open
    ServerLog(overflowed).apply(split_parse(lines[: end + 1]))
    units = [
        UnitStatus({"server": "a-calm"}, ServerView(calm, incidents=calm.incidents.all())),
        UnitStatus({"server": "b-overflowing"}, ServerView(overflowed, incidents=overflowed.incidents.all())),
    ]
    doc = document(units, version="t", time=0.0)
    servers = doc["servers"]
    assert isinstance(servers, list)
    assert [s["state"] for s in servers] == ["up", "up"]
    assert [s["name"] for s in servers] == ["server b-overflowing", "server a-calm"]
    html = page(doc)
    assert html.count('<section class="server">') == 2
    assert html.index("server b-overflowing") < html.index("server a-calm") and "(still settling)" in html


def test_the_guard_section_from_a_real_guard() -> None:
    from exporter.guard.admission import Pool
    from exporter.guard.proxy import Guard, GuardSettings
    from exporter.serve import guard_figures
    from exporter.settings import GuardArea

    guard = Guard(GuardSettings.of(GuardArea(), "http://127.0.0.1:9"), lambda: Pool(1000, 600, True))
    guard.books.outcomes["refused"] += 2
    figures = guard_figures(guard)()
    assert figures["in_flight"] == 0 and figures["queued"] == 0 and figures["refused"] == 2
    state = _demo_state()
    unit = UnitStatus({}, ServerView(state, incidents=state.incidents.all()), None, None, {"guard": figures})
    doc = document([unit], version="t", time=0.0)
    assert doc["servers"][0]["guard"]["refused"] == 2  # type: ignore[index]
    assert "<h3>Guard</h3>" in page(doc) and "refused: 2" in page(doc)


def test_up_loading_down_from_health_else_from_the_log_or_an_exited_process() -> None:
    from exporter.model.live import HttpSnapshot, ProcSnapshot
    from exporter.status.document import server_state

    state = ServerState()
    ServerLog(state).apply(split_parse(DEMO.read_text(encoding="utf-8").splitlines()[:200]))
    assert server_state(ServerView(state)) == ("up", "log")
    assert server_state(ServerView(state, http=HttpSnapshot(up=True, status={"/health": 200}))) == ("up", "http")
    loading = HttpSnapshot(loading=True, status={"/health": 503})
    assert server_state(ServerView(state, http=loading)) == ("loading", "http")
    assert server_state(ServerView(state, http=HttpSnapshot(status={"/health": 0}))) == ("down", "http")
    # Killed: no line says so, but the process the exporter had found is gone and none took its place.
    assert server_state(ServerView(state, proc=ProcSnapshot(exited=4242))) == ("down", "proc")
    assert server_state(ServerView(state, proc=ProcSnapshot(error="no llama-server found"))) == ("up", "log")
    state.run.exiting = True
    assert server_state(ServerView(state)) == ("down", "log")
