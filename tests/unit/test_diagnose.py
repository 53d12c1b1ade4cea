"""`llamacpp-exporter diagnose LOG`: the incident report, checked against real logs and the issue's incident.

Ground truth is always the log itself: the report's counts must equal the number of matching lines,
and each failure's table must add up the `stop processing: n_tokens = N` lines written right after
the `Context size has been exceeded` line. The issue's incident (4 slots sharing 262,144 cells) is
rebuilt line by line in b11434's format, shaped after tests/fixtures/b11434/exhaust-lv4. The program
itself (exit status, streams, a history of files) and a real llama-server: tests/real_server/test_diagnose_cli.py.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from big_log import build_log, distinct_run
from diagnose_checks import (
    CAPTURE_ROOT,
    check_against_lines,
    log_lines,
)
from paths import B11434

from exporter import diagnose
from exporter.diagnose import Diagnoser, Report, analyze, diagnose_file, render_text, to_json

FIXTURES = B11434
# The project's captures (the build corpus, with a capture.json, is tests/unit/test_build_corpus.py's).
CAPTURES = sorted(
    p.name for p in CAPTURE_ROOT.iterdir() if (p / "llama-server.log").is_file() and not (p / "capture.json").exists()
)


# ------------------------------------------------------------------------------ the issue's incident

POOL = 262_144
AT_ABORT = {0: 159_069, 1: 23_428, 2: 77_417, 3: 2_949}  # slot -> tokens in its release line
TASKS = {0: 812, 1: 790, 2: 633, 3: 815}
FAILED_BATCH = 719  # 716 prompt tokens of slot 0 + one generated token for each of slots 1-3


def _stamp(seconds: float) -> str:
    """b9151+ `--log-timestamps`: minutes.seconds.milliseconds.microseconds since start."""
    us = round(seconds * 1e6)
    m, us = divmod(us, 60_000_000)
    s, us = divmod(us, 1_000_000)
    ms, us = divmod(us, 1000)
    return f"{m}.{s:02d}.{ms:03d}.{us:03d}"


def incident_lines() -> list[str]:
    """The issue's incident as llama-server b11434 writes it at -lv 4 (prefix and timestamps on)."""
    t = 0.0
    out: list[str] = []

    def log(level: str, msg: str, dt: float = 0.000_013) -> None:
        nonlocal t
        t += dt
        out.append(f"{_stamp(t)} {level} {msg}")

    def slot(s: int, task: int, func: str, msg: str) -> str:
        return f"slot {func:>12}: id {s:2d} | task {task} | {msg}"

    log("I", "srv  llama_server: initializing ...", 0.003_960)
    log("I", "cmn  common_param: common_params_print_info: build 11434 (b11434) with GNU 12.2.0 for Linux x86_64")
    log("I", "cmn  common_param: common_params_print_info: verbosity = 4 (adjust with the `-lv N` CLI arg)")
    log("I", "srv    load_model: loading model 'models/model.gguf'")
    log("I", "llama_context: constructing llama_context", 2.5)
    for name, value in (
        ("n_seq_max", "4"),
        ("n_ctx", str(POOL)),
        ("n_ctx_seq", str(POOL)),
        ("n_batch", "2048"),
        ("n_ubatch", "512"),
        ("causal_attn", "1"),
        ("flash_attn", "auto"),
        ("kv_unified", "true"),
    ):
        log("I", f"llama_context: {name:<21} = {value}")
    log("I", "llama_kv_cache:      CUDA0 KV buffer size =  6144.00 MiB")
    log(
        "I",
        f"llama_kv_cache: size = 6144.00 MiB ({POOL:6d} cells,  12 layers,  4/1 seqs), "
        "K (f16): 3072.00 MiB, V (f16): 3072.00 MiB",
    )
    log("I", f"srv    load_model: initializing, n_slots = 4, n_ctx_slot = {POOL}, kv_unified = 'true'", 0.8)
    for s in range(4):
        log("I", slot(s, -1, "load_model", f"new slot, n_ctx = {POOL}"))
    log("I", "srv          init: idle slots will be saved to prompt cache and cleared upon starting a new task")
    log("I", "srv  llama_server: model loaded")
    log("I", "srv  llama_server: listening on http://127.0.0.1:8080")
    log("I", "srv  update_slots: all slots are idle")

    # One request that finished normally (slot 3), then the four that died together.
    log("I", slot(3, 7, "launch_slot_", "processing task, is_child = 0"), 40.0)
    log("I", slot(3, 7, "operator()", f"new prompt, n_ctx_slot = {POOL}, n_keep = 0, task.n_tokens = 1034"))
    log("I", slot(3, 7, "operator()", "cached n_tokens = 0, memory_seq_rm [0, end)"))
    log("I", slot(3, 7, "release", "stop processing: n_tokens = 1233, truncated = 0"), 6.0)
    log("I", "srv  update_slots: all slots are idle")
    prompts = {2: 77_000, 1: 23_000, 3: 2_500, 0: 200_000}
    for s, n in prompts.items():
        task = TASKS[s]
        log("I", slot(s, task, "launch_slot_", "processing task, is_child = 0"), 3.0)
        log("I", slot(s, task, "operator()", f"new prompt, n_ctx_slot = {POOL}, n_keep = 0, task.n_tokens = {n}"))
        log("I", slot(s, task, "operator()", "cached n_tokens = 0, memory_seq_rm [0, end)"))
    for s in (2, 1, 3):
        log("I", slot(s, TASKS[s], "print_timing", f"n_decoded = {AT_ABORT[s] - prompts[s] - 1:6d}, tg =  31.20 t/s"))
    done = AT_ABORT[0] - 716
    log(
        "I",
        slot(0, TASKS[0], "print_timing", f"prompt processing, n_tokens = {done:6d}, progress = 0.79, t = 612.40 s"),
    )

    # The cascade: the 719-token batch at off = 0 halves down to 1 and still finds no room.
    size, n_batch = FAILED_BATCH, 2048
    while True:
        log("W", f"decode: failed to find a memory slot for batch of size {size}", 0.000_021)
        if n_batch == 1:
            break
        n_batch //= 2
        log(
            "W",
            "srv        decode: failed to find free space in the KV cache, retrying with smaller batch size, "
            f"off = 0, n_batch = {n_batch}, ret = 1",
        )
        size = min(n_batch, FAILED_BATCH)
    log("E", "srv        decode: Context size has been exceeded. off = 0, n_batch = 1, ret = 1")
    for s in range(4):
        task = TASKS[s]
        log("E", f"srv    send_error: task id = {task}, error: Context size has been exceeded.")
        log("W", f"srv          stop: cancel task, id_task = {task}")
        log("I", slot(s, task, "release", f"stop processing: n_tokens = {AT_ABORT[s]}, truncated = 0"))
        log("I", slot(s, -1, "prompt_clear", f"clearing prompt with {AT_ABORT[s]} tokens"))
    log("E", "srv  update_slots: decode() failed: Context size has been exceeded.")
    log("I", "srv  update_slots: all slots are idle")
    return out


