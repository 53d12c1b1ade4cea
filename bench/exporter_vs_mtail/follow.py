"""follow: a writer appends the steady corpus at a fixed rate while the exporter and mtail follow the file
side by side, then an idle window; latency: from a line written until each /metrics counts it."""

from __future__ import annotations

import argparse
import itertools
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .processes import Child, Scraper, exporter_argv, free_port, load, mtail_argv, ts, wait_ready, wait_until
from .table import Report, Stat, percentile, ratio

RETRY_LINE = (
    "W srv        decode: failed to find free space in the KV cache, retrying with smaller batch size, "
    "off = 0, n_batch = 256, ret = 1"
)


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
        # schedstat's nanoseconds, not /proc/<pid>/stat's 10 ms ticks: a tick is 0.5 µs a line in a 10 s window.
        before = {p.name: p.cpu_ns() / 1e9 for p in procs}
        t_before, lines_before = time.perf_counter(), 0
        writer.start()
        t_start = t_before
        for w in range(max(1, round(args.follow_seconds / args.window))):
            time.sleep(max(0.0, t_start + (w + 1) * args.window - time.perf_counter()))
            now, lines_now = time.perf_counter(), writer.written
            for p in procs:
                c = p.cpu_ns() / 1e9
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
