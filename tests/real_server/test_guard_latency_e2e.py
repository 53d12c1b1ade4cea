"""The guard's time to first byte and end to end by client, against a real llama-server (b11434): three named
clients stream through the guard at once, each measuring its own requests, and one scrape after they have
their answers shows each client's histograms.

Every bound is causal, never a margin of time: each request's interval in the guard lies inside the one its
client measured (the client sent before the guard's clock started and read after it stopped), and contains
llama-server's own `timings` of the request (the prompt's evaluation before its first token, and the whole
task before its last), so per request `server <= guard <= client`, for the sums and bucket by bucket.
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from llama_harness import LlamaServer, make_prompt, start_guarded
from prometheus_client.parser import text_string_to_metric_families
from tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.llama_server

CLIENTS = ("orchestrator", "claude-cli", "chat-window")
#: Each client's requests, one after the other: (prompt characters, tokens to generate, streamed).
REQUESTS = ((300, 64, True), (900, 200, True), (150, 32, False), (600, 400, True))


@dataclass
class Timed:
    """One client's requests: what it measured itself, and llama-server's own `timings` of them (seconds)."""

    first: list[float] = field(default_factory=list)  # send to the first body bytes read
    end: list[float] = field(default_factory=list)  # send to the body read whole
    prompt: list[float] = field(default_factory=list)  # timings.prompt_ms: the prompt's evaluation
    total: list[float] = field(default_factory=list)  # prompt_ms + predicted_ms: the whole task
    statuses: list[int] = field(default_factory=list)


@pytest.fixture(scope="module")
def server(llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    tmp = tmp_path_factory.mktemp("latency")
    model = write_tiny_llama(tmp / "tiny-llama.gguf")
    with LlamaServer(llama_server_bin, model, ("-c", "4096", "-np", "3", "-t", "1"), log_file=tmp / "ls.log") as s:
        yield s


def timings(body: bytes, streamed: bool) -> dict[str, Any]:
    """llama-server's `timings` of a request: in the answer, or in a stream's last event."""
    if not streamed:
        return dict(json.loads(body)["timings"])
    events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: {")]
    return dict(next(e["timings"] for e in reversed(events) if "timings" in e))


def send(base: str, name: str, timed: Timed, salt: int) -> None:
    host, port = base.removeprefix("http://").split(":")
    for i, (chars, n, streamed) in enumerate(REQUESTS):
        body = {
            "prompt": f"{name} {salt} {i} " + make_prompt(chars),
            "n_predict": n,
            "ignore_eos": True,
            "cache_prompt": False,
            "stream": streamed,
        }
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        try:
            sent = time.monotonic()
            headers = {"Content-Type": "application/json", "X-Client-Name": name}
            conn.request("POST", "/completion", json.dumps(body).encode(), headers)
            resp = conn.getresponse()
            first_bytes = resp.read1(65536)
            first = time.monotonic()
            rest = resp.read()
            end = time.monotonic()
        finally:
            conn.close()
        t = timings(first_bytes + rest, streamed)
        timed.statuses.append(resp.status)
        timed.first.append(first - sent)
        timed.end.append(end - sent)
        timed.prompt.append(t["prompt_ms"] / 1000)
        timed.total.append((t["prompt_ms"] + t["predicted_ms"]) / 1000)


def histograms(text: str, family: str) -> dict[str, tuple[list[tuple[float, float]], float, float]]:
    """client → (cumulative buckets (le, count), _count, _sum) of one histogram family in an exposition."""
    out: dict[str, tuple[list[tuple[float, float]], float, float]] = {}
    for f in text_string_to_metric_families(text):
        if f.name != family:
            continue
        assert f.type == "histogram"
        for s in f.samples:
            buckets, count, total = out.get(s.labels["client"], ([], 0.0, 0.0))
            if s.name.endswith("_bucket"):
                buckets.append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                count = s.value
            elif s.name.endswith("_sum"):
                total = s.value
            out[s.labels["client"]] = (buckets, count, total)
    return out


def test_acceptance_each_clients_first_byte_and_end_to_end_lie_between_the_servers_and_its_own(
    server: LlamaServer, tmp_path: Path
) -> None:
    exporter, port = start_guarded(server, tmp_path, "--guard.client-header", "X-Client-Name")
    timed = {name: Timed() for name in CLIENTS}
    try:
        threads = [
            threading.Thread(target=send, args=(f"http://127.0.0.1:{port}", name, timed[name], i))
            for i, name in enumerate(CLIENTS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        text = exporter.scrape()  # one scrape, after every client has its answers
    finally:
        exporter.stop()
    first = histograms(text, "llamacpp_guard_client_time_to_first_byte_seconds")
    end = histograms(text, "llamacpp_guard_client_request_duration_seconds")
    assert set(histograms(text, "llamacpp_guard_client_queue_wait_seconds")) == set(CLIENTS)
    for name in CLIENTS:
        t = timed[name]
        assert t.statuses == [200] * len(REQUESTS), name
        for (buckets, count, total), low, high in ((first[name], t.prompt, t.first), (end[name], t.total, t.end)):
            assert count == len(REQUESTS), name
            # Per request server <= guard <= client: so for the sums, and for each bucket's count.
            assert sum(low) <= total <= sum(high), (name, sum(low), total, sum(high))
            for le, n in buckets:
                below = (sum(v <= le for v in high), sum(v <= le for v in low))
                assert below[0] <= n <= below[1], (name, le, below, n)
            assert buckets[-1] == (math.inf, count)
        print(
            f"{name}: first byte server/guard/client sums {sum(t.prompt):.4f}/{first[name][2]:.4f}/{sum(t.first):.4f} s;"
            f" end to end {sum(t.total):.4f}/{end[name][2]:.4f}/{sum(t.end):.4f} s; {len(REQUESTS)} requests"
        )
