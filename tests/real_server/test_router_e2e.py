"""End to end with a real router: llama-server b11434 `--models-dir` with two models, real exporters, a
real Prometheus loading the shipped rules.

alpha is the slow model (its four prompts take seconds to read, so the page can come first), beta a
tiny one. Two exporters follow the router's log: one also reads the router's endpoints
(`--server-url`), one reads only the log. In one run of the router (every step once):

1. scraping loads nothing (the router's model list before and after);
2. both models loaded by requests: each model's slots and pool in both exporters equal its own
   `/slots?model=…&autoload=false`;
3. an overflow in alpha: the pool alert fires for alpha, with its name in the page, and none for
   beta; beta's series do not move;
4. beta unloaded: its series are gone, and scraping does not load it again;
5. alpha's child killed: counted as a crash, its series gone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from llama_harness import ExporterProcess, LlamaRouter, http_json, make_prompt, wait_for
from paths import REPO
from prom_harness import Prometheus, find_prometheus, prometheus_test_config
from prometheus_client.parser import text_string_to_metric_families
from tiny_gguf import write_slow_llama, write_tiny_llama

pytestmark = [pytest.mark.llama_server, pytest.mark.promtool]

ROOT = REPO
RULES = ROOT / "alerts" / "llamacpp-rules.yml"
# Two prompts of about 4,600 tokens overflow it. llama-server reads them one after the other and logs
# each one's size when it starts reading it: the second one's size (the page) comes with about 4,096 cells
# read, the abort at 8,192, seconds later on the slow model.
POOL = 8192
OVERFLOWING = 2
CHILD_ARGS = ["-c", str(POOL), "-np", "4", "-kvu", "-lv", "4", "-t", "2"]
#: The alerts that come before an overflow: the forecast (a warning, the guard's signal) and the page at 90 %.
AHEAD = ("LlamaCppKVPoolOverflowAhead", "LlamaCppKVPoolSaturated")
#: The pages that hold an overflow's incident once requests are lost.
PAGES = ("LlamaCppKVPoolRequestsAborted", "LlamaCppKVPoolSaturated")
#: What the log alone says about a model: these families must not move when another model overflows.
LOG_FAMILIES = (
    "llamacpp_slots",
    "llamacpp_slot_context_tokens",
    "llamacpp_slot_tokens",
    "llamacpp_slot_processing",
    "llamacpp_kv_pool_capacity_tokens",
    "llamacpp_kv_pool_used_tokens",
    "llamacpp_kv_retries_total",
    "llamacpp_kv_cascades_total",
    "llamacpp_context_exceeded_total",
    "llamacpp_requests_aborted_total",
    "llamacpp_server_starts_total",
    "llamacpp_exporter_log_lines_rejected_total",
)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _series(text: str, model: str | None = None) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if model is None or s.labels.get("model") == model:
                out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _of(series: Series, name: str) -> dict[str, float]:
    """slot → value (or "" → value) of one family's samples."""
    return {dict(labels).get("slot", ""): v for (n, labels), v in series.items() if n == name}


def _shows(exporter: ExporterProcess, text: str, *, present: bool = True) -> Callable[[], bool]:
    return lambda: (text in exporter.scrape()) == present


def _log_view(series: Series) -> Series:
    return {k: v for k, v in series.items() if k[0] in LOG_FAMILIES}


@pytest.fixture(scope="module")
def prometheus_bin() -> Path:
    found = find_prometheus()
    if found is None:
        pytest.skip("prometheus not found: run scripts/unpack-test-tools.sh")
    return found


