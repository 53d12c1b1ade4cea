"""The guard's pure parts: admission (books, FIFO queue, bounds, refusals) and sizing (what a body asks for)."""

from __future__ import annotations

import dataclasses
import doctest
import json
import random

import pytest

from exporter.guard import admission as admission_module
from exporter.guard import preempt
from exporter.guard import sizing as sizing_module
from exporter.guard.admission import Admission, Pool, Ticket
from exporter.guard.sizing import plan

SHARED = Pool(capacity=1000, slot_window=1000, unified=True)


def test_docstrings() -> None:
    for module in (admission_module, sizing_module, preempt):
        assert doctest.testmod(module).failed == 0


def test_admits_while_the_demand_fits_then_queues_in_order() -> None:
    a = Admission(max_queue=10, max_wait=60)
    assert a.offer(Ticket(1, prompt=300, budget=100), SHARED, 0).kind == "admit"
    assert a.offer(Ticket(2, prompt=300, budget=100), SHARED, 0).kind == "admit"
    assert a.demand == 800
    assert a.offer(Ticket(3, prompt=300, budget=100), SHARED, 0).kind == "queue"
    # A small one that would fit waits behind the head: first in, first out.
    assert a.offer(Ticket(4, prompt=50, budget=10), SHARED, 0).kind == "queue"
    assert [t.id for t in a.release(1, SHARED, 1)] == [3, 4]
    assert a.demand == 400 + 400 + 60
    assert not a.queue


def test_the_head_is_admitted_alone_whatever_its_size() -> None:
    """A request that fits its slot runs when nothing else does: a full pool never deadlocks."""
    a = Admission(max_queue=10, max_wait=60)
    assert a.offer(Ticket(1, prompt=900, budget=5000), SHARED, 0).kind == "admit"
    assert a.in_flight[1].demand == 1000  # capped at the slot's window: the server stops generating there
    assert a.offer(Ticket(2, prompt=900, budget=5000), SHARED, 0).kind == "queue"
    assert [t.id for t in a.release(1, SHARED, 1)] == [2]


def test_a_prompt_that_fills_its_slot_is_left_to_the_server_and_one_past_the_pool_refused() -> None:
    a = Admission(max_queue=10, max_wait=60)
    assert a.offer(Ticket(1, prompt=1000, budget=1), SHARED, 0).kind == "forward"
    capped = Pool(capacity=800, slot_window=1000, unified=True)
    d = a.offer(Ticket(2, prompt=900, budget=1), capped, 0)
    assert (d.kind, d.status, d.error_type) == ("refuse", 400, "exceed_context_size_error")
    assert "exceeds the available context size (800 tokens)" in d.reason
    assert not a.in_flight and not a.queue


def test_the_queue_is_bounded_by_length_and_by_wait() -> None:
    a = Admission(max_queue=1, max_wait=30)
    a.offer(Ticket(1, prompt=900, budget=100), SHARED, 0)
    assert a.offer(Ticket(2, prompt=900, budget=100), SHARED, 0).kind == "queue"
    full = a.offer(Ticket(3, prompt=10, budget=1), SHARED, 0)
    assert (full.kind, full.status) == ("refuse", 429) and full.retry_after == 30
    assert a.expired(29.9) == []
    assert [t.id for t in a.expired(30.0)] == [2]
    assert not a.queue


def test_a_waiter_that_leaves_lets_the_next_one_in() -> None:
    a = Admission(max_queue=5, max_wait=60)
    a.offer(Ticket(1, prompt=600, budget=0), SHARED, 0)
    a.offer(Ticket(2, prompt=600, budget=0), SHARED, 0)
    a.offer(Ticket(3, prompt=300, budget=0), SHARED, 0)
    # The head leaves (its client went away): the one behind it fits next to what runs.
    assert [t.id for t in a.release(2, SHARED, 1)] == [3]
    assert set(a.in_flight) == {1, 3}


def test_separate_streams_only_check_the_window() -> None:
    """Without a shared pool no request can push another out: all are admitted."""
    own = Pool(capacity=4000, slot_window=1000, unified=False)
    a = Admission(max_queue=5, max_wait=60)
    assert all(a.offer(Ticket(i, prompt=900, budget=100), own, 0).kind == "admit" for i in range(6))


def test_an_unknown_capacity_admits_against_one_slots_window() -> None:
    unknown = Pool(capacity=None, slot_window=1000, unified=None)
    a = Admission(max_queue=5, max_wait=60)
    assert a.offer(Ticket(1, prompt=600, budget=0), unknown, 0).kind == "admit"
    assert a.offer(Ticket(2, prompt=600, budget=0), unknown, 0).kind == "queue"


