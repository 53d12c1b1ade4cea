"""The guard's proxy in process: the real assembly (`start_guard`, its server and client) in front of a scripted
upstream (tests/support/scripted_upstream.py) that holds each generation request until the test lets it go.

Every path of a request through the guard: passed on byte for byte, sized (`n`, `/v1/responses`, media, a huge
prompt, the client's credentials), queued, refused, cancelled by its client, stopped and replayed, and the
upstream's errors. Each test waits for events (a request reaching the upstream, a connection closing), never for
a wall-clock margin.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from guard_rig import rig
from scripted_upstream import Upstream, words
from yarl import URL

from exporter.guard.admission import Pool
from exporter.guard.preempting import Preemption
from exporter.guard.upstream import CUT_MARGIN, PREFIX_CHARS_PER_TOKEN


async def until(condition: Callable[[], bool]) -> None:
    """Until `condition()` holds; a hang guard of a minute ends a wait that never does."""

    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), 60)


def prompt(n: int) -> str:
    """A completion prompt of `n` scripted tokens (n - 1 words and the BOS)."""
    return " ".join(["w"] * (n - 1))


# ---------------------------------------------------------------------- passed on unchanged


async def test_the_path_and_query_go_upstream_byte_for_byte() -> None:
    async with rig() as r:
        for raw in ("/v1/../health?x=%2F&y=a%20b", "/v1/models?model=a%2Fb", "/v1//models?q=%zz"):
            async with r.session.get(URL(r.url + raw, encoded=True), headers={"X-Custom": "1"}) as resp:
                assert resp.status == 200
                assert (await resp.json())["path"] == raw
                assert resp.headers["X-Upstream"] == "scripted"
        # The request's own end-to-end headers pass, hop-by-hop ones do not.
        assert r.up.calls[-1].headers["X-Custom"] == "1"
        assert "Connection" not in r.up.calls[-1].headers or r.up.calls[-1].headers["Connection"] != "keep-alive"


async def test_an_escaped_generation_path_is_sized_as_the_server_routes_it() -> None:
    async with rig() as r:
        status, _, _ = await r.post("/v1/chat%2Fcompletions", {"messages": [{"role": "user", "content": "a b"}]})
        assert status == 200
        assert r.up.paths()[-1] == "/v1/chat%2Fcompletions"
        assert "/apply-template" in r.up.paths()  # sized first, as /v1/chat/completions is
        assert r.outcomes()["admitted"] == 1


async def test_sizing_calls_carry_the_clients_key_whichever_header_it_uses() -> None:
    async with rig() as r:
        chat = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}
        assert (await r.post("/v1/chat/completions", chat, **{"X-Api-Key": "k1"}))[0] == 200
        assert (await r.post("/v1/chat/completions", chat, Authorization="Bearer k2"))[0] == 200
    sizing = [c for c in r.up.calls if c.raw_path in ("/apply-template", "/tokenize")]
    assert [c.headers.get("X-Api-Key") for c in sizing] == ["k1", "k1", None, None]
    assert [c.headers.get("Authorization") for c in sizing] == [None, None, "Bearer k2", "Bearer k2"]
    async with rig(api_key="own") as r:
        assert (await r.post("/v1/chat/completions", chat))[0] == 200
    assert {c.headers.get("Authorization") for c in r.up.calls if c.raw_path == "/tokenize"} == {"Bearer own"}


# ---------------------------------------------------------------------- sized


async def test_n_completions_are_counted_once_per_task_next_to_one_prompt() -> None:
    pool = Pool(capacity=4096, slot_window=1024, unified=True)
    async with rig(pool) as r:
        r.up.hold("n3")
        body = {"messages": [{"role": "user", "content": prompt(64)}], "n": 3, "max_tokens": 600, "tag": "n3"}
        task = r.post("/v1/chat/completions", body)
        await r.up.arrived("n3")
        [ticket] = r.books.in_flight.values()
        assert (ticket.prompt, ticket.tasks, ticket.demand) == (64, 3, 64 + 3 * 600)
        r.up.release("n3")
        assert (await task)[0] == 200
        assert not r.books.in_flight


async def test_responses_are_sized_by_the_servers_route_and_queued_like_chat() -> None:
    async with rig() as r:
        r.up.hold("first")
        first = r.post("/v1/responses", {"input": prompt(500), "max_output_tokens": 100, "tag": "first"})
        await r.up.arrived("first")
        [ticket] = r.books.in_flight.values()
        # instructions and input as the server's own counting route counts them, max_output_tokens as the budget
        assert (ticket.prompt, ticket.budget, ticket.demand) == (words(" " + prompt(500)), 100, 600)
        second = r.post(
            "/v1/responses",
            {"input": [{"role": "user", "content": prompt(400)}], "instructions": "brief", "max_output_tokens": 50},
        )
        await until(lambda: len(r.books.queue) == 1)
        assert r.up.arrivals[""] == 0  # it waits: 600 + 452 would pass the pool
        r.up.release("first")
        assert [(await first)[0], (await second)[0]] == [200, 200]
        assert r.outcomes()["queued"] == 1
        assert r.up.paths().count("/v1/responses/input_tokens") == 2


async def test_media_are_counted_by_the_server_or_at_the_slots_window() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what"}, image]}], "tag": "m"}
    async with rig() as r:
        r.up.hold("m")
        task = r.post("/v1/chat/completions", chat)
        await r.up.arrived("m")
        assert "/v1/chat/completions/input_tokens" in r.up.paths()
        assert [t.prompt for t in r.books.in_flight.values()] == [words("what")]
        r.up.release("m")
        await task
    # A build without the counting route: the most one slot holds.
    async with rig(up=Upstream(window=1000, count_routes=False)) as r:
        r.up.hold("m")
        task = r.post("/v1/chat/completions", chat)
        await r.up.arrived("m")
        assert [t.prompt for t in r.books.in_flight.values()] == [999]
        r.up.release("m")
        await task
        mm = {"prompt": {"prompt_string": "<__media__>", "multimodal_data": ["AAAA"]}, "n_predict": 4}
        assert (await r.post("/completion", mm))[0] == 200


async def test_a_huge_prompt_is_tokenized_only_as_far_as_it_proves_it_cannot_fit() -> None:
    async with rig() as r:
        huge = prompt(600_000)  # 1.2 MB of text for a window of 1,000 tokens
        status, _, _ = await r.post("/completion", {"prompt": huge, "n_predict": 4})
        assert status == 200  # the scripted server answers; llama-server would refuse it itself
        [tokenize] = [c for c in r.up.calls if c.raw_path == "/tokenize"]
        assert len(json.loads(tokenize.body)["content"]) == PREFIX_CHARS_PER_TOKEN * 1000
        assert not r.books.in_flight and r.outcomes().get("admitted", 0) == 0  # passed on, outside the books
        # A text of long tokens, whose prefix does not prove it: counted at the window, never tokenized whole.
        r.up.hold("long")
        long_words = " ".join(["x" * 40] * 300)
        task = r.post("/completion", {"prompt": long_words, "n_predict": 4, "tag": "long"})
        await r.up.arrived("long")
        assert [t.prompt for t in r.books.in_flight.values()] == [999]
        assert words(long_words[: PREFIX_CHARS_PER_TOKEN * 1000]) - CUT_MARGIN <= 1000
        r.up.release("long")
        await task


# ---------------------------------------------------------------------- queue, cancel, refuse


async def test_the_queue_holds_what_does_not_fit_until_room_is_made() -> None:
    async with rig() as r:
        r.up.hold("a")
        a = r.post("/completion", {"prompt": prompt(500), "n_predict": 300, "tag": "a"})
        await r.up.arrived("a")
        b = r.post("/completion", {"prompt": prompt(300), "n_predict": 100, "tag": "b"})
        await until(lambda: len(r.books.queue) == 1)
        assert r.up.arrivals["b"] == 0
        r.up.release("a")
        assert (await a)[0] == 200
        status, body, _ = await b
        assert (status, body["tag"]) == (200, "b")
        assert r.outcomes()["queued"] == 1 and r.outcomes()["admitted"] == 2
        assert not r.books.in_flight and not r.books.queue


async def test_a_full_queue_answers_429_and_a_wait_past_the_timeout_503_both_with_retry_after() -> None:
    async with rig(max_queue=1, max_wait=0.5) as r:
        r.up.hold("a")
        a = r.post("/completion", {"prompt": prompt(900), "n_predict": 50, "tag": "a"})
        await r.up.arrived("a")
        b = r.post("/completion", {"prompt": prompt(900), "n_predict": 50, "tag": "b"})
        await until(lambda: len(r.books.queue) == 1)
        status, body, headers = await r.post("/completion", {"prompt": prompt(900), "n_predict": 50})
        assert status == 429 and "Retry-After" in headers and body["error"]["code"] == 429
        status, body, headers = await b
        assert status == 503 and "Retry-After" in headers and body["error"]["type"] == "unavailable_error"
        assert r.up.arrivals["b"] == 0
        r.up.release("a")
        assert (await a)[0] == 200


async def test_a_queued_request_is_answered_503_when_admissions_clock_says_so_and_not_before() -> None:
    """The wait in the queue reads `Admission`'s clock: a request whose clock began later (as a replay's does)
    outlasts the timer it started with, and the request behind it, on the first clock, runs out first."""
    async with rig(max_queue=5, max_wait=0.5) as r:
        r.up.hold("a")
        a = r.post("/completion", {"prompt": prompt(900), "n_predict": 50, "tag": "a"})
        await r.up.arrived("a")
        b = r.post("/completion", {"prompt": prompt(900), "n_predict": 50, "tag": "b"})
        await until(lambda: len(r.books.queue) == 1)
        waiting = r.books.queue[0]
        assert waiting.queued_at is not None
        waiting.queued_at += 3600  # its wait began an hour later
        c = r.post("/completion", {"prompt": prompt(900), "n_predict": 50, "tag": "c"})
        status, body, headers = await c  # c's wait began after b's first clock: b's first timer has fired
        assert (status, headers["Retry-After"]) == (503, "1") and "after 0.5 s in the guard's queue" in str(body)
        assert not b.done() and len(r.books.queue) == 1
        r.up.release("a")
        assert (await a)[0] == 200
        status, body, _ = await b
        assert (status, body["tag"]) == (200, "b")
        assert r.outcomes()["refused"] == 1 and r.up.arrivals["c"] == 0


async def test_a_client_that_leaves_the_queue_or_a_running_request_is_forgotten_and_cancelled() -> None:
    async with rig() as r:
        r.up.hold("a", "b")
        a = r.post("/completion", {"prompt": prompt(600), "n_predict": 100, "tag": "a"})
        await r.up.arrived("a")
        b = r.post("/completion", {"prompt": prompt(600), "n_predict": 100, "tag": "b"})
        await until(lambda: len(r.books.queue) == 1)
        b.cancel()  # its client goes away while it waits
        await until(lambda: not r.books.queue)
        a.cancel()  # its client goes away while llama-server works on it
        await r.up.was_cancelled("a")
        await until(lambda: not r.books.in_flight)
        assert r.up.arrivals["b"] == 0


# ---------------------------------------------------------------------- preempt and replay


def _slot(i: int, held: int, prompt_tokens: int) -> dict[str, Any]:
    return {
        "id": i,
        "n_ctx": 1000,
        "is_processing": True,
        "n_prompt_tokens": held,
        "n_prompt_tokens_processed": prompt_tokens,
        "n_prompt_tokens_cache": 0,
        "params": {"n_predict": -1},
        "next_token": [{"has_next_token": True, "n_remain": -1, "n_decoded": held - prompt_tokens}],
    }


async def test_a_request_that_outgrows_its_budget_is_stopped_and_replayed_unseen_by_its_client() -> None:
    fast: dict[str, Any] = {"poll_interval": 0.02, "quiet": 0.05, "horizon": 0.5, "default_budget": 100}
    async with rig(**fast) as r:
        r.up.hold("a", "b")
        a = r.post("/completion", {"prompt": prompt(300), "tag": "a"})
        await r.up.arrived("a")
        b = r.post("/completion", {"prompt": prompt(301), "tag": "b"})
        await r.up.arrived("b")
        assert len(r.books.in_flight) == 2  # 400 + 401 of 1000: both admitted on their default budgets
        # Both generate past the default budget: 530 + 520 cells, past the pool of 1000.
        r.up.slots = [_slot(0, 530, 300), _slot(1, 520, 301)]
        await r.up.was_cancelled("a")  # the fuller slot's request is stopped: its upstream connection closed
        r.up.slots = [_slot(1, 520, 301)]
        assert r.outcomes()["preempted"] == 1
        # It waits at the head of the queue, counted at its window now, until the other ends.
        await until(lambda: len(r.books.queue) == 1)
        assert r.books.queue[0].demand == 1000
        r.up.release("a")
        r.up.release("b")
        r.up.slots = []
        assert (await b)[0] == 200
        status, body, _ = await a
        assert (status, body["tag"], body["n"]) == (200, "a", 2)  # the answer to its second sending
        assert r.up.arrivals["a"] == 2 and r.up.arrivals["b"] == 1
        assert r.outcomes()["replayed"] == 1
        assert not r.books.in_flight and not r.books.queue


async def test_a_request_admitted_on_its_byte_bound_is_placed_from_the_read_that_could_not_place_it() -> None:
    """A short prompt in an empty pool is admitted on its byte bound, so the first read of /slots shows a prompt
    size no request has: the guard counts the prompt exactly and places the request from that same read, with
    no second read (one request shorter than two polls would otherwise never be placed)."""
    async with rig(poll_interval=0.02) as r:
        r.up.hold("a")
        r.up.slot_reads_allowed = 1  # the second read waits: the placement can only come from the first
        a = r.post("/completion", {"prompt": prompt(30), "tag": "a", "n_predict": 100})
        await r.up.arrived("a")
        assert not any(p.startswith("/tokenize") for p in r.up.paths())  # admitted on its bound, uncounted
        r.up.slots = [{**_slot(0, 45, 30), "params": {"n_predict": 100}}]
        records = r.guard.guard.accounting.records
        await until(lambda: any(rec.slot == 0 and rec.running for rec in records.values()))
        assert r.up.slot_reads == 1 and any(p.startswith("/tokenize") for p in r.up.paths())
        r.up.release_slots()
        r.up.slots = []
        r.up.release("a")
        assert (await a)[0] == 200


async def test_a_request_still_reading_its_prompt_is_not_the_one_stopped() -> None:
    """The slots reach the pool while `a` generates past its budget and `b`, holding more, still reads its prompt
    (b11434: n_decoded 0, n_prompt_tokens the part read, n_prompt_tokens_processed a batch behind): `b` is matched
    to its slot all the same, and `a` is the one stopped."""
    fast: dict[str, Any] = {"poll_interval": 0.02, "quiet": 0.05, "horizon": 0.5, "default_budget": 100}
    async with rig(**fast) as r:
        r.up.hold("a", "b")
        a = r.post("/completion", {"prompt": prompt(200), "tag": "a"})
        await r.up.arrived("a")
        b = r.post("/completion", {"prompt": prompt(550), "tag": "b"})
        await r.up.arrived("b")
        assert len(r.books.in_flight) == 2  # 300 + 650 of 1000: both admitted
        reading = {**_slot(1, 550, 512), "id_task": 9, "next_token": [{"has_next_token": True, "n_decoded": 0}]}
        r.up.slots = [{**_slot(0, 450, 200), "id_task": 8}, reading]
        await r.up.was_cancelled("a")
        assert r.outcomes()["preempted"] == 1
        placed = {rec.ticket.prompt: rec.slot for rec in r.guard.guard.accounting.records.values() if rec.ticket}
        assert placed == {200: 0, 550: 1}
        r.up.slots = []
        r.up.release("a")
        r.up.release("b")
        assert (await b)[0] == 200 and (await a)[0] == 200
        assert r.up.arrivals["b"] == 1 and r.up.arrivals["a"] == 2


async def test_a_stream_that_has_begun_is_stopped_with_an_error_event_and_a_clean_end() -> None:
    fast: dict[str, Any] = {"poll_interval": 0.02, "quiet": 0.05, "horizon": 0.5, "default_budget": 100}
    async with rig(**fast) as r:
        r.up.hold("a+", "b+")
        a = r.post(
            "/v1/messages",
            {
                "messages": [{"role": "user", "content": prompt(300)}],
                "stream": True,
                "tag": "a",
                "script": "stream-hold",
            },
        )
        await r.up.arrived("a")
        b = r.post("/completion", {"prompt": prompt(301), "stream": True, "tag": "b", "script": "stream-hold"})
        await r.up.arrived("b")
        preemption = r.guard.guard.preemption
        assert isinstance(preemption, Preemption)
        await until(lambda: all(run.streaming for run in preemption.runs.values()) and len(preemption.runs) == 2)
        r.up.slots = [_slot(0, 530, 300), _slot(1, 520, 301)]
        await r.up.was_cancelled("a")
        status, body, _ = await a
        # What the server had sent, then the error in the form llama-server gives a /v1/messages stream, then the end.
        assert status == 200 and body.startswith('data: {"content": "a"}\n\nevent: error\ndata: {"error": {"code": 503')
        assert body.endswith("}}\n\n")
        r.up.slots = []
        r.up.release("b+")
        assert (await b)[1] == 'data: {"content": "a"}\n\ndata: [DONE]\n\n'
        assert r.outcomes()["preempted"] == 1 and "replayed" not in r.outcomes()


async def test_bodies_over_the_limit_or_stalled_are_refused_and_the_window_comes_from_props() -> None:
    async with rig(Pool(capacity=None, slot_window=None, unified=True), max_body_bytes=1000, body_timeout=0.2) as r:
        status, body, _ = await r.post("/completion", {"prompt": "x" * 2000})
        assert status == 413 and "larger than the guard's limit of 1000 bytes" in body["error"]["message"]
        host, port = r.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        head = await reader.readline()
        assert head.startswith(b"HTTP/1.1 408")
        writer.close()
        # Without a pool from the log, the guard admits against one slot's window, read from /props.
        assert (await r.post("/completion", {"prompt": "a b", "n_predict": 2}))[0] == 200
        assert "/props" in r.up.paths() and r.guard.guard.pool().limit == 1000


# ---------------------------------------------------------------------- upstream errors


async def test_upstream_errors_are_answered_or_passed_on() -> None:
    async with rig() as r:
        status, body, _ = await r.post("/completion", {"prompt": "a b", "n_predict": 2, "script": "fail"})
        assert (status, body["error"]["message"]) == (500, "Context size has been exceeded.")  # passed on as it came
        # llama-server dies before answering: the request is sent once more (counted), then the 502 says so.
        status, body, _ = await r.post("/completion", {"prompt": "a b", "n_predict": 2, "script": "die", "tag": "d"})
        assert status == 502 and "failed before answering" in body["error"]["message"]
        assert "retries are spent" in body["error"]["message"]
        assert r.up.arrivals["d"] == 2 and r.outcomes()["retried"] == 1
        status, body, headers = await r.post("/completion", {"prompt": "a b", "n_predict": 2, "script": "stream"})
        assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
        assert body == 'data: {"content": "a"}\n\ndata: [DONE]\n\n'
        assert r.outcomes()["failed"] == 1
        assert not r.books.in_flight
    # Nothing listens where llama-server should be.
    # Nothing listens where llama-server should be: a generation waits for it within its queue timeout, then
    # hears 503 with a Retry-After; any other route is answered 502 at once.
    async with rig(upstream=r.url, max_wait=0.5) as dead:
        status, body, headers = await dead.post(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}
        )
        assert status == 503 and "Retry-After" in headers
        status, body, _ = await dead.post("/tokenize", {"content": "x"})
        assert status == 502 and "cannot be reached" in body["error"]["message"]
