"""Benchmark: what one read of llama-server's process costs, by the /proc reader and by the psutil reader.

    $ .venv/bin/python bench/process_sources.py            # about a minute on 2 cores
    $ .venv/bin/python bench/process_sources.py --quick

Both readers run on this Linux host against the same real processes, alternating read by read so that
the machine's load falls on both. A read is what every scrape does for `source="proc"`: find the
process (or confirm the one found is still the same), read its RSS, start time, command line and
environment, and the host's memory. Three cases:

- ``found``: the server is running and was found before: the steady state of every scrape;
- ``scan, log absent``: our log does not exist yet while another llama-server runs: every process's
  name and command line are read at each scrape (nothing is cached while no server is ours);
- ``scan, nothing writes``: our log exists and no process writes it: after the names, every process's
  open files are read (the search for a renamed binary).

The server is the real llama-server (b11434, `LLAMA_SERVER_BIN` or the tests' build) with the tests'
tiny model when it is installed, else a stand-in process named llama-server. The process table is
filled up to `--processes` (default 400, a desktop's) with sleeping processes. Prints milliseconds per
read (median, p90) and CPU milliseconds per read, and the ratio psutil/procfs.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import psutil  # noqa: E402
from llama_harness import LlamaServer, find_llama_server  # noqa: E402
from tiny_gguf import write_tiny_llama  # noqa: E402

from exporter.sources.process import ProcessFinder  # noqa: E402
from exporter.sources.procfs import ProcReader  # noqa: E402
from exporter.sources.psutil_reader import PsutilReader  # noqa: E402


def pct(values: Sequence[float], q: float) -> float:
    """The q-quantile (0-1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


@contextmanager
def filler(count: int) -> Iterator[None]:
    """`count` more sleeping processes on the host (each with a command line and a few open files)."""
    procs = [subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL) for _ in range(max(0, count))]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextmanager
def server(work: Path) -> Iterator[tuple[int, Path, str]]:
    """(pid, its log file, what it is) of a running llama-server: the real one when installed."""
    binary = find_llama_server()
    log = work / "llama-server.log"
    if binary is not None:
        model = write_tiny_llama(work / "tiny-llama.gguf")
        with LlamaServer(binary, model, ["-c", "1024", "-np", "2", "-kvu", "-t", "1"], log_file=log) as srv:
            yield srv.pid, log, f"llama-server b11434 ({binary})"
        return
    log.write_text("")
    script = "import time; time.sleep(600)"
    cmd = ["bash", "-c", f'exec -a llama-server "$0" -c "{script}" --log-file "$1" -c 1024', sys.executable, str(log)]
    stand_in = subprocess.Popen(cmd)
    try:
        while psutil.Process(stand_in.pid).cmdline()[:1] != ["llama-server"]:
            time.sleep(0.01)
        yield stand_in.pid, log, "a stand-in process named llama-server (no llama-server installed)"
    finally:
        stand_in.kill()
        stand_in.wait()


def measure(readers: dict[str, ProcessFinder], rounds: int) -> dict[str, tuple[list[float], list[float]]]:
    """Wall and CPU milliseconds of each read, the readers alternating read by read."""
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in readers}
    for reader in readers.values():
        reader.read()  # the first read finds the process; later ones are what a scrape costs
    for _ in range(rounds):
        for name, reader in readers.items():
            wall, cpu = time.perf_counter(), time.process_time()
            reader.read()
            out[name][0].append((time.perf_counter() - wall) * 1000)
            out[name][1].append((time.process_time() - cpu) * 1000)
    return out


def cases(pid: int, log: Path, work: Path) -> dict[str, Callable[[], dict[str, ProcessFinder]]]:
    absent = str(work / "not-yet" / "llama-server.log")
    unwritten = work / "nobody-writes.log"
    unwritten.write_text("")
    return {
        "found": lambda: {"procfs": ProcReader(log_file=str(log)), "psutil": PsutilReader(log_file=str(log))},
        "scan, log absent": lambda: {"procfs": ProcReader(log_file=absent), "psutil": PsutilReader(log_file=absent)},
        "scan, nothing writes": lambda: {
            "procfs": ProcReader(log_file=str(unwritten)),
            "psutil": PsutilReader(log_file=str(unwritten)),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=400, help="fill the process table up to this many")
    ap.add_argument("--rounds", type=int, default=200, help="reads of each reader per case")
    ap.add_argument("--quick", action="store_true", help="50 reads per case")
    args = ap.parse_args(argv)
    rounds = 50 if args.quick else args.rounds
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="process-sources-")))
        pid, log, what = stack.enter_context(server(work))
        stack.enter_context(filler(args.processes - len(psutil.pids())))
        print(f"server: {what}, pid {pid}; {len(psutil.pids())} processes on the host; {rounds} reads each\n")
        print("| case | reader | ms per read, median | p90 | CPU ms per read | psutil / procfs |")
        print("|---|---|---|---|---|---|")
        for case, build in cases(pid, log, work).items():
            readers = build()
            found = {n: r.read().process for n, r in readers.items()}
            if case == "found":
                assert all(p is not None and p.pid == pid for p in found.values()), found
            else:
                assert all(p is None for p in found.values()), found
            times = measure(readers, rounds)
            medians = {n: statistics.median(w) for n, (w, _) in times.items()}
            for name, (wall, cpu) in times.items():
                ratio = f"{medians['psutil'] / medians['procfs']:.2f}x" if name == "psutil" else ""
                print(
                    f"| {case} | {name} | {medians[name]:.3f} | {pct(wall, 0.9):.3f} | "
                    f"{statistics.mean(cpu):.3f} | {ratio} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
