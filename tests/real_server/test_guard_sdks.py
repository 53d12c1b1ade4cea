"""The guard under the clients that agents use: the `openai` SDK (Responses API and chat completions) and the
`anthropic` SDK (messages), streaming and not, with the SDKs' default timeouts, against a real llama-server.

Three ~9,000-token requests overflow a `-c 24576 -np 3 -kvu` pool together: direct, llama-server aborts them
all (`Context size has been exceeded`); through the guard every one is answered and llama-server aborts none.
The SDKs' retries are off (`max_retries=0`) so that an abort cannot hide behind a retry.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from llama_harness import ExporterProcess, LlamaServer, free_port, http_json, make_prompt, tail_text, wait_for
from tiny_gguf import write_tiny_llama

anthropic = pytest.importorskip("anthropic", reason="pip install -e '.[test]' (the anthropic SDK)")
openai = pytest.importorskip("openai", reason="pip install -e '.[test]' (the openai SDK)")

pytestmark = pytest.mark.llama_server

POOL = ("-c", "24576", "-np", "3", "-kvu", "-t", "2")
PROMPT_CHARS = (
    10750  # about 9,000 tokens of the tiny model (0.84 per character): three pass the 24,576-cell pool, two fit
)
BUDGET = 64  # generated past the prompts, so that all three hold their cells at once
EXTRA = {"ignore_eos": True}  # the random model would end its answers at random


class Rig:
    def __init__(self, server: LlamaServer, exporter: ExporterProcess, guard: str) -> None:
        self.server = server
        self.exporter = exporter
        self.guard = guard

    def exceeded(self) -> int:
        return len(self.server.log_lines("Context size has been exceeded"))


@pytest.fixture(scope="module")
def rig(llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("guard-sdks")
    model = write_tiny_llama(tmp / "tiny.gguf")
    with LlamaServer(llama_server_bin, model, POOL, log_file=tmp / "llama-server.log") as server:
        port = free_port()
        # An explicit queue timeout far past any wait here: the wait is the guard's to bound, not the test's, and
        # on a loaded host its estimate of the wait (751 s seen at load 10) must not refuse a request this file
        # checks is counted, not timed.
        args = ["--server-url", server.url, "--nvml", "off", "--guard.listen-address", f"127.0.0.1:{port}"]
        exporter = ExporterProcess(
            server.log_file,
            [*args, "--guard.queue-timeout", "3600"],
            output_file=tmp / "exporter.out",
        ).start()
        try:
            # The guard admits against the pool once the exporter has read its size from the log.
            wait_for(lambda: exporter.sample("llamacpp_kv_pool_capacity_tokens") == 24576, timeout=30)
            yield Rig(server, exporter, f"http://127.0.0.1:{port}")
        finally:
            exporter.stop()


def _three(call: Callable[[int], Any]) -> list[Any]:
    """Three calls at once; each one's result, or the exception it raised."""

    def safe(i: int) -> Any:
        try:
            return call(i)
        except Exception as exc:  # the outcome is what the test compares: what was raised, then where
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return f"{type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno})"

    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(safe, range(3)))


def _text(i: int, chars: int = PROMPT_CHARS) -> str:
    return f"{i} " + make_prompt(chars)  # each its own prompt: no prompt-cache sharing between them


def responses(base: str, stream: bool) -> Callable[[int], Any]:
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)

    def call(i: int) -> Any:
        kwargs: dict[str, Any] = {"model": "tiny", "input": _text(i), "instructions": "Answer.", "extra_body": EXTRA}
        if not stream:
            r = client.responses.create(max_output_tokens=BUDGET, **kwargs)
            return r.status
        # The raw events (the SDK's `responses.stream` helper cannot assemble b11434's events: a TypeError in it,
        # direct as through the guard); the last one is `response.completed` with the response's status.
        events = list(client.responses.create(max_output_tokens=BUDGET, stream=True, **kwargs))
        return events[-1].response.status if events[-1].type == "response.completed" else events[-1]

    return call


def chat(base: str, stream: bool) -> Callable[[int], Any]:
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)

    def call(i: int) -> Any:
        messages = [{"role": "user", "content": _text(i)}]
        if not stream:
            r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=BUDGET, extra_body=EXTRA)
            return r.choices[0].finish_reason
        chunks = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=BUDGET, extra_body=EXTRA, stream=True
        )
        return [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1]

    return call


