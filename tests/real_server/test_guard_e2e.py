"""The guard in front of a real llama-server (b11434): transparent pass-through, admission, faults.

The model is `write_slow_llama`'s (a few hundred prompt tokens per second on 2 cores), so that
requests overlap; every assertion is about order and causality, none about a wall-clock margin.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_harness import (
    ExporterProcess,
    LlamaRouter,
    LlamaServer,
    free_port,
    http_json,
    http_request,
    make_prompt,
    run_concurrent_completions,
    start_guarded,
    wait_for,
)
from paths import REPO
from tiny_gguf import write_slow_llama

pytestmark = pytest.mark.llama_server

# 4 x (200 prompt + 8 generated) cells overflow a 512-cell shared pool; 2 fit together.
POOL = ("-c", "512", "-np", "4", "-kvu", "-t", "2")


class Guarded:
    """A llama-server, and an exporter whose guard stands in front of it."""

    def __init__(self, server: LlamaServer, exporter: ExporterProcess, guard_port: int) -> None:
        self.server = server
        self.exporter = exporter
        self.guard = f"http://127.0.0.1:{guard_port}"

    def outcome(self, outcome: str) -> float:
        value = self.exporter.sample("llamacpp_guard_requests_total", {"outcome": outcome})
        assert value is not None
        return value


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_slow_llama(tmp_path_factory.mktemp("models") / "slow-llama.gguf")


@pytest.fixture(scope="module")
def guarded(llama_server_bin: Path, slow_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    tmp = tmp_path_factory.mktemp("guard")
    with LlamaServer(llama_server_bin, slow_model, POOL, log_file=tmp / "llama-server.log") as server:
        exporter, port = start_guarded(server, tmp)
        try:
            yield Guarded(server, exporter, port)
        finally:
            exporter.stop()


def raw_request(
    base: str, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------- pass-through


@pytest.mark.parametrize("path", ["/health", "/props", "/v1/models", "/slots", "/models", "/no-such-route"])
def test_every_other_path_passes_through_unchanged(guarded: Guarded, path: str) -> None:
    direct = raw_request(guarded.server.url, "GET", path)
    through = raw_request(guarded.guard, "GET", path)
    assert through[0] == direct[0]
    assert through[1].get("content-type") == direct[1].get("content-type")
    if path in ("/health", "/no-such-route", "/v1/models"):
        assert through[2] == direct[2]
    else:  # /props and /slots change between two reads (timings, slot ids): same keys
        assert json.loads(through[2]).__class__ is json.loads(direct[2]).__class__


def test_a_generation_answer_and_its_headers_come_back_unchanged(guarded: Guarded) -> None:
    body = json.dumps({"prompt": "Hello", "n_predict": 4, "seed": 1, "temperature": 0}).encode()
    headers = {"Content-Type": "application/json", "X-Custom": "kept"}
    direct = raw_request(guarded.server.url, "POST", "/completion", body, headers)
    through = raw_request(guarded.guard, "POST", "/completion", body, headers)
    assert (
        (through[0], through[1]["content-type"])
        == (direct[0], direct[1]["content-type"])
        == (200, direct[1]["content-type"])
    )
    assert json.loads(through[2])["content"] == json.loads(direct[2])["content"]  # greedy: the same text
    assert int(through[1]["content-length"]) == len(through[2])


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completion", b'{"prompt": "x",'),
        ("/v1/chat/completions", b'{"prompt": "x",'),
        ("/completion", b"[1, 2]"),
        ("/completion", b'{"prompt": {"a": 1}}'),
        ("/v1/chat/completions", b'{"messages": "hi"}'),
        ("/completion", b"\xff\xfe\x00"),
        ("/completion", b""),
    ],
)
def test_bad_json_gets_llama_servers_own_error(guarded: Guarded, path: str, body: bytes) -> None:
    """What the guard cannot read it passes on unsized; the client gets exactly llama-server's answer."""
    before = guarded.outcome("unsized")
    direct = raw_request(guarded.server.url, "POST", path, body, {"Content-Type": "application/json"})
    through = raw_request(guarded.guard, "POST", path, body, {"Content-Type": "application/json"})
    assert (through[0], through[2]) == (direct[0], direct[2])
    assert through[0] >= 400
    assert guarded.outcome("unsized") == before + 1


