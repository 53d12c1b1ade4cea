#!/usr/bin/env python3
# ruff: noqa: PTH100, PTH118, PTH119, PTH120, PTH123, PTH202, PTH207, E501, E741, UP031  (kept close to the shared original)
"""Deterministic large llama-server (b11434) log corpus for exporter benchmarks.

A copy of shared/bench/make_corpus.py that reads the same captures from this repository
(tests/fixtures/b11434 holds byte-identical copies of shared/captures/b11434), so that the corpus,
and with it every number in bench/run.py's table, is the same as the one the issue was measured on.

Stitches the real run logs in tests/fixtures/b11434/*/llama-server.log
(text format, default "<min>.<ss>.<ms>.<us> <L> " prefix) back to back, as if the
server had been restarted between runs, until the requested number of lines is
reached.  Each stitched copy ("instance") of a run keeps its lines verbatim and in
order -- including the multi-line "sampler params:" blocks (4 TAB-indented
continuation lines) and the multi-line chat-template example block -- except:

  * timestamps are rewritten so they increase monotonically over the whole file
    (instance base = end of previous instance + a seeded gap of 0.5..30 s;
    deltas inside an instance are kept);
  * task ids (`task N`, `task id = N`, `id_task = N`; `task -1` is kept) get a
    per-instance offset so they increase monotonically across instances.

Run order: every cycle uses each source run once, in a seeded random order.
The output is cut at exactly --lines lines (the last instance may be partial).

Only the text-format runs with the default prefix are used: exhaust-jsonl
(--log-jsonl) and exhaust-no-prefix (--no-log-prefix --no-log-timestamps) are excluded.

Usage:
  python3 bench/make_corpus.py --out corpus.log --lines 2000000 --seed 11434
  python3 bench/make_corpus.py --out corpus_steady.log --lines 2000000 --seed 11434 --restart-every 1000
  python3 bench/make_corpus.py --stats corpus.log      # line-mix report (JSON)
"""

import argparse
import glob
import json
import os
import random
import re
import sys

SRC_GLOB = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "b11434", "*", "llama-server.log"
)
EXCLUDE = ("exhaust-jsonl", "exhaust-no-prefix")
# The runs of shared/captures/b11434, the corpus the limits were set on. tests/fixtures/b11434 holds more runs
# since (recorded by scripts/record-build.sh); one prints a token that is part of a UTF-8 character as U+FFFD,
# at which mtail 3.0.0~rc50 stops counting (google/mtail#698), so the comparison reads only these.
RUNS = (
    "checkpoints-swa-lv4",
    "exhaust-default-verbosity",
    "exhaust-jsonl",
    "exhaust-long-lv4",
    "exhaust-lv4",
    "exhaust-no-prefix",
    "longprompt-lv4",
    "recover-purge-lv4",
)

TS_RE = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ([IWED]) ")
TASK_RE = re.compile(r"(task |task id = |id_task = )(\d+)")


def load_runs(pattern=SRC_GLOB):
    runs = []
    for path in sorted(glob.glob(pattern)):
        run = os.path.basename(os.path.dirname(path))
        if run in EXCLUDE or (pattern == SRC_GLOB and run not in RUNS):
            continue
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            raw = f.read().split("\n")
        if raw and raw[-1] == "":
            raw.pop()
        if not raw or not TS_RE.match(raw[0]):
            continue  # not the prefixed text format
        lines = []  # (ts_us or None, rest-of-line, has_task)
        max_task = 0
        last_ts = 0
        for ln in raw:
            m = TS_RE.match(ln)
            if m:
                mi, s, ms, us = (int(g) for g in m.group(1, 2, 3, 4))
                ts = ((mi * 60 + s) * 1000 + ms) * 1000 + us
                last_ts = ts
                rest = ln[m.end(4) :]  # " I srv ..."
            else:
                ts = None
                rest = ln
            has_task = "task" in rest
            if has_task:
                for tm in TASK_RE.finditer(rest):
                    max_task = max(max_task, int(tm.group(2)))
            lines.append((ts, rest, has_task))
        # sections: startup = up to and including "listening on"; shutdown = from
        # "cleaning up before exit"; body = the requests in between
        s_end = next((i + 1 for i, l in enumerate(lines) if "llama_server: listening on" in l[1]), 0)
        sh_beg = next((i for i, l in enumerate(lines) if "cleaning up before exit" in l[1]), len(lines))
        runs.append(
            {
                "path": path,
                "lines": lines,
                "max_task": max_task,
                "dur_us": last_ts,
                "startup_end": s_end,
                "shutdown_begin": sh_beg,
            }
        )
    return runs