def messages(base: str, stream: bool) -> Callable[[int], Any]:
    client = anthropic.Anthropic(base_url=base, api_key="none", max_retries=0)

    def call(i: int) -> Any:
        kwargs: dict[str, Any] = {
            "model": "tiny",
            "max_tokens": BUDGET,
            "messages": [{"role": "user", "content": _text(i)}],
            "extra_body": EXTRA,
        }
        if not stream:
            return client.messages.create(**kwargs).stop_reason
        # The raw events: b11434 sends `message_start` with a token's partial result only when it is the first
        # token decoded; a first token that is an incomplete UTF-8 sequence (the random model's byte tokens often
        # are) is held back, and the stream then has no `message_start`, which the SDK's `messages.stream` helper
        # cannot assemble (an AssertionError in it), direct as through the guard. The end is `message_delta`.
        events = list(client.messages.create(stream=True, **kwargs))
        ends = [e for e in events if e.type == "message_delta"]
        return ends[-1].delta.stop_reason if ends and events[-1].type == "message_stop" else events[-1]

    return call


FINISHED = {"completed", "length", "max_tokens", "stop", "end_turn"}


def test_acceptance_three_responses_that_overflow_the_pool_directly_are_all_aborted(rig: Rig) -> None:
    """The load is one that llama-server cannot serve alone: every request of it aborted."""
    before = rig.exceeded()
    failed = len(rig.server.log_lines("decode() failed"))
    outcomes = _three(responses(rig.server.url, stream=False))
    assert all("InternalServerError" in str(o) and "Context size has been exceeded" in str(o) for o in outcomes), (
        outcomes
    )
    # The abort's last line (after one per task): the next test counts the lines from here on.
    wait_for(lambda: len(rig.server.log_lines("decode() failed")) > failed, timeout=30)
    assert rig.exceeded() > before


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", [responses, chat, messages], ids=["responses", "chat", "messages"])
def test_acceptance_three_sdk_requests_that_overflow_the_pool_are_all_answered_through_the_guard(
    rig: Rig, api: Callable[[str, bool], Callable[[int], Any]], stream: bool
) -> None:
    before = rig.exceeded()
    queued = rig.exporter.sample("llamacpp_guard_requests_total", {"outcome": "queued"}) or 0
    outcomes = _three(api(rig.guard, stream))
    assert all(o in FINISHED for o in outcomes), (outcomes, tail_text(rig.exporter.output_file))
    assert rig.exceeded() == before  # llama-server aborted nothing
    # They did not fit together: one waited in the guard's queue for the others' room.
    assert (rig.exporter.sample("llamacpp_guard_requests_total", {"outcome": "queued"}) or 0) > queued
    assert rig.exporter.sample("llamacpp_guard_requests_total", {"outcome": "unsized"}) in (None, 0)


def test_n_completions_are_counted_per_task_so_the_request_beside_them_waits(rig: Rig) -> None:
    """`n: 2` starts two tasks on one prompt: 11,000 + 2 x 1,200 cells, next to an 11,000 + 1,200 request: 25,600
    of 24,576. Counted once (12,200 + 12,200) they would both be sent and all three tasks aborted; counted per
    task the second request waits for the first, and none is aborted."""
    before = rig.exceeded()
    queued = rig.exporter.sample("llamacpp_guard_requests_total", {"outcome": "queued"}) or 0

    def call(i: int) -> tuple[int, dict[str, Any]]:
        body: dict[str, Any] = {"prompt": _text(i, 13300), "n_predict": 1200, "ignore_eos": True}
        if i == 0:
            body["n"] = 2
        return http_json(rig.guard + "/completion", body=body, timeout=3600)

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(call, 0)
        wait_for(lambda: rig.exporter.sample("llamacpp_guard_in_flight_requests") == 1, timeout=60)
        demand = rig.exporter.sample("llamacpp_guard_admitted_demand_tokens")
        second = pool.submit(call, 1)
        (s1, b1), (s2, b2) = first.result(), second.result()
    assert demand is not None and 10800 + 2400 < demand < 11200 + 2400  # its prompt (about 11,000) once, 2 x 1,200
    assert (s1, s2) == (200, 200), (b1, b2)
    assert [r["tokens_predicted"] for r in b1["_"]] == [1200, 1200] and b2["tokens_predicted"] == 1200
    assert rig.exceeded() == before
    assert (rig.exporter.sample("llamacpp_guard_requests_total", {"outcome": "queued"}) or 0) == queued + 1