@pytest.mark.parametrize("seed", range(20))
def test_admitted_demand_never_passes_the_pool(seed: int) -> None:
    """Random arrivals and ends: the books stay within the pool, and every request is admitted in arrival order."""
    rng = random.Random(seed)
    a = Admission(max_queue=1000, max_wait=1e9)
    order: list[int] = []
    for i in range(300):
        if a.in_flight and rng.random() < 0.45:
            for t in a.release(rng.choice(list(a.in_flight)), SHARED, i):
                order.append(t.id)
        else:
            if a.offer(Ticket(i, prompt=rng.randint(1, 900), budget=rng.randint(0, 400)), SHARED, i).kind == "admit":
                order.append(i)
        assert a.demand <= 1000 or len(a.in_flight) == 1
    assert order == sorted(order)


def test_sizing_plans() -> None:
    chat = plan("/chat/completions", b'{"messages": [], "n_predict": 5, "max_tokens": 9, "stream": true, "model": "m"}')
    assert chat is not None and (chat.template, chat.budget, chat.stream, chat.model) == (True, 5, True, "m")
    many = plan("/v1/completions", b'{"prompt": ["a", "b", [1, 2, 3]], "max_tokens": -1}')
    assert many is not None and (many.texts, many.token_counts, many.tasks, many.budget) == (["a", "b"], [3], 3, None)
    msgs = plan("/v1/messages", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 7}')
    assert msgs is not None and msgs.count_route == "/v1/messages/count_tokens" and msgs.budget == 7
    infill = plan("/infill", b'{"input_prefix": "def f(", "input_suffix": ")", "n_predict": 3}')
    assert infill is not None and infill.texts == ["def f()"]
    for path, body in [
        ("/completion", b"{oops"),
        ("/completion", b"[1, 2]"),
        ("/completion", b'{"prompt": {"a": 1}}'),
        ("/completion", b'{"prompt": [true]}'),
        ("/v1/chat/completions", b'{"messages": "hi"}'),
        ("/completion", b"\xff\xfe"),
        ("/v1/responses", b'{"input": 3}'),
        ("/health", b'{"prompt": "x"}'),
    ]:
        assert plan(path, body) is None, (path, body)


def test_responses_are_counted_by_the_servers_own_route_and_budgeted_by_max_output_tokens() -> None:
    r = plan("/v1/responses", b'{"input": "hi", "instructions": "be brief", "max_output_tokens": 50, "stream": true}')
    assert r is not None
    assert (r.count_route, r.budget, r.stream, r.media, r.tasks) == ("/v1/responses/input_tokens", 50, True, False, 1)
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    items = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "what is it"}, image]}]}
    m = plan("/responses", json.dumps(items).encode())
    assert m is not None and m.media and m.bound() is None and not m.exact


def test_n_completions_multiply_the_tasks_not_the_prompt() -> None:
    """llama-server starts `n` (or `n_cmpl`) tasks per prompt, each in its own slot; the children copy the
    parent's cells (shared in a unified pool), so the prompt counts once and the budget once per task."""
    p = plan("/v1/chat/completions", b'{"messages": [], "n": 3, "max_tokens": 600}')
    assert p is not None and (p.copies, p.prompts, p.tasks) == (3, 1, 3)
    both = plan("/completion", b'{"prompt": ["a", "b"], "n_cmpl": 2, "n": 5}')
    assert both is not None and (both.copies, both.tasks) == (2, 4)  # n_cmpl wins over its alias
    a = Admission(max_queue=5, max_wait=60)
    pool = Pool(capacity=4096, slot_window=1024, unified=True)
    t = Ticket(1, prompt=64, budget=600 * 3, tasks=3, copies=3)
    assert a.offer(t, pool, 0).kind == "admit"
    assert t.demand == 1864  # the measured growth of such a request: 64 + 3 x 600
    # A prompt too large for its slot is left to the server, whatever `n` asks.
    assert a.offer(Ticket(2, prompt=1100, budget=3, tasks=3, copies=3), pool, 0).kind == "forward"


def test_chat_with_images_is_counted_by_the_servers_route_and_a_multimodal_prompt_at_the_window() -> None:
    chat = plan(
        "/v1/chat/completions",
        b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}',
    )
    assert chat is not None and chat.media and not chat.template
    assert chat.count_route == "/v1/chat/completions/input_tokens"
    mm = plan("/completion", b'{"prompt": [{"prompt_string": "<__media__>", "multimodal_data": ["AAAA"]}]}')
    assert mm is not None and mm.media and mm.windows == 1 and mm.tasks == 1


