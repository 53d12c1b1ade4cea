"""Paired CPU bench between two revisions: CPU a log line costs, and CPU a scrape costs, A against B.

    $ .venv/bin/python bench/cpu_paired.py e0aa933 main              # two git revisions of this repository
    $ .venv/bin/python bench/cpu_paired.py /path/to/a /path/to/b      # or two checkouts
    $ .venv/bin/python bench/cpu_paired.py HEAD HEAD                  # the same twice: the noise floor

A revision is exported (`git archive` of its `exporter/` and `tests/support/`) into a temporary folder; a
path that is a folder is used as it is. Each revision runs in a fresh process of its own with its checkout
first on `sys.path`; the two processes run side by side and take turns, one block of work at a time,
A B B A A B …, so that both meet the same load on a shared machine (another process on the same core
slows the CPU time of a block too). Each process builds the exporter as `llamacpp-exporter` does,
through the checkout's own `tests/support/assembly.py` (the tests' production assembly; a checkout older
than it uses that helper's first version, `FIRST_ASSEMBLY`), live sources off, and times its own work with
`time.process_time` (its CPU time, user and system; not wall time):

- line: a block is `--block` lines of the corpus (`bench/make_corpus.py`: real b11434 runs stitched,
  `--lines` lines) appended to the log the exporter follows, then read, split, parsed and applied to the
  state (`LogTailer.poll` → `LogPipeline.feed`, as the follower does); CPU µs a line. Both processes read
  the same blocks in the same order, so each pair of blocks is the same work.
- scrape: a block is `--renders` renders of the `/metrics` body (as the web app renders it for a scrape
  without an Accept header: the checkout's `Assembly.render`) of the state after the corpus (one server:
  its slots, checkpoints, histograms, the process metrics); CPU µs a scrape.
- router scrape: the same, of the router capture with both children loaded (tests/fixtures/router: each
  child's series labelled).

This is done `--runs` times, each with two fresh processes. Printed: each revision's median CPU µs a line
and a scrape over all blocks, and the paired ratio B/A (each block of B over its partner of A): the
median with the quartiles and the range. A ratio above 1 means B costs more.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import IO, Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
ROUTER_LOG = REPO / "tests" / "fixtures" / "router" / "router.log"
#: The router capture's lines up to where both children run (tests/support/log_goldens.py's ROUTER_LOADED).
ROUTER_LOADED = 648
FIGURES = ("line", "scrape", "router_scrape")


# -- a measuring process (one checkout) ---------------------------------------------------------------
#: The assembly helper's first version, written for the build of its time (`single_server`, `LogPipeline` in
#: logs/): what a checkout older than the helper is measured through.
FIRST_ASSEMBLY = "7138fa9"


def _assembly(checkout: Path) -> ModuleType:
    """The checkout's `tests/support/assembly.py`, or, for a checkout older than it, the helper's first version."""
    path = checkout / "tests" / "support" / "assembly.py"
    if not path.exists():
        first = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{FIRST_ASSEMBLY}:tests/support/assembly.py"],
            check=True,
            capture_output=True,
        ).stdout
        with tempfile.NamedTemporaryFile("wb", suffix=".py", prefix="first_assembly_", delete=False) as f:
            f.write(first)  # a temporary file: a checkout folder given as it is stays untouched
        path = Path(f.name)
    spec = importlib.util.spec_from_file_location("assembly", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _follow(exporter: Any) -> int:
    """Read the log to its end through the assembly; the lines read (revision-dependent: one place)."""
    if hasattr(exporter, "follow"):
        return int(exporter.follow())
    return int(exporter.write(b""))


def _render(exporter: Any) -> bytes:
    """One /metrics body of the assembly's registry (revision-dependent: one place)."""
    if hasattr(exporter, "render"):
        return bytes(exporter.render())
    from prometheus_client import generate_latest

    return generate_latest(exporter.registry)


def _refresh(exporter: Any) -> None:
    """What precedes a scrape (a router's children opened), done before the timed renders."""
    if hasattr(exporter, "refresh"):
        exporter.refresh()
    else:
        exporter.scrape()


