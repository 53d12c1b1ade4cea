"""scrape: /metrics response time with 4 slots, and with 64 slots plus 8 GPUs' worth of NVML series from the
tests' fake pynvml; flood: a burst of lines while /metrics is scraped, RSS sampled."""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import threading
import time
from pathlib import Path

from .processes import (
    REPO,
    Child,
    Scraper,
    exporter_argv,
    exporter_help,
    free_port,
    load,
    metric_value,
    ts,
    wait_ready,
    wait_until,
)
from .table import Report, percentile

sys.path.insert(0, str(REPO / "tests" / "support"))  # the tests' fake NVML

from fake_nvml import GIB, FakeGpu, pynvml_env


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
