"""`llamacpp-exporter diagnose LOG` on the issue's incident (4 slots sharing 262,144 cells), rebuilt line by
line in b11434's format, shaped after tests/fixtures/b11434/exhaust-lv4: its table, its text, its JSON schema,
many failures summarized, and the same report from parsed events.

Each failure's table must add up the `stop processing: n_tokens = N` lines written right after the
`Context size has been exceeded` line. The program itself (exit status, streams, a history of files) and a
real llama-server: tests/real_server/test_diagnose_cli.py.
"""

from __future__ import annotations

import json
from typing import Any

from diagnose_checks import CAPTURE_NAMES, CAPTURE_ROOT
from paths import B11434

from exporter.diagnose import Diagnoser, analyze, diagnose_file, render_text, to_json

FIXTURES = B11434


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
    report = analyze(incident_lines(), "incident.log")
    text = render_text(report)
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
    # The victims' own cells, not the private pool's size, so that none reads as if it held 65,536.
    assert "collateral victims: slot 1 23,428, slot 3 2,949 tokens: each no more than a private" in text
    # The history's verdict: the pool overflowed, by the sum held at the failure; the recommendation is
    # at least that floor.
    assert "Pool: too small: it overflowed." in text
    assert report.sizing is not None and report.sizing.held_at_failure == 262_863
    assert report.sizing.overflow == 719 and (report.sizing.recommended or 0) >= 262_863
    assert "overcommit   4.0 (4 slots x 262,144 = 1,048,576 tokens promised to a pool of 262,144 cells)" in text
    assert "1. --kv-unified-per-slot 262144 (supported by this log)" in text
    assert "4 x 262,144 = 1,048,576 cells" in text
    assert "KV cache K q8_0, V q8_0 with -ctk q8_0 -ctv q8_0: 12.75 GiB, 6.75 GiB more than now" in text


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
    "cause",
]


def test_json_schema_is_stable() -> None:
    """Tools rely on these keys: changing them needs a new schema version."""
    data = json.loads(to_json(analyze(incident_lines(), "incident.log")))
    assert data["schema"] == "llamacpp-exporter/diagnose/v8" and data["exit_status"] == 1
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
        "sizing",
        "guard",
        "series",
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
        "first_tokens",
    ]
    assert run["first_tokens"] is None  # no `prompt eval time` line in the incident
    swa = json.loads(to_json(diagnose_file(str(FIXTURES / "checkpoints-swa-lv4" / "llama-server.log"))))
    first = swa["runs"][0]["first_tokens"]
    assert list(first) == [
        "outcomes",
        "seconds",
        "full_reprocess_share",
        "model_memory",
        "swa_cells",
        "full_cells",
        "full_reprocess_lines",
        "checkpoints_invalidated",
        "checkpoints_evicted",
        "checkpoints_restored",
        "checkpoint_limit",
        "prompt_cache_enabled",
        "prompt_cache_limit_mib",
        "advice",
    ]
    assert list(first["outcomes"][0]) == ["cache", "requests", "seconds", "p50_s", "p95_s", "max_s", "quantiles"]
    assert list(run["ending"]) == [
        "how",
        "reason",
        "in_flight",
        "pool_used_tokens",
        "pool_capacity_tokens",
        "memory",
        "cause",
        "cause_message",
    ]
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
        "held_at_failure",
        "held_at_failure_line",
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
    assert list(run["failures"][0]["slots"][0]) == [
        "slot",
        "task",
        "tokens",
        "share_of_pool",
        "client",
        "guard_request",
    ]
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
    for name in CAPTURE_NAMES:
        other = json.loads(to_json(diagnose_file(str(CAPTURE_ROOT / name / "llama-server.log"))))
        assert list(other) == list(data) and list(other["runs"][0]) == list(run)
        assert list(other["runs"][0]["counts"]) == list(run["counts"])
        for f in other["runs"][0]["failures"]:
            assert list(f) == _FAILURE_KEYS
