"""bench/cpu_paired.py's measuring side, in process on this checkout: it builds the exporter through the
same assembly as the log goldens (tests/support/assembly.py), follows corpus blocks and renders both states
(the driver, which starts two processes, is the bench's own)."""

from __future__ import annotations

import contextlib
import importlib.util
from pathlib import Path
from types import ModuleType

from paths import B11434, REPO


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cpu_paired", REPO / "bench" / "cpu_paired.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_worker_follows_blocks_and_renders_both_states(tmp_path: Path) -> None:
    bench = _bench()
    corpus = tmp_path / "corpus.log"
    corpus.write_bytes((B11434 / "exhaust-lv4" / "llama-server.log").read_bytes())
    total = len(corpus.read_bytes().splitlines())
    with contextlib.ExitStack() as stack:
        worker = bench.Worker(REPO, corpus, 100, tmp_path, stack)
        assert len(worker.blocks) == -(-total // 100)
        read = [worker.line(k) for k in range(len(worker.blocks))]
        assert sum(n for _, n in read) == total and all(cpu >= 0 for cpu, _ in read)
        cpu, renders = worker.scrape("scrape", 3)
        assert renders == 3 and cpu >= 0
        body = bench._render(worker.plain).decode()
        assert "llamacpp_slots 4.0" in body and "llamacpp_kv_retries_total 26.0" in body  # counted live
        worker.scrape("router_scrape", 1)
        routed = bench._render(worker.router).decode()
        assert 'llamacpp_slots{model="alpha"}' in routed and 'llamacpp_slots{model="beta"}' in routed