def test_a_prompt_larger_than_the_slot_gets_llama_servers_own_refusal(guarded: Guarded) -> None:
    body = {"prompt": "word " * 700, "n_predict": 4}
    direct = http_request(guarded.server.url + "/completion", body=body, timeout=60)
    refused = guarded.outcome("refused")
    through = http_request(guarded.guard + "/completion", body=body, timeout=60)
    assert through == direct
    assert direct[0] == 400 and b"exceeds the available context size" in direct[1]
    assert guarded.outcome("refused") == refused + 1


def test_a_stream_is_passed_on_as_it_is_produced(guarded: Guarded) -> None:
    """The first event reaches the client while llama-server is still generating the rest."""
    host, port = guarded.guard.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {"messages": [{"role": "user", "content": "Count."}], "max_tokens": 200, "ignore_eos": True, "stream": True}
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
    first = resp.readline()
    assert first.startswith(b"data: ")
    # The server still works on this request: its slot is processing, so nothing was held back until the end.
    _, slots = http_json(guarded.server.url + "/slots")
    assert any(s.get("is_processing") for s in slots["_"])
    rest = resp.read()
    conn.close()
    assert rest.rstrip().endswith(b"data: [DONE]")


@pytest.mark.parametrize("reused", [False, True], ids=["fresh", "reused"])
def test_a_client_that_goes_away_cancels_its_request(guarded: Guarded, reused: bool) -> None:
    """Closing the upstream connection cancels the server's task, also right after another request."""
    host, port = guarded.guard.removeprefix("http://").split(":")
    if reused:
        assert http_request(guarded.guard + "/completion", body={"prompt": "x", "n_predict": 1})[0] == 200
    cancelled = len(guarded.server.log_lines("cancel task"))
    released = len(guarded.server.log_lines("stop processing"))
    sock = socket.create_connection((host, int(port)))
    body = json.dumps({"prompt": "Tell a long story.", "n_predict": 5000, "ignore_eos": True}).encode()
    sock.sendall(
        b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    wait_for(lambda: any(s.get("is_processing") for s in http_json(guarded.server.url + "/slots")[1]["_"]), timeout=30)
    sock.close()
    wait_for(lambda: len(guarded.server.log_lines("cancel task")) > cancelled, timeout=30)
    # Cancelled, not finished: it ended before its natural end at its slot's window of 512.
    wait_for(lambda: len(guarded.server.log_lines("stop processing")) > released, timeout=30)
    last = guarded.server.log_lines("stop processing")[-1]
    assert int(last.split("n_tokens = ")[1].split(",")[0]) < 500, last
    wait_for(
        lambda: not any(s.get("is_processing") for s in http_json(guarded.server.url + "/slots")[1]["_"]), timeout=30
    )
    wait_for(lambda: guarded.exporter.sample("llamacpp_guard_in_flight_requests") == 0, timeout=30)


# ---------------------------------------------------------------------------------------- admission


def test_acceptance_prompts_that_overflow_together_are_queued_not_aborted(guarded: Guarded) -> None:
    """4 prompts that together pass the pool: all aborted direct, all answered through the guard."""
    failed = len(guarded.server.log_lines("decode() failed"))
    direct = run_concurrent_completions(guarded.server.url, 4, prompt_chars=200, n_predict=8, timeout=120)
    assert [s for s, _ in direct] == [500] * 4
    assert all("Context size has been exceeded" in b["error"]["message"] for _, b in direct)
    # The abort's last line ends the direct run's lines (the log is written a little after the answers).
    wait_for(lambda: len(guarded.server.log_lines("decode() failed")) > failed, timeout=30)
    exceeded = len(guarded.server.log_lines("Context size has been exceeded"))
    queued, admitted = guarded.outcome("queued"), guarded.outcome("admitted")
    sized = guarded.exporter.sample("llamacpp_guard_request_prompt_tokens_sum") or 0
    through = run_concurrent_completions(guarded.guard, 4, prompt_chars=200, n_predict=8, timeout=120)
    assert [s for s, _ in through] == [200] * 4
    # The guard's prompt sizes are the server's own: what it evaluated for each (no prompt cache).
    evaluated = sum(b["tokens_evaluated"] for _, b in through)
    wait_for(
        lambda: guarded.exporter.sample("llamacpp_guard_request_prompt_tokens_sum") == sized + evaluated, timeout=10
    )
    assert len(guarded.server.log_lines("Context size has been exceeded")) == exceeded
    # Two fit the pool together; the others waited for one of them to end.
    assert guarded.outcome("queued") - queued >= 1
    assert guarded.outcome("admitted") - admitted == 4
    wait = guarded.exporter.sample("llamacpp_guard_queue_wait_seconds_count")
    assert wait is not None and wait >= 1
    assert guarded.exporter.sample("llamacpp_guard_queue_requests") == 0


@pytest.mark.promtool
def test_the_guards_families_pass_promtool(guarded: Guarded, promtool_bin: Path) -> None:
    text = guarded.exporter.scrape()
    assert "llamacpp_guard_requests_total{" in text and "llamacpp_guard_queue_wait_seconds_bucket{" in text
    out = subprocess.run(
        [str(promtool_bin), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_acceptance_a_load_that_fits_is_never_queued(guarded: Guarded) -> None:
    """Requests that fit the pool together are all sent at once: none waits."""
    queued, admitted = guarded.outcome("queued"), guarded.outcome("admitted")
    through = run_concurrent_completions(guarded.guard, 2, prompt_chars=200, n_predict=8, timeout=120)
    assert [s for s, _ in through] == [200] * 2
    through = run_concurrent_completions(guarded.guard, 4, prompt_chars=60, n_predict=40, timeout=120)
    assert [s for s, _ in through] == [200] * 4
    assert guarded.outcome("queued") == queued
    assert guarded.outcome("admitted") == admitted + 6


# ---------------------------------------------------------------------------------------- faults


def test_upstream_down_gives_502_at_once_and_a_generation_503_after_its_wait(tmp_path: Path) -> None:
    """Nothing listens: /health is passed on as it is (502 at once); a generation waits its queue timeout for the
    server, then gets 503 with Retry-After. Each with one line naming the server."""
    log = tmp_path / "llama-server.log"
    log.touch()
    port, guard_port = free_port(), free_port()
    exporter = ExporterProcess(
        log,
        [
            *("--server-url", f"http://127.0.0.1:{port}", "--nvml", "off"),
            *("--guard.listen-address", f"127.0.0.1:{guard_port}", "--guard.queue-timeout", "1"),
        ],
    ).start()
    try:
        status, answer = http_json(f"http://127.0.0.1:{guard_port}/health")
        message = answer["error"]["message"]
        assert status == 502 and "cannot be reached" in message
        assert "\n" not in message and f"127.0.0.1:{port}" in message
        status, raw = http_request(f"http://127.0.0.1:{guard_port}/completion", body={"prompt": "x"}, timeout=60)
        message = json.loads(raw)["error"]["message"]
        assert status == 503 and "is not ready" in message and "after 1 s" in message
        assert "\n" not in message and f"127.0.0.1:{port}" in message
        assert (exporter.sample("llamacpp_guard_server_down_wait_seconds_total") or 0) > 0
        assert exporter.sample("llamacpp_guard_server_down_waiting_requests") == 0
    finally:
        exporter.stop()


def test_a_body_over_the_limit_is_refused(guarded: Guarded, tmp_path: Path) -> None:
    exporter, port = start_guarded(guarded.server, tmp_path, "--guard.max-body-bytes", "1000")
    try:
        status, answer = http_json(f"http://127.0.0.1:{port}/completion", body={"prompt": "x" * 2000})
        assert status == 413 and "1000 bytes" in answer["error"]["message"]
        status, _ = http_json(f"http://127.0.0.1:{port}/completion", body={"prompt": "x", "n_predict": 2})
        assert status == 200
    finally:
        exporter.stop()


def test_queue_bounds_answer_429_and_503_with_retry_after(guarded: Guarded, tmp_path: Path) -> None:
    """One request holds the pool; one waits; a third finds the queue full (429); the waiter times out (503)."""
    exporter, port = start_guarded(guarded.server, tmp_path, "--guard.queue-size", "1", "--guard.queue-timeout", "1")
    base = f"http://127.0.0.1:{port}"
    host = "127.0.0.1"
    try:
        holder = socket.create_connection((host, port))
        # A short prompt and no end: it generates until its slot's window is full, holding the whole pool.
        big = json.dumps({"prompt": "a story", "n_predict": 5000, "ignore_eos": True}).encode()
        holder.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(big)}\r\n\r\n".encode()
            + big
        )
        wait_for(lambda: exporter.sample("llamacpp_guard_in_flight_requests") == 1, timeout=30)
        results: dict[str, tuple[int, dict[str, str], bytes]] = {}
        body = json.dumps({"prompt": "a story " * 40, "n_predict": 300}).encode()
        waiter = threading.Thread(
            target=lambda: results.__setitem__(
                "w", raw_request(base, "POST", "/completion", body, {"Content-Type": "application/json"})
            )
        )
        waiter.start()
        wait_for(lambda: exporter.sample("llamacpp_guard_queue_requests") == 1, timeout=30)
        full = raw_request(base, "POST", "/completion", body, {"Content-Type": "application/json"})
        assert full[0] == 429 and int(full[1]["retry-after"]) >= 1
        assert "queue is full" in json.loads(full[2])["error"]["message"]
        waiter.join(60)
        status, headers, answer = results["w"]
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert "guard's queue" in json.loads(answer)["error"]["message"]
        holder.close()
    finally:
        exporter.stop()


def test_authorization_passes_through_and_sizing_uses_the_clients_key(
    llama_server_bin: Path, slow_model: Path, tmp_path: Path
) -> None:
    """With --api-key, the guard neither adds nor drops a key: the client's own decides, as direct."""
    args = (*POOL, "--api-key", "k-123")
    with LlamaServer(llama_server_bin, slow_model, args, log_file=tmp_path / "llama-server.log") as server:
        # The exporter has no key: only the client's own reaches llama-server.
        exporter, port = start_guarded(server, tmp_path)
        guard = f"http://127.0.0.1:{port}"
        try:
            # A chat request: the guard sizes it through the server's /apply-template and /tokenize.
            body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).encode()
            keys: tuple[dict[str, str], ...] = (
                {},
                {"Authorization": "Bearer wrong"},
                {"X-Api-Key": "k-123"},
                {"Authorization": "Bearer k-123"},
            )
            for headers in keys:
                headers = {**headers, "Content-Type": "application/json"}
                direct = raw_request(server.url, "POST", "/v1/chat/completions", body, headers)
                through = raw_request(guard, "POST", "/v1/chat/completions", body, headers)
                assert through[0] == direct[0], headers
                if direct[0] != 200:
                    assert through[2] == direct[2]
            assert direct[0] == 200
            # The keyed requests were sized (the server's /tokenize took the client's key, in either header
            # llama-server accepts); the others were refused by the server's /tokenize, and so passed on unsized
            # for the server's own 401.
            admitted = exporter.sample("llamacpp_guard_requests_total", {"outcome": "admitted"})
            unsized = exporter.sample("llamacpp_guard_requests_total", {"outcome": "unsized"})
            assert (admitted, unsized) == (2, 2)
            assert raw_request(guard, "GET", "/health")[0] == 200  # public, as on llama-server
            assert raw_request(guard, "GET", "/slots")[0] == raw_request(server.url, "GET", "/slots")[0] == 401
        finally:
            exporter.stop()