def test_incident_table_matches_the_issue() -> None:
    """Acceptance 1: 60.7/8.9/29.5/1.1 %, sum 262,863 = 100.3 %, overflow 719 = the failed batch."""
    report = analyze(incident_lines(), "incident.log")
    assert report.exit_status == 1 and report.runs_total == 1 and report.failures_total == 1
    run = report.runs[0]
    c = run.configuration
    assert (c.n_slots, c.n_ctx_slot, c.kv_unified, c.pool_cells, c.pool_source) == (4, POOL, True, POOL, "log_kv_cache")
    assert c.overcommit == 4.0
    assert (c.type_k, c.type_v, c.kv_bytes_per_cell) == ("f16", "f16", 24_576)  # 6,144 MiB / 262,144 cells

    (f,) = run.failures
    assert [(s.slot, s.task, s.tokens) for s in f.slots] == [(s, TASKS[s], AT_ABORT[s]) for s in range(4)]
    assert [f"{s.share_of_pool * 100:.1f}" for s in f.slots if s.share_of_pool is not None] == [
        "60.7",
        "8.9",
        "29.5",
        "1.1",
    ]
    assert f.tokens_sum == 262_863 and f.share_sum is not None and f"{f.share_sum * 100:.1f}" == "100.3"
    assert f.pool_cells == POOL and f.overflow == 719
    assert (f.failed_batch, f.failed_offset, f.overflow_is_failed_batch) == (FAILED_BATCH, 0, True)
    assert f.heaviest_slot == 0
    assert 3 in f.victims and f.victims == [1, 3]  # both held at most 65,536 = pool / 4 slots
    assert f.equal_share == 65_536
    assert (f.retries, f.memory_slot_failures, f.smallest_batch, f.aborted_requests) == (11, 12, 1, 4)

    rec = run.recommendations[0]
    assert rec.flags == "--kv-unified-per-slot 262144" and rec.pool_cells == 1_048_576 and rec.supported_by_log
    # Memory from the measured 24,576 bytes per cell: 24 GiB at f16, 12.75 GiB at q8_0 (34 bytes per 32).
    assert [(m.type_k, m.kv_bytes, m.delta_bytes) for m in rec.memory] == [
        ("f16", 24 * 2**30, 18 * 2**30),
        ("q8_0", 13_056 * 2**20, 6_912 * 2**20),
    ]
    alt = run.recommendations[1]
    assert (alt.kind, alt.window_per_slot, alt.requests_over_window, alt.supported_by_log) == (
        "no_kv_unified",
        65_536,
        2,  # slots 0 and 2 held more than 65,536 tokens
        False,
    )


def test_incident_text_report() -> None:
    """The plain-text table is aligned and uses thousands separators."""
    text = render_text(analyze(incident_lines(), "incident.log"))
    print(text)
    assert (
        "\n".join(
            [
                "      slot  task  tokens at abort  share of pool",
                "         0   812          159,069         60.7 %",
                "         1   790           23,428          8.9 %",
                "         2   633           77,417         29.5 %",
                "         3   815            2,949          1.1 %",
                "       sum                262,863        100.3 %",
            ]
        )
        in text
    )
    assert "overflow: 262,863 - 262,144 = 719 tokens, exactly the batch of 719 tokens that found no room" in text
    assert "heaviest: slot 0, 159,069 tokens (60.7 % of the pool)" in text
    assert "collateral victims: slots 1, 3 each held at most 65,536 tokens (pool / slots)" in text
    assert "overcommit   4.0 (4 slots x 262,144 = 1,048,576 tokens promised to a pool of 262,144 cells)" in text
    assert "1. --kv-unified-per-slot 262144 (supported by this log)" in text
    assert "4 x 262,144 = 1,048,576 cells" in text
    assert "KV cache K q8_0, V q8_0 with -ctk q8_0 -ctv q8_0: 12.75 GiB, 6.75 GiB more than now" in text


# ------------------------------------------------------------------------------------ real captures


@pytest.mark.parametrize("name", CAPTURES)
def test_capture_counts_equal_line_counts(name: str) -> None:
    path = CAPTURE_ROOT / name / "llama-server.log"
    report = diagnose_file(str(path))
    check_against_lines(report, log_lines(path))
    assert report.runs_total == 1 and report.runs[0].started
    for f in report.runs[0].failures:
        # The captures confirm the arithmetic: the sum overflows the pool by exactly the batch that found no room.
        assert f.overflow is not None and f.overflow == f.failed_batch and f.overflow_is_failed_batch
        assert f.smallest_batch == 1


