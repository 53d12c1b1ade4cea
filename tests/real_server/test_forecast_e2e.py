"""End to end: the forecast (LlamaCppKVPoolOverflowAhead, a warning and the guard's signal) or the page
(LlamaCppKVPoolSaturated) comes before llama-server aborts every request, and only then.

A real llama-server b11434 with a random-weight model slow enough on 2 cores (512 wide, 12 layers)
that filling a 32,768-cell pool takes a minute or more, real exporters, and a real Prometheus that
loads the shipped `alerts/llamacpp-rules.yml` unchanged, scraping and evaluating every second: the rules
read two samples, so the alert's own fixed delay (two scrapes and an evaluation) is a few seconds, while
everything llama-server does (the time from the last prompt's `new prompt` line to the overflow) takes
longer the slower the host. Each scenario measures, in wall-clock time, when our poll of Prometheus first saw one of them
firing for an exporter and when the `Context size has been exceeded` line appeared in the log.

Server A runs at `-lv 4` (prompt sizes from `new prompt` lines), followed by a log-only exporter:
  1. no false page: prompts for 85 % of the pool that finish (the exporter restarted in the middle
     of the fill), idle slots that keep their cached tokens, a small request next to them, a
     server restart;
  2. a prompt-driven overflow (four ~9,000-token prompts, 110 %): page, lead, ETA at 50 % fill.
Server B runs at the default verbosity (sizes from progress lines), followed by one exporter with
`--server-url` and one reading only the log:
  3. a prompt-driven overflow shaped like the incident that started this project (a few small
     prompts and one large one, the large one read last): both exporters page ahead of the abort.
Server C (default verbosity, a 16,384-cell pool and two slots, followed with `--server-url`):
  4. a generation-driven overflow (prompts for 80 %, long generations): the page comes ahead of
     the abort, and the warning that the requests may outgrow the pool before it.

The figures are printed (`pytest -s`). Slow (~10 minutes on 2 cores): every scenario runs once.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
from llama_harness import ExporterProcess, LlamaServer, http_json, wait_for
from paths import REPO
from prom_harness import Prometheus, find_prometheus, prometheus_test_config
from tiny_gguf import write_slow_llama

from exporter import diagnose

pytestmark = [pytest.mark.llama_server, pytest.mark.promtool]

ROOT = REPO
RULES = ROOT / "alerts" / "llamacpp-rules.yml"
POOL = 32768
SERVER_ARGS = ["-c", str(POOL), "-np", "4", "-kvu", "-t", "2"]
#: Generation over a large unified pool is slow on CPU (every token attends over all its cells): the
#: generation-driven scenario gets a smaller pool of its own (two slots) so that it fills in about two
#: minutes, the last 10 % in about 40 s.
GENERATION_POOL = 16384
GENERATION_ARGS = ["-c", str(GENERATION_POOL), "-np", "2", "-kvu", "-t", "2"]
EXCEEDED = "Context size has been exceeded"
#: The alerts that come ahead of an abort: the forecast and the page.
CRITICAL = ("LlamaCppKVPoolOverflowAhead", "LlamaCppKVPoolSaturated")
SCENARIO_TIMEOUT = 600.0
#: n_predict of the requests that must stay in flight: llama-server reads concurrent prompts one after
#: another, and a request that finished before the last prompt is read would leave room (its idle slot
#: is purged) instead of being aborted.
LONG = 4000
_WORDS = [
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
    "its",
    "tokens",
    "in",
    "one",
    "shared",
    "pool",
]


def _missing(what: str) -> NoReturn:
    hint = "run scripts/unpack-test-tools.sh"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{what} not found under CI: {hint}", pytrace=False)
    pytest.skip(f"{what} not found: {hint}")


def _text(seed: int, chars: int) -> str:
    """Distinct English-looking text per seed: no two prompts share a prefix the prompt cache could reuse."""
    words, i = [f"Request{seed}:"], seed
    while sum(len(w) + 1 for w in words) < chars:
        words.append(_WORDS[(i * 7 + len(words) * 3) % len(_WORDS)])
        i += 1
    return " ".join(words)[:chars]


def _prompt(url: str, seed: int, tokens: int) -> str:
    """A prompt of about `tokens` tokens (within 1 %), sized with the server's own /tokenize."""
    chars = tokens
    for _ in range(4):
        text = _text(seed, chars)
        status, body = http_json(url + "/tokenize", body={"content": text}, timeout=30)
        assert status == 200, body
        n = len(body["tokens"]) + 1  # + BOS
        if abs(n - tokens) <= tokens * 0.01:
            break
        chars = max(1, round(chars * tokens / n))
    return text