# ---------------------------------------------------------------------------------------- preemption

# Budgets the guard cannot know: the server's own -n 400, and clients that send none (the guard counts its
# default of 32). 3 x (40 + 400) cells overflow the 1,024-cell pool while they generate; 2 fit.
UNKNOWN_BUDGETS = ("-c", "1024", "-np", "4", "-kvu", "-t", "2", "-n", "400")


@pytest.fixture(scope="module")
def unknown_budgets(
    llama_server_bin: Path, slow_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Guarded]:
    tmp = tmp_path_factory.mktemp("guard-preempt")
    with LlamaServer(llama_server_bin, slow_model, UNKNOWN_BUDGETS, log_file=tmp / "llama-server.log") as server:
        exporter, port = start_guarded(server, tmp, "--guard.default-budget", "32")
        try:
            yield Guarded(server, exporter, port)
        finally:
            exporter.stop()


def test_acceptance_generation_overflow_stops_one_request_and_replays_it(unknown_budgets: Guarded) -> None:
    g = unknown_budgets
    failed = len(g.server.log_lines("decode() failed"))
    direct = run_concurrent_completions(g.server.url, 3, prompt_chars=40, n_predict=-1, timeout=300)
    assert [s for s, _ in direct] == [500] * 3  # every one aborted for the others' growth
    wait_for(lambda: len(g.server.log_lines("decode() failed")) > failed, timeout=30)  # its lines are written
    exceeded = len(g.server.log_lines("Context size has been exceeded"))
    cancelled = len(g.server.log_lines("cancel task"))
    through = run_concurrent_completions(g.guard, 3, prompt_chars=40, n_predict=-1, timeout=300)
    assert [s for s, _ in through] == [200] * 3
    assert all(b["tokens_predicted"] == 400 for _, b in through)  # each answer is whole, the replayed one too
    assert len(g.server.log_lines("Context size has been exceeded")) == exceeded
    assert g.outcome("preempted") == 1 and g.outcome("replayed") == 1
    # The stop was a cancelled task in llama-server, ended before its budget was used.
    assert len(g.server.log_lines("cancel task")) > cancelled


