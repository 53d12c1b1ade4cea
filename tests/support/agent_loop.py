"""Coding agents' turns fill a real llama-server's shared KV pool behind a real Prometheus with the shipped rules.

Shared by `tests/real_server/test_alerts_agent_loop.py` (asserts the order: the page, then the abort) and
`bench/agent_loop_page.py` (prints the lead). Real llama-server (`-c 8192 -np 3 -kvu`, default verbosity)
with a random-weight model slow enough on 2 cores that a turn takes seconds, the exporter with
`--server-url`, a real Prometheus scraping and evaluating every second with `alerts/llamacpp-rules.yml`
unchanged. Three agents each run a conversation: a turn sends the whole conversation (`cache_prompt`, 16
tokens to generate), then the agent "runs its tools" for 3-8 s and comes back with the conversation a few
hundred tokens longer. Between their turns the agents' slots are idle, and every other agent's start clears
them to the host prompt cache: the requests processing at one instant are a poor guide, and the pool's usage
dips and comes back. Sooner or later two turns overlap with more than the pool together, and llama-server
aborts both. Everything the run saw is returned (`AgentLoopRun`).
"""

from __future__ import annotations

import random
import re
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from llama_harness import ExporterProcess, LlamaServer, http_json, wait_for
from paths import REPO
from prom_harness import Prometheus, prometheus_test_config
from tiny_gguf import write_slow_llama

POOL = 8192
SERVER_ARGS = ["-c", str(POOL), "-np", "3", "-kvu", "-t", "2"]
EXCEEDED = "Context size has been exceeded"
RULES = REPO / "alerts" / "llamacpp-rules.yml"
PAGE = "LlamaCppKVPoolSaturated"
#: What the page reads, and what the forecast alone would have read, queried when it is seen firing.
AT_PAGE = {
    "processing": "instance:llamacpp_slots_processing:sum",
    "usage": "llamacpp_kv_pool_usage_ratio",
    "active": "llamacpp_kv_pool_active_ratio",
    "prompt_demand": 'llamacpp_kv_pool_demand_ratio{horizon="prompt"}',
}
TOOL_GAP_S = (3.0, 8.0)
WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "every",
    "server",
    "counts",
    "tokens",
    "and",
    "agents",
    "run",
    "tools",
]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Agent(threading.Thread):
    """One conversation: turn, tool gap, a longer turn, until a turn is aborted or `stop` is set."""

    def __init__(self, url: str, name: str, seed: int, step: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.rng, self.step, self.stop = url, random.Random(seed), step, stop
        self.conversation = f"{name}: " + _text(self.rng, 300)
        self.turns: list[tuple[float, int]] = []  # (end time, status)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                status, _ = http_json(
                    self.url + "/completion",
                    body={"prompt": self.conversation, "n_predict": 16, "cache_prompt": True},
                    timeout=600,
                )
            except OSError:
                status = -1
            self.turns.append((time.time(), status))
            if status != 200:
                self.stop.set()
                return
            self.stop.wait(self.rng.uniform(*TOOL_GAP_S))  # the agent runs its tools
            self.conversation += " " + _text(self.rng, self.step)


def iso_seconds(ts: str) -> float:
    """Prometheus' RFC 3339 timestamps (nanoseconds, `Z`) -> epoch seconds."""
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", ts)
    assert m, ts
    whole = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3]))
    return whole.timestamp() + float("0." + (m[2] or "0"))


@dataclass
class AgentLoopRun:
    """What one run saw (epoch seconds)."""

    begin: float
    page_active_at: float | None = None  # Prometheus' activeAt of the page
    page_seen: float | None = None  # when our poll first saw it firing
    abort_logged_at_page: bool | None = None  # the abort line was already in the log when the page was seen
    abort_line_seen: float | None = None  # when our poll first saw `Context size has been exceeded`
    alerts_before_abort: list[str] = field(default_factory=list)  # critical alerts firing when the abort showed
    at_page: dict[str, float | None] = field(default_factory=dict)
    turns: int = 0
    statuses: list[int] = field(default_factory=list)  # the agents' last turn's status each

    @property
    def lead_s(self) -> float | None:
        if self.page_active_at is None or self.abort_line_seen is None:
            return None
        return self.abort_line_seen - self.page_active_at


def _query_one(prom: Prometheus, expr: str, instance: str) -> float | None:
    selector = f'instance="{instance}"'
    expr = expr.replace("}", f", {selector}}}") if "{" in expr else f"{expr}{{{selector}}}"
    got = prom.query(expr)
    return float(got[0]["value"][1]) if got else None


def run_agent_loop(
    binary: Path, prometheus: Path, tmp: Path, *, seed: int = 1, step: int = 60, timeout: float = 900.0
) -> AgentLoopRun:
    """Start the server, the exporter and Prometheus, run three agents until an abort (and 30 s more for
    Prometheus to see it) or `timeout`, and return what was seen."""
    with ExitStack() as stack:
        model = write_slow_llama(tmp / "slow-llama.gguf")
        srv = stack.enter_context(LlamaServer(binary, model, SERVER_ARGS, log_file=tmp / "server.log"))
        exporter = stack.enter_context(
            ExporterProcess(srv.log_file, ["--server-url", srv.url, "--log-poll-interval", "0.2", "--nvml", "off"])
        )
        instance = f"127.0.0.1:{exporter.port}"
        prom = stack.enter_context(
            Prometheus(prometheus, prometheus_test_config({"llamacpp": [instance]}, [RULES], None))
        )
        wait_for(
            lambda: prom.query(f'llamacpp_kv_pool_capacity_tokens{{instance="{instance}"}} == {POOL}'),
            timeout=120,
            what="Prometheus scraping the exporter, the pool size known",
        )
        stop = threading.Event()
        agents = [Agent(srv.url, f"agent {i}", seed * 10 + i, step, stop) for i in range(3)]
        run = AgentLoopRun(begin=time.time())
        for a in agents:
            a.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            firing = [a for a in prom.alerts() if a["state"] == "firing" and a["labels"].get("severity") == "critical"]
            if run.page_active_at is None:
                page = next((a for a in firing if a["labels"].get("alertname") == PAGE), None)
                if page is not None:
                    run.page_seen = time.time()
                    run.page_active_at = iso_seconds(page["activeAt"])
                    run.abort_logged_at_page = EXCEEDED in srv.log_text()
                    run.at_page = {name: _query_one(prom, expr, instance) for name, expr in AT_PAGE.items()}
            if run.abort_line_seen is None and srv.log_lines(EXCEEDED):
                run.abort_line_seen = time.time()
                run.alerts_before_abort = sorted(a["labels"]["alertname"] for a in firing)
            if run.abort_line_seen is not None and (
                run.page_active_at is not None or time.time() - run.abort_line_seen > 30
            ):
                break  # seen both, or Prometheus had its time to see the abort
            time.sleep(0.2)
        stop.set()
        for a in agents:
            a.join(5)
        run.turns = sum(len(a.turns) for a in agents)
        run.statuses = [a.turns[-1][1] if a.turns else 0 for a in agents]
        return run
