"""Coding agents' turns fill a real llama-server's shared KV pool: does the shipped page come before the abort?

A check on real programs: its lead depends on the host's speed, so it prints what it measured and exits 1
only when the page did not come before the abort (or nothing overflowed). The run itself is
tests/support/agent_loop.py (the test tests/real_server/test_alerts_agent_loop.py asserts its order for one
seed); this runs it with any seed and step.

    .venv/bin/python bench/agent_loop_page.py [--seed 1] [--step 60] [--timeout 900]

Prints, as JSON: when the page (LlamaCppKVPoolSaturated) started firing (Prometheus' activeAt), when the
`Context size has been exceeded` line appeared, the lead, and at the page: the slots processing, the usage,
the prompt demand and the active ratio (what it pages on).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from paths import TOOLS_BIN  # noqa: E402

# Prometheus as scripts/unpack-test-tools.sh unpacks it, first on PATH (as tests/conftest.py puts it).
os.environ["PATH"] = f"{TOOLS_BIN}{os.pathsep}{os.environ.get('PATH', '')}"

from agent_loop import POOL, run_agent_loop  # noqa: E402
from llama_harness import find_llama_server  # noqa: E402
from prom_harness import find_prometheus  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--step", type=int, default=60, help="words each turn adds to a conversation")
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    binary, prom_bin = find_llama_server(), find_prometheus()
    if binary is None or prom_bin is None:
        print("needs llama-server and prometheus: run scripts/bootstrap.sh", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        run = run_agent_loop(binary, prom_bin, Path(tmp), seed=args.seed, step=args.step, timeout=args.timeout)
    out: dict[str, Any] = {"pool": POOL, "seed": args.seed, "step_words": args.step, "turns": run.turns}
    if run.abort_line_seen is not None:
        out["abort_s"] = round(run.abort_line_seen - run.begin, 1)
    if run.page_active_at is not None:
        out["page_s"] = round(run.page_active_at - run.begin, 1)
        out["at_page"] = run.at_page
        out["abort_logged_when_page_seen"] = run.abort_logged_at_page
    out["critical_alerts_when_abort_seen"] = run.alerts_before_abort
    lead = run.lead_s
    if lead is not None:
        out["lead_s"] = round(lead, 1)
    print(json.dumps(out))
    return 0 if lead is not None and lead > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