def test_a_stopped_stream_ends_with_an_error_event_and_the_others_finish(unknown_budgets: Guarded) -> None:
    g = unknown_budgets
    exceeded = len(g.server.log_lines("Context size has been exceeded"))
    preempted = g.outcome("preempted")
    body = json.dumps({"prompt": "The quick brown fox jumps over the dog.", "stream": True}).encode()
    outputs: list[bytes] = [b""] * 3

    def stream(i: int) -> None:
        outputs[i] = raw_request(g.guard, "POST", "/completion", body, {"Content-Type": "application/json"})[2]

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    stopped = [o for o in outputs if b'"error"' in o]
    finished = [o for o in outputs if b'"stop":true' in o and b'"error"' not in o]
    assert len(stopped) == 1 and len(finished) == 2, [o[-300:] for o in outputs]
    last = stopped[0].rstrip().rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"data: ") and b"stopped by the guard so that the other requests could finish" in last
    assert g.outcome("preempted") == preempted + 1
    assert len(g.server.log_lines("Context size has been exceeded")) == exceeded


# ---------------------------------------------------------------------------------------- router mode


def test_router_mode_admits_each_model_against_its_own_pool(
    llama_server_bin: Path, slow_model: Path, tmp_path: Path
) -> None:
    """A request that fills model alpha's pool holds back the next alpha request, never a beta one."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("alpha", "beta"):
        os.link(slow_model, models / f"{name}.gguf")
    with LlamaRouter(llama_server_bin, models, POOL, log_file=tmp_path / "router.log") as router:
        exporter, port = start_guarded(router, tmp_path)
        guard = f"http://127.0.0.1:{port}"
        try:
            for name in ("alpha", "beta"):
                router.load(name, timeout=60)

            def pools_known() -> bool:
                return all(
                    exporter.sample("llamacpp_kv_pool_capacity_tokens", {"model": m}) == 512 for m in ("alpha", "beta")
                )

            wait_for(pools_known, timeout=60)
            holder = socket.create_connection(("127.0.0.1", port))
            big = json.dumps({"model": "alpha", "prompt": "a story", "n_predict": 5000, "ignore_eos": True}).encode()
            holder.sendall(
                b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(big)}\r\n\r\n".encode()
                + big
            )
            wait_for(lambda: exporter.sample("llamacpp_guard_in_flight_requests") == 1, timeout=30)
            results: list[tuple[int, bytes]] = []
            waiter = threading.Thread(
                target=lambda: results.append(
                    http_request(
                        guard + "/completion", body={"model": "alpha", "prompt": "x", "n_predict": 64}, timeout=120
                    )
                )
            )
            waiter.start()
            wait_for(lambda: exporter.sample("llamacpp_guard_queue_requests") == 1, timeout=30)
            # beta's pool is its own: its request is admitted and answered while alpha's still waits.
            status, _ = http_request(
                guard + "/completion", body={"model": "beta", "prompt": "x", "n_predict": 64}, timeout=120
            )
            assert status == 200
            assert exporter.sample("llamacpp_guard_queue_requests") == 1 and not results
            holder.close()
            waiter.join(120)
            assert results and results[0][0] == 200
            assert not router.log_lines("Context size has been exceeded")
        finally:
            exporter.stop()


def test_a_client_that_leaves_the_queue_is_forgotten(guarded: Guarded, tmp_path: Path) -> None:
    """A waiting client that disconnects leaves the queue: the next one is admitted in its place."""
    exporter, port = start_guarded(guarded.server, tmp_path)
    try:
        holder = socket.create_connection(("127.0.0.1", port))
        big = json.dumps({"prompt": "a story", "n_predict": 5000, "ignore_eos": True}).encode()
        post = b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        holder.sendall(post + f"{len(big)}\r\n\r\n".encode() + big)
        wait_for(lambda: exporter.sample("llamacpp_guard_in_flight_requests") == 1, timeout=30)
        leaver = socket.create_connection(("127.0.0.1", port))
        small = json.dumps({"prompt": "x" * 300, "n_predict": 8}).encode()
        leaver.sendall(post + f"{len(small)}\r\n\r\n".encode() + small)
        wait_for(lambda: exporter.sample("llamacpp_guard_queue_requests") == 1, timeout=30)
        # What an inference gateway reads as this server's queue counts the request the guard holds.
        assert exporter.sample("llamacpp_requests_queued") == 1
        leaver.close()
        wait_for(lambda: exporter.sample("llamacpp_guard_queue_requests") == 0, timeout=30)
        assert exporter.sample("llamacpp_requests_queued") == 0
        assert exporter.sample("llamacpp_guard_in_flight_requests") == 1  # it never ran
        holder.close()
        wait_for(lambda: exporter.sample("llamacpp_guard_in_flight_requests") == 0, timeout=30)
        status, _ = http_request(f"http://127.0.0.1:{port}/completion", body={"prompt": "x", "n_predict": 2})
        assert status == 200
    finally:
        exporter.stop()


def test_a_stream_whose_client_leaves_is_cancelled(guarded: Guarded) -> None:
    released = len(guarded.server.log_lines("stop processing"))
    host, port = guarded.guard.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    body = json.dumps({"prompt": "Go on.", "n_predict": 5000, "ignore_eos": True, "stream": True}).encode()
    sock.sendall(
        b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert b"data: " in sock.recv(65536) + sock.recv(65536)  # the stream has begun
    sock.close()
    wait_for(lambda: len(guarded.server.log_lines("stop processing")) > released, timeout=30)
    last = guarded.server.log_lines("stop processing")[-1]
    assert int(last.split("n_tokens = ")[1].split(",")[0]) < 500, last  # before its natural end at 512
    wait_for(lambda: guarded.exporter.sample("llamacpp_guard_in_flight_requests") == 0, timeout=30)
    output = guarded.exporter.output_file.read_text(errors="replace")
    assert "Traceback" not in output and "Error handling request" not in output


def test_a_guard_port_in_use_ends_the_exporter_with_one_line(tmp_path: Path) -> None:
    log = tmp_path / "llama-server.log"
    log.touch()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [
                *(sys.executable, "-m", "exporter", "--log-file", str(log), "--listen-address", "127.0.0.1:0"),
                *("--nvml", "off", "--http", "off", "--guard.listen-address", f"127.0.0.1:{port}"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert out.returncode == 1
    errors = [line for line in out.stderr.splitlines() if "error:" in line]
    assert errors == [f"llamacpp-exporter: error: --guard.listen-address 127.0.0.1:{port}: address already in use"], (
        out.stderr
    )


def test_a_chat_prompt_is_counted_as_the_server_counts_it(guarded: Guarded) -> None:
    """/apply-template then /tokenize gives exactly the prompt tokens the server reports for the chat request."""
    before = guarded.exporter.sample("llamacpp_guard_request_prompt_tokens_sum") or 0
    body = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three colours."}],
        "max_tokens": 4,
        "cache_prompt": False,
    }
    status, answer = http_json(guarded.guard + "/v1/chat/completions", body=body, timeout=60)
    assert status == 200
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert guarded.exporter.sample("llamacpp_guard_request_prompt_tokens_sum") == before + prompt_tokens


# ---------------------------------------------------------------------------------------- the forecast

# One slot's window is the whole 8,192-cell pool; a prompt past half of it is counted with the tokenizer. A
# batch of 4,096 tokens takes seconds on 2 cores: the log's first progress line comes with the second batch.
FORECAST_POOL = ("-c", "8192", "-np", "2", "-kvu", "-t", "2", "-b", "4096", "-ub", "512")
_PROGRESS = "prompt processing, n_tokens"


def test_the_forecast_has_a_prompts_size_through_the_guard_before_the_log_does(
    llama_server_bin: Path, slow_model: Path, tmp_path: Path
) -> None:
    """At the default verbosity the log sizes a prompt only with its second batch (a progress line); through
    the guard the exact size is in the pool's demand while the log still has no line that could give it."""
    with LlamaServer(llama_server_bin, slow_model, FORECAST_POOL, log_file=tmp_path / "llama-server.log") as server:
        exporter, port = start_guarded(server, tmp_path)
        try:
            prompt = make_prompt(5000)
            _, tokens = http_json(server.url + "/tokenize", body={"content": prompt, "add_special": True})
            size = len(tokens["tokens"])
            assert size > 4096  # two batches: the first alone is read without a line at the default verbosity
            wait_for(lambda: exporter.sample("llamacpp_kv_pool_capacity_tokens") == 8192, timeout=30)
            before = len(server.log_lines(_PROGRESS))
            assert exporter.sample("llamacpp_kv_pool_demand_tokens", {"horizon": "prompt"}) == 0
            results: list[tuple[int, bytes]] = []
            body = {"prompt": prompt, "n_predict": 8, "cache_prompt": False}
            worker = threading.Thread(
                target=lambda: results.append(
                    http_request(f"http://127.0.0.1:{port}/completion", body=body, timeout=300)
                )
            )
            worker.start()
            seen: list[int] = []

            def exact() -> bool:
                demand = exporter.sample("llamacpp_kv_pool_demand_tokens", {"horizon": "prompt"})
                seen.append(len(server.log_lines(_PROGRESS)))  # what the log says at that moment
                return demand == size

            wait_for(exact, timeout=60)
            assert seen[-1] == before, "the log had a progress line before the demand was exact"
            assert exporter.sample("llamacpp_kv_pool_demand_tokens", {"horizon": "limits"}) == size + 8
            assert exporter.sample("llamacpp_kv_pool_demand_ratio", {"horizon": "prompt"}) == size / 8192
            worker.join(300)
            assert results and results[0][0] == 200
            # The log did size it, later: its progress line came with the second batch.
            assert len(server.log_lines(_PROGRESS)) > before
            wait_for(lambda: exporter.sample("llamacpp_kv_pool_demand_tokens", {"horizon": "prompt"}) == 0, timeout=30)
        finally:
            exporter.stop()