@dataclass
class Watch:
    """Polls Prometheus' alerts, the server logs and the exporters' /metrics in a background thread."""

    prom: Prometheus
    servers: dict[str, LlamaServer]
    exporters: dict[str, ExporterProcess]
    firing: dict[tuple[str, str], float] = field(default_factory=dict)  # (alert, exporter) -> first seen firing
    firing_log: list[tuple[float, str, str]] = field(default_factory=list)  # (when, alert, exporter)
    exceeded: dict[str, float] = field(default_factory=dict)  # server -> first seen a new abort line
    _aborts_before: dict[str, int] = field(default_factory=dict)  # server -> abort lines at the last reset
    samples: dict[str, list[tuple[float, dict[str, float]]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Watch:
        self._threads = [
            threading.Thread(target=self._alerts, daemon=True),
            threading.Thread(target=self._logs, daemon=True),
            threading.Thread(target=self._metrics, daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def reset(self) -> None:
        """Forget what was seen (between scenarios)."""
        with self._lock:
            self.firing.clear()
            self.exceeded.clear()
            self.samples.clear()
            self._aborts_before = {name: srv.log_text().count(EXCEEDED) for name, srv in self.servers.items()}

    def _instance_names(self) -> dict[str, str]:
        return {f"127.0.0.1:{e.port}": name for name, e in self.exporters.items()}

    def _alerts(self) -> None:
        names = self._instance_names()
        while not self._stop.wait(0.5):
            try:
                alerts = self.prom.alerts()
            except OSError:
                continue
            now = time.time()
            with self._lock:
                for a in alerts:
                    who = names.get(a["labels"].get("instance", ""))
                    if a.get("state") == "firing" and who is not None:
                        key = (a["labels"]["alertname"], who)
                        if key not in self.firing:
                            self.firing[key] = now
                            self.firing_log.append((now, key[0], who))

    def _logs(self) -> None:
        while not self._stop.wait(0.1):
            for name, srv in self.servers.items():
                # The log is truncated only when the server restarts: count the lines since the last reset.
                if name not in self.exceeded and srv.log_text().count(EXCEEDED) > self._aborts_before.get(name, 0):
                    with self._lock:
                        self.exceeded[name] = time.time()

    def _metrics(self) -> None:
        wanted = (
            "llamacpp_kv_pool_usage_ratio",
            "llamacpp_kv_pool_full_eta_seconds",
            'llamacpp_kv_pool_demand_tokens{horizon="prompt"}',
        )
        while not self._stop.wait(1.0):
            for name, exp in self.exporters.items():
                try:
                    text = exp.scrape(timeout=5)
                except (OSError, RuntimeError):
                    continue
                values = {}
                for line in text.splitlines():
                    for w in wanted:
                        if line.startswith(w + " "):
                            values[w] = float(line.rsplit(" ", 1)[1])
                with self._lock:
                    self.samples.setdefault(name, []).append((time.time(), values))

    def first_critical(self, exporter: str) -> tuple[str, float] | None:
        with self._lock:
            seen = [(t, a) for (a, who), t in self.firing.items() if who == exporter and a in CRITICAL]
        return (min(seen)[1], min(seen)[0]) if seen else None

    def criticals_between(self, exporter: str, begin: float, end: float) -> list[tuple[float, str]]:
        with self._lock:
            return [(t, a) for t, a, who in self.firing_log if who == exporter and a in CRITICAL and begin <= t <= end]


@dataclass
class Env:
    watch: Watch
    a: LlamaServer
    b: LlamaServer
    c: LlamaServer
    exporters: dict[str, ExporterProcess]
    figures: dict[str, Any] = field(default_factory=dict)


def _send(url: str, prompts: list[str], n_predict: int, timeout: float = SCENARIO_TIMEOUT) -> list[int]:
    """One request per slot (slot i gets prompt i), all at once; returns the HTTP statuses."""
    statuses: list[int] = [0] * len(prompts)

    def worker(i: int) -> None:
        body = {"prompt": prompts[i], "n_predict": n_predict, "ignore_eos": True, "cache_prompt": True, "id_slot": i}
        try:
            statuses[i] = http_json(url + "/completion", body=body, timeout=timeout)[0]
        except OSError:
            statuses[i] = -1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
        time.sleep(0.05)  # in slot order: llama-server reads concurrent prompts slot by slot
    for t in threads:
        t.join(timeout + 10)
    return statuses


@pytest.fixture(scope="module")
def env(llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    prom_bin = find_prometheus() or _missing("prometheus")
    tmp = tmp_path_factory.mktemp("forecast-e2e")
    model = write_slow_llama(tmp / "slow-llama.gguf")
    with ExitStack() as stack:
        a = stack.enter_context(
            LlamaServer(llama_server_bin, model, [*SERVER_ARGS, "-lv", "4"], log_file=tmp / "a.log")
        )
        b = stack.enter_context(LlamaServer(llama_server_bin, model, SERVER_ARGS, log_file=tmp / "b.log"))
        c = stack.enter_context(LlamaServer(llama_server_bin, model, GENERATION_ARGS, log_file=tmp / "c.log"))
        exporters = {
            "a_log": stack.enter_context(ExporterProcess(a.log_file, ["--http", "off", "--nvml", "off"])),
            "b_http": stack.enter_context(ExporterProcess(b.log_file, ["--server-url", b.url, "--nvml", "off"])),
            "b_log": stack.enter_context(ExporterProcess(b.log_file, ["--http", "off", "--nvml", "off"])),
            "c_http": stack.enter_context(ExporterProcess(c.log_file, ["--server-url", c.url, "--nvml", "off"])),
        }
        targets = [f"127.0.0.1:{e.port}" for e in exporters.values()]
        prom = stack.enter_context(
            Prometheus(
                prom_bin,
                prometheus_test_config(
                    {"llamacpp": targets}, [RULES], None, scrape_interval="1s", evaluation_interval="1s"
                ),
            )
        )
        wait_for(
            lambda: len(prom.query("llamacpp_kv_pool_capacity_tokens")) == len(exporters),
            timeout=90,
            what="Prometheus scraping every exporter with the pool size known",
        )
        watch = Watch(prom, {"a": a, "b": b, "c": c}, exporters).start()
        stack.callback(watch.stop)
        e = Env(watch, a, b, c, exporters)
        yield e
        print("\nforecast e2e figures:\n" + json.dumps(e.figures, indent=2))


def _overflow(env: Env, server: str, sizes: list[int], n_predict: int) -> tuple[float, list[int]]:
    """Send the prompts and wait until every request ended; returns (when sent, statuses)."""
    srv = {"a": env.a, "b": env.b, "c": env.c}[server]
    prompts = [_prompt(srv.url, 100 * len(env.figures) + i, n) for i, n in enumerate(sizes)]
    instances = {f"127.0.0.1:{e.port}" for name, e in env.exporters.items() if name.startswith(server)}
    wait_for(
        lambda: (
            not any(
                a["labels"].get("alertname") in CRITICAL and a["labels"].get("instance") in instances
                for a in env.watch.prom.alerts()
            )
        ),
        timeout=60,
        what="no critical alert left from the previous scenario",
    )
    env.watch.reset()
    sent = time.time()
    statuses = _send(srv.url, prompts, n_predict)
    wait_for(lambda: server in env.watch.exceeded, timeout=60, what="the abort line seen")  # a hang guard
    return sent, statuses


def _lead(env: Env, exporter: str, server: str, sent: float) -> dict[str, Any]:
    abort = env.watch.exceeded[server]
    first = env.watch.first_critical(exporter)
    assert first is not None, f"{exporter}: no critical alert fired before or after the abort"
    alert, fired = first
    return {"alert": alert, "fired_after_s": round(fired - sent, 1), "abort_after_s": round(abort - sent, 1),
            "lead_s": round(abort - fired, 1)}  # fmt: skip


def test_1_no_false_page(env: Env) -> None:
    """85 % of the pool, an exporter restart mid-fill, idle slots with cached tokens, a server restart: no page."""
    w, a, exp = env.watch, env.a, env.exporters["a_log"]
    begin = time.time()
    sizes = [1000, 4000, 8000, 14800]  # 27,800 of 32,768 cells: 85 %
    prompts = [_prompt(a.url, 10 + i, n) for i, n in enumerate(sizes)]
    w.reset()
    done: list[int] = []
    sender = threading.Thread(target=lambda: done.extend(_send(a.url, prompts, 4)), daemon=True)
    sender.start()
    wait_for(
        lambda: (exp.sample("llamacpp_kv_pool_usage_ratio") or 0) > 0.3, timeout=SCENARIO_TIMEOUT, what="30 % filled"
    )
    exp.restart()  # mid-fill: it replays the log and goes on
    sender.join(SCENARIO_TIMEOUT)
    assert done == [200] * 4, done
    peak = max((v.get("llamacpp_kv_pool_usage_ratio", 0) for _, v in w.samples.get("a_log", [])), default=0)
    time.sleep(12)  # idle slots keep their cached cells: two evaluations
    held = exp.sample("llamacpp_kv_pool_used_tokens") or 0
    assert held > 0.8 * POOL, "the idle slots should still hold their cached tokens"
    assert http_json(a.url + "/completion", body={"prompt": _text(99, 500), "n_predict": 4}, timeout=120)[0] == 200
    time.sleep(12)
    a.restart()
    time.sleep(12)
    pages = w.criticals_between("a_log", begin, time.time())
    env.figures["no_false_page"] = {"peak_usage": round(peak, 3), "idle_held_tokens": held, "pages": pages}
    assert pages == []


def test_2_prompt_overflow_at_lv4(env: Env) -> None:
    """Four ~9,000-token prompts at -lv 4: the page comes at the `new prompt` lines, the ETA is right."""
    sent, statuses = _overflow(env, "a", [9000] * 4, LONG)
    assert statuses == [500] * 4, statuses
    lead = _lead(env, "a_log", "a", sent)
    abort = env.watch.exceeded["a"]
    # The ETA when the pool passed 50 %, against the time that was really left.
    samples = env.watch.samples["a_log"]
    at_half = next((t, v) for t, v in samples if v.get("llamacpp_kv_pool_usage_ratio", 0) >= 0.5)
    eta = at_half[1].get("llamacpp_kv_pool_full_eta_seconds")
    left = abort - at_half[0]
    lead["eta_at_50pct_s"], lead["time_left_at_50pct_s"] = eta, round(left, 1)
    env.figures["prompt_overflow_lv4"] = lead
    # Order, not margins: the page came before the abort. How long before, and how close the ETA was, depend
    # on the host's speed; they are figures (printed), not assertions.
    assert lead["lead_s"] > 0, lead
    assert eta is not None and eta > 0, lead
    # The log says how big each prompt was; the exporter's demand was their sum.
    demand = max(v.get('llamacpp_kv_pool_demand_tokens{horizon="prompt"}', 0) for _, v in samples)
    sizes = [int(line.rsplit("= ", 1)[1]) for line in env.a.log_lines("new prompt,")[-4:]]
    assert demand == sum(sizes), (demand, sizes)
    report = diagnose.diagnose_file(str(env.a.log_file))
    failure = report.runs[-1].failures[-1]
    assert failure.predictable_line is not None and failure.predictable_lead_s is not None
    assert failure.predictable_lead_s >= lead["lead_s"], (failure, lead)
    assert failure.predictable_line < failure.line, failure  # in the log's own order: foreseen, then failed


def test_3_prompt_overflow_at_default_verbosity(env: Env) -> None:
    """Incident-shaped prompts (small ones first, the large one read last) at the default verbosity."""
    sent, statuses = _overflow(env, "b", [1500, 4500, 9000, 21000], LONG)
    assert statuses == [500] * 4, statuses
    figures = {name: _lead(env, name, "b", sent) for name in ("b_http", "b_log")}
    env.figures["prompt_overflow_default_verbosity"] = figures
    for name, lead in figures.items():
        assert lead["lead_s"] > 0, (name, lead)
    report = diagnose.diagnose_file(str(env.b.log_file))
    failure = report.runs[-1].failures[-1]
    assert failure.predictable_line is not None and failure.predictable_line < failure.line, failure
    assert (failure.predictable_lead_s or 0) > 0, failure


def test_4_generation_overflow_with_server_url(env: Env) -> None:
    """Prompts for 80 % of a pool and long generations: the page comes while the pool grows token by token."""
    sent, statuses = _overflow(env, "c", [6550, 6550], 8000)
    assert statuses == [500] * 2, statuses
    lead = _lead(env, "c_http", "c", sent)
    with env.watch._lock:
        warned = env.watch.firing.get(("LlamaCppKVPoolOverflowPossible", "c_http"))
    lead["overflow_possible_warned_after_s"] = None if warned is None else round(warned - sent, 1)
    env.figures["generation_overflow_server_url"] = lead
    assert lead["lead_s"] > 0, lead
    # The warning waits a minute (its for:); a fill that takes longer than that plus a few evaluations gets it first.
    if lead["abort_after_s"] >= 80:
        assert warned is not None and warned < env.watch.exceeded["c"], lead