class Worker:
    """The exporter of one checkout, built twice: following the corpus block by block, and the router."""

    def __init__(self, checkout: Path, corpus: Path, block: int, tmp: Path, stack: contextlib.ExitStack) -> None:
        import exporter as package

        if not Path(package.__file__).resolve().is_relative_to(checkout.resolve()):
            raise SystemExit(f"exporter imported from {package.__file__}, not from {checkout}")
        assembly = _assembly(checkout)
        lines = corpus.read_bytes().splitlines(keepends=True)
        self.blocks = [b"".join(lines[i : i + block]) for i in range(0, len(lines), block)]
        self.log = tmp / "llama-server.log"
        self.log.write_bytes(b"")
        self.plain = stack.enter_context(assembly.assembled(self.log))
        routed = tmp / "router.log"
        routed.write_bytes(b"".join(ROUTER_LOG.read_bytes().splitlines(keepends=True)[:ROUTER_LOADED]))
        self.router = stack.enter_context(assembly.assembled(routed))
        _follow(self.router)
        _refresh(self.router)
        self.sizes = {"scrape": 0, "router_scrape": len(_render(self.router))}

    def line(self, k: int) -> tuple[float, int]:
        """CPU seconds to follow block `k` (written untimed), and its lines."""
        with self.log.open("ab") as f:
            f.write(self.blocks[k])
        cpu = time.process_time()
        n = _follow(self.plain)
        return time.process_time() - cpu, n

    def scrape(self, which: str, renders: int) -> tuple[float, int]:
        """CPU seconds for `renders` renders of the plain server's or the router's body."""
        exporter = self.plain if which == "scrape" else self.router
        if not self.sizes[which]:
            _refresh(exporter)
            self.sizes[which] = len(_render(exporter))  # once untimed: first-call costs left out
        cpu = time.process_time()
        for _ in range(renders):
            _render(exporter)
        return time.process_time() - cpu, renders


def serve(checkout: Path, corpus: Path, block: int) -> None:
    """A measuring process: one JSON line per command read from stdin (`line K`, `scrape N`,
    `router_scrape N`); the first line says how many blocks there are."""
    import logging

    logging.disable(logging.WARNING)  # the exporter's warnings about the corpus' verbosity
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        worker = Worker(checkout, corpus, block, Path(tmp), stack)
        print(json.dumps({"blocks": len(worker.blocks)}), flush=True)
        for command in sys.stdin:
            what, arg = command.split()
            cpu, n = worker.line(int(arg)) if what == "line" else worker.scrape(what, int(arg))
            print(json.dumps({"cpu": cpu, "n": n, "size": worker.sizes.get(what, 0)}), flush=True)


# -- the driver ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def checkout_of(spec: str, tmp: Path, name: str) -> Iterator[Path]:
    """A folder holding revision `spec` (a folder as it is, else `git archive` of the revision)."""
    if Path(spec).is_dir():
        yield Path(spec).resolve()
        return
    folder = tmp / name
    folder.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", spec, "exporter", "tests/support"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        safe: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # 3.12+ wants one
        tar.extractall(folder, **safe)
    # Compiled once, before any timed run: every process then reads the same .pyc files.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder / "exporter")], check=True)
    yield folder


class Process:
    """A measuring process of one checkout, driven over its stdin and stdout."""

    def __init__(self, checkout: Path, corpus: Path, block: int) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        argv = [sys.executable, str(Path(__file__).resolve()), "--serve", str(checkout), str(corpus), str(block)]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.blocks = int(self._answer()["blocks"])

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a measuring process ended (exit code {self.proc.wait()}); see its errors above")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ask(self, command: str) -> dict[str, Any]:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(command + "\n")
        stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