@pytest.fixture(scope="module")
def stack(llama_server_bin: Path, prometheus_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    tmp = tmp_path_factory.mktemp("router-e2e")
    models = tmp / "models"
    write_slow_llama(models / "alpha.gguf")
    write_tiny_llama(models / "beta.gguf")
    with ExitStack() as stack:
        router = stack.enter_context(LlamaRouter(llama_server_bin, models, CHILD_ARGS, log_file=tmp / "router.log"))
        live = stack.enter_context(
            ExporterProcess(router.log_file, ["--server-url", router.url, "--nvml", "off"], output_file=tmp / "e1")
        )
        log_only = stack.enter_context(
            ExporterProcess(router.log_file, ["--http", "off", "--nvml", "off"], output_file=tmp / "e2")
        )
        config = prometheus_test_config(
            {"llamacpp": [live.url.removeprefix("http://")]}, [RULES], None, scrape_interval="1s"
        )
        prom = stack.enter_context(Prometheus(prometheus_bin, config))
        yield router, live, log_only, prom


def test_one_router_two_models(stack: Any) -> None:
    router, live, log_only, prom = stack
    # 1. Scraping loads nothing.
    assert router.models() == {"alpha": "unloaded", "beta": "unloaded"}
    for _ in range(3):
        live.scrape()
    wait_for(lambda: prom.query("llamacpp_router_children"), 20, what="Prometheus scraping the exporter")
    assert router.models() == {"alpha": "unloaded", "beta": "unloaded"}
    assert "model=" not in live.scrape()

    # 2. Both loaded by requests; each model's slots and pool equal its own /slots.
    for name in ("alpha", "beta"):
        status, body = router.complete(name, "Hello there", n_predict=4)
        assert status == 200, body
    for exporter in (live, log_only):
        wait_for(_shows(exporter, 'llamacpp_slots{model="beta"}'), 20, what="both children")
    for name in ("alpha", "beta"):
        code, slots = router.slots(name)
        assert code == 200, slots
        want = {str(s["id"]): float(s.get("n_prompt_tokens") or 0) for s in slots}
        for exporter in (live, log_only):
            # The request's last lines (its release) may still be on their way through the tailer.
            wait_for(
                lambda e=exporter, n=name, w=want: _of(_series(e.scrape(), n), "llamacpp_slot_tokens") == w,  # type: ignore[misc]
                10,
                interval=0.1,
                what=f"{name}'s slots in the exporter to equal /slots",
            )
            got = _series(exporter.scrape(), name)
            assert _of(got, "llamacpp_slot_tokens") == want, (name, exporter.extra)
            assert _of(got, "llamacpp_slot_context_tokens") == {str(s["id"]): float(s["n_ctx"]) for s in slots}
            assert _of(got, "llamacpp_kv_pool_capacity_tokens") == {"": POOL}
            assert _of(got, "llamacpp_kv_pool_used_tokens") == {"": sum(want.values())}

    for name in ("alpha", "beta"):
        for source in ("http", "proc"):
            assert live.sample("llamacpp_exporter_source_up", {"model": name, "source": source}) == 1, (name, source)
    code, health = http_json(live.url + "/healthz")
    assert code == 200 and health["sources"]["http of model beta"] == {"up": True, "error": None}, health

    # 3. An overflow in alpha: the page names alpha, beta's series stay as they were.
    beta_before = {e.url: _log_view(_series(e.scrape(), "beta")) for e in (live, log_only)}
    pool = stack_pool = ThreadPoolExecutor(OVERFLOWING)
    barrier = threading.Barrier(OVERFLOWING)

    def overflow_request() -> tuple[int, dict[str, Any]]:
        barrier.wait()  # released together, so that both prompts are in flight at once
        return router.complete(  # type: ignore[no-any-return]
            "alpha", make_prompt(5500), n_predict=8, timeout=120, ignore_eos=True, cache_prompt=False
        )

    started = time.monotonic()
    futures = [pool.submit(overflow_request) for _ in range(OVERFLOWING)]
    fired: list[dict[str, Any]] = []

    def paged() -> bool:
        fired.extend(a for a in prom.alerts() if a["labels"]["alertname"] in AHEAD and a["state"] == "firing")
        return bool(fired) or all(f.done() for f in futures)

    wait_for(paged, 120, interval=0.2, what="an alert ahead or the end of alpha's requests")
    paged_after = time.monotonic() - started
    answers = [f.result(timeout=120) for f in futures]
    aborted_after = time.monotonic() - started
    print(
        f"\npaged after {paged_after:.1f} s ({sorted({a['labels']['alertname'] for a in fired})}), "
        f"requests aborted after {aborted_after:.1f} s; summary: {fired[0]['annotations']['summary'] if fired else '-'}"
    )
    stack_pool.shutdown()
    assert [code for code, _ in answers] == [500] * OVERFLOWING, answers
    assert fired, "no alert fired before alpha's requests were aborted"
    assert {a["labels"].get("model") for a in fired} == {"alpha"}, fired
    assert all("model alpha" in a["annotations"]["summary"] for a in fired), fired
    # The lost requests page, for alpha alone (one page per incident: the one already up, or RequestsAborted).
    wait_for(
        lambda: any(
            a["labels"]["alertname"] in PAGES and a["labels"].get("model") == "alpha" and a["state"] == "firing"
            for a in prom.alerts()
        ),
        30,
        what="a page for alpha's lost requests",
    )
    assert not [a for a in prom.alerts() if a["labels"].get("model") == "beta"]
    for exporter in (live, log_only):
        # The clients' 500s can come before the router has copied the child's abort line into its log: wait
        # for the line to be read (a hang guard, not a margin), then the figures.
        wait_for(partial(_aborted_once, exporter), 60, what="alpha's abort line read")
        text = exporter.scrape()
        assert _log_view(_series(text, "beta")) == beta_before[exporter.url]
        alpha = _series(text, "alpha")
        assert _of(alpha, "llamacpp_context_exceeded_total") == {"": 1.0}
        assert (
            alpha[("llamacpp_requests_aborted_total", (("model", "alpha"), ("reason", "context_exceeded")))]
            == OVERFLOWING
        )

    # 4. beta unloaded: its series go; scraping does not load it again.
    router.unload("beta")
    for exporter in (live, log_only):
        wait_for(_shows(exporter, 'model="beta"', present=False), 20, what="beta's series to go")
    for _ in range(3):
        live.scrape()
    assert router.models() == {"alpha": "loaded", "beta": "unloaded"}
    assert live.sample("llamacpp_router_child_exits_total", {"outcome": "unloaded"}) == 1

    # 5. alpha's child killed: a crash; its series go too.
    router.kill9_child("alpha")
    wait_for(lambda: live.sample("llamacpp_router_child_exits_total", {"outcome": "crashed"}) == 1, 20, what="crash")
    assert 'model="alpha"' not in live.scrape()
    assert live.sample("llamacpp_router_children") == 0
    assert live.sample("llamacpp_router_child_starts_total") == 2
    assert router.models() == {"alpha": "unloaded", "beta": "unloaded"}


def _aborted_once(exporter: ExporterProcess) -> bool:
    return _of(_series(exporter.scrape(), "alpha"), "llamacpp_context_exceeded_total") == {"": 1.0}
