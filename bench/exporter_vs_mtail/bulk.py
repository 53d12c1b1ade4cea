"""bulk: the exporter's tailer, parser and state catching up on the corpus against `mtail --one_shot`, the
counts both extract compared; diagnose: bench/diagnose_big.py on a big log."""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from pathlib import Path

from .processes import BENCH, MTAIL_PROG, REPO, load, metric_value, run_measured
from .table import Report, Stat, ratio

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
