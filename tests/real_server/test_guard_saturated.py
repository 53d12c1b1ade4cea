"""The guard's protection on a saturated host (b11434): the generation-driven overflow of unknown budgets while a
CPU burner runs on every core, so that llama-server, its `/slots` answers and the guard itself are all starved.

`LLAMACPP_EXPORTER_GUARD_SATURATED_RUNS=N` repeats the run N times (default 1).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, LlamaServer, free_port, run_concurrent_completions, wait_for
from tiny_gguf import write_slow_llama

pytestmark = pytest.mark.llama_server

# Budgets the guard cannot know: the server's own -n 400, and clients that send none (the guard counts its
# default of 32). 3 x (40 + 400) cells overflow the 1,024-cell pool while they generate; 2 fit.
UNKNOWN_BUDGETS = ("-c", "1024", "-np", "4", "-kvu", "-t", "2", "-n", "400")
RUNS = int(os.environ.get("LLAMACPP_EXPORTER_GUARD_SATURATED_RUNS", "1"))
# A busy loop that ends by itself after argv[1] seconds, whatever happens to the test.
BURN = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


@contextmanager
def every_core_busy(seconds: float = 900) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One CPU burner per core, started here and stopped by its own pid."""
    burners = [
        subprocess.Popen([sys.executable, "-c", BURN, str(seconds)], stdin=subprocess.DEVNULL)
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield burners
    finally:
        for b in burners:
            b.kill()
            b.wait(10)


class Guarded:
    def __init__(self, server: LlamaServer, exporter: ExporterProcess) -> None:
        self.server, self.exporter = server, exporter

    def outcome(self, outcome: str) -> float:
        value = self.exporter.sample("llamacpp_guard_requests_total", {"outcome": outcome})
        assert value is not None
        return value


@pytest.fixture(scope="module")
def unknown_budgets(llama_server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Guarded, str]]:
    tmp = tmp_path_factory.mktemp("guard-saturated")
    model = write_slow_llama(tmp / "slow-llama.gguf")
    with LlamaServer(llama_server_bin, model, UNKNOWN_BUDGETS, log_file=tmp / "llama-server.log") as server:
        port = free_port()
        exporter = ExporterProcess(
            server.log_file,
            [
                *("--server-url", server.url, "--nvml", "off", "--guard.listen-address", f"127.0.0.1:{port}"),
                *("--guard.default-budget", "32"),
            ],
            output_file=tmp / "exporter.out",
        ).start()
        try:
            wait_for(lambda: exporter.sample("llamacpp_kv_pool_capacity_tokens") == 1024, timeout=30)
            yield Guarded(server, exporter), f"http://127.0.0.1:{port}"
        finally:
            exporter.stop()


@pytest.mark.parametrize("run", range(RUNS))
def test_acceptance_generation_overflow_on_a_saturated_host_aborts_nothing(
    unknown_budgets: tuple[Guarded, str], run: int
) -> None:
    """Three requests without max_tokens outgrow the pool while every core is busy with other work: none is
    aborted by llama-server, each answer is whole (the stopped one replayed)."""
    g, guard = unknown_budgets
    exceeded = len(g.server.log_lines("Context size has been exceeded"))
    preempted, replayed = g.outcome("preempted"), g.outcome("replayed")
    with every_core_busy() as burners:
        through = run_concurrent_completions(guard, 3, prompt_chars=40, n_predict=-1, timeout=600)
        assert all(b.poll() is None for b in burners)  # the cores were busy for the whole run
    assert [s for s, _ in through] == [200] * 3, [b.get("error") for _, b in through]
    assert all(b["tokens_predicted"] == 400 for _, b in through)
    assert len(g.server.log_lines("Context size has been exceeded")) == exceeded
    # The overflow was coming: it was stopped (or admission held a request back while the guard was blind).
    assert g.outcome("preempted") - preempted == g.outcome("replayed") - replayed
    stops = [
        line.split("finish: ", 1)[-1] for line in g.exporter.output_file.read_text().splitlines() if "stopped" in line
    ]
    print(
        f"run {run}: load {os.getloadavg()[0]:.1f}, {g.outcome('preempted') - preempted:g} stopped, last: {stops[-1:]}"
    )
    wait_for(lambda: g.exporter.sample("llamacpp_guard_in_flight_requests") == 0, timeout=60)
