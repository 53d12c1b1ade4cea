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
  without writes; CPU from /proc/<pid>/stat, idle CPU from the threads' schedstat (ns resolution).
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
import contextlib
import functools
import http.client
import itertools
import json
import math
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
sys.path.insert(0, str(REPO / "tests" / "support"))  # the tests' fake NVML

from fake_nvml import GIB, FakeGpu, pynvml_env  # noqa: E402

MTAIL_PROG = BENCH / "llama.mtail"
CLK_TCK = os.sysconf("SC_CLK_TCK")
RETRY_LINE = (
    "W srv        decode: failed to find free space in the KV cache, retrying with smaller batch size, "
    "off = 0, n_batch = 256, ret = 1"
)


# ---------------------------------------------------------------------------------------------- numbers


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass
class Stat:
    """A measured quantity: its samples and how to print one."""

    values: list[float]
    fmt: str = "{:.3g}"

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def __str__(self) -> str:
        if not self.values:
            return "n/a"
        med = self.fmt.format(self.median)
        if len(self.values) == 1:
            return med
        return f"{med} [{self.fmt.format(min(self.values))}-{self.fmt.format(max(self.values))}]"


def ratio(a: Stat | None, b: Stat | None) -> Stat | None:
    """Paired ratios a_i / b_i."""
    if a is None or b is None or not a.values or len(a.values) != len(b.values):
        return None
    return Stat([x / y for x, y in zip(a.values, b.values, strict=True) if y], "{:.2f}x")


@dataclass
class Row:
    section: str
    measure: str
    exporter: Stat | str | None
    mtail: Stat | str | None = None
    ratio: Stat | None = None
    target: str = ""
    met: bool | None = None


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *args: object, **kwargs: object) -> None:
        self.rows.append(Row(*args, **kwargs))  # type: ignore[arg-type]

    def print(self) -> None:
        header = ("", "measure", "exporter", "mtail", "exporter/mtail", "target", "met")
        cells = [header]
        for r in self.rows:
            met = "" if r.met is None else ("yes" if r.met else "NO")
            cells.append(
                (
                    r.section,
                    r.measure,
                    str(r.exporter) if r.exporter is not None else "",
                    str(r.mtail) if r.mtail is not None else "",
                    str(r.ratio) if r.ratio is not None else "",
                    r.target,
                    met,
                )
            )
        widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
        for n, c in enumerate(cells):
            print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
            if n == 0:
                print("  ".join("-" * w for w in widths))
        for note in self.notes:
            print(f"* {note}")


def ts(i: int) -> str:
    """A llama-server elapsed timestamp (`min.ss.mmm.uuu`) for the i-th millisecond."""
    return f"{i // 60000}.{i // 1000 % 60:02d}.{i % 1000:03d}.000"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ---------------------------------------------------------------------------------------------- processes


