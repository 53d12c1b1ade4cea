"""Who fills the pool, against a real llama-server (b11434) behind the guard: the cells each client holds,
the bound on client names in a real exposition, and an overflow with admission off that `diagnose
--guard-log` names client by client.

Every assertion is about order and causality: a client's cells are bracketed by two reads of `/slots`
made before and after the scrape, never compared within a margin of time.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from llama_harness import (
    ExporterProcess,
    LlamaServer,
    http_json,
    http_request,
    make_prompt,
    start_guarded,
    wait_for,
)
from paths import REPO
from tiny_gguf import write_slow_llama

pytestmark = pytest.mark.llama_server

# Room for four requests of up to 60 + 150 tokens at once (admission lets all four run together), or, with
# the server's -n 400 and no limit from the clients, three that outgrow the pool while they generate.
POOL = ("-c", "1024", "-np", "4", "-kvu", "-t", "2", "-n", "400")
#: Each client's prompt, of its own length: a slot's prompt size tells whose request it runs.
PROMPTS = {"orchestrator": 60, "claude-cli": 45, "chat-window": 30}


@pytest.fixture(scope="module")
def server(llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    tmp = tmp_path_factory.mktemp("clients")
    model = write_slow_llama(tmp / "slow-llama.gguf")
    with LlamaServer(llama_server_bin, model, POOL, log_file=tmp / "llama-server.log") as s:
        yield s


def start_guard(server: LlamaServer, tmp: Path, *extra: str) -> tuple[ExporterProcess, str]:
    exporter, port = start_guarded(server, tmp, *extra)
    return exporter, f"http://127.0.0.1:{port}"


def post(base: str, body: dict[str, Any], headers: dict[str, str], timeout: float = 300) -> tuple[int, bytes]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/completion", json.dumps(body).encode(), {"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def prompt_tokens(server: LlamaServer, chars: int) -> int:
    _, out = http_json(server.url + "/tokenize", body={"content": make_prompt(chars), "add_special": True})
    return len(out["tokens"])


def slots(server: LlamaServer) -> list[dict[str, Any]]:
    read: list[dict[str, Any]] = json.loads(http_request(server.url + "/slots")[1])
    return [s for s in read if s.get("is_processing")]


def held(read: list[dict[str, Any]], sizes: dict[int, str]) -> dict[str, int]:
    """Each client's cells in one read of /slots (its slot is the one whose prompt has its size)."""
    return {sizes[s["n_prompt_tokens_processed"] + s["n_prompt_tokens_cache"]]: s["n_prompt_tokens"] for s in read}


