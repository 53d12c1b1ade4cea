"""The guard across llama-server restarts (b11434): requests wait while it is down or loading and then go in; a
request whose upstream died before any byte reached its client is sent again (counted, within the retry budget);
a stream that had begun ends with an error event and a clean end of its body; a crash loop gets clear errors.
And a wait in the queue that cannot fit the queue timeout is refused at once.

Every assertion is about order and causality (what the client had received when the server died, what the
server's log says it ran), none about a wall-clock margin.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from llama_harness import ExporterProcess, LlamaServer, http_request, make_prompt, start_guarded, wait_for
from tiny_gguf import SLOW_LOAD_SERVER_ARGS, write_slow_llama, write_slow_loading_model

pytestmark = pytest.mark.llama_server

# Room for every request of the mixed load at once: admission never holds one back here.
POOL = ("-c", "4096", "-np", "6", "-kvu", "-t", "2")
# What llama-server logs once for every task it starts (its stderr keeps every run's lines).
LAUNCHED = "processing task"


def start_guard(server: LlamaServer, tmp: Path, *extra: str) -> tuple[ExporterProcess, str]:
    exporter, port = start_guarded(server, tmp, *extra)
    return exporter, f"http://127.0.0.1:{port}"


class Answer:
    """One request through the guard, on its own thread: status, headers, body, and when its first byte came."""

    def __init__(self, base: str, path: str, body: dict[str, Any]) -> None:
        self.base, self.path, self.body = base, path, body
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.data = b""
        self.first_byte: float | None = None  # time.monotonic() of the first body byte
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        host, port = self.base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=300)
        try:
            conn.request("POST", self.path, json.dumps(self.body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.status, self.headers = resp.status, {k.lower(): v for k, v in resp.getheaders()}
            while chunk := resp.read1(65536):  # raises IncompleteRead on a torn chunked body
                if self.first_byte is None:
                    self.first_byte = time.monotonic()
                self.data += chunk
        except BaseException as exc:  # re-checked by the test
            self.error = exc
        finally:
            conn.close()

    def join(self, timeout: float = 300) -> Answer:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"{self.path} got no answer within {timeout} s"
        assert self.error is None, f"{self.path}: {self.error!r}"
        return self

    def events(self) -> list[bytes]:
        return [e for e in self.data.split(b"\n\n") if e.strip()]


def completion(n_predict: int, *, stream: bool = False, prompt_chars: int = 40) -> dict[str, Any]:
    return {
        "prompt": make_prompt(prompt_chars),
        "n_predict": n_predict,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": stream,
    }


def whole_stream(a: Answer) -> bool:
    """A stream answered in full: every token, then the final event."""
    events = a.events()
    return a.status == 200 and b'"stop":true' in events[-1] and b'"error"' not in a.data


def launched(server: LlamaServer) -> int:
    return sum(LAUNCHED in line for line in server.stderr_file.read_text(errors="replace").splitlines())


def sample(exporter: ExporterProcess, name: str, labels: dict[str, str] | None = None) -> float:
    value = exporter.sample(name, labels)
    assert value is not None, name
    return value


def books_empty(exporter: ExporterProcess) -> bool:
    return all(
        exporter.sample(name) == 0
        for name in (
            "llamacpp_guard_in_flight_requests",
            "llamacpp_guard_queue_requests",
            "llamacpp_guard_admitted_demand_tokens",
            "llamacpp_guard_server_down_waiting_requests",
        )
    )


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_slow_llama(tmp_path_factory.mktemp("models") / "slow-llama.gguf")


def test_requests_wait_while_the_server_is_down_or_loading_and_then_go_in(
    llama_server_bin: Path, tmp_path: Path
) -> None:
    """Sent while nothing listens, and while the server answers `503 Loading model`: both answered 200, each
    run once; one whose client left meanwhile never runs; the guard's /health passes on the truth (502, 503)."""
    model = write_slow_loading_model(tmp_path / "slow-load.gguf", 1024)
    server = LlamaServer(
        llama_server_bin,
        model,
        [*SLOW_LOAD_SERVER_ARGS, "-c", "512", "-t", "2"],
        log_file=tmp_path / "llama-server.log",
        wait_ready=False,
    )
    exporter, guard = start_guard(server, tmp_path)
    try:
        assert http_request(guard + "/health")[0] == 502  # not a generation: passed on, nothing waits
        down = Answer(guard, "/completion", completion(2))
        wait_for(lambda: exporter.sample("llamacpp_guard_server_down_waiting_requests") == 1, timeout=30)
        # A client that leaves while it waits is forgotten: it never runs.
        leaver = socket.create_connection(("127.0.0.1", int(guard.rsplit(":", 1)[1])))
        body = json.dumps(completion(2)).encode()
        leaver.sendall(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_for(lambda: exporter.sample("llamacpp_guard_server_down_waiting_requests") == 2, timeout=30)
        leaver.close()
        wait_for(lambda: exporter.sample("llamacpp_guard_server_down_waiting_requests") == 1, timeout=30)
        assert down.status is None
        server.start()
        wait_for(lambda: (h := server.health()) is not None and h[0] == 503, timeout=30, what="503 Loading model")
        loading = Answer(guard, "/completion", completion(2))
        assert http_request(guard + "/health")[0] in (503, 200)
        server.wait_healthy(60)
        for a in (down.join(), loading.join()):
            assert a.status == 200 and json.loads(a.data)["tokens_predicted"] == 2
        assert sample(exporter, "llamacpp_guard_server_down_wait_seconds_total") > 0
        assert sample(exporter, "llamacpp_guard_requests_total", {"outcome": "retried"}) == 0
        assert launched(server) == 2  # each ran once, the one whose client left never
        wait_for(lambda: books_empty(exporter), timeout=30)
    finally:
        exporter.stop()
        server.stop()


def test_acceptance_a_killed_and_restarted_server_costs_latency_not_errors(
    llama_server_bin: Path, slow_model: Path, tmp_path: Path
) -> None:
    """SIGKILL during a mixed load, then a restart on the same port: the requests without a byte of their answer
    are answered 200 (the ones llama-server had started: retried, counted); the stream that had begun ends with an
    error event and a clean end of its body; nothing runs twice but the counted retries; the books end empty."""
    with LlamaServer(llama_server_bin, slow_model, POOL, log_file=tmp_path / "llama-server.log") as server:
        exporter, guard = start_guard(server, tmp_path)
        try:
            running = [Answer(guard, "/completion", completion(300)) for _ in range(2)]
            begun = Answer(guard, "/completion", completion(300, stream=True))
            wait_for(lambda: begun.first_byte is not None, timeout=60, what="the stream's first event")
            # A stream still reading its long prompt: no byte yet (classified below by what it had received).
            reading = Answer(guard, "/completion", completion(64, stream=True, prompt_chars=3500))
            wait_for(lambda: exporter.sample("llamacpp_guard_in_flight_requests") == 4, timeout=60)
            before = launched(server)
            server.kill9()
            killed = time.monotonic()
            down = [
                Answer(guard, "/completion", completion(8)),
                Answer(guard, "/completion", completion(8, stream=True)),
                Answer(
                    guard, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
                ),
            ]
            waiting = 2 + len(down) + (reading.first_byte is None)
            wait_for(
                lambda: exporter.sample("llamacpp_guard_server_down_waiting_requests") == waiting,
                timeout=60,
                what=f"{waiting} requests waiting for the server",
            )
            assert all(a.status is None for a in [*running, *down])
            server.start()
            for a in running:
                assert a.join().status == 200 and json.loads(a.data)["tokens_predicted"] == 300
            assert down[0].join().status == 200 and json.loads(down[0].data)["tokens_predicted"] == 8
            assert whole_stream(down[1].join())
            assert down[2].join().status == 200 and json.loads(down[2].data)["choices"]
            # A stream that had begun: an error event in llama-server's form, then a clean end of the body. One
            # that had no byte yet (its prompt still being read) was sent again and answered whole.
            begun.join()
            assert begun.first_byte is not None and begun.first_byte < killed
            reading.join()
            had_begun = [a for a in (begun, reading) if a.first_byte is not None and a.first_byte < killed]
            for a in had_begun:
                last = a.events()[-1]
                assert a.status == 200 and last.startswith(b"data: "), a.data[-300:]
                assert json.loads(last[6:])["error"]["type"] == "unavailable_error" and b"broke off this stream" in last
            if reading not in had_begun:
                assert whole_stream(reading)
            retried = sample(exporter, "llamacpp_guard_requests_total", {"outcome": "retried"})
            assert retried == 2 + (reading not in had_begun)
            assert sample(exporter, "llamacpp_guard_requests_total", {"outcome": "failed"}) == len(had_begun)
            # Nothing ran twice but the retries: the server's tasks after the kill are the retried and the new ones.
            wait_for(lambda: books_empty(exporter), timeout=60)
            assert launched(server) - before <= retried + len(down)
            assert sample(exporter, "llamacpp_guard_server_down_wait_seconds_total") > 0
            output = exporter.output_file.read_text(errors="replace")
            assert "Traceback" not in output
        finally:
            exporter.stop()


def test_acceptance_a_crash_loop_gets_clear_errors_within_the_retry_budget(
    llama_server_bin: Path, slow_model: Path, tmp_path: Path
) -> None:
    """The server killed every few seconds while three clients keep sending: every request gets an answer (200,
    or a one-line 502/503 error), the retries stay within 3 + 20 % of the requests, and the books end empty."""
    with LlamaServer(llama_server_bin, slow_model, POOL, log_file=tmp_path / "llama-server.log") as server:
        exporter, guard = start_guard(server, tmp_path, "--guard.queue-timeout", "15")
        answers: list[Answer] = []
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                a = Answer(guard, "/completion", completion(40))
                answers.append(a)
                a.thread.join(300)

        clients = [threading.Thread(target=client, daemon=True) for _ in range(3)]
        try:
            for c in clients:
                c.start()
            for _ in range(6):
                wait_for(lambda: exporter.sample("llamacpp_guard_in_flight_requests"), timeout=60)
                time.sleep(1.0)  # let them run a while: some die mid-answer
                server.kill9()
                server.start()
            stop.set()
            for c in clients:
                c.join(300)
                assert not c.is_alive(), "a client hangs"
            statuses: list[int] = []
            for a in answers:
                a.join()
                statuses.append(a.status or 0)
                if a.status != 200:
                    assert a.status in (502, 503), a.data
                    message = json.loads(a.data)["error"]["message"]
                    assert "\n" not in message and "llama-server" in message
                    if a.status == 503:
                        assert 1 <= int(a.headers["retry-after"]) <= 60
            admitted = sample(exporter, "llamacpp_guard_requests_total", {"outcome": "admitted"})
            retried = sample(exporter, "llamacpp_guard_requests_total", {"outcome": "retried"})
            failed = sample(exporter, "llamacpp_guard_requests_total", {"outcome": "failed"})
            print(
                f"crash loop: {len(answers)} requests, {admitted:g} admitted, {retried:g} retried, {failed:g} failed, "
                f"statuses {sorted(set(statuses))}: {[statuses.count(x) for x in sorted(set(statuses))]}"
            )
            assert retried + failed >= 1, "no kill caught a request in flight"
            assert retried <= 3 + 0.2 * admitted, (retried, admitted, statuses)
            # Once the loop ends, the guard serves as before.
            assert Answer(guard, "/completion", completion(8)).join().status == 200
            wait_for(lambda: books_empty(exporter), timeout=60)
        finally:
            stop.set()
            exporter.stop()


def test_a_wait_predicted_past_the_queue_timeout_is_refused_at_once(
    llama_server_bin: Path, slow_model: Path, tmp_path: Path
) -> None:
    """One request holds the pool for its long budget; one that needs room meanwhile is told at once (503, a
    Retry-After of at most a minute) that its wait would outlast the queue timeout, while the first still runs."""
    pool = ("-c", "1024", "-np", "2", "-kvu", "-t", "2")
    with LlamaServer(llama_server_bin, slow_model, pool, log_file=tmp_path / "llama-server.log") as server:
        exporter, guard = start_guard(server, tmp_path, "--guard.queue-timeout", "3")
        try:
            holder = Answer(guard, "/completion", completion(1000))
            wait_for(lambda: exporter.sample("llamacpp_guard_in_flight_requests") == 1, timeout=60)
            refused = None
            while holder.status is None and refused is None:
                # The first ones may wait their 3 s out while the guard measures the holder's speed.
                probe = Answer(guard, "/completion", completion(100, prompt_chars=100)).join()
                assert probe.status == 503, probe.data
                if b"within the guard's queue timeout" in probe.data:
                    refused = probe
            assert refused is not None and holder.status is None  # told while the holder still ran
            assert 1 <= int(refused.headers["retry-after"]) <= 60
            assert "\n" not in json.loads(refused.data)["error"]["message"]
            assert holder.join().status == 200
            wait_for(lambda: books_empty(exporter), timeout=30)
        finally:
            exporter.stop()