class Child:
    """A process this benchmark started; CPU and memory from /proc."""

    def __init__(self, name: str, argv: list[str], workdir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.errfile = workdir / f"{name}.stderr"
        with self.errfile.open("wb") as err:  # a file, not a pipe: a chatty child must never block on it
            self.popen = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=REPO, env=env)
        self.pid = self.popen.pid

    def cpu_s(self) -> float:
        """utime + stime of the process (all threads, including those that ended), /proc/<pid>/stat."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def cpu_ns(self) -> int:
        """On-CPU nanoseconds summed over the live threads (/proc/<pid>/task/*/schedstat)."""
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
        return total

    def status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        return 0

    def stop(self) -> str:
        """SIGTERM, then SIGKILL; returns what the process wrote to stderr (last lines)."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        err = self.errfile.read_text(errors="replace")
        return "\n".join(err.strip().splitlines()[-5:])


def run_measured(argv: list[str], stdout_path: Path) -> tuple[float, float, float, int]:
    """Run to completion: (wall s, CPU s, peak RSS MiB, exit status), from the child's own rusage."""
    with stdout_path.open("wb") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE, cwd=REPO)
        assert p.stderr is not None
        err = p.stderr.read()
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}): {err.decode(errors='replace')[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, p.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Scraper:
    """GET /metrics over one kept-alive connection, like Prometheus."""

    def __init__(self, port: int, authorization: str | None = None) -> None:
        self.port = port
        self.headers = {"Authorization": authorization} if authorization else {}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def get(self) -> tuple[float, str]:
        """(seconds until the whole body was read, body)."""
        for attempt in range(2):
            t0 = time.perf_counter()
            try:
                self.conn.request("GET", "/metrics", headers=self.headers)
                resp = self.conn.getresponse()
                body = resp.read()
                return time.perf_counter() - t0, body.decode(errors="replace")
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def value(self, name: str) -> float | None:
        return metric_value(self.get()[1], name)

    def close(self) -> None:
        self.conn.close()


def metric_value(body: str, name: str) -> float | None:
    """Sum of the samples of `name` (any labels) in a text exposition; None if absent."""
    values = [float(m[1]) for m in re.finditer(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", body, re.MULTILINE)]
    return sum(values) if values else None


def wait_ready(child: Child, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.popen.poll() is not None:
            raise SystemExit(f"{child.name} exited at start: {child.stop()}")
        try:
            Scraper(port).get()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{child.name} did not answer on port {port} within {timeout:.0f} s")


def wait_until(predicate: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


# ---------------------------------------------------------------------------------------------- set-up


def find_mtail(install: bool) -> str | None:
    """mtail where scripts/unpack-test-tools.sh unpacks it, else on PATH; with ``install``, unpack it first."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llamacpp-exporter" / "tools"
    tools_bin = Path(os.environ.get("LLAMACPP_EXPORTER_TOOLS") or cache) / "bin"
    unpacked = tools_bin / "mtail"
    if not os.access(unpacked, os.X_OK) and not shutil.which("mtail") and install:
        print("mtail not found: unpacking Debian's mtail package (scripts/unpack-test-tools.sh) ...", flush=True)
        subprocess.run([str(REPO / "scripts" / "unpack-test-tools.sh")], check=False)
    return str(unpacked) if os.access(unpacked, os.X_OK) else shutil.which("mtail")


def make_corpus(workdir: Path, lines: int, seed: int, restart_every: int) -> Path:
    path = workdir / f"corpus-{lines}-{seed}-{restart_every}.log"
    if not path.exists():
        print(f"building {path.name} ...", flush=True)
        tmp = path.with_suffix(".tmp")
        cmd = [sys.executable, str(BENCH / "make_corpus.py"), "--out", str(tmp), "--lines", str(lines)]
        cmd += ["--seed", str(seed), "--restart-every", str(restart_every)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        tmp.rename(path)
    return path


@functools.cache
def exporter_help() -> str:
    argv = [sys.executable, "-m", "exporter", "--help"]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False).stdout


def exporter_argv(log: Path, port: int, *, nvml: bool = False) -> list[str]:
    argv = [sys.executable, "-m", "exporter", "--log-file", str(log), "--listen-address", f"127.0.0.1:{port}"]
    argv += ["--log-level", "warning"]
    for flag, value in (("--nvml", "on" if nvml else "off"), ("--proc", "off"), ("--http", "off")):
        if flag in exporter_help():  # live sources are off (or idle); older checkouts have no such flags
            argv += [flag, value]
    return argv


def mtail_argv(mtail: str, log: Path, port: int) -> list[str]:
    return [mtail, "--progs", str(MTAIL_PROG), "--logs", str(log), "--address", "127.0.0.1", "--port", str(port)]


# ---------------------------------------------------------------------------------------------- bulk


MTAIL_NAMES = {
    "lines": "llama_log_lines_total",
    "kv_retries": "llama_kv_retry_total",
    "memory_slot_failures": "llama_memory_slot_failures_total",
    "context_exceeded": "llama_context_exceeded_total",
    "decode_failed": "llama_decode_failed_total",
    "n_slots": "llama_n_slots",
    "n_ctx_slot": "llama_n_ctx_slot",
    "prompt_cache_prompts": "llama_prompt_cache_prompts",
    "prompt_cache_mib": "llama_prompt_cache_mib",
}


def mtail_counts(body: str) -> dict[str, object]:
    """The shared counts from mtail's exposition, in bench/bulk_exporter.py's names."""
    out: dict[str, object] = {key: metric_value(body, name) for key, name in MTAIL_NAMES.items()}
    for op in ("created", "restored", "erased"):
        m = re.search(rf'^llama_checkpoint_events_total{{op="{op}"[^}}]*}} (\S+)$', body, re.MULTILINE)
        out[f"checkpoints_{op}"] = float(m[1]) if m else 0.0
        m = re.search(rf'^llama_checkpoint_mib_total{{op="{op}"[^}}]*}} (\S+)$', body, re.MULTILINE)
        out[f"checkpoint_mib_{op}"] = float(m[1]) if m else 0.0
    out["last_stop_n_tokens"] = {
        m[1]: float(m[2])
        for m in re.finditer(r'^llama_slot_last_stop_n_tokens{[^}]*slot="(\d+)"[^}]*} (\S+)$', body, re.MULTILINE)
    }
    return out


def same(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return a == b


def bench_bulk(report: Report, args: argparse.Namespace, corpus: Path, mtail: str | None) -> None:
    print(f"bulk: {args.bulk_reps} x (exporter, mtail) on {corpus.name}, load {load()}", flush=True)
    exp: dict[str, list[float]] = {"lps": [], "cpu": [], "rss": []}
    mt: dict[str, list[float]] = {"lps": [], "cpu": [], "rss": []}
    out_exp, out_mt = args.workdir / "bulk-exporter.json", args.workdir / "bulk-mtail.txt"
    lines = 0
    for _ in range(args.bulk_reps):
        wall, cpu, rss, _ = run_measured([sys.executable, str(BENCH / "bulk_exporter.py"), str(corpus)], out_exp)
        lines = json.loads(out_exp.read_text())["lines"]
        exp["lps"].append(lines / wall)
        exp["cpu"].append(cpu)
        exp["rss"].append(rss)
        if mtail:
            argv = [mtail, "--progs", str(MTAIL_PROG), "--logs", str(corpus), "--one_shot"]
            wall, cpu, rss, _ = run_measured([*argv, "--one_shot_format", "prometheus", "--logtostderr"], out_mt)
            mt["lps"].append(lines / wall)
            mt["cpu"].append(cpu)
            mt["rss"].append(rss)
    e = {k: Stat(v) for k, v in exp.items()}
    m = {k: Stat(v) for k, v in mt.items()} if mtail else {}
    e["lps"].fmt = "{:,.0f}"
    if m:
        m["lps"].fmt = "{:,.0f}"
    lps_ratio = ratio(e["lps"], m.get("lps"))
    met = lps_ratio.median >= 2.8 if lps_ratio else e["lps"].median >= 5.6e5
    report.add("bulk", f"lines/s ({lines:,} lines)", e["lps"], m.get("lps"), lps_ratio, ">= 2.8x mtail (560k)", met)
    report.add("bulk", "CPU s", e["cpu"], m.get("cpu"), ratio(e["cpu"], m.get("cpu")))
    rss_e, rss_m = Stat(exp["rss"], "{:.1f}"), Stat(mt["rss"], "{:.1f}") if mtail else None
    report.add("bulk", "peak RSS MiB", rss_e, rss_m, ratio(rss_e, rss_m))

    # The agreement check: every count both extract, on the same corpus.
    terms = args.workdir / "bulk-terms.json"
    run_measured([sys.executable, str(BENCH / "bulk_exporter.py"), "--mtail-terms", str(corpus)], terms)
    mine = json.loads(terms.read_text())
    state = json.loads(out_exp.read_text())
    if not mtail:
        report.notes.append("counts: mtail missing, the agreement check was skipped")
        return
    theirs = mtail_counts(out_mt.read_text())
    keys = [k for k in mine if k in theirs]
    bad = [f"{k}: exporter {mine[k]} mtail {theirs[k]}" for k in keys if not same(mine[k], theirs[k])]
    # The state (what /metrics shows) must count the same as its parser.
    bad += [f"state {k}: {state[k]} != {mine[k]}" for k in state if k in mine and not same(state[k], mine[k])]
    report.add(
        "bulk",
        f"shared counts equal ({len(keys)} families)",
        "all equal" if not bad else f"{len(bad)} differ",
        "",
        None,
        "all equal",
        not bad,
    )
    for b in bad:
        report.notes.append(f"count mismatch: {b}")
    report.notes.append(
        "counts compared: " + ", ".join(f"{k}={_short(mine[k])}" for k in keys) + " (restored MiB: not in the events)"
    )


def _short(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_short(x)}" for k, x in sorted(v.items())) + "}"
    return str(v)


# ---------------------------------------------------------------------------------------------- follow


class Writer(threading.Thread):
    """Appends lines at a fixed rate in ticks of `tick` seconds, flushing every tick (one write each)."""

    def __init__(self, path: Path, lines: Iterator[str], rate: float, seconds: float, tick: float) -> None:
        super().__init__(daemon=True)
        self.path, self.lines, self.rate, self.seconds, self.tick = path, lines, rate, seconds, tick
        self.written = 0
        self.last_flush = (0.0, 0)  # (perf_counter just after the latest flush, lines written by then)
        self.behind_s = 0.0  # how far the writer fell behind its schedule at worst

    def run(self) -> None:
        t0 = time.perf_counter()
        ticks = int(self.seconds / self.tick)
        with self.path.open("a", encoding="utf-8") as f:
            for i in range(1, ticks + 1):
                due = int(self.rate * self.tick * i) - self.written
                f.write("".join(itertools.islice(self.lines, due)))
                f.flush()
                self.written += due
                self.last_flush = (time.perf_counter(), self.written)
                delay = t0 + i * self.tick - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                else:
                    self.behind_s = max(self.behind_s, -delay)


def cycle_lines(path: Path, limit: int) -> Iterator[str]:
    """The first `limit` lines of `path` (each with its newline), over and over."""
    with path.open(encoding="utf-8") as f:
        head = list(itertools.islice(f, limit))
    return itertools.cycle(head)


def bench_follow(report: Report, args: argparse.Namespace, steady: Path, mtail: str | None) -> None:
    log = args.workdir / "follow.log"
    log.write_text("")
    pe, pm = free_port(), free_port()
    exporter = Child("exporter", exporter_argv(log, pe), args.workdir)
    mt = Child("mtail", [*mtail_argv(mtail, log, pm), "--logtostderr"], args.workdir) if mtail else None
    try:
        wait_ready(exporter, pe)
        if mt:
            wait_ready(mt, pm)
        time.sleep(2)
        print(
            f"follow: {args.follow_rate:,} lines/s for {args.follow_seconds} s, exporter"
            f"{' and mtail side by side' if mt else ''}, load {load()}",
            flush=True,
        )
        writer = Writer(
            log,
            cycle_lines(steady, int(args.follow_rate * (args.follow_seconds + 2 * args.load_latency_seconds))),
            args.follow_rate,
            args.follow_seconds + 2 * args.load_latency_seconds,
            args.write_tick,
        )
        procs = [exporter, mt] if mt else [exporter]
        cpu: dict[str, list[float]] = {p.name: [] for p in procs}
        per_line: dict[str, list[float]] = {p.name: [] for p in procs}
        before = {p.name: p.cpu_s() for p in procs}
        t_before, lines_before = time.perf_counter(), 0
        writer.start()
        t_start = t_before
        for w in range(max(1, round(args.follow_seconds / args.window))):
            time.sleep(max(0.0, t_start + (w + 1) * args.window - time.perf_counter()))
            now, lines_now = time.perf_counter(), writer.written
            for p in procs:
                c = p.cpu_s()
                cpu[p.name].append((c - before[p.name]) / (now - t_before) * 100)
                per_line[p.name].append((c - before[p.name]) / max(1, lines_now - lines_before) * 1e6)
                before[p.name] = c
            t_before, lines_before = now, lines_now
        se, sm = Scraper(pe), Scraper(pm) if mt else None
        # Latency under load: the writer goes on; how long until /metrics counts the last line of a flush.
        print(f"latency under load: {args.load_latency_seconds} s, load {load()}", flush=True)
        load_lat = measure_load_latency(writer, se, sm, args.load_latency_seconds, args.poll_step)
        print(f"single scrapes under load: {args.load_latency_seconds} s, load {load()}", flush=True)
        missed = measure_missed(writer, pe, pm if mt else None, args.load_latency_seconds, args.follow_rate)
        writer.join()
        written = writer.written
        caught_up = wait_until(
            lambda: (
                (se.value("llamacpp_exporter_log_lines_total") or 0) >= written
                and (sm is None or (sm.value("llama_log_lines_total") or 0) >= written)
            ),
            timeout=30,
        )
        agree = ""
        if sm:
            e_retries, m_retries = se.value("llamacpp_kv_retries_total"), sm.value("llama_kv_retry_total")
            e_lines, m_lines = se.value("llamacpp_exporter_log_lines_total"), sm.value("llama_log_lines_total")
            agree = f"lines {e_lines:.0f}/{m_lines:.0f}, retries {e_retries:.0f}/{m_retries:.0f}"
        if writer.behind_s > 0.05:
            report.notes.append(f"follow: the writer fell up to {writer.behind_s * 1000:.0f} ms behind its schedule")
        if not caught_up:
            report.notes.append("follow: not every written line was counted within 30 s after the writer stopped")

        # Idle: nothing written, nothing scraped.
        time.sleep(2)
        idle: dict[str, list[float]] = {p.name: [] for p in procs}
        idle_windows = max(1, round(args.idle_seconds / args.window))
        print(f"idle: {args.idle_seconds} s without writes or scrapes, load {load()}", flush=True)
        for _ in range(idle_windows):
            ns0, t0 = {p.name: p.cpu_ns() for p in procs}, time.perf_counter()
            time.sleep(args.window)
            dt = time.perf_counter() - t0
            for p in procs:
                idle[p.name].append((p.cpu_ns() - ns0[p.name]) / 1e9 / dt * 100)
        hwm = {p.name: p.status_kib("VmHWM") / 1024 for p in procs}

        # Latency: one retry line, then both /metrics until the retry counters move.
        print(f"latency: {args.latency_samples} samples, load {load()}", flush=True)
        lat = measure_latency(log, se, sm, args.latency_samples, args.poll_step)
        se.close()
        if sm:
            sm.close()
    finally:
        err_e = exporter.stop()
        err_m = mt.stop() if mt else ""
    if exporter.popen.returncode not in (0, -15):
        report.notes.append(f"exporter exit status {exporter.popen.returncode}: {err_e}")
    if mt and mt.popen.returncode not in (0, -15, 2):
        report.notes.append(f"mtail exit status {mt.popen.returncode}: {err_m}")

    name = "mtail"
    e_cpu, m_cpu = Stat(cpu["exporter"], "{:.2f}%"), Stat(cpu[name], "{:.2f}%") if mt else None
    r = ratio(e_cpu, m_cpu)
    report.add(
        "follow",
        f"CPU, % of a core ({args.follow_rate:,} lines/s, {args.window:.0f} s windows)",
        e_cpu,
        m_cpu,
        r,
        "<= 0.5x mtail (stretch 0.3x)",
        r.median <= 0.5 if r else None,
    )
    e_pl, m_pl = Stat(per_line["exporter"], "{:.2f}"), Stat(per_line[name], "{:.2f}") if mt else None
    report.add("follow", "CPU us per line", e_pl, m_pl, ratio(e_pl, m_pl))
    e_idle, m_idle = Stat(idle["exporter"], "{:.3f}%"), Stat(idle[name], "{:.3f}%") if mt else None
    report.add(
        "follow",
        "idle CPU, % of a core",
        e_idle,
        m_idle,
        ratio(e_idle, m_idle),
        "<= 0.1%",
        e_idle.median <= 0.1,
    )
    report.add(
        "follow",
        "peak RSS MiB (VmHWM)",
        f"{hwm['exporter']:.1f}",
        f"{hwm[name]:.1f}" if mt else None,
        None,
        "<= 40",
        hwm["exporter"] <= 40,
    )
    if agree:
        report.add("follow", "lines / retries counted (exporter/mtail)", agree, "", None, "equal", _agrees(agree))
    for kind, (e_lat, m_lat) in (("", lat), (f" at {args.follow_rate:,} lines/s", load_lat)):
        add_latency(report, kind, e_lat, m_lat)
    e_missed, m_missed = missed
    for label, pct in (("p50", 50), ("p99", 99)):
        ev = percentile(e_missed, pct) if e_missed else float("nan")
        mv = percentile(m_missed, pct) if m_missed else None
        report.add(
            "latency",
            f"lines written before a scrape 0.5-2 s after the last and missed by it, {label}, ms of writing"
            f" ({len(e_missed)} scrapes)",
            f"{ev:.1f}",
            f"{mv:.1f}" if mv is not None else None,
            None,
            "",
            None,
        )


def add_latency(report: Report, kind: str, e_lat: list[float], m_lat: list[float]) -> None:
    # Prometheus scrapes every 5-60 s: latency beyond a scrape buys nothing, so only p99 has a goal,
    # and it is below mtail's median (its 250 ms poll).
    for label, pct, target in (("p50", 50, None), ("p99", 99, 250)):
        ev = percentile(e_lat, pct) if e_lat else float("nan")
        mv = percentile(m_lat, pct) if m_lat else None
        report.add(
            "latency",
            f"line to /metrics{kind} {label}, ms ({len(e_lat)} samples)",
            f"{ev:.1f}",
            f"{mv:.1f}" if mv is not None else None,
            Stat([ev / mv], "{:.2f}x") if mv else None,
            f"<= {target} ms" if target else "",
            ev <= target if target else None,
        )


def _agrees(text: str) -> bool:
    pairs = re.findall(r"(\d+)/(\d+)", text)
    return all(a == b for a, b in pairs)


def measure_load_latency(
    writer: Writer, se: Scraper, sm: Scraper | None, seconds: float, step: float
) -> tuple[list[float], list[float]]:
    """While the writer runs: at its next flush, poll /metrics until it counts that many lines; ms.

    One sampling thread per target, so mtail's slow samples do not thin out the exporter's.
    """
    deadline = time.perf_counter() + seconds

    def sample(scraper: Scraper, name: str, out: list[float]) -> None:
        while time.perf_counter() < deadline and writer.is_alive():
            previous = writer.last_flush
            while writer.last_flush is previous and writer.is_alive():
                time.sleep(0.0005)  # measure from a flush that just happened
            flushed_at, lines = writer.last_flush
            while time.perf_counter() - flushed_at < 5:
                if (scraper.value(name) or 0) >= lines:
                    out.append((time.perf_counter() - flushed_at) * 1000)
                    break
                time.sleep(step)
            time.sleep(rng.uniform(0.005, 0.06))  # sample at random phases of the follower's batching

    rng = random.Random(8)
    e_ms: list[float] = []
    m_ms: list[float] = []
    threads = [threading.Thread(target=sample, args=(se, "llamacpp_exporter_log_lines_total", e_ms))]
    if sm is not None:
        threads.append(threading.Thread(target=sample, args=(sm, "llama_log_lines_total", m_ms)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return e_ms, m_ms


def measure_missed(
    writer: Writer, pe: int, pm: int | None, seconds: float, rate: float
) -> tuple[list[float], list[float]]:
    """While the writer runs: single scrapes 0.5-2 s apart (each on its own connection, as a new
    Prometheus scrape), each the lines flushed before its request that it does not count, as ms at
    the writer's rate. The polling latency above cannot show this: each of its polls is a scrape."""
    deadline = time.perf_counter() + seconds

    def sample(port: int, name: str, seed: int, out: list[float]) -> None:
        rng = random.Random(seed)
        while time.perf_counter() < deadline and writer.is_alive():
            time.sleep(rng.uniform(0.5, 2.0))
            before = writer.last_flush[1]
            scraper = Scraper(port)
            try:
                counted = scraper.value(name) or 0
            finally:
                scraper.close()
            out.append(max(0.0, before - counted) / rate * 1000)

    e_ms: list[float] = []
    m_ms: list[float] = []
    threads = [threading.Thread(target=sample, args=(pe, "llamacpp_exporter_log_lines_total", 1, e_ms))]
    if pm is not None:
        threads.append(threading.Thread(target=sample, args=(pm, "llama_log_lines_total", 2, m_ms)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return e_ms, m_ms


def measure_latency(
    log: Path, se: Scraper, sm: Scraper | None, samples: int, step: float
) -> tuple[list[float], list[float]]:
    """Per sample: append a task start and a retry line, poll both until their retry counters moved; ms each."""
    e_ms: list[float] = []
    m_ms: list[float] = []
    e_last = se.value("llamacpp_kv_retries_total") or 0.0
    m_last = (sm.value("llama_kv_retry_total") or 0.0) if sm else 0.0
    with log.open("a", encoding="utf-8") as f:
        for i in range(samples):
            # A request starts, then its batch is retried: a retry while nothing runs would be forged.
            f.write(f"{ts(i)} I slot launch_slot_: id  0 | task {900000 + i} | processing task, is_child = 0\n")
            f.write(f"{ts(i)} {RETRY_LINE}\n")
            f.flush()
            t0 = time.perf_counter()
            e_done, m_done = False, sm is None
            while not (e_done and m_done):
                if time.perf_counter() - t0 > 5:
                    break
                if not e_done and (se.value("llamacpp_kv_retries_total") or 0.0) > e_last:
                    e_ms.append((time.perf_counter() - t0) * 1000)
                    e_last, e_done = e_last + 1, True
                if not m_done and sm is not None and (sm.value("llama_kv_retry_total") or 0.0) > m_last:
                    m_ms.append((time.perf_counter() - t0) * 1000)
                    m_last, m_done = m_last + 1, True
                time.sleep(step)
            time.sleep(0.01 + (i % 5) * 0.007)  # spread the writes over mtail's poll phase
    return e_ms, m_ms


# ---------------------------------------------------------------------------------------------- scrape


def slots_log(path: Path, slots: int) -> None:
    """A llama-server b11434 log (-lv 4) whose server has `slots` slots, each with a request and checkpoints."""
    lines = [
        "0.00.000.100 I log_info: verbosity = 4 (adjust with the `-lv N` CLI arg)",
        "0.00.003.960 I srv  llama_server: initializing ...",
        "0.00.005.046 I cmn  common_param: common_params_print_info: build 11434 (b11434) with GNU 12.2.0 for Linux",
        "0.00.006.000 I srv    load_model: loading model 'models/bench.gguf'",
        f"0.00.007.000 I llama_context: n_ctx         = {slots * 4096}",
        f"0.00.007.100 I llama_context: n_seq_max     = {slots}",
        "0.00.007.200 I llama_context: kv_unified    = true",
        f"0.00.007.300 I llama_kv_cache: size = {slots * 64}.00 MiB ({slots * 4096:6d} cells,  32 layers, "
        f"{slots}/1 seqs), K (f16): {slots * 32}.00 MiB, V (f16): {slots * 32}.00 MiB",
        "0.00.008.000 I srv    load_model: prompt cache is enabled, size limit: 8192 MiB",
        "0.00.008.100 I srv    load_model: context checkpoints enabled, max = 32, min spacing = 8192",
        f"0.00.008.200 I srv    load_model: initializing, n_slots = {slots}, n_ctx_slot = {slots * 4096}, "
        "kv_unified = 'true'",
        "0.00.009.000 I srv  llama_server: listening on http://127.0.0.1:8080",
    ]
    for s in range(slots):
        task = 100 + s
        lines += [
            f"{ts(10_000 + 4 * s)} I slot launch_slot_: id {s:2d} | task {task} | processing task",
            f"{ts(10_001 + 4 * s)} I slot update_slots: id {s:2d} | task {task} | new prompt, "
            f"n_ctx_slot = {slots * 4096}, n_keep = 0, task.n_tokens = 2048",
            f"{ts(10_002 + 4 * s)} I slot create_check: id {s:2d} | task {task} | created context checkpoint 1 of 32 "
            "(pos_min = 0, pos_max = 1023, n_tokens = 1024, size = 62.813 MiB)",
            f"{ts(10_003 + 4 * s)} I slot      release: id {s:2d} | task {task} | stop processing: n_tokens = 2100, "
            "truncated = 0",
        ]
    lines += [
        "0.20.000.000 I srv        update:  - cache state: 3 prompts, 150.000 MiB (limits: 8192.000 MiB, "
        "131072 tokens, 45117300 est)",
        "0.20.000.100 I srv  update_slots: all slots are idle",
    ]
    path.write_text("\n".join(lines) + "\n")


def bench_scrape(report: Report, args: argparse.Namespace) -> None:
    small, big = args.workdir / "scrape-4.log", args.workdir / "scrape-64.log"
    slots_log(small, 4)
    slots_log(big, 64)
    p4, p64 = free_port(), free_port()
    # A big inference box: 8 GPUs, each with another process and llama-server on it.
    gpus = [
        FakeGpu(
            "NVIDIA H200 (bench stand-in)",
            f"GPU-00000000-0000-0000-0000-{i:012d}",
            141 * GIB,
            (100 + 3 * i) * GIB,
            [(1000 + i, 90 * GIB), (4242, 2 * GIB)],
        )
        for i in range(8)
    ]
    nvml = pynvml_env(gpus)
    env = {**os.environ, **nvml, "PYTHONPATH": os.pathsep.join([nvml["PYTHONPATH"], str(REPO)])}
    a = Child("exporter-4", exporter_argv(small, p4), args.workdir)
    b = Child("exporter-64", exporter_argv(big, p64, nvml=True), args.workdir, env)
    # The 4-slot exporter again, behind basic auth (a bcrypt hash at cost 10, as htpasswd -B makes).
    pa, authorization, auth_argv = free_port(), None, None
    if "--web.config.file" in exporter_help():
        import base64

        import bcrypt

        web_config = args.workdir / "web-config.yml"
        hashed = bcrypt.hashpw(b"bench", bcrypt.gensalt(rounds=10)).decode()
        web_config.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        authorization = "Basic " + base64.b64encode(b"prometheus:bench").decode()
        auth_argv = [*exporter_argv(small, pa), "--web.config.file", str(web_config)]
    c = Child("exporter-4-auth", auth_argv, args.workdir) if auth_argv else None
    tc: list[float] = []
    try:
        wait_ready(a, p4)
        wait_ready(b, p64)
        if c is not None:
            wait_ready(c, pa)
        sa, sb = Scraper(p4), Scraper(p64)
        sc = Scraper(pa, authorization) if c is not None else None
        series = {}
        for name, s in (("4", sa), ("64", sb)):
            body = s.get()[1]
            series[name] = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
        gpus = metric_value(sb.get()[1], "llamacpp_gpu_memory_total_bytes")
        print(f"scrape: {args.scrapes} x 2 scrapes, alternated, load {load()}", flush=True)
        ta: list[float] = []
        tb: list[float] = []
        for _ in range(args.scrapes):
            ta.append(sa.get()[0] * 1000)
            tb.append(sb.get()[0] * 1000)
            if sc is not None:
                tc.append(sc.get()[0] * 1000)
        sa.close()
        sb.close()
        if sc is not None:
            sc.close()
    finally:
        a.stop()
        b.stop()
        if c is not None:
            c.stop()
    if gpus is None:
        report.notes.append("scrape: no GPU series in the 64-slot exporter (no --nvml flag, or the reader changed)")
    for label, times, target, n in (
        ("4 slots", ta, 5.0, series["4"]),
        ("64 slots + 8 GPUs", tb, 25.0, series["64"]),
    ):
        p50, p99 = percentile(times, 50), percentile(times, 99)
        report.add("scrape", f"/metrics {label} ({n} series) p50, ms", f"{p50:.2f}")
        report.add(
            "scrape", f"/metrics {label} p99, ms", f"{p99:.2f}", None, None, f"<= {target:.0f} ms", p99 <= target
        )
    if tc:
        p50, p99 = percentile(tc, 50), percentile(tc, 99)
        report.add("scrape", "/metrics 4 slots with basic auth p50, ms", f"{p50:.2f}")
        report.add(
            "scrape", "/metrics 4 slots with basic auth p99, ms", f"{p99:.2f}", None, None, "<= 5 ms", p99 <= 5.0
        )


# ---------------------------------------------------------------------------------------------- flood


def bench_flood(report: Report, args: argparse.Namespace, steady: Path) -> None:
    log = args.workdir / "flood.log"
    log.write_text("")
    port = free_port()
    exporter = Child("exporter", exporter_argv(log, port), args.workdir)
    try:
        wait_ready(exporter, port)
        block_lines = max(1, int(args.flood_rate * 0.05))
        with steady.open(encoding="utf-8") as f:
            block = "".join(itertools.islice(f, block_lines))
        print(f"flood: {args.flood_rate:,} lines/s for {args.flood_seconds} s, load {load()}", flush=True)
        scraper = Scraper(port)
        times: list[float] = []
        rss: list[float] = []
        stop = threading.Event()

        def scrape_loop() -> None:
            while not stop.is_set():
                times.append(scraper.get()[0] * 1000)
                rss.append(exporter.status_kib("VmRSS") / 1024)
                stop.wait(0.05)

        t = threading.Thread(target=scrape_loop, daemon=True)
        t.start()
        written, t0, behind = 0, time.perf_counter(), 0.0
        with log.open("a", encoding="utf-8") as f:
            for i in range(1, int(args.flood_seconds / 0.05) + 1):
                f.write(block)
                f.flush()
                written += block_lines
                delay = t0 + i * 0.05 - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                else:
                    behind = max(behind, -delay)
        wrote_s = time.perf_counter() - t0
        check = Scraper(port)
        caught = wait_until(lambda: (check.value("llamacpp_exporter_log_lines_total") or 0) >= written, 120, 0.1)
        lag = time.perf_counter() - t0 - wrote_s
        stop.set()
        t.join()
        scraper.close()
        check.close()
        hwm = exporter.status_kib("VmHWM") / 1024
    finally:
        exporter.stop()
    rate = written / wrote_s
    report.add(
        "flood",
        f"written {written:,} lines at {rate:,.0f}/s; caught up after",
        f"{lag:.2f} s" if caught else "NOT within 120 s",
    )
    p99 = percentile(times, 99)
    report.add(
        "flood",
        f"/metrics during the flood p50 / p99, ms ({len(times)} scrapes)",
        f"{percentile(times, 50):.1f} / {p99:.1f}",
        None,
        None,
        "p99 <= 100 ms",
        p99 <= 100,
    )
    report.add("flood", "RSS MiB: peak (VmHWM) / highest sampled", f"{hwm:.1f} / {max(rss):.1f}", None, None, "bounded")
    if behind > 0.1:
        report.notes.append(f"flood: the writer fell up to {behind:.2f} s behind (the machine could not write faster)")


# ---------------------------------------------------------------------------------------------- diagnose


def bench_diagnose(report: Report, args: argparse.Namespace) -> None:
    script = BENCH / "diagnose_big.py"
    if not script.exists():
        report.add("diagnose", "1 GiB log: MB/s, peak RSS", "not available (bench/diagnose_big.py missing)")
        return
    print(f"diagnose: bench/diagnose_big.py --size-mb {args.diagnose_mb:g}, load {load()}", flush=True)
    cmd = [sys.executable, str(script), "--size-mb", str(args.diagnose_mb), "--dir", str(args.workdir)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    m = re.search(r"([\d,.]+) MB/s, peak RSS ([\d,.]+) MiB", proc.stdout)
    if not m:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        report.add("diagnose", f"{args.diagnose_mb:g} MiB log", "not available: " + " | ".join(tail)[:200])
        return
    mbs, rss = float(m[1].replace(",", "")), float(m[2].replace(",", ""))
    mb_target = ">= 60 (stretch 100)"
    report.add("diagnose", f"{args.diagnose_mb:g} MiB log, MB/s", f"{mbs:.1f}", None, None, mb_target, mbs >= 60)
    report.add("diagnose", "peak RSS MiB", f"{rss:.1f}", None, None, "<= 200", rss <= 200)
    if proc.returncode != 0:
        report.notes.append(f"diagnose_big.py exit status {proc.returncode}: {proc.stderr.strip()[-300:]}")


# ---------------------------------------------------------------------------------------------- main


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
