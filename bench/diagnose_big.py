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
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CAPTURES = REPO / "tests" / "fixtures" / "b11434"
_FATAL = re.compile(rb"Context size has been exceeded\. off = ")
_SEND_ERROR = re.compile(rb"send_error: task id = \d+, error: Context size has been exceeded")
_RETRY = re.compile(rb"retrying with smaller batch size")


@dataclass(frozen=True)
class BuiltLog:
    """What was written: the totals the report must show."""

    path: Path
    bytes: int
    repetitions: int
    runs: int
    failures: int
    aborted_requests: int
    retries: int


def capture_logs(root: Path = CAPTURES) -> list[bytes]:
    """The real captures, each as bytes ending in a newline."""
    logs = []
    for p in sorted(root.glob("*/llama-server.log")):
        data = p.read_bytes()
        logs.append(data if data.endswith(b"\n") else data + b"\n")
    if not logs:
        raise SystemExit(f"no captures under {root}")
    return logs


_FIRST_STAMP = re.compile(rb"^(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) |^(\{[^\n]*?\"time\":)(\d+)")


def distinct_run(log: bytes, k: int) -> bytes:
    """`log` as another start of the same server: its first line's time stamp k µs later.

    A real server never writes the same time stamps twice, and diagnose counts a run whose first
    lines (time stamps included) repeat an earlier run's as that run read twice; so a log made of
    one capture again and again moves each copy's first stamp.
    """
    m = _FIRST_STAMP.match(log)
    if m is None or k == 0:
        return log
    if m[6] is not None:
        return log[: m.start(6)] + str(int(m[6]) + k).encode() + log[m.end(6) :]
    us = ((int(m[1]) * 60 + int(m[2])) * 1000 + int(m[3])) * 1000 + int(m[4]) + k
    stamp = f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d} "
    return stamp.encode() + log[m.end() :]


def build_log(path: Path, size_bytes: int, root: Path = CAPTURES) -> BuiltLog:
    """Write the captures again and again into `path` until it holds at least `size_bytes`, each copy
    as a later start of its server (`distinct_run`)."""
    logs = capture_logs(root)
    block = b"".join(logs)
    reps = max(1, -(-size_bytes // len(block)))
    with path.open("wb") as f:
        for k in range(reps):
            f.write(block if k == 0 else b"".join(distinct_run(log, k) for log in logs))
    return BuiltLog(
        path=path,
        bytes=reps * len(block),
        repetitions=reps,
        runs=reps * len(logs),
        failures=reps * len(_FATAL.findall(block)),
        aborted_requests=reps * len(_SEND_ERROR.findall(block)),
        retries=reps * len(_RETRY.findall(block)),
    )


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