def fmt_ts(t):
    us = t % 1000
    ms = (t // 1000) % 1000
    s = (t // 1000000) % 60
    mi = t // 60000000
    return "%d.%02d.%03d.%03d" % (mi, s, ms, us)


def generate(out, n_lines, seed, restart_every=1):
    runs = load_runs()
    if not runs:
        sys.exit("no source runs found under " + SRC_GLOB)
    rng = random.Random(seed)
    base_us = 0
    task_base = 0
    written = 0
    instances = 0
    with open(out, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        buf = []
        while written < n_lines:
            order = list(range(len(runs)))
            rng.shuffle(order)
            for ri in order:
                run = runs[ri]
                instances += 1
                toff = task_base

                def sub_task(m, toff=toff):
                    return m.group(1) + str(int(m.group(2)) + toff)

                lines = run["lines"]
                if restart_every > 1:
                    # long-running server: the startup banner only on every restart_every-th
                    # instance (and the shutdown lines just before the next restart)
                    pos = (instances - 1) % restart_every
                    lo = 0 if pos == 0 else run["startup_end"]
                    hi = len(lines) if pos == restart_every - 1 else run["shutdown_begin"]
                    lines = lines[lo:hi]
                for ts, rest, has_task in lines:
                    if has_task:
                        rest = TASK_RE.sub(sub_task, rest)
                    if ts is None:
                        buf.append(rest)
                    else:
                        buf.append(fmt_ts(base_us + ts) + rest)
                    written += 1
                    if written >= n_lines:
                        break
                if len(buf) >= 65536 or written >= n_lines:
                    f.write("\n".join(buf))
                    f.write("\n")
                    buf = []
                if written >= n_lines:
                    break
                base_us += run["dur_us"] + rng.randint(500_000, 30_000_000)
                task_base += run["max_task"] + 1 + rng.randint(0, 50)
        if buf:
            f.write("\n".join(buf))
            f.write("\n")
    return {
        "out": out,
        "lines": written,
        "bytes": os.path.getsize(out),
        "instances": instances,
        "seed": seed,
        "restart_every": restart_every,
        "sources": [os.path.basename(os.path.dirname(r["path"])) for r in runs],
        "source_lines": {os.path.basename(os.path.dirname(r["path"])): len(r["lines"]) for r in runs},
    }


# ---- line-mix report -----------------------------------------------------------------------
# Families the exporter extracts (the same set as llama.mtail).
FAMILIES = {
    "retry_free_space": re.compile(rb"decode: failed to find free space in the KV cache"),
    "memslot_fail": re.compile(rb"decode: failed to find a memory slot for batch of size"),
    "ctx_exceeded": re.compile(rb"decode: Context size has been exceeded"),
    "decode_failed": re.compile(rb"decode\(\) failed"),
    "ckpt_created": re.compile(rb"created context checkpoint \d+ of \d+"),
    "ckpt_restored": re.compile(rb"restored context checkpoint \("),
    "ckpt_erased": re.compile(
        rb"(?:erasing old context checkpoint|erasing context checkpoint too close to an earlier one|erased invalidated context checkpoint) \("
    ),
    "stop_processing": re.compile(rb"release: id +\d+ \| task -?\d+ \| stop processing: n_tokens = "),
    "init_slots": re.compile(rb"initializing, n_slots = \d+, n_ctx_slot = \d+"),
    "cache_state": re.compile(rb"update: +- cache state: \d+ prompts, [0-9.]+ MiB"),
}
PFX = re.compile(rb"^\d+\.\d{2}\.\d{3}\.\d{3} ([IWED]) (slot |srv  |cmn  |spec )?")


def stats(path):
    cat = {"slot": 0, "srv": 0, "cmn/spec (other tagged)": 0, "library (untagged)": 0, "continuation": 0}
    lvl = {"I": 0, "W": 0, "E": 0, "D": 0}
    fam = dict.fromkeys(FAMILIES, 0)
    n = 0
    nbytes = 0
    with open(path, "rb") as f:
        for line in f:
            n += 1
            nbytes += len(line)
            m = PFX.match(line)
            if not m:
                cat["continuation"] += 1
                continue
            lvl[m.group(1).decode()] += 1
            tag = m.group(2)
            if tag is None:
                cat["library (untagged)"] += 1
            elif tag == b"slot ":
                cat["slot"] += 1
            elif tag == b"srv  ":
                cat["srv"] += 1
            else:
                cat["cmn/spec (other tagged)"] += 1
            for k, rx in FAMILIES.items():
                if rx.search(line):
                    fam[k] += 1
                    break
    relevant = sum(fam.values())
    return {
        "file": path,
        "lines": n,
        "bytes": nbytes,
        "mean_line_bytes": round(nbytes / n, 1),
        "category_counts": cat,
        "category_fraction": {k: round(v / n, 4) for k, v in cat.items()},
        "level_counts": lvl,
        "family_counts": fam,
        "family_fraction": {k: round(v / n, 5) for k, v in fam.items()},
        "exporter_relevant_lines": relevant,
        "exporter_relevant_fraction": round(relevant / n, 4),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="corpus.log")
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--seed", type=int, default=11434)
    ap.add_argument(
        "--restart-every",
        type=int,
        default=1,
        help="1 (default): every stitched run keeps its startup banner and shutdown "
        "lines, i.e. a restart per run; K>1: only every K-th run does (a "
        "request-dominated, long-running-server mix)",
    )
    ap.add_argument("--stats", metavar="FILE", help="print the line-mix report for FILE and exit")
    a = ap.parse_args()
    if a.stats:
        print(json.dumps(stats(a.stats), indent=2))
        return
    print(json.dumps(generate(a.out, a.lines, a.seed, a.restart_every), indent=2))


if __name__ == "__main__":
    main()
