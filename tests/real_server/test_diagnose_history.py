"""`diagnose` on a history of real runs: a real llama-server b11434 started, stopped, failing its pool,
killed with SIGKILL mid-prompt, failing to start, and started with an argument split in two; its log
rotated and gzipped as logrotate would. Each run is reported in order with how it ended, and the
totals equal the lines of the files; the same history as one stream on standard input gives the
same report."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from llama_harness import LlamaServer, make_prompt, run_concurrent_completions, wait_for
from paths import REPO
from tiny_gguf import write_slow_llama

from exporter import diagnose
from exporter.diagnose import render_text, to_json

POOL_ARGS = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "-t", "2"]


def _rotate(log: Path, n: int, mtime: float, *, gz: bool = False) -> Path:
    """`log` renamed to `log.N` (gzipped to `log.N.gz`), with a modification time that orders it."""
    rotated = log.with_name(f"{log.name}.{n}")
    log.rename(rotated)
    if gz:
        packed = rotated.with_name(rotated.name + ".gz")
        packed.write_bytes(gzip.compress(rotated.read_bytes()))
        rotated.unlink()
        rotated = packed
    os.utime(rotated, (mtime, mtime))
    return rotated


def _text(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def _post_long_prompt(url: str, done: threading.Event) -> None:
    """A long prompt; the server is killed while it reads it, so the request fails (that is expected)."""
    import urllib.request

    body = json.dumps({"prompt": make_prompt(6000), "n_predict": 4, "cache_prompt": False}).encode()
    req = urllib.request.Request(url + "/completion", data=body, headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=120).read()
    except OSError:
        pass
    finally:
        done.set()


@pytest.mark.llama_server
def test_a_history_of_real_runs(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    log = logs / "llama-server.log"
    stamp = 1_800_000_000.0

    # 1. A quiet run, stopped with SIGTERM: a clean exit. Rotated twice since: .4.gz.
    with LlamaServer(llama_server_bin, tiny_llama_model, POOL_ARGS, log_file=log) as srv:
        assert all(status == 200 for status, _ in run_concurrent_completions(srv.url, n=1, n_predict=8))
        srv.stop()
    _rotate(log, 4, stamp, gz=True)

    # 2. Four concurrent requests overflow the shared pool: one failure, four aborted requests. .3.gz
    with LlamaServer(llama_server_bin, tiny_llama_model, POOL_ARGS, log_file=log) as srv:
        results = run_concurrent_completions(srv.url, n=4)
        assert sum(status == 500 for status, _ in results) == 4, results
        wait_for(lambda: srv.log_lines("decode() failed"), timeout=15, what="decode() failed logged")
        srv.stop()
    _rotate(log, 3, stamp + 60, gz=True)

    # 3. Killed with SIGKILL while it reads a long prompt: no line says so. .2
    slow = write_slow_llama(tmp_path / "slow-llama.gguf")
    with LlamaServer(llama_server_bin, slow, ["-c", "8192", "-np", "1", "-lv", "4", "-t", "2"], log_file=log) as srv:
        done = threading.Event()
        threading.Thread(target=_post_long_prompt, args=(srv.url, done), daemon=True).start()
        wait_for(lambda: srv.log_lines("new prompt"), timeout=60, what="the long prompt started")
        assert not srv.log_lines("stop processing")  # still reading it
        srv.kill9()
        assert done.wait(30)
    _rotate(log, 2, stamp + 120)

    # 4. A start that fails: the model file is not there. .1
    failed = LlamaServer(llama_server_bin, tmp_path / "missing.gguf", ["-lv", "4"], log_file=log, wait_ready=False)
    failed.start()
    wait_for(lambda: not failed.is_running(), timeout=30, what="the failed start to exit")
    _rotate(log, 1, stamp + 180)

    # 5. An option value split into two arguments (`--alias tiny llama`): refused before the log is
    #    written, so the log is empty.
    split = LlamaServer(
        llama_server_bin, tiny_llama_model, ["--alias", "tiny", "llama"], log_file=log, wait_ready=False
    )
    split.start()
    wait_for(lambda: not split.is_running(), timeout=30, what="the refused start to exit")
    assert log.exists() and log.stat().st_size == 0
    os.utime(log, (stamp + 240, stamp + 240))

    # (The harness keeps each server's stderr beside its log: not part of this history.)
    paths, order = diagnose.input_files([str(logs / "llama-server.log.[0-9]*"), str(log)])
    assert order is not None
    report = diagnose.diagnose_files(paths, max_runs=0)
    print(render_text(report))
    names = [Path(f).name for f in report.files]
    assert names == [f"llama-server.log.{n}" for n in ("4.gz", "3.gz", "2", "1")]
    assert [Path(r.file).name for r in report.runs] == names
    assert [r.ending.how for r in report.runs] == ["clean", "clean", "died_mid_request", "failed_start"]
    assert report.endings == {"clean": 2, "failed_start": 1, "died_mid_request": 1}
    assert report.skipped == [f"{log}: empty file, nothing to diagnose"]
    killed = report.runs[2].ending
    (in_flight,) = killed.in_flight
    assert in_flight.prompt_tokens is not None and in_flight.prompt_tokens > 1000
    assert report.runs[3].ending.reason == f"failed to load model '{tmp_path / 'missing.gguf'}'"
    # The memory each run projected at start (-lv 4), the last figures the log gave before the kill.
    assert killed.memory is not None and killed.memory.kind == "host" and killed.memory.used_mib > 0
    # Every run in one line, dated by its file's time (llama-server's stamps count from its start).
    assert [(s.ending, s.clock, s.ended_at) for s in report.history] == [
        ("clean", "file", stamp),
        ("clean", "file", stamp + 60),
        ("died_mid_request", "file", stamp + 120),
        ("failed_start", "file", stamp + 180),
    ]
    assert report.history[2].in_flight_prompt_tokens == in_flight.prompt_tokens
    assert report.overlaps == []

    text = render_text(report)
    assert "Timeline (UTC; each file's modification time, about when its last run ended):" in text
    assert "  2027-01-15 08:00:00  llama-server.log.4.gz  1 run: 1 clean" in text
    assert "  2027-01-15 08:01:00  llama-server.log.3.gz  1 run: 1 clean; 1 failure, 4 aborted" in text
    assert "Aborted requests per day: 2027-01-15 4" in text
    assert "Largest requests: " in text and "(run 3 in llama-server.log.2)" in text  # the killed long prompt

    # The totals are the files' line counts.
    texts = [_text(Path(p)) for p in report.files]
    assert report.lines == sum(len(t.splitlines()) for t in texts)
    assert (
        report.failures_total == sum(len(re.findall(rb"Context size has been exceeded\. off", t)) for t in texts) == 1
    )
    aborted = sum(
        len(re.findall(rb"send_error: task id = \d+, error: Context size has been exceeded", t)) for t in texts
    )
    assert report.aborted_requests_total == aborted == 4
    assert [r.counts.requests_started for r in report.runs] == [len(re.findall(rb"processing task", t)) for t in texts]
    # The sizes of the history's requests: one per release line; the pool that would have held them.
    releases = [int(n) for t in texts for n in re.findall(rb"stop processing: n_tokens = (\d+)", t)]
    requests = report.requests
    assert requests is not None and requests.requests == len(releases)
    assert requests.tokens_max == max(s.largest_request_tokens for s in report.history) >= max(releases)
    assert requests.tokens_p99 is not None and requests.concurrency_p99 is not None
    assert requests.pool_needed == requests.tokens_p99 * requests.concurrency_p99  # the figures printed
    ranked = sorted(releases)
    assert requests.tokens_p50 == ranked[(len(ranked) + 1) // 2 - 1]  # exact (nearest rank), not a bucket's
    assert f"Requests: {len(releases):,}, tokens each p50 {requests.tokens_p50:,}" in text
    # A history that overflowed: too small, and a recommendation at least what was held at the failure.
    assert report.sizing is not None and report.sizing.verdict == "too_small"
    assert "Pool: too small: it overflowed." in text
    assert (report.sizing.recommended or 0) >= (report.sizing.held_at_failure or 0) > 0

    # The page: a chart of every run, and one of the tokens each slot held for each run that had requests.
    page = tmp_path / "post-mortem.html"
    html_run = subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", *paths, "--html", str(page)],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
    )
    assert html_run.returncode == 1, html_run.stderr
    html = page.read_text()
    assert html.count("<svg") == 4, "the history, and runs 1-3 (run 4 never started: nothing to draw)"
    assert "crashed or was killed mid-request" in html and "No request in this run" in html

    # The same history as one stream (oldest first, decompressed), as `zcat -f` would give it.
    stream = subprocess.run(
        [sys.executable, "-m", "exporter", "diagnose", "--json", "--max-runs", "0", "-"],
        input=b"".join(texts),
        capture_output=True,
        check=False,
        cwd=REPO,
    )
    assert stream.returncode == 1, stream.stderr  # a failure was found
    from_stdin, from_files = json.loads(stream.stdout), json.loads(to_json(report))
    for key in ("runs_total", "failures_total", "aborted_requests_total", "endings", "lines", "exit_status"):
        assert from_stdin[key] == from_files[key], key
    for a, b in zip(from_stdin["runs"], from_files["runs"], strict=True):
        # Line numbers are the stream's there and each file's here; everything else is the same.
        assert a["last_line"] - a["first_line"] == b["last_line"] - b["first_line"]
        for f in a["failures"] + b["failures"]:
            f.pop("line")
        assert (a["counts"], a["ending"], a["failures"]) == (b["counts"], b["ending"], b["failures"])
