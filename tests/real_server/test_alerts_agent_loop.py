"""On a real llama-server: coding agents' turns with tool gaps fill the shared KV pool, and the shipped page
(LlamaCppKVPoolSaturated) comes before llama-server aborts the requests in flight.

Real llama-server b11434 (`-c 8192 -np 3 -kvu`, default verbosity, a slow random-weight model), the exporter
with `--server-url`, a real Prometheus scraping and evaluating every second with the shipped
`alerts/llamacpp-rules.yml` (tests/support/agent_loop.py). Three agents each send their whole conversation,
run their tools for 3-8 s, and come back with it longer; their slots are idle between turns and cleared to
the prompt cache by each other's starts, so the pool's usage dips and comes back while the conversations
grow. The order is asserted, not a margin: the page became active (Prometheus' activeAt, an evaluation
time) before the `Context size has been exceeded` line was seen in the log. A page caused by the abort
would need two samples after it (the rule reads two), so it could not be active before the line. The lead
and what the page read are printed (`pytest -s`); bench/agent_loop_page.py runs the same with other seeds.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest
from agent_loop import EXCEEDED, PAGE, run_agent_loop
from prom_harness import find_prometheus

pytestmark = [pytest.mark.llama_server, pytest.mark.promtool]


def _missing(what: str) -> NoReturn:
    hint = "run scripts/unpack-test-tools.sh"
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no"):
        pytest.fail(f"{what} not found under CI: {hint}", pytrace=False)
    pytest.skip(f"{what} not found: {hint}")


def _since(at: float | None, begin: float) -> str:
    return "never" if at is None else f"+{at - begin:.1f}s"


def test_an_agent_loop_fill_pages_before_the_abort(llama_server_bin: Path, tmp_path: Path) -> None:
    prometheus = find_prometheus() or _missing("prometheus")
    run = run_agent_loop(llama_server_bin, prometheus, tmp_path, seed=1, step=40, timeout=1200)
    report = (
        f"turns {run.turns}, abort line at {_since(run.abort_line_seen, run.begin)}, "
        f"page active at {_since(run.page_active_at, run.begin)}, lead {run.lead_s}s; "
        f"at the page {run.at_page}; critical alerts firing when the abort showed: {run.alerts_before_abort}"
    )
    print(report)
    assert run.abort_line_seen is not None, f"no '{EXCEEDED}' line: the agents never overflowed the pool\n{report}"
    assert run.page_active_at is not None, f"{PAGE} never fired\n{report}"
    # The agents ran turns with tool gaps before the overflow: it is the loop that filled the pool.
    assert run.turns >= 6, report
    lead = run.lead_s
    assert lead is not None and lead > 0, f"the page came after the abort\n{report}"