def test_the_path_is_routed_as_llama_server_routes_it() -> None:
    assert sizing_module.server_path("/v1/chat%2fcompletions") == "/v1/chat/completions"
    assert sizing_module.server_path("/v1/%u0063hat/completions#x") == "/v1/chat/completions"
    assert sizing_module.server_path("/%zz/../completion?prompt=%2F") == "/%zz/../completion"


def test_slots_answer_read_for_preemption() -> None:
    """A real b11434 `/slots` entry of a generating slot: its held cells, its task's prompt and budget."""
    body = [
        {"id": 0, "n_ctx": 512, "is_processing": False},
        {
            "id": 3,
            "n_ctx": 512,
            "is_processing": True,
            "id_task": 0,
            "n_prompt_tokens": 188,
            "n_prompt_tokens_processed": 19,
            "n_prompt_tokens_cache": 0,
            "params": {"n_predict": 300},
            "next_token": [{"has_next_token": True, "n_remain": 131, "n_decoded": 169}],
        },
    ]
    speeds: dict[int, preempt.LastRead] = {3: (88, 1.0, 0)}
    [s] = preempt.slot_views(body, speeds, now=2.0)
    assert (s.id, s.held, s.prompt, s.n_predict, s.rate, s.remaining, s.window) == (3, 188, 19, 300, 100.0, 131, 512)
    assert s.steady  # task 0 was generating at the last read as well
    assert s.ahead(10.0) == 188 + 131  # its budget ends it before its speed says
    assert speeds[3] == (188, 2.0, 0)
    assert preempt.slot_views({"error": "x"}, {}, 0.0) == []


def test_a_speed_counts_as_steady_only_when_the_same_task_generated_at_both_reads() -> None:
    """The first read after a prompt divides the few tokens generated since by a span spent reading the prompt:
    a speed far below the real one, from which a predicted wait would refuse requests in vain."""

    def slot(held: int, task: int = 7) -> dict[str, object]:
        return {
            "id": 0,
            "is_processing": True,
            "id_task": task,
            "n_prompt_tokens": held,
            "n_prompt_tokens_processed": 1000,
            "n_prompt_tokens_cache": 0,
        }

    speeds: dict[int, preempt.LastRead] = {}
    [reading] = preempt.slot_views([slot(600)], speeds, now=0.0)  # still reading its prompt
    [first] = preempt.slot_views([slot(1002)], speeds, now=10.0)  # two tokens generated since
    [second] = preempt.slot_views([slot(1052)], speeds, now=11.0)
    [other] = preempt.slot_views([slot(1100, task=8)], speeds, now=12.0)  # a new task in the same slot
    assert [v.steady for v in (reading, first, second, other)] == [False, False, True, False]
    assert second.rate == 50.0


def _generating(held: list[int], prompt: int = 35, budget: int = 400) -> list[dict[str, object]]:
    """A b11434 `/slots` answer: slots 1.. generating, each holding `held[i]` cells of `prompt` plus its budget."""
    return [
        {
            "id": i + 1,
            "n_ctx": 1024,
            "is_processing": True,
            "id_task": 5 + i,
            "n_prompt_tokens": h,
            "n_prompt_tokens_processed": prompt,
            "n_prompt_tokens_cache": 0,
            "params": {"n_predict": budget},
            "next_token": [{"has_next_token": True, "n_remain": prompt + budget - h, "n_decoded": h - prompt}],
        }
        for i, h in enumerate(held)
    ]


def first_stop(reads: list[int], interval: float = 1.25) -> int | None:
    """The read (by index) at which the guard stops one of three slots that each hold `reads[k]` at read k."""
    speeds: dict[int, preempt.LastRead] = {}
    running = [preempt.Running(r, 35, -1, admitted_at=float(r)) for r in range(3)]
    for k, held in enumerate(reads):
        slots = preempt.slot_views(_generating([held] * 3), speeds, now=k * interval)
        if preempt.choose_victim(slots, running, limit=1024, horizon=3.5) is not None:
            return k
    return None


