"""Benchmark: what the guard costs, and what it saves, against a real llama-server. Prints tables.

    $ .venv/bin/python bench/guard.py            # about 3 minutes on 2 cores
    $ .venv/bin/python bench/guard.py --quick    # smaller sizes, for a first look
    $ .venv/bin/python bench/guard.py --overhead-only --threads 1   # llama-server on one core, one left over
    $ .venv/bin/python bench/guard.py --against /tmp/base --threads 1  # CPU per streamed token, B/A (below)
    $ .venv/bin/python bench/guard.py --against /tmp/base --per-request  # CPU per small request, B/A

Every figure comes from real processes: llama-server (b11434, `LLAMA_SERVER_BIN` or the tests' build)
with the tests' tiny random llama, and `python -m exporter --guard.listen-address`. Direct and guarded
runs alternate in the same seconds, so the machine's load falls on both.

- overhead: small requests one at a time (`n_predict` 1), the first streamed byte of a stream, and a
  long stream's tokens per second, each direct and through the guard, interleaved; and the CPU the
  exporter's process spends on each (through the guard less direct: what the proxying costs);
- fits: 4 clients whose requests always fit the pool together; latency direct and through the guard,
  and what the guard queued (it must queue nothing);
- mixed: a seeded load of mixed sizes (some streaming, up to 6 in flight) that overflows a 1,024-cell
  `-kvu` pool now and then: aborted requests, answered requests, p50/p99 latency and tokens per second,
  direct and through the guard.
- against (`--against DIR`, DIR another checkout, e.g. `git worktree add /tmp/base main`): the CPU per
  streamed token of two exporters, A from DIR and B from this checkout, each with its guard in front of one
  llama-server, their long streams alternating (A B, then B A) so that the load falls on both alike; B/A is
  what a change costs on the streaming path, within a few per cent on a shared 2-core machine (the
  overhead table's figure, a difference of two small CPU figures over 7 streams, is too coarse for that);
  with `--per-request`, blocks of 20 small requests (one token, not streamed) instead: what the guard's
  sizing, admission and relay cost a request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from llama_harness import ExporterProcess, LlamaServer, find_llama_server, free_port, make_prompt  # noqa: E402
from llama_requests import try_http_status  # noqa: E402
from tiny_gguf import write_tiny_llama  # noqa: E402


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0-1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


class Client:
    """One keep-alive connection to a base URL (a client that reuses its connection, as SDKs do)."""

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=300)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes, float, float]:
        """(status, body, seconds to the first body byte, seconds in all)."""
        data = json.dumps(body).encode()
        start = time.perf_counter()
        self.conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
        resp = self.conn.getresponse()
        first_chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        first = time.perf_counter() - start
        rest = resp.read()
        return resp.status, first_chunk + rest, first, time.perf_counter() - start

    def close(self) -> None:
        self.conn.close()


@dataclass
class Load:
    """What one run of a load got back."""

    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    aborted: int = 0
    answered: int = 0


def run_load(base: str, requests: Sequence[dict[str, Any]], clients: int) -> Load:
    """Send `requests` from `clients` threads, each taking the next one; collect what came back."""
    out = Load()
    lock = threading.Lock()
    queue = list(reversed(requests))

    def worker() -> None:
        client = Client(base)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                if body.get("stream") is True:  # llama-server closes the connection after a stream
                    client.close()
                    client = Client(base)
                status, raw, _, total = client.post("/completion", body)
                if body.get("stream") is True:
                    client.close()
                    client = Client(base)
                tokens = _tokens(raw, body.get("stream") is True)
                with lock:
                    out.latencies.append(total)
                    out.statuses.append(status)
                    aborted = b"Context size has been exceeded" in raw  # a stream's error event comes with 200
                    out.aborted += aborted
                    out.answered += status == 200 and not aborted
                    out.tokens += tokens if status == 200 and not aborted else 0
        finally:
            client.close()

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.wall = time.perf_counter() - start
    return out


def _tokens(raw: bytes, stream: bool) -> int:
    """Tokens generated, from the answer (a stream's last event carries the same count)."""
    text = raw.decode(errors="replace")
    if stream:
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        for event in reversed(events):
            try:
                value = json.loads(event).get("tokens_predicted")
            except ValueError:
                continue
            if isinstance(value, int):
                return value
        return 0
    try:
        value = json.loads(text).get("tokens_predicted")
    except ValueError:
        return 0
    return value if isinstance(value, int) else 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far (/proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Interleaved:
    """Seconds each call took, per base, and the exporter's CPU seconds spent during each base's calls."""

    took: tuple[list[float], list[float]]
    cpu: tuple[float, float]


def interleaved(n: int, send: Callable[[str], float], bases: tuple[str, str], pid: int) -> Interleaved:
    """`send(base)` n times for each base, alternating; what each took, and the CPU of process `pid` meanwhile."""
    took: tuple[list[float], list[float]] = ([], [])
    cpu = [0.0, 0.0]
    for _ in range(n):
        for i, base in enumerate(bases):
            before = cpu_seconds(pid)
            took[i].append(send(base))
            cpu[i] += cpu_seconds(pid) - before
    return Interleaved(took, (cpu[0], cpu[1]))


def ms(x: float) -> str:
    return f"{x * 1000:.1f}"


def overhead(direct: str, guard: str, n: int, pid: int) -> list[str]:
    clients = {direct: Client(direct), guard: Client(guard)}
    small = {"prompt": "Hello", "n_predict": 1, "cache_prompt": False}
    for base in clients:  # warm both paths
        clients[base].post("/completion", small)

    def one(base: str) -> float:
        return clients[base].post("/completion", small)[3]

    smalls = interleaved(n, one, (direct, guard), pid)
    d, g = smalls.took
    stream = {"prompt": "Hello", "n_predict": 16, "stream": True, "cache_prompt": False}

    def fresh(base: str, body: dict[str, Any]) -> tuple[int, bytes, float, float]:
        # llama-server closes the connection after a stream: each stream gets its own, on both paths.
        client = Client(base)
        try:
            return client.post("/completion", body)
        finally:
            client.close()

    def first_byte(base: str) -> float:
        return fresh(base, stream)[2]

    firsts = interleaved(n, first_byte, (direct, guard), pid)
    fd, fg = firsts.took
    long = {"prompt": "Hello", "n_predict": 3000, "ignore_eos": True, "stream": True, "cache_prompt": False}
    streamed = [0, 0]

    def rate(base: str) -> float:
        _, raw, _, total = fresh(base, long)
        tokens = _tokens(raw, True)
        streamed[base == guard] += tokens
        return tokens / total

    rates = interleaved(max(3, n // 40), rate, (direct, guard), pid)
    rd, rg = rates.took
    for c in clients.values():
        c.close()
    added = pct(g, 0.99) - pct(d, 0.99)
    first = pct(fg, 0.5) - pct(fd, 0.5)
    first99 = pct(fg, 0.99) - pct(fd, 0.99)
    # The exporter follows the log on both paths; what it spends beyond that on the guard's calls is the proxying.
    per_request = (smalls.cpu[1] - smalls.cpu[0]) / n
    per_token = (rates.cpu[1] / max(streamed[1], 1)) - (rates.cpu[0] / max(streamed[0], 1))
    return [
        "| measure | direct | guard | added | limit |",
        "|---|---|---|---|---|",
        f"| small request (`n_predict` 1), p50 / p99 ms ({n} each) | {ms(pct(d, 0.5))} / {ms(pct(d, 0.99))} | "
        f"{ms(pct(g, 0.5))} / {ms(pct(g, 0.99))} | {ms(pct(g, 0.5) - pct(d, 0.5))} / {ms(added)} | p99 ≤ 5 ms |",
        f"| first streamed byte, p50 / p99 ms | {ms(pct(fd, 0.5))} / {ms(pct(fd, 0.99))} | {ms(pct(fg, 0.5))} / "
        f"{ms(pct(fg, 0.99))} | {ms(first)} / {ms(first99)} | ≤ 5 ms |",
        f"| long stream (3,000 tokens), tokens/s, median of {len(rd)} | {statistics.median(rd):,.0f} | "
        f"{statistics.median(rg):,.0f} | {statistics.median(rg) / statistics.median(rd):.3f}x | unchanged |",
        f"| exporter CPU per small request / per streamed token, ms | | | {per_request * 1000:.2f} / "
        f"{per_token * 1000:.3f} | |",
    ]


def fits(direct: str, guard: str, exporter: ExporterProcess, n: int) -> list[str]:
    rng = random.Random(4)
    requests = [
        {"prompt": make_prompt(rng.randint(20, 300)), "n_predict": rng.randint(8, 100), "ignore_eos": True}
        for _ in range(n)
    ]
    queued = exporter.sample("llamacpp_guard_requests_total", {"outcome": "queued"}) or 0
    runs: dict[str, list[Load]] = {direct: [], guard: []}
    for _ in range(3):
        for base in (direct, guard):
            runs[base].append(run_load(base, requests, 4))
    queued_now = (exporter.sample("llamacpp_guard_requests_total", {"outcome": "queued"}) or 0) - queued
    lines = ["| | p50 ms | p99 ms | answered | queued by the guard |", "|---|---|---|---|---|"]
    for name, base in (("direct", direct), ("guard", guard)):
        lat = [x for load in runs[base] for x in load.latencies]
        ok = sum(load.answered for load in runs[base])
        q = f"{queued_now:.0f}" if base == guard else ""
        lines.append(f"| {name} | {ms(pct(lat, 0.5))} | {ms(pct(lat, 0.99))} | {ok} of {len(lat)} | {q} |")
    return lines


def mixed(direct: str, guard: str, n: int) -> list[str]:
    rng = random.Random(32)
    requests: list[dict[str, Any]] = []
    for _ in range(n):
        big = rng.random() < 0.25
        body: dict[str, Any] = {
            "prompt": make_prompt(rng.randint(300, 600) if big else rng.randint(10, 120)),
            "n_predict": rng.randint(100, 300) if big else rng.randint(8, 64),
            "ignore_eos": True,
            "cache_prompt": False,
        }
        if rng.random() < 0.3:
            body["stream"] = True
        requests.append(body)
    lines = [
        "| | answered | aborted | p50 ms | p99 ms | tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, base in (("direct", direct), ("guard", guard)):
        load = run_load(base, requests, 6)
        lines.append(
            f"| {name} | {load.answered} of {len(requests)} | {load.aborted} | "
            f"{ms(pct(load.latencies, 0.5))} | {ms(pct(load.latencies, 0.99))} | {load.tokens / load.wall:,.0f} |"
        )
    return lines


def guard_at(checkout: Path, server: LlamaServer, out: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The exporter of `checkout` (its own code, this Python) with its guard in front of `server`: (process, port)."""
    port, guard = free_port(), free_port()
    command = [sys.executable, "-m", "exporter", "--log-file", str(server.log_file)]
    command += ["--listen-address", f"127.0.0.1:{port}", "--server-url", server.url, "--nvml", "off"]
    command += ["--guard.listen-address", f"127.0.0.1:{guard}"]
    with out.open("ab") as sink:
        proc = subprocess.Popen(command, cwd=checkout, stdout=sink, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while try_http_status(f"http://127.0.0.1:{port}/") != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the exporter of {checkout} did not start: {out.read_text()[-2000:]}")
        time.sleep(0.05)
    return proc, guard


#: `--against --per-request`: small requests a turn, on one connection.
REQUEST_BLOCK = 20


def against(
    other: Path, binary: Path, model: Path, tmp: Path, threads: str, rounds: int, per_request: bool = False
) -> list[str]:
    """CPU per streamed token through the guard of `other` (A) and of this checkout (B), streams alternating;
    `per_request`: CPU per small request instead (one token, not streamed: sizing, admission, the relay)."""
    server = LlamaServer(binary, model, ("-c", "4096", "-np", "4", "-kvu", "-t", threads), log_file=tmp / "ab.log")
    server.start()
    procs: list[subprocess.Popen[bytes]] = []
    sides: list[tuple[int, int]] = []  # (pid, guard port) of A, then B
    try:
        for checkout, name in ((other, "a"), (ROOT, "b")):
            proc, port = guard_at(checkout, server, tmp / f"exporter-{name}.out")
            procs.append(proc)
            sides.append((proc.pid, port))
        long = {"prompt": "Hello", "n_predict": 3000, "ignore_eos": True, "stream": True, "cache_prompt": False}
        small = {"prompt": "Hello", "n_predict": 1, "cache_prompt": False}

        def stream(port: int) -> int:
            client = Client(f"http://127.0.0.1:{port}")
            try:
                if per_request:  # a block of small requests on one keep-alive connection, as SDKs send them
                    return sum(client.post("/completion", small)[0] == 200 for _ in range(REQUEST_BLOCK))
                return _tokens(client.post("/completion", long)[1], True)
            finally:
                client.close()

        for _, port in sides:  # warm both
            stream(port)
        cpu, tokens = [0.0, 0.0], [0, 0]
        for r in range(rounds):
            for i in (0, 1) if r % 2 == 0 else (1, 0):
                pid, port = sides[i]
                before = cpu_seconds(pid)
                tokens[i] += stream(port)
                cpu[i] += cpu_seconds(pid) - before
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
        server.stop()
    a, b = (cpu[i] / max(tokens[i], 1) for i in (0, 1))
    unit = "request" if per_request else "streamed token"
    return [
        f"| exporter | {unit}s | CPU s | CPU per {unit}, µs |",
        "|---|---|---|---|",
        f"| A: {other} | {tokens[0]:,} | {cpu[0]:.2f} | {a * 1e6:.1f} |",
        f"| B: {ROOT} | {tokens[1]:,} | {cpu[1]:.2f} | {b * 1e6:.1f} |",
        f"| B/A | | | {b / a:.3f} |",
    ]


def serve(binary: Path, model: Path, tmp: Path, args: Sequence[str]) -> tuple[LlamaServer, ExporterProcess, str]:
    server = LlamaServer(binary, model, args, log_file=tmp / f"llama-server-{args[1]}.log").start()
    from llama_harness import free_port

    port = free_port()
    exporter = ExporterProcess(
        server.log_file,
        ["--server-url", server.url, "--nvml", "off", "--guard.listen-address", f"127.0.0.1:{port}"],
        output_file=tmp / f"exporter-{port}.out",
    ).start()
    return server, exporter, f"http://127.0.0.1:{port}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes")
    parser.add_argument("--fits-only", action="store_true", help="only the load that always fits")
    parser.add_argument("--overhead-only", action="store_true", help="only the overhead table")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's -t (default 2)")
    parser.add_argument("--against", type=Path, help="only: CPU per streamed token, this checkout's guard vs DIR's")
    parser.add_argument("--rounds", type=int, default=30, help="--against: streams of 3,000 tokens each side")
    parser.add_argument(
        "--per-request", action="store_true", help="--against: CPU per small request (blocks of 20) instead"
    )
    args = parser.parse_args(argv)
    binary = find_llama_server()
    if binary is None:
        print("llama-server not found: run scripts/install-llama-server.sh or set LLAMA_SERVER_BIN", file=sys.stderr)
        return 2
    n = 100 if args.quick else 300
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-guard-") as tmpdir:
        tmp = Path(tmpdir)
        model = write_tiny_llama(tmp / "tiny.gguf")
        threads = ("-t", str(args.threads))
        if args.against is not None:
            what = f"blocks of {REQUEST_BLOCK} small requests" if args.per_request else "streams of 3,000 tokens"
            unit = "request" if args.per_request else "streamed token"
            print(f"\n## CPU per {unit}, {args.rounds} {what} each side\n")
            other = args.against.resolve()
            lines = against(other, binary, model, tmp, str(args.threads), args.rounds, args.per_request)
            print("\n".join(lines))
            print(f"\nload average {os.getloadavg()[0]:.2f}")
            return 0
        server, exporter, guard = serve(binary, model, tmp, ("-c", "4096", "-np", "4", "-kvu", *threads))
        try:
            if not args.fits_only:
                print(f"\n## overhead (llama-server -t {args.threads})\n")
                print("\n".join(overhead(server.url, guard, n, exporter.pid)))
            if not args.overhead_only:
                print("\n## a load that always fits (4 clients, 3 rounds each way)\n")
                print("\n".join(fits(server.url, guard, exporter, n // 3)))
        finally:
            exporter.stop()
            server.stop()
        if args.fits_only or args.overhead_only:
            return 0
        server, exporter, guard = serve(binary, model, tmp, ("-c", "1024", "-np", "6", "-kvu", *threads))
        try:
            print(f"\n## a seeded mixed load ({max(100, n // 2)} requests, 6 clients, 30% streaming)\n")
            print("\n".join(mixed(server.url, guard, max(100, n // 2))))
            print(
                "\nguard outcomes:",
                {
                    o: exporter.sample("llamacpp_guard_requests_total", {"outcome": o})
                    for o in ("admitted", "queued", "refused", "preempted", "replayed", "failed")
                },
            )
        finally:
            exporter.stop()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