def one_run(a: Path, b: Path, corpus: Path, args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    """Two fresh processes taking turns; per figure, (A, B) CPU µs a unit for each pair of blocks."""
    pa, pb = Process(a, corpus, args.block), Process(b, corpus, args.block)
    pairs: dict[str, list[tuple[float, float]]] = {f: [] for f in FIGURES}
    sizes: dict[str, tuple[int, int]] = {}
    try:
        commands = [("line", f"line {k}") for k in range(pa.blocks)]
        commands += [(f, f"{f} {args.renders}") for f in ("scrape", "router_scrape") for _ in range(args.scrape_pairs)]
        for i, (figure, command) in enumerate(commands):
            first, second = (pa, pb) if i % 2 == 0 else (pb, pa)  # A B, B A: neither always goes first
            x, y = first.ask(command), second.ask(command)
            ra, rb = (x, y) if first is pa else (y, x)
            if ra["n"] != rb["n"]:
                raise SystemExit(f"{command}: A read {ra['n']} lines, B {rb['n']}: not the same work")
            pairs[figure].append((ra["cpu"] / ra["n"] * 1e6, rb["cpu"] / rb["n"] * 1e6))
            if figure != "line":
                sizes[figure] = (ra["size"], rb["size"])
    finally:
        pa.close()
        pb.close()
    print(f"  bodies (bytes, A / B): {sizes}", flush=True)
    return pairs


def _quartiles(values: Sequence[float]) -> str:
    q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return f"{statistics.median(values):.3f} [{q1:.3f}-{q3:.3f}] ({min(values):.3f}-{max(values):.3f})"


def report(args: argparse.Namespace, pairs: dict[str, list[tuple[float, float]]]) -> dict[str, Any]:
    """Print the table; return its figures."""
    print(f"A = {args.a}   B = {args.b}   {args.runs} runs; CPU µs (time.process_time), median [quartiles] (range)")
    summary: dict[str, Any] = {"a": args.a, "b": args.b, "runs": args.runs}
    for figure in FIGURES:
        a = [x for x, _ in pairs[figure]]
        b = [y for _, y in pairs[figure]]
        ratio = [y / x for x, y in pairs[figure]]
        summary[figure] = {
            "a_median_us": statistics.median(a),
            "b_median_us": statistics.median(b),
            "ratio_median": statistics.median(ratio),
            "ratio_quartiles": statistics.quantiles(ratio, n=4) if len(ratio) > 1 else [ratio[0]] * 3,
            "total_ratio": sum(b) / sum(a),
            "pairs": len(ratio),
        }
        unit = "a line" if figure == "line" else "a scrape"
        print(f"{figure} ({len(ratio)} pairs of blocks), CPU µs {unit}:")
        print(f"  A    {_quartiles(a)}")
        print(f"  B    {_quartiles(b)}")
        print(f"  B/A  {_quartiles(ratio)}   (sum B / sum A: {summary[figure]['total_ratio']:.3f})")
    print(f"load average {os.getloadavg()[0]:.2f}")
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("a", nargs="?", help="revision or checkout folder A (the base)")
    ap.add_argument("b", nargs="?", help="revision or checkout folder B (compared with A)")
    ap.add_argument("--runs", type=int, default=3, help="runs, each with two fresh processes (default 3)")
    ap.add_argument("--lines", type=int, default=200_000, help="corpus lines (default 200,000)")
    ap.add_argument("--block", type=int, default=5_000, help="corpus lines a block (default 5,000)")
    ap.add_argument("--renders", type=int, default=20, help="renders a scrape block (default 20)")
    ap.add_argument("--scrape-pairs", type=int, default=30, help="pairs of scrape blocks a run, each state (30)")
    ap.add_argument("--seed", type=int, default=11434)
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--serve", nargs=3, metavar=("CHECKOUT", "CORPUS", "BLOCK"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:  # a measuring process: its checkout first on sys.path
        checkout, corpus, block = Path(args.serve[0]), Path(args.serve[1]), int(args.serve[2])
        sys.path.insert(0, str(checkout))
        serve(checkout, corpus, block)
        return 0
    if not args.a or not args.b:
        ap.error("two revisions or checkout folders are needed")
    pairs: dict[str, list[tuple[float, float]]] = {f: [] for f in FIGURES}
    with tempfile.TemporaryDirectory(prefix="cpu-paired-") as name:
        tmp = Path(name)
        corpus = tmp / "corpus.log"
        make = [sys.executable, str(HERE / "make_corpus.py"), "--out", str(corpus), "--lines", str(args.lines)]
        subprocess.run([*make, "--seed", str(args.seed)], check=True, stdout=subprocess.DEVNULL)
        with checkout_of(args.a, tmp, "a") as a, checkout_of(args.b, tmp, "b") as b:
            for run in range(args.runs):
                print(f"run {run + 1} of {args.runs}", flush=True)
                for figure, found in one_run(a, b, corpus, args).items():
                    pairs[figure] += found
    summary = report(args, pairs)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