def test_a_speed_that_triples_between_two_reads_is_stopped_before_the_pool_overflows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Real reads of three requests without a budget (`-c 1024 -np 4 -kvu -n 400`, 35-token prompts) on 2 cores
    with a busy loop on each: 25-32 tokens a second per slot, then 73 from one read to the next, as the busy
    loops left the cores. The pool overflows at 342 cells a slot, and a stop takes over a second to be noticed.
    The guard stops one at the first read that measures a speed; at the measured speed alone it would have
    stopped one at 326 cells, too late."""
    reads = [65, 105, 137, 169, 204, 235, 326]
    assert first_stop(reads) == 1
    monkeypatch.setattr(preempt, "SURGE", 1.0)
    assert first_stop(reads) == 6


def test_the_victim_is_the_fullest_slot_and_none_is_chosen_in_time() -> None:
    slots = [
        preempt.SlotView(0, 300, 40, -1, rate=30.0, steady=True),
        preempt.SlotView(1, 200, 50, -1, rate=30.0, steady=True),
        preempt.SlotView(2, 100, 60, 64, rate=30.0, remaining=4, steady=True),  # near its end: it holds the least
    ]
    running = [
        preempt.Running(7, 60, 64, admitted_at=0.0),
        preempt.Running(8, 40, -1, admitted_at=1.0),
        preempt.Running(9, 50, -1, admitted_at=2.0),
    ]
    assert preempt.match(slots, running) == {7: slots[2], 8: slots[0], 9: slots[1]}
    victim = preempt.choose_victim(slots, running, limit=700, horizon=2.0)
    assert victim is not None and victim[0] == 8
    # 300 + 3 x 60 + 200 + 3 x 60 + 104: three times the measured speed (`SURGE`) within their budgets.
    assert preempt.choose_victim(slots, running, limit=965, horizon=2.0) is None
    assert preempt.choose_victim(slots, running, limit=964, horizon=2.0) is not None
    # A prompt being read, or a speed not yet measured over two reads while generating: at the speed measured.
    unsteady = [dataclasses.replace(s, steady=False) for s in slots]
    assert preempt.choose_victim(unsteady, running, limit=725, horizon=2.0) is None  # 300+60 + 200+60 + 104
    assert preempt.choose_victim(unsteady, running, limit=724, horizon=2.0) is not None
    # A request alone is never stopped: its window is at most the pool.
    assert preempt.choose_victim(slots[:1], running, limit=100, horizon=2.0) is None
    # Slots that are not the guard's requests are not stopped.
    assert preempt.choose_victim(slots, [preempt.Running(1, 999, -1, 0.0)], limit=100, horizon=2.0) is None


def test_a_bound_admits_without_the_tokenizer_only_what_fits_anyway() -> None:
    p = plan("/completion", json.dumps({"prompt": "héllo", "n_predict": 8}).encode())
    assert p is not None and p.bound() == 6 + 4 and not p.exact  # 6 bytes: at most 6 tokens, plus BOS and the like
    tokens = plan("/completion", b'{"prompt": [1, 2, 3]}')
    assert tokens is not None and tokens.exact and tokens.bound() == 3
    chat = plan("/v1/chat/completions", b'{"messages": []}')
    assert chat is not None and chat.bound() is None
    a = Admission(max_queue=5, max_wait=60)
    a.offer(Ticket(1, prompt=500, budget=100), SHARED, 0)
    assert a.admits_now(Ticket(2, prompt=300, budget=100), SHARED)
    assert not a.admits_now(Ticket(3, prompt=400, budget=100), SHARED)  # size it exactly: it may still fit
    assert not a.admits_now(Ticket(4, prompt=1000, budget=0), SHARED)  # too large for its slot: the server says so
    # The exact size, known later, frees what the bound held: a waiting request gets in.
    a.offer(Ticket(5, prompt=350, budget=100), SHARED, 0)
    assert [t.id for t in a.resize(a.in_flight[1], 380, SHARED, 1)] == [5]


@pytest.mark.parametrize("reading", [9_500, 8_500, 8_000], ids=["largest", "middle", "smallest"])
@pytest.mark.parametrize("order", [(9_500, 8_000, 8_500), (8_000, 8_500, 9_500), (8_000, 9_500, 8_500)])
def test_a_request_still_reading_its_prompt_is_matched_by_elimination(
    reading: int, order: tuple[int, int, int]
) -> None:
    """Three prompts that overflow a pool together, admitted in every order; one is still being read (its slot
    shows only the part read) while the others have theirs: every request is matched to its slot, and keeps
    its slot once matched while that slot runs the same task."""
    running = [preempt.Running(i, n, -1, admitted_at=float(i)) for i, n in enumerate(order)]
    slots = [
        preempt.SlotView(k, 3_000, 0, -1, task=20 + k, reading=True)
        if n == reading
        else preempt.SlotView(k, n, n, -1, task=20 + k)
        for k, n in enumerate(order)
    ]
    matched = preempt.match(slots, running)
    assert {rid: s.id for rid, s in matched.items()} == {0: 0, 1: 1, 2: 2}
    # The next read: the others are done (generating), the reader still reads; two reading slots could
    # each be either request, but the matches made before hold while their slots run the same tasks.
    later = [dataclasses.replace(s, held=s.held + 100, prompt=s.prompt) for s in slots]
    two_reading = [dataclasses.replace(s, held=2_000, prompt=0, reading=True) for s in later]
    # Without what was known, all three being read are paired by the order of their tasks.
    assert {rid: s.id for rid, s in preempt.match(two_reading, running).items()} == {0: 0, 1: 1, 2: 2}
    # Not where a pair is impossible (a part read larger than the prompt it would be).
    too_long = [dataclasses.replace(s, held=8_200, prompt=0, reading=True) for s in later]
    assert len(preempt.match(too_long, running)) < 3
    known = {rid: (s.id, s.task) for rid, s in matched.items() if s.task is not None}
    assert {rid: s.id for rid, s in preempt.match(two_reading, running, known).items()} == {0: 0, 1: 1, 2: 2}
    # A new task in a slot is not the old match: reversed task order, paired anew by that order.
    moved = [dataclasses.replace(s, task=100 - (s.task or 0)) for s in two_reading]
    assert {rid: s.id for rid, s in preempt.match(moved, running, known).items()} == {0: 2, 1: 1, 2: 0}


def test_a_slot_reading_its_prompt_is_seen_as_reading() -> None:
    """b11434's /slots while a 9,514-token prompt is read in 2,048-token batches (as read from a real server):
    n_prompt_tokens is the part read, n_prompt_tokens_processed trails it by a batch (0 during the first, equal
    to it when the slot waited a turn), next_token.n_decoded is 0 until the first token. A part read is never
    taken for a whole prompt; once generating, processed is the prompt."""

    def entry(held: int, processed: int, decoded: int) -> dict[str, object]:
        return {"id": 2, "is_processing": True, "id_task": 1, "n_prompt_tokens": held,
                "n_prompt_tokens_processed": processed, "n_prompt_tokens_cache": 0, "params": {"n_predict": 16},
                "next_token": [{"has_next_token": True, "n_remain": 16 - decoded, "n_decoded": decoded}]}  # fmt: skip

    reads = [(2048, 0, 0), (4096, 2048, 0), (4096, 4096, 0), (8192, 6144, 0), (9514, 8192, 0), (9516, 9514, 2)]
    speeds: dict[int, preempt.LastRead] = {}
    views = [preempt.slot_views([entry(*r)], speeds, now=float(i))[0] for i, r in enumerate(reads)]
    assert [(v.reading, v.held, v.prompt) for v in views] == [
        *((True, held, None) for held, _, _ in reads[:-1]),
        (False, 9516, 9514),
    ]
    assert not any(v.steady for v in views)  # reading a prompt is no generation speed
    # A build without n_decoded: a prompt is being read while nothing of it is counted processed.
    old = [{"id": 0, "is_processing": True, "id_task": 3, "n_prompt_tokens": 2048, "n_prompt_tokens_processed": 0,
            "n_prompt_tokens_cache": 0}]  # fmt: skip
    [v] = preempt.slot_views(old, {}, now=1.0)
    assert (v.reading, v.prompt) == (True, None)


def test_a_request_still_reading_its_prompt_is_not_stopped() -> None:
    """The projection reaches the pool while one slot generates past its budget and another, holding more, still
    reads its prompt: the generating one is stopped (the reader was admitted on its exact prompt and has
    generated nothing); with only readers matched, nothing is."""
    reader = preempt.SlotView(0, 6_000, None, -1, rate=2_000.0, task=9, reading=True)
    grower = preempt.SlotView(1, 3_000, 1_000, -1, rate=40.0, task=8, steady=True)
    running = [preempt.Running(1, 1_000, -1, admitted_at=0.0), preempt.Running(2, 8_000, -1, admitted_at=1.0)]
    assert {rid: s.id for rid, s in preempt.match([reader, grower], running).items()} == {1: 1, 2: 0}
    victim = preempt.choose_victim([reader, grower], running, limit=9_000, horizon=2.0)
    assert victim is not None and victim[0] == 1, victim
    assert victim[1].startswith("slot 1 holds 3000 of the")
    other = preempt.SlotView(1, 3_000, None, -1, rate=2_000.0, task=10, reading=True)
    both = [preempt.Running(1, 4_000, -1, admitted_at=0.0), preempt.Running(2, 8_000, -1, admitted_at=1.0)]
    assert len(preempt.match([reader, other], both)) == 2
    assert preempt.choose_victim([reader, other], both, limit=9_000, horizon=2.0) is None
