"""Benchmark: `llamacpp-exporter diagnose` on a big log (1 GiB by default) built from real captures.

The log repeats every real llama-server b11434 capture (tests/fixtures/b11434/*/llama-server.log,
copies of shared/captures/b11434) until it reaches the size asked for: each repetition of a capture
is one more server run, so the file holds thousands of runs, retry cascades and aborts. diagnose runs
in a subprocess; the script prints its wall time, throughput and peak RSS, and checks the report's
totals against what was written.

    $ .venv/bin/python bench/diagnose_big.py            # 1 GiB
    $ .venv/bin/python bench/diagnose_big.py --size-mb 20
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))  # the log builder the tests use too

from big_log import build_log  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--size-mb", type=float, default=1024.0, help="log size in MiB (default 1024)")
    ap.add_argument("--dir", type=Path, default=None, help="where to build the log (default: a temporary directory)")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="diagnose-big-", dir=args.dir) as tmp:
        t0 = time.perf_counter()
        built = build_log(Path(tmp) / "llama-server.log", int(args.size_mb * 1024 * 1024))
        print(
            f"built {built.bytes / 1e6:,.0f} MB ({built.bytes / 2**20:,.0f} MiB) in {time.perf_counter() - t0:.1f} s: "
            f"{built.repetitions:,} x {built.runs // built.repetitions} captures = {built.runs:,} server runs, "
            f"{built.failures:,} failures, {built.aborted_requests:,} aborted requests, {built.retries:,} retries"
        )
        out = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "exporter", "diagnose", str(built.path), "--json"]
        t0 = time.perf_counter()
        with out.open("wb") as stdout:
            proc = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE, cwd=REPO, check=False)
        wall = time.perf_counter() - t0
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        peak_kib = usage.ru_maxrss  # KiB on Linux
        cpu = usage.ru_utime + usage.ru_stime
        if proc.returncode not in (0, 1):
            print(proc.stderr.decode(errors="replace"), file=sys.stderr)
            return 1
        report = json.loads(out.read_text())
        print(
            f"diagnose: {wall:.1f} s wall ({cpu:.1f} s CPU), {built.bytes / 1e6 / wall:,.1f} MB/s, "
            f"peak RSS {peak_kib / 1024:,.1f} MiB, exit status {proc.returncode}"
        )
        got = (report["runs_total"], report["failures_total"], report["aborted_requests_total"])
        want = (built.runs, built.failures, built.aborted_requests)
        print(f"report: runs, failures, aborted requests = {got} (written: {want})")
        if got != want:
            print("MISMATCH", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
