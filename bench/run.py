"""Benchmark: the exporter against mtail 3 on the same llama-server log. Prints a table.

    $ .venv/bin/python bench/run.py            # the issue's sizes: about 5 minutes on 2 cores
    $ .venv/bin/python bench/run.py --quick    # smaller sizes, for a first look (about 2 minutes)

Every measurement runs real processes: `python -m exporter` (HTTP server, watchdog, live sources off)
and `mtail` (Debian's mtail 3, with bench/llama.mtail extracting the same families), on a
deterministic corpus stitched from real llama-server b11434 captures (bench/make_corpus.py).

- bulk: the exporter's tailer + parser + state catching up on the corpus (bench/bulk_exporter.py)
  against `mtail --one_shot`, alternated A B A B; lines/s over each process' wall time, CPU seconds
  and peak RSS from the child's rusage; the counts both extract must agree (checked).
- follow: a writer appends the steady corpus at 2,000 lines/s for 60 s while the exporter and mtail
  both follow the file, side by side in the same seconds (paired per window); then an idle window
  without writes; CPU, following and idle, from the threads' schedstat (ns resolution).
- latency: a task start and a retry line are appended to a quiet log and both /metrics are polled until their retry
  counter moves; and, while the follow writer goes on, the time from a flush until each /metrics
  counts its lines; and single scrapes at random moments, 0.5-2 s apart as Prometheus' would be,
  with how many of the lines written before each it missed (as ms of writing).
- scrape: /metrics response time with 4 slots, and with 64 slots plus 8 GPUs' worth of NVML series
  (the tests' fake pynvml, tests/support/fake_nvml.py, stands in for NVML), alternated.
- flood: 200,000 lines/s for 10 s while /metrics is scraped every 50 ms; RSS sampled.
- diagnose: bench/diagnose_big.py on a 1 GiB log, when present.

Medians with [min-max] over repetitions or windows; ratios are paired (same repetition or window).
The machine's load average is printed: on a shared machine every number moves with it.
"""

from __future__ import annotations

import argparse
import compileall
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from exporter_vs_mtail.bulk import bench_bulk, bench_diagnose
from exporter_vs_mtail.follow import bench_follow
from exporter_vs_mtail.processes import REPO, find_mtail, load, make_corpus
from exporter_vs_mtail.scrape import bench_flood, bench_scrape
from exporter_vs_mtail.table import Report

PHASES = ("bulk", "follow", "scrape", "flood", "diagnose")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, default=Path.home() / ".cache" / "llamacpp-exporter" / "bench")
    ap.add_argument("--lines", type=int, default=2_000_000, help="bulk corpus lines (default 2,000,000)")
    ap.add_argument("--seed", type=int, default=11434)
    ap.add_argument("--bulk-reps", type=int, default=3, help="bulk repetitions, each exporter then mtail")
    ap.add_argument("--follow-rate", type=int, default=2000, help="lines/s while following (default 2000)")
    ap.add_argument("--follow-seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=10.0, help="CPU sampling window, s (default 10)")
    ap.add_argument("--write-tick", type=float, default=0.01, help="the follow writer writes every N s (0.01)")
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--latency-samples", type=int, default=200, help="latency samples without other writes (200)")
    ap.add_argument("--load-latency-seconds", type=float, default=20.0, help="latency sampled while following (20)")
    ap.add_argument("--poll-step", type=float, default=0.002, help="latency: /metrics polled every N s (0.002)")
    ap.add_argument("--scrapes", type=int, default=500)
    ap.add_argument("--flood-rate", type=int, default=200_000)
    ap.add_argument("--flood-seconds", type=float, default=10.0)
    ap.add_argument("--diagnose-mb", type=float, default=1024.0, help="diagnose log size, MiB (default 1024)")
    ap.add_argument("--only", default=",".join(PHASES), help=f"comma-separated phases (default all: {PHASES})")
    ap.add_argument("--no-install", action="store_true", help="do not try to install mtail")
    ap.add_argument("--quick", action="store_true", help="small sizes for a first look")
    args = ap.parse_args(argv)
    if args.quick:
        args.lines, args.bulk_reps, args.follow_seconds, args.idle_seconds = 300_000, 2, 20.0, 10.0
        args.window, args.latency_samples, args.scrapes, args.flood_seconds = 5.0, 50, 200, 5.0
        args.load_latency_seconds = 5.0
        args.diagnose_mb = 100.0
    phases = {p.strip() for p in args.only.split(",") if p.strip()}
    args.workdir.mkdir(parents=True, exist_ok=True)

    report = Report()
    # The exporter's bytecode first, as `pip install` compiles it: where PYTHONDONTWRITEBYTECODE is set or
    # the checkout is read-only, every exporter started here would otherwise compile its sources again,
    # start-up time and peak memory that an installed exporter never spends.
    compileall.compile_dir(str(REPO / "exporter"), quiet=1)
    mtail = find_mtail(install=not args.no_install)
    if mtail:
        version = subprocess.run([mtail, "--version"], capture_output=True, text=True, check=False).stdout
        mtail_version = version.split(" git ")[0].strip()
    else:
        mtail_version = "missing"
        report.notes.append("mtail could not be found or installed: the mtail columns are empty")
    cores = os.cpu_count()
    print(f"machine: {cores} cores, load {load()}; Python {sys.version.split()[0]}; {mtail_version}", flush=True)
    load_start = load()
    t0 = time.monotonic()
    if "bulk" in phases:
        bench_bulk(report, args, make_corpus(args.workdir, args.lines, args.seed, 1), mtail)
    steady = None
    if phases & {"follow", "flood"}:
        steady = make_corpus(args.workdir, 2_000_000, args.seed, 1000)
    if "follow" in phases and steady:
        bench_follow(report, args, steady, mtail)
    if "scrape" in phases:
        bench_scrape(report, args)
    if "flood" in phases and steady:
        bench_flood(report, args, steady)
    if "diagnose" in phases:
        bench_diagnose(report, args)
    report.notes.append(
        f"{cores} cores; load average (1/5/15 min) {load_start} at the start, {load()} at the end; "
        f"{time.monotonic() - t0:.0f} s in all; {mtail_version}"
    )
    print()
    report.print()
    return 0 if all(r.met is not False for r in report.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
