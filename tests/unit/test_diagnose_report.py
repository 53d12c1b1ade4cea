"""What `llamacpp-exporter diagnose LOG` reports, checked against real logs.

Ground truth is always the log itself: on every capture the report's counts must equal the number of
matching lines, and each failure's table must add up the `stop processing: n_tokens = N` lines written right
after the `Context size has been exceeded` line. Then: older builds' wording, advice in proportion to what
the log shows, how each run ended, and the advice a history of crashes gives.
"""

from __future__ import annotations

import re

import pytest
from big_log import later_start
from diagnose_checks import CAPTURE_NAMES, CAPTURE_ROOT, check_against_lines, log_lines
from paths import B11434

from exporter.diagnose import Report, analyze, diagnose_file, render_text

FIXTURES = B11434


@pytest.mark.parametrize("name", CAPTURE_NAMES)
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
    history = [*lines, *(x for k, text in enumerate(starts, 1) for x in later_start(text, k).splitlines(keepends=True))]
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
        return analyze("".join(later_start(r, k) for k, r in enumerate(runs)).splitlines(keepends=True), max_runs=0)

    little = history("projected to use 23668 MiB of device memory vs. 24080 MiB of free device memory")
    assert [s.ending for s in little.history] == ["clean", "died_mid_request", "died_mid_request", "clean"]
    assert little.runs[1].ending.memory is not None and little.runs[1].ending.memory.headroom_mib == 412
    pool_advice, advice = little.history_advice  # the pool overflowed too: its advice comes first
    assert pool_advice.startswith("Raise the pool to ")
    assert advice.startswith("2 of 2 crashes came while a long prompt (339 tokens) was being processed")
    assert "as little as 412 MiB of device memory left at start (of 24,080 MiB)" in advice
    assert "Those runs also overflowed the KV pool" in advice  # they also aborted requests
    assert "-ub" in advice and "-ctk q8_0 -ctv q8_0" in advice
    text = render_text(little)
    assert "Across the history: 2 of 2 crashes came while a long prompt" in text
    assert "Memory at start: 23,668 MiB projected of 24,080 MiB free device memory (412 MiB left)" in text

    assert [a for a in history(as_logged[0]).history_advice if "crash" in a] == []  # 24 GB of host memory to spare
    _, unknown = history("").history_advice
    assert "The logs do not say how much was free" in unknown and "llamacpp_gpu_memory_free_bytes" in unknown