def cells_by_client(text: str) -> dict[str, float]:
    out = {}
    for m in re.finditer(r'^llamacpp_guard_client_pool_tokens\{client="([^"]*)"\} (\S+)$', text, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def test_acceptance_each_clients_cells_are_its_slots_cells_while_they_run(server: LlamaServer, tmp_path: Path) -> None:
    """Three clients named by a header and a fourth by its User-Agent: while their requests run, /metrics shows
    each one's cells between two reads of its slots' n_prompt_tokens in /slots, one before, one after."""
    exporter, guard = start_guard(server, tmp_path, "--guard.client-header", "X-Client-Name")
    clients = {**PROMPTS, "opencode": 75}
    sizes = {prompt_tokens(server, chars): name for name, chars in clients.items()}
    assert len(sizes) == 4  # each client's prompt size is its own
    results: dict[str, int] = {}

    def send(name: str) -> None:
        headers = {"User-Agent": "opencode/0.3.110 ai-sdk/provider-utils/3.0.3"}
        if name != "opencode":
            headers["X-Client-Name"] = name
        body = {"prompt": make_prompt(clients[name]), "n_predict": 150, "ignore_eos": True, "cache_prompt": False}
        results[name] = post(guard, body, headers)[0]

    threads = [threading.Thread(target=send, args=(name,)) for name in clients]
    try:
        for t in threads:
            t.start()
        # The guard has matched all four requests to their slots (its monitor reads /slots while they run).
        wait_for(lambda: len([v for v in cells_by_client(exporter.scrape()).values() if v > 0]) == 4, timeout=120)
        checked = 0
        for _ in range(20):
            before = slots(server)
            metrics = cells_by_client(exporter.scrape())
            after = slots(server)
            if len(before) < 4 or {s["id_task"] for s in before} != {s["id_task"] for s in after}:
                break  # a request ended between the reads: the brackets no longer hold (enough were checked)
            low, high = held(before, sizes), held(after, sizes)
            for name in clients:
                assert low[name] <= metrics[name] <= high[name], (name, low, metrics, high)
            checked += 1
        assert checked >= 1
    finally:
        for t in threads:
            t.join(300)
        text = exporter.scrape()
        exporter.stop()
    assert results == dict.fromkeys(clients, 200)
    for name in clients:
        assert f'llamacpp_guard_client_requests_total{{client="{name}",outcome="admitted"}} 1.0' in text


def test_a_request_admitted_on_its_byte_length_is_placed_once_it_has_run(server: LlamaServer, tmp_path: Path) -> None:
    """A small text prompt in an empty pool is admitted without the tokenizer; the guard's first read of /slots
    finds a slot it cannot place, counts the prompt exactly, and places it from that read. The request runs
    for the server's whole -n (400 tokens), well past the first read of /slots."""
    exporter, guard = start_guard(server, tmp_path, "--guard.client-header", "X-Client-Name")
    size = prompt_tokens(server, 30)
    status: list[int] = []
    body = {"prompt": make_prompt(30), "n_predict": 400, "ignore_eos": True, "cache_prompt": False}
    sender = threading.Thread(target=lambda: status.append(post(guard, body, {"X-Client-Name": "chat"})[0]))
    try:
        sender.start()
        wait_for(lambda: cells_by_client(exporter.scrape()).get("chat", 0) > size, timeout=120)
    finally:
        sender.join(300)
        text = exporter.scrape()
        exporter.stop()
    assert status == [200]
    assert f'llamacpp_guard_client_prompt_tokens_total{{client="chat"}} {size:.1f}' in text


def test_acceptance_a_hundred_header_values_make_at_most_max_clients_series(
    server: LlamaServer, tmp_path: Path, promtool_bin: Path
) -> None:
    """100 distinct names: 16 series and `other`. Quotes, a folded line and 10 KB of text never reach a label;
    the real exposition passes promtool."""
    exporter, guard = start_guard(
        server, tmp_path, "--guard.client-header", "X-Client-Name", "--guard.max-clients", "16"
    )
    try:
        body = {"prompt": "Hi", "n_predict": 1, "cache_prompt": False}
        names = [f"client-{i:03d}" for i in range(100)]

        def send(chunk: list[str]) -> None:
            for name in chunk:
                assert post(guard, body, {"X-Client-Name": name})[0] == 200

        threads = [threading.Thread(target=send, args=(names[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        host, port = guard.removeprefix("http://").split(":")
        data = json.dumps(body).encode()
        for value in (b'evil"} 1\nfake_metric 1', b"a\r\n folded", b"x" * 10_240):
            with socket.create_connection((host, int(port)), timeout=60) as s:
                s.sendall(
                    b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Client-Name: "
                    + value
                    + b"\r\nContent-Length: "
                    + str(len(data)).encode()
                    + b"\r\nConnection: close\r\n\r\n"
                    + data
                )
                assert s.recv(12).startswith(b"HTTP/1.")  # answered (200, or 400 for a malformed or too large head)
        text = exporter.scrape()
    finally:
        exporter.stop()
    labels = set(re.findall(r'^llamacpp_guard_client_requests_total\{client="([^"]*)"', text, re.M))
    assert len(labels) == 17 and "other" in labels and labels - {"other"} <= set(names), labels
    other = re.search(r'^llamacpp_guard_client_requests_total\{client="other",outcome="admitted"\} (\S+)$', text, re.M)
    assert other is not None and float(other.group(1)) >= 100 - 16
    assert "fake_metric" not in text and "folded" not in text
    out = subprocess.run(
        [str(promtool_bin), "check", "metrics"], input=text.encode(), capture_output=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr.decode()


def test_acceptance_an_overflow_with_admission_off_is_named_client_by_client(
    server: LlamaServer, tmp_path: Path
) -> None:
    """Admission off: three requests without a limit outgrow the pool and are aborted by the server. `diagnose
    LOG --guard-log ACCESS_LOG` names each aborted slot's client (as /slots showed whose prompt it ran) and
    its tokens are the log's release lines."""
    access = tmp_path / "access.log"
    exporter, guard = start_guard(
        server, tmp_path, "--guard.admission", "off", "--guard.access-log", str(access),
        "--guard.client-header", "X-Client-Name",
    )  # fmt: skip
    sizes = {prompt_tokens(server, chars): name for name, chars in PROMPTS.items()}
    seen: dict[tuple[int, int], str] = {}  # (slot, task) -> client, from /slots read by the test itself
    statuses: dict[str, int] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for s in slots(server):
                size = s["n_prompt_tokens_processed"] + s["n_prompt_tokens_cache"]
                if size in sizes:
                    seen[(s["id"], s["id_task"])] = sizes[size]
            done.wait(0.2)

    def send(name: str) -> None:
        body = {"prompt": make_prompt(PROMPTS[name]), "n_predict": -1, "cache_prompt": False}
        statuses[name] = post(guard, body, {"X-Client-Name": name})[0]

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=send, args=(name,)) for name in PROMPTS]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        wait_for(lambda: access.exists() and len(access.read_text().splitlines()) >= 3, timeout=30)
        text = exporter.scrape()
    finally:
        done.set()
        watcher.join(10)
        exporter.stop()
    assert statuses == dict.fromkeys(PROMPTS, 500)  # aborted by the server: the guard held no one back
    assert 'llamacpp_guard_requests_total{outcome="queued"} 0.0' in text
    wait_for(lambda: "Context size has been exceeded" in server.log_file.read_text(), timeout=30)
    out = subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", str(server.log_file), "--guard-log", str(access), "--json"],
        cwd=REPO, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    report = json.loads(out.stdout)
    failure = report["runs"][-1]["failures"][-1]
    named = {(s["slot"], s["task"]): s["client"] for s in failure["slots"]}
    assert len(named) == 3 and all(named.values()), named
    assert named == {k: seen[k] for k in named}  # whose prompt each slot ran, as /slots showed it
    releases = {
        (int(m.group(1)), int(m.group(2))): int(m.group(3))
        for m in re.finditer(
            r"release: id +(\d+) \| task (\d+) \| stop processing: n_tokens = (\d+)", server.log_text()
        )
    }
    assert {(s["slot"], s["task"]): s["tokens"] for s in failure["slots"]} == {k: releases[k] for k in named}
    heaviest = max(failure["slots"], key=lambda s: s["tokens"])
    assert failure["cause"].startswith(f"caused by {heaviest['client']}: its request in slot {heaviest['slot']}")
    lines = [json.loads(x) for x in access.read_text().splitlines()]
    assert all("prompt" not in x and "body" not in x for x in lines)
    assert sorted(x["client"] for x in lines) == sorted(PROMPTS)


#: The burst of the post-mortem, a quarter of its size: three named clients whose prompts overflow a -c 6144 -np 3
#: -kvu pool together. The slow model in batches of 128 reads the first prompt for over a second after the test has
#: seen it start, so the others arrive while it is read (the tiny model in batches of 2,048 read the post-mortem's
#: 8,000 tokens in 0.4 s, and the others came after it had finished about one run in six).
BURST_CELLS = 6144
BURST_POOL = ("-c", str(BURST_CELLS), "-np", "3", "-kvu", "-t", "2", "-b", "128", "-ub", "128", "-lv", "4")
BURST = {"planner": 2_375, "coder": 2_000, "reviewer": 2_125}  # tokens: 6,500 > 6,144
#: Each answer's tokens: the first request generates one a batch while the others' prompts are read (128 tokens a
#: batch), so it must still run after the 4,500 or so of theirs, or its release leaves room for the other two.
ANSWER = 64


@pytest.fixture(scope="module")
def burst_server(llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    tmp = tmp_path_factory.mktemp("burst")
    model = write_slow_llama(tmp / "slow-llama.gguf")
    with LlamaServer(llama_server_bin, model, BURST_POOL, log_file=tmp / "llama-server.log") as s:
        yield s


@pytest.mark.parametrize(
    "order",
    [("planner", "coder", "reviewer"), ("coder", "reviewer", "planner"), ("coder", "planner", "reviewer")],
    ids=["largest-first", "largest-last", "largest-middle"],
)
def test_acceptance_every_holder_of_an_overflow_is_named_whatever_the_order(
    burst_server: LlamaServer, tmp_path: Path, order: tuple[str, str, str]
) -> None:
    """Admission off; the first request is still reading its prompt when the other two start. Every aborted
    slot's client (its slot and task) in the access log and in `diagnose --guard-log` is the one whose prompt
    the log's `new prompt` line gave that slot and task; diagnose's cells are its release line's."""
    server = burst_server
    access = tmp_path / "access.log"
    exporter, guard = start_guard(
        server, tmp_path, "--guard.admission", "off", "--guard.access-log", str(access),
        "--guard.client-header", "X-Client-Name",
    )  # fmt: skip
    before = len(server.log_file.read_text().splitlines())
    # Characters for each prompt's tokens (the tokenizer merges some characters).
    per_char = prompt_tokens(server, 10_000) / 10_000
    chars = {name: round(n / per_char) for name, n in BURST.items()}
    sizes = {name: prompt_tokens(server, c) for name, c in chars.items()}
    assert sum(sizes.values()) > BURST_CELLS, sizes  # the prompts alone overflow the pool
    statuses: dict[str, int] = {}

    def send(name: str) -> None:
        body = {"prompt": make_prompt(chars[name]), "n_predict": ANSWER, "cache_prompt": False}
        statuses[name] = post(guard, body, {"X-Client-Name": name})[0]

    threads = {name: threading.Thread(target=send, args=(name,)) for name in order}
    try:
        threads[order[0]].start()
        # The first is still reading its prompt when the others start: its slot shows only a part (b11434's
        # n_prompt_tokens_processed trails the part read by a batch, and is 0 during the first).
        wait_for(lambda: any(0 < s["n_prompt_tokens_processed"] < sizes[order[0]] for s in slots(server)), timeout=60)
        for name in order[1:]:
            threads[name].start()
        for t in threads.values():
            t.join(300)
        wait_for(lambda: access.exists() and len(access.read_text().splitlines()) >= 3, timeout=30)
    finally:
        exporter.stop()
    assert statuses == dict.fromkeys(BURST, 500), statuses  # aborted together by the server
    log = "\n".join(server.log_file.read_text().splitlines()[before:])
    by_size = {n: name for name, n in sizes.items()}
    prompt_of = {
        (int(m[1]), int(m[2])): by_size[int(m[3])]
        for m in re.finditer(r"id +(\d+) \| task (\d+) \| new prompt, .*task\.n_tokens = (\d+)", log)
        if int(m[3]) in by_size
    }
    releases = {
        (int(m[1]), int(m[2])): int(m[3])
        for m in re.finditer(r"release: id +(\d+) \| task (\d+) \| stop processing: n_tokens = (\d+)", log)
    }
    lines = {x["client"]: x for x in map(json.loads, access.read_text().splitlines()) if x["client"] in BURST}
    assert set(lines) == set(BURST)
    for name, x in lines.items():
        assert x["slot"] is not None and x["task"] is not None and x["cells"] is not None, x
        assert prompt_of[(x["slot"], x["task"])] == name, (x, prompt_of)
        # The cells the guard saw at its last read before the abort: at most what the release line says (0 when
        # that read came before the slot's first batch).
        assert 0 <= x["cells"] <= releases[(x["slot"], x["task"])]
    assert any(x["cells"] > 0 for x in lines.values()), lines  # it saw the pool fill
    out = subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", str(server.log_file), "--guard-log", str(access), "--json"],
        cwd=REPO, capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    failure = json.loads(out.stdout)["runs"][-1]["failures"][-1]
    assert {(s["slot"], s["task"]): s["client"] for s in failure["slots"]} == {
        (x["slot"], x["task"]): name for name, x in lines.items()
    }
    assert {(s["slot"], s["task"]): s["tokens"] for s in failure["slots"]} == {
        k: releases[k] for k in ((x["slot"], x["task"]) for x in lines.values())
    }