def test_exhaust_lv4_report() -> None:
    """exhaust-lv4: 128+128+129+128 = 513 in a 512-cell pool: overflow 1 = the last batch of size 1."""
    report = diagnose_file(str(FIXTURES / "exhaust-lv4" / "llama-server.log"))
    text = render_text(report)
    print(text)
    (f,) = report.runs[0].failures
    assert [s.tokens for s in f.slots] == [128, 128, 129, 128]
    assert (f.tokens_sum, f.pool_cells, f.overflow, f.failed_batch, f.failed_offset) == (513, 512, 1, 1, 3)
    assert (f.heaviest_slot, f.victims, f.elapsed_s) == (2, [0, 1, 3], 0.06419)
    assert "overflow: 513 - 512 = 1 token, exactly the batch of 1 token that found no room (off = 3)" in text
    assert report.runs[0].recommendations[0].flags == "--kv-unified-per-slot 512"
    assert report.runs[0].recommendations[0].pool_cells == 2048


def test_recovered_cascade_is_no_failure() -> None:
    report = diagnose_file(str(FIXTURES / "recover-purge-lv4" / "llama-server.log"))
    c = report.runs[0].counts
    assert report.exit_status == 0 and report.failures_total == 0
    assert (c.cascades_recovered, c.cascades_failed, c.idle_slots_purged, c.retries) == (1, 0, 1, 1)


def test_not_overcommitted_run_gets_no_recommendation() -> None:
    report = diagnose_file(str(FIXTURES / "longprompt-lv4" / "llama-server.log"))
    run = report.runs[0]
    assert run.configuration.overcommit == 1.0 and run.configuration.kv_unified is False
    assert run.recommendations == [] and run.verdict is None
    assert run.counts.largest_request_tokens == 47_732


# ---------------------------------------------------------------------------------- formats and runs


def _same_failures(a: Report, b: Report) -> None:
    def key(r: Report) -> list[Any]:
        return [
            (dataclasses.astuple(run.counts), [dataclasses.replace(f, elapsed_s=None) for f in run.failures])
            for run in r.runs
        ]

    assert key(a) == key(b)


def _jsonl(line: str, i: int) -> str:
    return json.dumps({"type": "log", "time": i * 17, "level": "info", "msg": line + "\n"})


def _coloured(line: str) -> str:
    # llama-server's colours: blue timestamp, level letter in colour, the reset at the start of the next line.
    m = re.match(r"^(\d+\.\d{2}\.\d{3}\.\d{3}) ([IWE]) (.*)$", line)
    if not m:
        return line
    colour = {"I": "\x1b[32m", "W": "\x1b[35m", "E": "\x1b[31m"}[m[2]]
    return f"\x1b[0m\x1b[34m{m[1]}\x1b[0m {colour}{m[2]} \x1b[0m{m[3]}"


