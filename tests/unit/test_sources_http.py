"""HTTP source: parsing real b11434 /slots and /props bodies, and the reader's behaviour on every answer.

The endpoints are served by a small aiohttp app that answers with captured real bodies (or with the
errors a real server gives: 401 without the key, 501 with --no-slots, 503 while loading, silence).
The real llama-server runs in test_live_server.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from expositions import LogStatus
from llama_harness import free_port
from paths import B11434
from prometheus_client import CollectorRegistry

from exporter.logs.parse import parse_line
from exporter.metrics.exporter_health import ExporterCollector
from exporter.metrics.live import live_collectors
from exporter.metrics.server_log import ServerLogCollector
from exporter.metrics.servers import log_collectors
from exporter.model.live import HttpSnapshot, parse_slots
from exporter.model.server_cmdline import parse_command_line
from exporter.model.state import ServerState
from exporter.model.view import ServerView, merge_view
from exporter.sources import server_http
from exporter.sources.live import LiveSources
from exporter.sources.server_http import ServerHttpReader, parse_props
from exporter.unit import ServerUnit

FIXTURES = B11434
LONG = FIXTURES / "exhaust-long-lv4"
METRICS = FIXTURES / "pool-overflow-default" / "metrics.txt"  # llama-server's own /metrics (--metrics)


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_parse_slots_b11434_array_next_token() -> None:
    slots = parse_slots(_json(LONG / "load-slots-12.json"))
    assert [(s.id, s.tokens, s.processing, s.n_ctx) for s in slots] == [
        (0, 3879, True, 32768),
        (1, 3879, True, 32768),
        (2, 3880, True, 32768),
        (3, 3879, True, 32768),
    ]
    assert slots[0].n_decoded == 3540


def test_parse_slots_never_used_slots_hold_nothing() -> None:
    # A fresh b11434 lists only id, n_ctx, speculative, is_processing for a slot that never had a task.
    slots = parse_slots(_json(LONG / "pre_slots.json"))
    assert [(s.tokens, s.processing) for s in slots] == [(0, False)] * 4


def test_parse_slots_older_shapes() -> None:
    # b4029-b6889: next_token is an object; no n_prompt_tokens (the log is the source then).
    old = [{"id": 0, "id_task": 5, "n_ctx": 4096, "is_processing": True, "next_token": {"n_decoded": 17}}]
    (s,) = parse_slots(old)
    assert (s.tokens, s.processing, s.n_decoded) == (None, True, 17)
    # b2357-b4028: `state` 0/1 instead of is_processing.
    (s,) = parse_slots([{"id": 3, "id_task": -1, "state": 1, "n_ctx": 512}])
    assert (s.id, s.processing, s.tokens) == (3, True, None)
    with pytest.raises(ValueError):
        parse_slots({"error": "nope"})


def test_parse_props() -> None:
    assert parse_props(_json(LONG / "pre_props.json")) == (11434, 4, 32768, "models/tiny-llama.gguf")
    assert parse_props({"build_info": "b0-unknown"}) == (None, None, None, None)  # `build 0 (unknown)` builds


# ---------------------------------------------------------------- the reader against served answers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message}}, status=status)


class FakeServer:
    """llama-server's three endpoints with swappable answers; counts requests and their auth headers."""

    def __init__(self) -> None:
        self.health: Handler = lambda r: _ok({"status": "ok"})
        self.slots: Handler = lambda r: _ok(_json(LONG / "load-slots-12.json"))
        self.props: Handler = lambda r: _ok(_json(LONG / "pre_props.json"))
        self.metrics: Handler = lambda r: _text(METRICS.read_text())
        self.auth: list[str | None] = []
        self.key: str | None = None

    def app(self) -> web.Application:
        async def route(request: web.Request) -> web.StreamResponse:
            self.auth.append(request.headers.get("Authorization"))
            if request.path != "/health" and self.key and request.headers.get("Authorization") != f"Bearer {self.key}":
                return _error(401, "Invalid API Key")
            handlers = {"/health": self.health, "/slots": self.slots, "/props": self.props, "/metrics": self.metrics}
            handler = handlers[request.path]
            return await handler(request)

        app = web.Application()
        for path in ("/health", "/slots", "/props", "/metrics"):
            app.router.add_get(path, route)
        return app