# ---------------------------------------------------------------------------------------- slow clients


def _closed_by_the_guard(s: socket.socket) -> bool:
    """Whether the other end closed `s` (without waiting for it)."""
    s.settimeout(0.01)
    try:
        return s.recv(1) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


def test_clients_that_send_no_head_or_stall_are_cut_and_block_nobody(guarded: Guarded, tmp_path: Path) -> None:
    """Silent connections, a head sent a byte at a time, a head whose body never comes: each is disconnected
    after --guard.head-timeout, and a client that talks is answered meanwhile, past the connection cap too."""
    exporter, port = start_guarded(
        guarded.server, tmp_path, "--guard.head-timeout", "1", "--guard.max-connections", "8"
    )
    held: list[socket.socket] = []
    try:
        for _ in range(20):  # more than the cap: the oldest silent one makes room for each new one
            held.append(socket.create_connection(("127.0.0.1", port)))
        trickle = socket.create_connection(("127.0.0.1", port))
        trickle.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b'POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"prompt"')
        held.append(trickle)
        for _ in range(3):  # a client that talks is served while they hold their connections
            status, _ = http_request(f"http://127.0.0.1:{port}/completion", body={"prompt": "x", "n_predict": 1})
            assert status == 200
        assert http_request(f"http://127.0.0.1:{port}/health")[0] == 200
        wait_for(lambda: all(_closed_by_the_guard(s) for s in held), timeout=60)
        # The stalled body is told why, then its connection closes.
        stalled.settimeout(60)
        answer = b""
        while chunk := stalled.recv(65536):
            answer += chunk
        stalled.close()
        assert answer.startswith(b"HTTP/1.1 408") and b"no byte of the request body for 1 s" in answer, answer
        assert http_request(f"http://127.0.0.1:{port}/health")[0] == 200
        output = exporter.output_file.read_text(errors="replace")
        assert "Traceback" not in output
    finally:
        for s in held:
            s.close()
        exporter.stop()