@pytest.mark.parametrize("form", ["jsonl", "coloured", "router", "crlf", "no-prefix"])
def test_other_line_forms_give_the_same_report(form: str) -> None:
    plain = log_lines(FIXTURES / "exhaust-lv4" / "llama-server.log")
    if form == "jsonl":
        lines = [_jsonl(re.sub(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ", "", ln), i) for i, ln in enumerate(plain)]
    elif form == "coloured":
        lines = [_coloured(ln) for ln in plain]
    elif form == "router":
        lines = [f"[18080] {ln}" for ln in plain]
    elif form == "crlf":
        lines = [ln + "\r\n" for ln in plain]
    else:
        lines = [re.sub(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ", "", ln) for ln in plain]
    if form == "jsonl":
        # A JSONL entry may hold several lines; the physical lines of the plain log that are continuations
        # become part of the previous entry's msg, so compare everything but line numbers.
        base, other = analyze(plain), analyze(lines)
        assert [dataclasses.astuple(r.counts) for r in base.runs] == [dataclasses.astuple(r.counts) for r in other.runs]
        assert [[s.tokens for s in f.slots] for f in other.runs[0].failures] == [[128, 128, 129, 128]]
        return
    report = analyze(lines)
    _same_failures(analyze(plain), report)
    if form == "router":
        assert report.runs[0].source == "18080"
    if form == "no-prefix":
        assert report.runs[0].failures[0].elapsed_s is None


def test_jsonl_capture() -> None:
    report = diagnose_file(str(FIXTURES / "exhaust-jsonl" / "llama-server.log"))
    (f,) = report.runs[0].failures
    assert [s.tokens for s in f.slots] == [129, 129, 129, 129]
    assert (f.overflow, f.failed_batch, f.elapsed_s) == (4, 4, 0.067023)  # JSONL `time` is in microseconds
    assert f.victims == []  # everyone held more than 128 = pool / 4
    assert "slots 0, 1, 2, 3 (tied)" in render_text(report)


def test_multi_run_log(tmp_path: Path) -> None:
    """All captures in one file (as `>>` or a restarted server's stderr would leave them): one run each."""
    path = tmp_path / "all.log"
    singles = [diagnose_file(str(CAPTURE_ROOT / n / "llama-server.log")) for n in CAPTURES]
    with path.open("w", encoding="utf-8") as f:
        for n in CAPTURES:
            f.write((CAPTURE_ROOT / n / "llama-server.log").read_text(encoding="utf-8"))
    report = diagnose_file(str(path), max_runs=0)
    assert report.runs_total == len(CAPTURES) == len(report.runs)
    check_against_lines(report, log_lines(path))
    for single, run in zip(singles, report.runs, strict=True):
        assert dataclasses.astuple(single.runs[0].counts) == dataclasses.astuple(run.counts)
        assert dataclasses.astuple(single.runs[0].configuration) == dataclasses.astuple(run.configuration)
        assert [[s.tokens for s in f.slots] for f in single.runs[0].failures] == [
            [s.tokens for s in f.slots] for f in run.failures
        ]
    assert sum(r.failure_summary.total for r in report.runs) == report.failures_total

    # Only the last two runs in detail; the others are summarized, and the totals still cover everything.
    short = diagnose_file(str(path), max_runs=2)
    assert [r.index for r in short.runs] == [len(CAPTURES) - 1, len(CAPTURES)]
    assert short.omitted_runs.runs == len(CAPTURES) - 2
    assert short.omitted_runs.failures + sum(r.failure_summary.total for r in short.runs) == report.failures_total
    assert (short.failures_total, short.aborted_requests_total) == (
        report.failures_total,
        report.aborted_requests_total,
    )
    assert "summarized, not shown" in render_text(short)


def test_log_starting_mid_run_then_restart() -> None:
    """A log that begins after the server started (no banner), then a restart: two runs."""
    lines = log_lines(FIXTURES / "exhaust-lv4" / "llama-server.log")
    tail = lines[250:]  # from the middle of the first request on
    report = analyze([*tail, *lines])
    assert report.runs_total == 2
    first, second = report.runs
    assert not first.started and second.started
    assert first.configuration.pool_cells is None and second.configuration.pool_cells == 512
    assert len(first.failures) == len(second.failures) == 1
    assert [s.tokens for s in first.failures[0].slots] == [128, 128, 129, 128]


def test_many_failures_are_summarized() -> None:
    """A run with 25 failures keeps the first 5 and the last 5 in detail, and counts all 25."""
    lines = incident_lines()
    start = next(i for i, ln in enumerate(lines) if "processing task" in ln and "task 812" in ln) - 9
    incident = lines[start:]
    report = analyze([*lines, *(incident * 24)])
    (run,) = report.runs
    assert run.failure_summary.total == 25 == report.failures_total
    assert [f.number for f in run.failures] == [1, 2, 3, 4, 5, 21, 22, 23, 24, 25]
    assert run.failure_summary.aborted_requests == 100 == run.counts.aborted_requests
    assert run.failure_summary.victims == 50
    assert len(analyze([*lines, *(incident * 24)], max_failures=0).runs[0].failures) == 25


# ------------------------------------------------------------------------------------------- JSON


def _shape(value: Any) -> Any:
    """The key structure of a JSON value (lists by their first element)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__


_FAILURE_KEYS = [
    "number",
    "line",
    "elapsed_s",
    "reason",
    "retries",
    "memory_slot_failures",
    "idle_slots_purged",
    "smallest_batch",
    "failed_offset",
    "failed_batch",
    "aborted_requests",
    "slots",
    "tokens_sum",
    "share_sum",
    "pool_cells",
    "overflow",
    "overflow_is_failed_batch",
    "heaviest_slot",
    "equal_share",
    "victims",
    "predictable_line",
    "predictable_elapsed_s",
    "predictable_lead_s",
    "predictable_demand",
    "predictable_from",
]


def test_json_schema_is_stable() -> None:
    """Tools rely on these keys: changing them needs a new schema version."""
    data = json.loads(to_json(analyze(incident_lines(), "incident.log")))
    assert data["schema"] == "llamacpp-exporter/diagnose/v6" and data["exit_status"] == 1
    assert list(data) == [
        "schema",
        "file",
        "files",
        "files_order",
        "skipped",
        "lines",
        "long_lines",
        "runs_total",
        "failures_total",
        "aborted_requests_total",
        "runs",
        "omitted_runs",
        "endings",
        "failed_starts_in_a_row",
        "by_file",
        "largest_requests",
        "history",
        "overlaps",
        "history_advice",
        "requests",
        "exit_status",
    ]
    run = data["runs"][0]
    assert list(run) == [
        "index",
        "source",
        "file",
        "first_line",
        "last_line",
        "started",
        "duration_s",
        "configuration",
        "counts",
        "failures",
        "failure_summary",
        "recommendations",
        "verdict",
        "cannot_know",
        "ending",
        "model",
    ]
    assert list(run["ending"]) == ["how", "reason", "in_flight", "pool_used_tokens", "pool_capacity_tokens", "memory"]
    assert list(data["history"][0]) == [
        "index",
        "file",
        "source",
        "first_line",
        "last_line",
        "ending",
        "failures",
        "aborted_requests",
        "retries",
        "largest_request_tokens",
        "duration_s",
        "started_at",
        "ended_at",
        "clock",
        "in_flight_prompt_tokens",
        "n_ctx_slot",
        "memory",
        "same_as",
        "model",
        "pool_cells",
    ]
    assert list(run["configuration"]) == [
        "build",
        "model",
        "verbosity",
        "n_slots",
        "n_ctx_slot",
        "kv_unified",
        "pool_cells",
        "pool_source",
        "per_slot_cap",
        "overcommit",
        "type_k",
        "type_v",
        "kv_bytes",
        "kv_bytes_per_cell",
        "k_bytes_per_cell",
        "v_bytes_per_cell",
        "kv_bytes_rel_error",
        "swa_kv_bytes",
    ]
    assert list(run["counts"]) == [
        "requests_started",
        "requests_finished",
        "retries",
        "memory_slot_failures",
        "idle_slots_purged",
        "cascades_recovered",
        "cascades_failed",
        "cascade_unfinished",
        "aborts",
        "decode_failures",
        "aborted_requests",
        "request_errors",
        "largest_request_tokens",
        "requests_over_equal_share",
    ]
    assert list(run["failures"][0]) == _FAILURE_KEYS
    assert list(run["failures"][0]["slots"][0]) == ["slot", "task", "tokens", "share_of_pool"]
    assert list(run["recommendations"][0]) == [
        "kind",
        "flags",
        "pool_cells",
        "window_per_slot",
        "memory",
        "requests_over_window",
        "supported_by_log",
        "summary",
    ]
    assert list(run["recommendations"][0]["memory"][0]) == ["type_k", "type_v", "flags", "kv_bytes", "delta_bytes"]
    assert list(data["omitted_runs"]) == ["runs", "failures", "aborted_requests", "retries"]
    # Every capture's JSON has the same shape as far as it goes (no key appears or vanishes by content).
    for name in CAPTURES:
        other = json.loads(to_json(diagnose_file(str(CAPTURE_ROOT / name / "llama-server.log"))))
        assert list(other) == list(data) and list(other["runs"][0]) == list(run)
        assert list(other["runs"][0]["counts"]) == list(run["counts"])
        for f in other["runs"][0]["failures"]:
            assert list(f) == _FAILURE_KEYS


# --------------------------------------------------------------------------------------- CLI and I/O


def test_a_copytruncate_hole_before_the_log_is_skipped(tmp_path: Path) -> None:
    """copytruncate without O_APPEND leaves NUL bytes where the old lines were (see logs/tail.py): not binary."""
    log = FIXTURES / "exhaust-lv4" / "llama-server.log"
    path = tmp_path / "llama-server.log"
    path.write_bytes(b"\x00" * (2 * diagnose.SNIFF_BYTES + 3) + log.read_bytes())
    with_hole, plain = diagnose_file(str(path)), diagnose_file(str(log))
    _same_failures(plain, with_hole)
    assert (with_hole.lines, with_hole.runs_total) == (plain.lines, plain.runs_total)


def test_gzip_log(tmp_path: Path) -> None:
    path = tmp_path / "llama-server.log.1.gz"
    path.write_bytes(gzip.compress((FIXTURES / "exhaust-lv4" / "llama-server.log").read_bytes()))
    _same_failures(diagnose_file(str(FIXTURES / "exhaust-lv4" / "llama-server.log")), diagnose_file(str(path)))


def test_over_long_line_is_cut_not_kept(tmp_path: Path) -> None:
    lines = (FIXTURES / "exhaust-lv4" / "llama-server.log").read_bytes().splitlines(keepends=True)
    path = tmp_path / "long.log"
    path.write_bytes(b"".join([*lines[:200], b"x" * (3 * diagnose.MAX_LINE_BYTES + 5) + b"\n", *lines[200:]]))
    report = diagnose_file(str(path))
    assert report.long_lines == 1 and report.lines == len(lines) + 1
    assert [s.tokens for s in report.runs[0].failures[0].slots] == [128, 128, 129, 128]
    assert report.runs[0].failures[0].line == 355


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    data = (FIXTURES / "exhaust-lv4" / "llama-server.log").read_bytes()
    path = tmp_path / "bad-utf8.log"
    path.write_bytes(data.replace(b"tiny-llama", b"tiny-\xff\xfellama"))
    report = diagnose_file(str(path))
    assert report.runs[0].configuration.model == "models/tiny-\ufffd\ufffdllama.gguf"
    assert report.failures_total == 1


def test_memory_stays_bounded(tmp_path: Path) -> None:
    """Structural check for acceptance 3: 4x the log does not need more memory (no per-line state).

    bench/diagnose_big.py builds the log the same way (support/big_log.py) and measures 1 GiB in a subprocess.
    """
    peaks = []
    for size_mb in (3, 12):
        built = build_log(tmp_path / f"{size_mb}.log", size_mb * 2**20)
        tracemalloc.start()
        try:
            report = diagnose_file(str(built.path))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert (report.runs_total, report.failures_total) == (built.runs, built.failures)
        assert len(report.runs) == 10 and report.omitted_runs.runs == built.runs - 10
    print(f"peak traced memory: 3 MiB log {peaks[0] / 1024:,.0f} KiB, 12 MiB log {peaks[1] / 1024:,.0f} KiB")
    assert peaks[1] < peaks[0] * 1.25 + 256 * 1024
    assert peaks[1] < 8 * 2**20


def test_stream_reader_bounds_lines() -> None:
    stats = diagnose.ReadStats()
    data = b"a\n" + b"b" * 100 + b"\nc"
    assert list(diagnose.read_lines(io.BytesIO(data), stats, max_line=10)) == ["a\n", "b" * 10, "c"]
    assert (stats.lines, stats.long_lines, stats.bytes) == (3, 1, len(data))


def test_block_reader_gives_the_lines_and_counts_of_the_line_reader() -> None:
    """`read_blocks` (diagnose after the first MiB) against `read_lines` on random lines around the
    cut length, lines longer than a block, a missing final newline and multi-byte characters."""
    rng = random.Random(7)
    for case in range(300):
        max_line = rng.choice([4, 7, 10, 33])
        parts = []
        for _ in range(rng.randrange(0, 30)):
            n = rng.choice([0, 1, max_line - 2, max_line - 1, max_line, max_line + 1, 3 * max_line, rng.randrange(50)])
            parts.append(bytes(rng.choice(b"ab\xc3\xa9 ") for _ in range(n)) + b"\n")
        data = b"".join(parts)
        if case % 3 == 0:
            data = data.rstrip(b"\n")
        by_line, by_block = diagnose.ReadStats(), diagnose.ReadStats()
        lines = list(diagnose.read_lines(io.BytesIO(data), by_line, max_line))
        blocks = list(diagnose.read_blocks(io.BytesIO(data), by_block, max_line))
        assert [x for b in blocks for x in diagnose.lines_of(b)] == lines, (case, data)
        assert (by_block.lines, by_block.long_lines, by_block.bytes) == (
            by_line.lines,
            by_line.long_lines,
            by_line.bytes,
        ), (case, data)


def test_pure_core_accepts_events() -> None:
    """The core takes parsed events too (what the exporter's pipeline already has)."""
    from exporter.logs.parse import parse_line

    d = Diagnoser("events")
    for i, line in enumerate(incident_lines(), 1):
        e = parse_line(line)
        if e is not None:
            d.feed_event(e, i, line)
    report = d.finish()
    assert report.runs[0].failures[0].tokens_sum == 262_863


# ------------------------------------------------------------------------------ a real llama-server


def test_older_build_wording_and_order() -> None:
    """b6072–b6924 wording (`i =`, `n_past`, comma after the message): release before send_error, and an
    error addressed to an idle slot's stale task (those builds send it to every slot)."""
    lines = [
        "build: 6500 (0123abcd) with cc (Ubuntu 13.3.0) for x86_64-linux-gnu",
        "llama_context: n_seq_max     = 2",
        "llama_context: n_ctx         = 512",
        "llama_context: n_ctx_per_seq = 512",
        "llama_context: kv_unified    = true",
        "llama_kv_cache_unified: size =    0.12 MiB (   512 cells,   2 layers,  2/1 seqs), K (f16):    0.06 MiB, V (f16):    0.06 MiB",
        "srv          init: initializing slots, n_slots = 3",
        "slot         init: id  0 | task -1 | new slot n_ctx_slot = 512",
        "slot         init: id  1 | task -1 | new slot n_ctx_slot = 512",
        "slot         init: id  2 | task -1 | new slot n_ctx_slot = 512",
        "main: server is listening on http://127.0.0.1:8080 - starting the main loop",
        "slot launch_slot_: id  2 | task 2 | processing task",  # slot 2's last task: stale by the failure
        "slot      release: id  2 | task 2 | stop processing: n_past = 20, truncated = 0",
        "slot launch_slot_: id  0 | task 5 | processing task",
        "slot launch_slot_: id  1 | task 6 | processing task",
        "decode: failed to find a memory slot for batch of size 18",
        "srv  update_slots: failed to find free space in the KV cache, retrying with smaller batch size, i = 0, n_batch = 256, ret = 1",
        *[
            line
            for n in (8, 4, 2, 1)
            for line in (
                f"decode: failed to find a memory slot for batch of size {min(2 * n, 18)}",
                f"srv  update_slots: failed to find free space in the KV cache, retrying with smaller batch size, i = 0, n_batch = {n}, ret = 1",
            )
        ],
        "decode: failed to find a memory slot for batch of size 1",
        "srv  update_slots: Context size has been exceeded., i = 0, n_batch = 1, ret = 1",
        "slot      release: id  0 | task 5 | stop processing: n_past = 300, truncated = 0",
        "srv    send_error: task id = 5, error: Context size has been exceeded.",
        "slot      release: id  1 | task 6 | stop processing: n_past = 230, truncated = 0",
        "srv    send_error: task id = 6, error: Context size has been exceeded.",
        "srv    send_error: task id = 2, error: Context size has been exceeded.",
        "srv  update_slots: all slots are idle",
    ]
    report = analyze(lines)
    (run,) = report.runs
    c = run.configuration
    assert (c.build, c.n_slots, c.n_ctx_slot, c.pool_cells, c.kv_unified) == (6500, 3, 512, 512, True)
    assert run.counts.retries == 5 and run.counts.aborted_requests == 3
    (f,) = run.failures
    assert [(s.slot, s.task, s.tokens) for s in f.slots] == [(0, 5, 300), (1, 6, 230)]
    assert (f.tokens_sum, f.overflow, f.failed_batch, f.overflow_is_failed_batch) == (530, 18, 18, True)
    assert f.aborted_requests == 3 and f.heaviest_slot == 0 and f.victims == []
    assert run.recommendations[0].flags == "--kv-unified-per-slot 512"
    assert "newer than b9928; this is b6500" in run.recommendations[0].summary


def test_console_script_dispatches_diagnose() -> None:
    """`llamacpp-exporter diagnose …` goes to exporter.diagnose before the exporter's own flags are parsed."""
    from exporter.cli import main as cli_main

    assert cli_main(["diagnose", str(FIXTURES / "recover-purge-lv4" / "llama-server.log"), "--json"]) == 0


def test_crash_loop_during_start_up_is_one_run_per_start() -> None:
    """A server that dies while loading and is restarted prints its banner again before any request."""
    lines = log_lines(FIXTURES / "exhaust-lv4" / "llama-server.log")
    loading = lines[:20]  # banner and model loading, then the process died
    report = analyze([*loading, *loading, *lines])
    assert report.runs_total == 3
    assert [r.started for r in report.runs] == [True, True, True]
    assert [len(r.failures) for r in report.runs] == [0, 0, 1]


def _again(text: str, k: int) -> str:
    """A capture as the k-th later start of its server (its first time stamp moved: see distinct_run)."""
    return str(distinct_run(text.encode(), k).decode())


def _line_by_line(path: Path) -> Report:
    """The reference: every line through `feed_line`, as `analyze` does."""
    d = Diagnoser(str(path))
    stats = diagnose.ReadStats()
    with path.open("rb") as f:
        for line in diagnose.read_lines(f, stats):
            d.feed_line(line, stats.lines)
    d.long_lines = stats.long_lines
    return d.finish({str(path): path.stat().st_mtime})  # what diagnose_files adds: the file's time


@pytest.mark.parametrize("mix", ["plain", "odd"])
def test_batched_diagnose_equals_line_by_line(tmp_path: Path, mix: str) -> None:
    """diagnose_file scans batches of lines at once after the first MiB; the report must not change.

    The log repeats every real capture past the 1 MiB sniff window (plain, no-prefix, default verbosity
    and long runs go through the batch scan), with, for "odd", JSONL, router-prefixed and coloured runs
    and an over-long line in between (those batches go line by line) and no newline at the end.
    """
    captures = [(CAPTURE_ROOT / c / "llama-server.log").read_text() for c in CAPTURES]
    plain = [c for c in captures if not c.startswith("{")]
    parts: list[str] = []
    size = 0
    while size < 3 * diagnose.SNIFF_BYTES:
        for c in plain if mix == "plain" else captures:
            parts.append(_again(c, len(parts)))
            size += len(c)
        if mix == "odd":
            first = plain[0].splitlines(keepends=True)
            parts.append("".join(f"[ 8081] {line}" for line in first[:400]))
            parts.append("".join(f"\x1b[32m{line}" if i % 3 else line for i, line in enumerate(first[:200])))
            parts.append("0.00.000.001 I " + "x" * (diagnose.MAX_LINE_BYTES + 10) + "\n")
    text = "".join(parts)
    path = tmp_path / "big.log"
    path.write_text(text.rstrip("\n") if mix == "odd" else text)
    batched, reference = diagnose_file(str(path)), _line_by_line(path)
    assert batched.runs_total > 50 and batched.failures_total > 10
    assert to_json(batched) == to_json(reference)


def test_advice_is_proportionate_to_what_the_log_shows() -> None:
    """No failure and requests that fit together: no change recommended. No failure yet, but this log's own
    requests could not run together: a risk, the fix that costs no memory first, each with its cost."""
    healthy = analyze(log_lines(FIXTURES / "checkpoints-swa-lv4" / "llama-server.log"))
    (run,) = healthy.runs
    assert run.configuration.overcommit == 2.0 and healthy.failures_total == 0
    assert run.recommendations == [] and run.verdict is None

    # Four 9,000-token prompts on a 32,768-cell pool, cut before llama-server failed them.
    lines = log_lines(FIXTURES / "prompt-overflow-lv4" / "llama-server.log")
    before_failure = lines[
        : next(i for i, line in enumerate(lines) if "failed to find" in line or "send_error" in line)
    ]
    risky = analyze(before_failure)
    (run,) = risky.runs
    assert risky.failures_total == 0
    assert [r.kind for r in run.recommendations] == ["no_kv_unified", "kv_unified_per_slot"]
    assert run.verdict is not None and run.verdict.startswith("No request failed in this log, but the pool is a risk")
    assert "shrinks the windows" in run.verdict and "more KV memory" in run.verdict


def test_how_each_run_ended() -> None:
    """From real b11434 lines: a clean exit, a start that never listens (three in a row), a run cut
    mid-request and followed by the next start (a crash or kill), and a log that ends mid-request."""
    lines = (CAPTURE_ROOT / "exhaust-lv4" / "llama-server.log").read_text().splitlines(keepends=True)
    listening = next(i for i, line in enumerate(lines) if "listening on" in line)
    in_flight = next(i for i, line in enumerate(lines) if "task 20 | new prompt" in line) + 1
    never_listens = "".join(lines[:listening])
    starts = [never_listens, never_listens, never_listens, "".join(lines[:in_flight]), "".join(lines[:in_flight])]
    history = [*lines, *(x for k, text in enumerate(starts, 1) for x in _again(text, k).splitlines(keepends=True))]
    report = analyze(history, "history.log", max_runs=0)
    assert [r.ending.how for r in report.runs] == [
        "clean",
        "failed_start",
        "failed_start",
        "failed_start",
        "died_mid_request",
        "log_ends_mid_request",
    ]
    assert report.endings == {"clean": 1, "failed_start": 3, "died_mid_request": 1, "log_ends_mid_request": 1}
    assert report.failed_starts_in_a_row == 3
    died = report.runs[4].ending
    # What was in flight: the tasks the log had started and not released, with the prompt size it gave.
    assert [(f.slot, f.task, f.prompt_tokens) for f in died.in_flight] == [(2, 20, 103)]
    assert died.pool_capacity_tokens == 512
    text = render_text(report)
    assert (
        "How runs ended: 1 clean, 3 failed start, 1 died mid-request, 1 log ends mid-request, 3 failed starts in a row."
        in text
    )
    assert "crashed or was killed mid-request" in text and "in flight: 1 request," in text


@pytest.mark.parametrize("mix", ["plain", "odd", "starting"])
def test_a_big_log_on_several_cores_gives_the_same_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mix: str
) -> None:
    """A log split at start lines and read by worker processes gives the report of one process, byte
    for byte (JSON, with --html's series); where a split would change it (router mode, a run cut
    during its start-up), the log is read as a whole. "starting": every start-up is cut short, so a
    start line may follow a run that never printed its own `initializing ...`."""
    from exporter.diagnose import parallel

    built = build_log(tmp_path / "big.log", 6 * 2**20, root=CAPTURE_ROOT)
    path = built.path
    if mix == "odd":
        lines = (CAPTURE_ROOT / "exhaust-lv4" / "llama-server.log").read_text().splitlines(keepends=True)
        with path.open("a") as f:
            f.write("".join(f"[ 8081] {line}" for line in lines))
    elif mix == "starting":
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(line for line in lines if "initializing ..." not in line or len(line) % 3))
    split: list[bool] = []
    real = parallel.feed_in_parts

    def recorded(*args: Any, **kwargs: Any) -> bool:
        split.append(real(*args, **kwargs))
        return split[-1]

    monkeypatch.setattr(parallel, "feed_in_parts", recorded)
    monkeypatch.setattr(parallel, "MIN_BYTES", 1024 * 1024)
    monkeypatch.setattr(parallel, "workers", lambda: 3)
    in_parts = diagnose.diagnose_files([str(path)], max_runs=0, series=True)
    monkeypatch.setattr(parallel, "MIN_BYTES", 1 << 62)
    whole = diagnose.diagnose_files([str(path)], max_runs=0, series=True)
    if mix != "starting":  # where the cuts fall decides whether a part ends in a start-up (then: as a whole)
        assert split[0] == (mix != "odd")  # router mode is read as a whole
    assert len(in_parts.history) > 100
    assert to_json(in_parts) == to_json(whole)
    assert {i: (s.x, s.tokens) for i, s in in_parts.series.items()} == {
        i: (s.x, s.tokens) for i, s in whole.series.items()
    }


def test_crashes_at_long_prompts_with_little_memory_point_at_headroom() -> None:
    """Real b11434 runs: two clean ones, and two cut mid-prompt (each followed by the next start: a
    crash), whose 339-token prompt is longer than any request the clean runs finished. The memory the
    crashed runs projected at start decides the advice: little left (the `projected to use` line
    rewritten with device figures) points at memory headroom; plenty (as logged, on a CPU) gives no
    advice; none logged says what would tell."""
    clean = (CAPTURE_ROOT / "exhaust-lv4" / "llama-server.log").read_text()
    cut = "".join((CAPTURE_ROOT / "exhaust-long-lv4" / "llama-server.log").read_text().splitlines(keepends=True)[:400])
    as_logged = re.search(r"projected to use \d+ MiB of host memory vs\. \d+ MiB of total host memory", cut)
    assert as_logged is not None

    def history(projection: str) -> Report:
        crashed = cut.replace(as_logged[0], projection) if projection else cut.replace(as_logged[0], "x")
        runs = [clean, crashed, crashed, clean]
        return analyze("".join(_again(r, k) for k, r in enumerate(runs)).splitlines(keepends=True), max_runs=0)

    little = history("projected to use 23668 MiB of device memory vs. 24080 MiB of free device memory")
    assert [s.ending for s in little.history] == ["clean", "died_mid_request", "died_mid_request", "clean"]
    assert little.runs[1].ending.memory is not None and little.runs[1].ending.memory.headroom_mib == 412
    (advice,) = little.history_advice
    assert advice.startswith("2 of 2 crashes came while a long prompt (339 tokens) was being processed")
    assert "as little as 412 MiB of device memory left at start (of 24,080 MiB)" in advice
    assert "Those runs also overflowed the KV pool" in advice  # they also aborted requests
    assert "-ub" in advice and "-ctk q8_0 -ctv q8_0" in advice
    text = render_text(little)
    assert "Across the history: 2 of 2 crashes came while a long prompt" in text
    assert "Memory at start: 23,668 MiB projected of 24,080 MiB free device memory (412 MiB left)" in text

    assert history(as_logged[0]).history_advice == []  # 24 GB of host memory to spare
    (unknown,) = history("").history_advice
    assert "The logs do not say how much was free" in unknown and "llamacpp_gpu_memory_free_bytes" in unknown


def test_journal_readers_take_hostile_input() -> None:
    """journalctl output is read from files anyone may have edited: nesting deeper than Python
    recurses, a 1 MiB+ text field, a cut binary field, impossible dates and U+2028 in a message (which
    str.splitlines would take for a line end, letting a prompt forge a line) neither raise nor forge."""
    from exporter.diagnose.journal import export_lines, json_lines
    from exporter.logs.journald import parse_entry

    assert parse_entry("[" * 100_000) is None
    forged = '{"__CURSOR":"c","MESSAGE":"prompt\\u2028srv  update_slots: all slots are idle"}'
    entry = parse_entry(forged)
    assert entry is not None and entry.lines == ["prompt\u2028srv  update_slots: all slots are idle"]
    dated = list(json_lines(['{"__REALTIME_TIMESTAMP":"9999999999999999999","MESSAGE":"a"}\n', "[" * 50_000]))
    assert dated == [(None, "a\n")]

    def entry_bytes(**fields: bytes) -> bytes:
        out = b""
        for name, value in fields.items():
            if b"\n" in value or b"\x1b" in value:
                out += name.encode() + b"\n" + len(value).to_bytes(8, "little") + value + b"\n"
            else:
                out += name.encode() + b"=" + value + b"\n"
        return out + b"\n"

    stream = (
        entry_bytes(__REALTIME_TIMESTAMP=b"1764612809000000", MESSAGE=b"first")
        + entry_bytes(MESSAGE=b"x" * (1024 * 1024 + 100))  # a text field over the 1 MiB kept
        + entry_bytes(__REALTIME_TIMESTAMP=b"1764612810000000", MESSAGE=b"\x1b[32mcoloured\x1b[0m\nsecond line")
        + entry_bytes(__REALTIME_TIMESTAMP=b"99999999999999999", MESSAGE=b"year 5138")
        + b"MESSAGE\n\x10\x00\x00"  # a binary field cut in its length
    )
    got = [(t, line) for t, line, _ in export_lines(io.BytesIO(stream))]
    assert got[0] == (1764612809.0, "first\n")
    assert got[1][0] is None and len(got[1][1]) == 1024 * 1024 - len("MESSAGE=") + 1
    assert got[2:] == [
        (1764612810.0, "\x1b[32mcoloured\x1b[0m\n"),
        (1764612810.0, "second line\n"),
        (None, "year 5138\n"),
    ]


def test_a_big_file_that_is_not_a_log_is_refused_in_parts_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MiB of binary data, then a log: one process stops at the first MiB and says so; so must the
    parts (a later part alone would find the log)."""
    from exporter.diagnose import parallel

    built = build_log(tmp_path / "log", 4 * 2**20, root=CAPTURE_ROOT)
    path = tmp_path / "binary-then-log"
    path.write_bytes(random.Random(7).randbytes(2**20) + built.path.read_bytes())
    monkeypatch.setattr(parallel, "MIN_BYTES", 1024 * 1024)
    monkeypatch.setattr(parallel, "workers", lambda: 3)
    with pytest.raises(diagnose.InputError, match="binary data"):
        diagnose.diagnose_files([str(path)])