async def _ok(body: object) -> web.Response:
    return web.json_response(body)


async def _text(body: str) -> web.Response:
    return web.Response(text=body, content_type="text/plain")


def _answers(body: str) -> Handler:
    return lambda r: _text(body)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeServer, str]]:
    server = FakeServer()
    ts = TestServer(server.app(), host="127.0.0.1", port=free_port())
    await ts.start_server()
    try:
        yield server, str(ts.make_url("")).rstrip("/")
    finally:
        await ts.close()


async def _read(url: str, **kw: Any) -> HttpSnapshot:
    reader = ServerHttpReader(url, **kw)
    try:
        return await reader.read()
    finally:
        await reader.close()


async def test_up_with_live_slots_and_props(fake: tuple[FakeServer, str]) -> None:
    _, url = fake
    snap = await _read(url)
    assert snap.ok and snap.up and not snap.loading and snap.slot_tokens_live
    assert [s.tokens for s in snap.slots or ()] == [3879, 3879, 3880, 3879]
    assert (snap.build, snap.total_slots, snap.n_ctx_slot) == (11434, 4, 32768)
    assert dict(snap.status) == {"/health": 200, "/slots": 200, "/props": 200, "/metrics": 200}
    assert snap.deferred == 0  # llama-server's own /metrics (real b11434 text)


async def test_loading(fake: tuple[FakeServer, str]) -> None:
    server, url = fake

    async def loading(r: web.Request) -> web.Response:
        return _error(503, "Loading model")

    server.health = server.slots = server.props = loading
    snap = await _read(url)
    assert (snap.up, snap.loading, snap.ok, snap.slots) == (False, True, True, None)


async def test_metrics_off_or_deferred_requests(fake: tuple[FakeServer, str]) -> None:
    server, url = fake

    async def off(r: web.Request) -> web.Response:  # llama-server without --metrics
        return _error(501, "This server does not support metrics endpoint. Start it with `--metrics`")

    server.metrics = off
    snap = await _read(url)
    assert snap.ok and snap.deferred is None and snap.status["/metrics"] == 501
    server.metrics = lambda r: _text(
        METRICS.read_text().replace("llamacpp:requests_deferred 0", "llamacpp:requests_deferred 3")
    )
    assert (await _read(url)).deferred == 3


REAL_METRICS = METRICS.read_text()
DEFERRED_LINE = "llamacpp:requests_deferred 0"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        # A build (or a proxy in front of it) whose /metrics lacks the figure; the rest of the body is real.
        ("\n".join(line for line in REAL_METRICS.splitlines() if "requests_deferred" not in line), "absent"),
        (REAL_METRICS.replace(DEFERRED_LINE, "llamacpp:requests_deferred NaN"), "not a count: 'NaN'"),
        (REAL_METRICS.replace(DEFERRED_LINE, "llamacpp:requests_deferred three"), "not a count: 'three'"),
        (REAL_METRICS.replace(DEFERRED_LINE, "llamacpp:requests_deferred -1"), "not a count: '-1'"),
        (REAL_METRICS.replace(DEFERRED_LINE, "llamacpp:requests_deferred 1e30"), "not a count: '1e30'"),
        (REAL_METRICS.replace(DEFERRED_LINE, "llamacpp:requests_deferred 2.5"), "not a count: '2.5'"),
        (REAL_METRICS.replace(DEFERRED_LINE, "llamacpp:requests_deferred +Inf"), "not a count: '+Inf'"),
        (REAL_METRICS.replace(DEFERRED_LINE, "llamacpp:requests_deferred 1_0"), "not a count: '1_0'"),
        ("", "absent"),
        ('{"requests_deferred": 3}', "absent"),  # JSON, not Prometheus text
    ],
)
def test_a_metrics_figure_absent_or_junk_is_left_out_alone(body: str, why: str) -> None:
    assert server_http.parse_metrics(body) == ({}, {"llamacpp:requests_deferred": why})


