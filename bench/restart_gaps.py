"""Bench: a wrapper restarting llama-server on one log, followed without close events, at short restart gaps.

    $ .venv/bin/python bench/restart_gaps.py              # 200 trials, about 5 minutes on 2 busy cores
    $ .venv/bin/python bench/restart_gaps.py --runs 2     # a quick look

Windows and macOS get no close events (polling, or watchdog's backends there): the follower looks at the
file while it waits (`exporter.logs.follow.Probe`). Each trial is one wrapper: four llama-server runs on
one log, each opening it with mode "w" (a truncation), writing its lines one write() at a time, exiting,
and the next starting `gap` ms after the old one's last line (no waiting for the follower). Two writers:

- ``four-run``: the four real b11434 captures of tests/unit/test_tail_restarts.py, a line every few
  hundred microseconds in bursts of eight;
- ``continuous``: a debug-level server writing without a pause up to its exit (the lv4 capture twice per
  run, a line every ~0.2 ms).

Followed the exporter's way (LogTailer, LogPipeline, `pipeline.run`, poll 1 s, batches up to 2 s), by
polling and by watchdog without close events. A trial is ``exact`` when every byte was read and /metrics
equals the truth (every line of every run read), ``counted`` when what was not read is counted in
``lost_bytes`` (at least the bytes not read), ``SILENT`` otherwise: bytes neither read nor counted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from corpus_replay import exported  # noqa: E402
from watchdog.observers.polling import PollingObserver  # noqa: E402

from exporter.logs import watch as watch_mod  # noqa: E402
from exporter.logs.file_source import FileSource  # noqa: E402
from exporter.logs.tail import LogTailer  # noqa: E402
from exporter.model.state import ServerState  # noqa: E402
from exporter.pipeline import LogPipeline  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "b11434"
FOUR = [
    (FIXTURES / name / "llama-server.log").read_bytes()
    for name in ("pool-overflow-lv4", "pool-overflow-default", "per-slot-streams", "exhaust-default-verbosity")
]
CONTINUOUS = [(FIXTURES / "pool-overflow-lv4" / "llama-server.log").read_bytes() * 2] * 4
WRITERS = {"four-run": (FOUR, 8, 0.002), "continuous": (CONTINUOUS, 1, 0.0002)}  # runs, lines per burst, pause
GAPS_MS = (0, 10, 50, 100, 150)
MODES = ("polling", "watchdog-without-closes")


def truth(runs: list[bytes], log: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /metrics shows when every line of every run is read (each run truncating the log)."""
    state = ServerState()
    tailer = LogTailer(log)
    pipeline = LogPipeline(state, tailer)
    pipeline.replay_existing()
    for run in runs:
        log.write_bytes(b"")
        pipeline.feed(tailer.poll())
        log.write_bytes(run)
        while tailer.has_pending():
            pipeline.feed(tailer.poll())
    tailer.close()
    return exported(state)


def wrapper(log: Path, runs: list[bytes], burst: int, pause: float, gap: float, out: dict[str, int]) -> None:
    """The wrapper and its servers: a process of its own, as llama-server is (`--write`)."""
    for i, run in enumerate(runs):
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for n, line in enumerate(run.splitlines(keepends=True)):
            os.write(fd, line)
            out["written"] += len(line)
            if n % burst == burst - 1:
                time.sleep(pause)
        os.close(fd)
        if i < len(runs) - 1 and gap:
            time.sleep(gap)


async def trial(log: Path, runs: list[bytes], burst: int, pause: float, gap: float, mode: str) -> dict[str, int]:
    state = ServerState()
    tailer = LogTailer(log)
    pipeline = LogPipeline(
        state, FileSource(tailer, poll_interval=1.0, batch_interval=2.0, use_watchdog=mode != "polling")
    )
    pipeline.replay_existing()
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(stop=stop))
    await asyncio.sleep(0.5)  # following before the wrapper starts (an exporter runs long before its server)
    name = next(n for n, w in WRITERS.items() if w[0] is runs)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--write", str(log), name, str(gap), stdout=subprocess.PIPE
    )
    stdout, _ = await proc.communicate()
    out = {"written": int(stdout)}
    deadline = time.monotonic() + 3
    while tailer.stats.bytes + tailer.stats.lost_bytes < out["written"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(task, 10)
    tailer.close()
    s = tailer.stats
    return {
        "written": out["written"],
        "unread": out["written"] - s.bytes,
        "lost": s.lost_bytes,
        "truncations": s.truncations,
        "exact": int(exported(state) == truth(runs, log.with_name("truth.log"))),
    }


def verdict(r: dict[str, int], runs: int) -> str:
    if r["unread"] == 0 and r["lost"] == 0 and r["exact"] and r["truncations"] == runs - 1:
        return "exact"
    if r["unread"] > 0 and r["lost"] >= r["unread"]:
        return "counted"
    return "SILENT" if r["lost"] < r["unread"] else "wrong"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--gaps", type=int, nargs="*", default=list(GAPS_MS), help="milliseconds")
    ap.add_argument("--writers", nargs="*", default=list(WRITERS))
    ap.add_argument("--modes", nargs="*", default=list(MODES))
    ap.add_argument("--write", nargs=3, metavar=("LOG", "WRITER", "GAP_S"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        log, name, gap = args.write
        runs, burst, pause = WRITERS[name]
        out = {"written": 0}
        wrapper(Path(log), runs, burst, pause, float(gap), out)
        print(out["written"])
        return
    watch_mod.libc_with_inotify = lambda: None  # watchdog, as on macOS/Windows
    watch_mod.Observer = functools.partial(PollingObserver, timeout=0.1)
    print(f"{'mode':<24} {'writer':<11} {'gap':>4}  exact counted SILENT wrong  lost/unread (bytes, summed)")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes:
            for name in args.writers:
                runs, burst, pause = WRITERS[name]
                for gap in args.gaps:
                    tally: collections.Counter[str] = collections.Counter()
                    lost = unread = 0
                    for k in range(args.runs):
                        log = Path(tmp) / f"{mode}-{name}-{gap}-{k}" / "llama-server.stderr"
                        log.parent.mkdir()
                        r = asyncio.run(trial(log, runs, burst, pause, gap / 1000, mode))
                        tally[verdict(r, len(runs))] += 1
                        lost, unread = lost + r["lost"], unread + r["unread"]
                        if verdict(r, len(runs)) in ("SILENT", "wrong"):
                            print("   ", verdict(r, len(runs)), r, flush=True)
                    print(
                        f"{mode:<24} {name:<11} {gap:>4}  {tally['exact']:>5} {tally['counted']:>7} "
                        f"{tally['SILENT']:>6} {tally['wrong']:>5}  {lost}/{unread}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
