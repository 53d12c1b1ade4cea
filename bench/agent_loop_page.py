"""Coding agents' turns fill a real llama-server's shared KV pool: does the shipped page come before the abort?

A check on real programs, not a test: its lead depends on the host's speed, so it prints what it measured and
exits 1 only when the page did not come before the abort (or nothing overflowed). Real llama-server b11434
(`-c 8192 -np 3 -kvu`, default verbosity) with a random-weight model slow enough on 2 cores that a turn
takes seconds, the exporter with `--server-url`, a real Prometheus scraping every second with the shipped
`alerts/llamacpp-rules.yml` unchanged. Three agents each run a conversation: a turn sends the whole
conversation (`cache_prompt`, 16 tokens to generate), then the agent "runs its tools" for 3-8 s and comes back
with the conversation a few hundred tokens longer. Between their turns the agents' slots are idle, and every
other agent's start clears them to the host prompt cache: the requests processing at one instant are a poor
guide, and the pool's usage dips and comes back. Sooner or later two turns overlap with more than the pool
together, and llama-server aborts both.

    .venv/bin/python bench/agent_loop_page.py [--seed 1] [--step 60] [--timeout 900]

Prints, as JSON: when the page (LlamaCppKVPoolSaturated) started firing (Prometheus' activeAt), when the
`Context size has been exceeded` line appeared, the lead, and at the page: the slots processing, the prompt
demand and the active ratio (what it pages on).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from paths import TOOLS_BIN  # noqa: E402

# Prometheus as scripts/unpack-test-tools.sh unpacks it, first on PATH (as tests/conftest.py puts it).
os.environ["PATH"] = f"{TOOLS_BIN}{os.pathsep}{os.environ.get('PATH', '')}"

from llama_harness import ExporterProcess, LlamaServer, find_llama_server, http_json, wait_for  # noqa: E402
from prom_harness import Prometheus, find_prometheus, prometheus_test_config  # noqa: E402
from tiny_gguf import write_slow_llama  # noqa: E402

POOL = 8192
SERVER_ARGS = ["-c", str(POOL), "-np", "3", "-kvu", "-t", "2"]
EXCEEDED = "Context size has been exceeded"
RULES = ROOT / "alerts" / "llamacpp-rules.yml"
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
            status, _ = http_json(
                self.url + "/completion",
                body={"prompt": self.conversation, "n_predict": 16, "cache_prompt": True},
                timeout=600,
            )
            self.turns.append((time.time(), status))
            if status != 200:
                self.stop.set()
                return
            self.stop.wait(self.rng.uniform(3, 8))  # the agent runs its tools
            self.conversation += " " + _text(self.rng, self.step)


def _iso(ts: str) -> float:
    """Prometheus' RFC 3339 timestamps (nanoseconds, `Z`) -> epoch seconds."""
    m = re.fullmatch(r"(.*T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", ts)
    assert m, ts
    whole = datetime.fromisoformat(m[1] + ("+00:00" if m[3] == "Z" else m[3]))
    return whole.timestamp() + float("0." + (m[2] or "0"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--step", type=int, default=60, help="words each turn adds to a conversation")
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    binary, prom_bin = find_llama_server(), find_prometheus()
    if binary is None or prom_bin is None:
        print("needs llama-server and prometheus: run scripts/bootstrap.sh", file=sys.stderr)
        return 2
    out: dict[str, Any] = {"pool": POOL, "seed": args.seed, "step_words": args.step}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        model = write_slow_llama(Path(tmp) / "slow-llama.gguf")
        srv = stack.enter_context(LlamaServer(binary, model, SERVER_ARGS, log_file=Path(tmp) / "server.log"))
        exporter = stack.enter_context(
            ExporterProcess(srv.log_file, ["--server-url", srv.url, "--log-poll-interval", "0.2", "--nvml", "off"])
        )
        instance = f"127.0.0.1:{exporter.port}"
        prom = stack.enter_context(
            Prometheus(prom_bin, prometheus_test_config({"llamacpp": [instance]}, [RULES], None))
        )
        wait_for(
            lambda: prom.query(f'llamacpp_kv_pool_capacity_tokens{{instance="{instance}"}} == {POOL}'),
            timeout=120,
            what="Prometheus scraping the exporter, the pool size known",
        )
        stop = threading.Event()
        agents = [Agent(srv.url, f"agent {i}", args.seed * 10 + i, args.step, stop) for i in range(3)]
        begin = time.time()
        for a in agents:
            a.start()
        fired: dict[str, Any] | None = None
        line_seen: float | None = None
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline and (line_seen is None or fired is None):
            if fired is None:
                for alert in prom.alerts():
                    if alert["labels"].get("alertname") == "LlamaCppKVPoolSaturated" and alert["state"] == "firing":
                        q = {
                            name: prom.query(f'{expr}{{instance="{instance}"}}')
                            for name, expr in (
                                ("processing", "instance:llamacpp_slots_processing:sum"),
                                ("usage", "llamacpp_kv_pool_usage_ratio"),
                                ("active", "llamacpp_kv_pool_active_ratio"),
                            )
                        }
                        prompt = prom.query(f'llamacpp_kv_pool_demand_ratio{{instance="{instance}", horizon="prompt"}}')
                        fired = {
                            "active_at": _iso(alert["activeAt"]),
                            "seen": time.time(),
                            "abort_logged_already": EXCEEDED in srv.log_text(),
                            **{k: float(v[0]["value"][1]) if v else None for k, v in q.items()},
                            "prompt_demand": float(prompt[0]["value"][1]) if prompt else None,
                        }
                        break
            if line_seen is None and srv.log_lines(EXCEEDED):
                line_seen = time.time()
            if line_seen is not None and time.time() - line_seen > 30:
                break  # Prometheus had its time to see the abort
            time.sleep(0.2)
        stop.set()
        out["turns"] = sum(len(a.turns) for a in agents)
        out["conversation_chars"] = [len(a.conversation) for a in agents]
        out["abort_s"] = line_seen and round(line_seen - begin, 1)
        if fired is not None:
            out["page_s"] = round(fired["active_at"] - begin, 1)
            out["at_page"] = {k: fired[k] for k in ("processing", "usage", "active", "prompt_demand")}
            out["abort_logged_when_page_seen"] = fired["abort_logged_already"]
        if fired is not None and line_seen is not None:
            out["lead_s"] = round(line_seen - fired["active_at"], 1)
    print(json.dumps(out))
    ok = "lead_s" in out and out["lead_s"] > 0 and not out.get("abort_logged_when_page_seen")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