def test_metrics_figures_that_are_counts_are_read() -> None:
    for text, value in (("0", 0), ("3", 3), ("3.0", 3), ("1e3", 1000), ("+7", 7)):
        body = REAL_METRICS.replace(DEFERRED_LINE, f"llamacpp:requests_deferred {text}")
        assert server_http.parse_metrics(body) == ({"llamacpp:requests_deferred": value}, {})
    labelled = 'llamacpp:requests_deferred{model="m"} 2 1700000000000\n'  # a label set and a timestamp
    assert server_http.parse_metrics(labelled) == ({"llamacpp:requests_deferred": 2}, {})


async def test_a_metrics_figure_not_understood_leaves_the_http_source_up(
    fake: tuple[FakeServer, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Through the real reader and live sources: /health and /slots answered, so the HTTP source is up;
    the figure is absent from the exposition and counted as not understood, once per read, and said in the
    exporter's log once per change."""
    server, url = fake
    caplog.set_level(logging.INFO, logger="exporter.sources.live")
    st = _log_state("exhaust-long-lv4")
    live = LiveSources(st, http=ServerHttpReader(url))
    reg = CollectorRegistry()
    view = ServerUnit(st, live).make_view  # a view made at each render, as each scrape makes one
    for c in log_collectors(view):
        reg.register(c)
    reg.register(ExporterCollector(LogStatus(), lambda: view().sources))
    for c in live_collectors(view, ["http"]):
        reg.register(c)
    rejected = {"endpoint": "/metrics", "metric": "llamacpp:requests_deferred"}
    try:
        await live.refresh()
        assert reg.get_sample_value("llamacpp_requests_queued") == 0
        assert reg.get_sample_value("llamacpp_exporter_http_values_rejected_total", rejected) == 0
        for junk in ("NaN", "-4", "2.5", "queue"):
            body = REAL_METRICS.replace(DEFERRED_LINE, f"llamacpp:requests_deferred {junk}")
            server.metrics = _answers(body)
            await live.refresh()
            assert reg.get_sample_value("llamacpp_exporter_source_up", {"source": "http"}) == 1
            assert reg.get_sample_value("llamacpp_requests_queued") is None  # absent, not 0
            assert reg.get_sample_value("llamacpp_slot_tokens", {"slot": "2"}) == 3880  # /slots still read
        server.metrics = lambda r: _text(REAL_METRICS.replace(DEFERRED_LINE + "\n", ""))
        await live.refresh()
        await live.refresh()
        assert reg.get_sample_value("llamacpp_exporter_source_up", {"source": "http"}) == 1
        assert reg.get_sample_value("llamacpp_requests_queued") is None
        assert reg.get_sample_value("llamacpp_exporter_http_values_rejected_total", rejected) == 6
        said = [r.getMessage() for r in caplog.records if "requests_deferred" in r.getMessage()]
        assert len(said) == 5 and "requests_deferred absent" in said[-1]  # once per change of why, not per read
        assert live.statuses["http"].failures == 0
        server.metrics = lambda r: _text(REAL_METRICS.replace(DEFERRED_LINE, "llamacpp:requests_deferred 2"))
        await live.refresh()
        assert reg.get_sample_value("llamacpp_requests_queued") == 2
        assert reg.get_sample_value("llamacpp_exporter_http_values_rejected_total", rejected) == 6
        assert "read again" in caplog.records[-1].getMessage()
    finally:
        await live.close()


async def test_slots_disabled_or_older_build_falls_back_to_the_log(fake: tuple[FakeServer, str]) -> None:
    server, url = fake

    async def disabled(r: web.Request) -> web.Response:
        return _error(501, "This server does not support slots endpoint. Start it with `--slots`")

    server.slots = disabled
    snap = await _read(url)
    assert snap.ok and snap.up and snap.slots is None and snap.status["/slots"] == 501 and not snap.slot_tokens_live

    async def old(r: web.Request) -> web.Response:  # b6890-b9275: no n_prompt_tokens
        return web.json_response([{"id": 0, "id_task": 3, "n_ctx": 512, "is_processing": True, "next_token": [{}]}])

    server.slots = old
    snap = await _read(url)
    assert snap.ok and snap.slots is not None and not snap.slot_tokens_live


async def test_api_key(fake: tuple[FakeServer, str]) -> None:
    server, url = fake
    server.key = "s3cret"
    snap = await _read(url)
    assert snap.up and not snap.ok  # /health is public; /slots and /props are not
    assert snap.status["/slots"] == 401 and snap.slots is None
    assert "requires an API key; set --api-key" in (snap.describe() or "")
    snap = await _read(url, api_key="wrong")
    assert "API key was rejected" in (snap.describe() or "")
    server.auth.clear()
    snap = await _read(url, api_key="s3cret")
    assert snap.ok and snap.slot_tokens_live
    assert server.auth == ["Bearer s3cret"] * 4


async def test_a_slow_server_never_holds_the_scrape(fake: tuple[FakeServer, str]) -> None:
    server, url = fake

    answered: list[bool] = []

    async def hang(r: web.Request) -> web.Response:
        await asyncio.sleep(30)
        answered.append(True)
        return web.json_response([])

    server.slots = hang
    snap = await _read(url, timeout=0.3)
    assert answered == []  # the read ended on its timeout, while the server still held the answer
    assert snap.up and not snap.ok and "no answer within 0.3s" in (snap.errors.get("/slots") or "")


async def test_server_down_is_a_value() -> None:
    snap = await _read(f"http://127.0.0.1:{free_port()}")
    assert (snap.up, snap.loading, snap.ok) == (False, False, False)
    assert list(snap.errors) == ["/health"] and "not answering" in snap.errors["/health"]
    assert dict(snap.status) == {"/health": 0, "/slots": 0, "/props": 0, "/metrics": 0}


async def test_unexpected_bodies_are_errors_not_crashes(fake: tuple[FakeServer, str]) -> None:
    server, url = fake

    async def html(r: web.Request) -> web.Response:
        return web.Response(text="<html>proxy error</html>", content_type="text/html")

    server.slots = server.props = server.metrics = html
    snap = await _read(url)
    assert snap.up and not snap.ok and set(snap.errors) == {"/slots", "/props"}
    # /metrics is read figure by figure: a body without one leaves that figure out, and is no error.
    assert snap.deferred is None and dict(snap.rejected) == {"llamacpp:requests_deferred": "absent"}


async def test_an_oversized_answer_is_not_read(fake: tuple[FakeServer, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A /slots answer beyond the cap is an error of that endpoint: neither decoded nor held in memory."""
    monkeypatch.setattr(server_http, "MAX_BODY_BYTES", 100_000)
    server, url = fake

    async def huge(r: web.Request) -> web.Response:
        return web.json_response([{"id": i, "n_ctx": 512, "params": {"grammar": "x" * 1000}} for i in range(200)])

    server.slots = huge
    snap = await _read(url)
    assert snap.up and "/slots" in snap.errors and "/props" not in snap.errors
    assert "more than" in snap.errors["/slots"]


# ---------------------------------------------------------------- merging /slots into what is rendered


def _log_state(name: str) -> ServerState:
    st = ServerState()
    for line in (FIXTURES / name / "llama-server.log").read_text().splitlines():
        e = parse_line(line)
        if e is not None:
            st.apply(e)
    return st


def test_live_slots_replace_the_log_estimate_and_flow_into_the_pool() -> None:
    st = _log_state("exhaust-long-lv4")
    live = HttpSnapshot(up=True, slots=parse_slots(_json(LONG / "load-slots-12.json")))
    before = {i: s.tokens for i, s in st.run.slots.items()}
    view = merge_view(st, live)
    assert {i: s.tokens for i, s in view.run.slots.items()} == {0: 3879, 1: 3879, 2: 3880, 3: 3879}
    assert {i: s.tokens for i, s in st.run.slots.items()} == before  # the state itself is untouched
    reg = CollectorRegistry()
    reg.register(ServerLogCollector(lambda: ServerView(view)))
    assert reg.get_sample_value("llamacpp_kv_pool_used_tokens") == 3879 * 3 + 3880
    assert reg.get_sample_value("llamacpp_kv_pool_usage_ratio") == pytest.approx((3879 * 3 + 3880) / 32768)
    assert reg.get_sample_value("llamacpp_slot_processing", {"slot": "2"}) == 1
    # A server that is down: the log's estimate again.
    assert merge_view(st, HttpSnapshot(up=False)).run.slots == st.run.slots


def test_gaps_of_a_default_verbosity_log_are_filled_from_props_and_the_command_line() -> None:
    st = _log_state("exhaust-default-verbosity")
    assert (st.run.build, st.run.type_k, st.run.verbosity) == (None, None, 3)  # hidden at -lv 3
    argv = (FIXTURES / "exhaust-default-verbosity" / "cmdline.txt").read_text().split()
    st.apply_command_line(parse_command_line(argv, {"LLAMA_ARG_CACHE_TYPE_V": "q8_0"}))
    props = parse_props(_json(FIXTURES / "exhaust-default-verbosity" / "post_props.json"))
    view = merge_view(st, HttpSnapshot(up=True, build=props[0], total_slots=props[1], n_ctx_slot=props[2]))
    assert (view.run.build, view.run.type_k, view.run.type_v, view.run.kv_unified) == (11434, "f16", "q8_0", True)
    assert view.pool_capacity() == (512, "command_line")
    assert st.run.build is None


@pytest.mark.parametrize("name", sorted(p.parent.name for p in FIXTURES.glob("*/llama-server.log")))
def test_a_view_is_a_copy_of_every_attribute_of_the_state_and_its_run(name: str) -> None:
    # merge_view copies attribute by attribute those a new state (and run) has: after a whole capture the
    # state has no other, and the view holds the same values, with a run of its own.
    st = _log_state(name)
    view = merge_view(st, None)
    assert view is not st and view.run is not st.run
    assert vars(view).keys() == vars(st).keys() == vars(ServerState()).keys()
    assert all(getattr(view, k) is v for k, v in vars(st).items() if k != "run")
    assert vars(view.run) == vars(st.run)
    view.run.n_slots = -1
    assert st.run.n_slots != -1


async def test_live_collector_says_which_source_the_slots_came_from(fake: tuple[FakeServer, str]) -> None:
    server, url = fake
    st = _log_state("exhaust-long-lv4")
    live = LiveSources(st, http=ServerHttpReader(url))
    reg = CollectorRegistry()
    view = ServerUnit(st, live).make_view  # a view made at each render, as each scrape makes one
    reg.register(ServerLogCollector(view))
    for c in live_collectors(view, ["http"]):
        reg.register(c)
    await live.refresh()
    assert reg.get_sample_value("llamacpp_slot_tokens_source", {"source": "slots_endpoint"}) == 1
    assert reg.get_sample_value("llamacpp_slot_tokens_source", {"source": "log"}) == 0
    assert reg.get_sample_value("llamacpp_slot_tokens", {"slot": "2"}) == 3880
    assert reg.get_sample_value("llamacpp_up") == 1
    assert reg.get_sample_value("llamacpp_log_verbosity") == 4

    async def disabled(r: web.Request) -> web.Response:
        return _error(501, "This server does not support slots endpoint. Start it with `--slots`")

    server.slots = disabled
    await live.refresh()
    assert reg.get_sample_value("llamacpp_slot_tokens_source", {"source": "log"}) == 1
    assert reg.get_sample_value("llamacpp_slot_tokens", {"slot": "2"}) == st.run.slots[2].tokens
    assert reg.get_sample_value("llamacpp_exporter_http_status", {"endpoint": "/slots"}) == 501
    await live.close()