def test_past_the_cap_new_connections_wait_for_a_busy_one_to_close(guarded: Guarded, tmp_path: Path) -> None:
    """8 connections busy with requests (running or queued in the guard): a 9th is accepted but held unread,
    none of the 8 is closed for it, and it is answered once one of them closes. Every wait is on what the
    exporter shows (its queue, its debug line for a held connection), none on a clock."""
    exporter, port = start_guarded(guarded.server, tmp_path, "--guard.max-connections", "8", "--log-level", "debug")
    busy: list[socket.socket] = []
    # Each would fill its slot's window: one runs at a time, the others wait in the guard's queue.
    big = json.dumps({"prompt": "a story", "n_predict": 5000, "ignore_eos": True}).encode()
    try:
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(
                b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(big)}\r\n\r\n".encode()
                + big
            )
            busy.append(s)

        def held() -> bool:  # all 8 requests are in the guard, running or queued
            queued = exporter.sample("llamacpp_guard_queue_requests") or 0
            return queued + (exporter.sample("llamacpp_guard_in_flight_requests") or 0) == 8

        wait_for(held, timeout=120, what="all 8 requests in the guard")
        late = socket.create_connection(("127.0.0.1", port))
        late.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        wait_for(
            lambda: "connection cap reached (8 open)" in exporter.output_file.read_text(errors="replace"),
            timeout=120,
            what="the 9th connection held at the cap",
        )
        late.setblocking(False)
        with pytest.raises(BlockingIOError):
            late.recv(1)  # held: not a byte of an answer
        assert not any(_closed_by_the_guard(s) for s in busy)  # none of them was cut for it
        busy.pop().close()  # a waiting one leaves: the 9th is served
        late.setblocking(True)
        late.settimeout(120)
        answer = b""
        while chunk := late.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        late.close()
        assert "Traceback" not in exporter.output_file.read_text(errors="replace")
    finally:
        for s in busy:
            s.close()
        exporter.stop()
