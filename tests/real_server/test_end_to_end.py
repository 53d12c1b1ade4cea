"""End to end: a real llama-server (b11434) with a tiny model, the exporter as a real process on its log.

These are the acceptance scenarios of the core pipeline: the seed incident (`-c 512 -np 4 -kvu`:
four concurrent requests overflow the shared pool and all die), its fix (`--kv-unified-per-slot`),
a server crash and restart on the same `--log-file`, and an exporter restart in mid-log.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, LlamaServer, run_concurrent_completions, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.llama_server

SEED_ARGS = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "--metrics", "-t", "2"]
PER_SLOT_ARGS = ["-np", "4", "-kvu", "--kv-unified-per-slot", "512", "-lv", "4", "--metrics", "-t", "2"]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _counters(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every llamacpp_* counter sample of a scrape (process_* counters are the exporter's own)."""
    names = {
        f.name + "_total"
        for f in text_string_to_metric_families(text)
        if f.type == "counter" and f.name.startswith("llamacpp_")
    }
    return {k: v for k, v in _samples(text).items() if k[0] in names}


def _count_lines(log_file: Path, needle: str) -> int:
    return sum(needle in line for line in log_file.read_text(encoding="utf-8", errors="replace").splitlines())


def _wait_value(exporter: ExporterProcess, name: str, want: float, labels: dict[str, str] | None = None) -> None:
    """Poll scrapes until the sample has the wanted value (the exporter tails asynchronously)."""
    wait_for(lambda: exporter.sample(name, labels) == want, timeout=15, what=f"{name}{labels or ''} == {want}")


@pytest.fixture
def seed_server(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> Iterator[LlamaServer]:
    with LlamaServer(llama_server_bin, tiny_llama_model, SEED_ARGS, log_file=tmp_path / "llama-server.log") as srv:
        yield srv


def test_seed_incident_is_visible(seed_server: LlamaServer, tmp_path: Path, promtool_bin: Path) -> None:
    """-c 512 -np 4 -kvu: pool 512, overcommit 4, and every retry/abort line and HTTP 500 counted."""
    log_file = seed_server.log_file
    with ExporterProcess(log_file) as exporter:
        assert exporter.sample("llamacpp_kv_pool_capacity_tokens") == 512
        assert exporter.sample("llamacpp_kv_pool_overcommit_ratio") == 4.0
        assert exporter.sample("llamacpp_slots") == 4
        assert exporter.sample("llamacpp_kv_retries_total") == 0

        results = run_concurrent_completions(seed_server.url, n=4)
        http_500 = sum(status == 500 for status, _ in results)
        assert http_500 == 4, results

        # The 500s can reach the clients before llama-server has written its last lines.
        wait_for(lambda: _count_lines(log_file, "decode() failed") == 1, timeout=15, what="decode() failed logged")
        send_errors = _count_lines(log_file, "send_error: task id")
        retries = _count_lines(log_file, "retrying with smaller batch size")
        exceeded = _count_lines(log_file, "Context size has been exceeded. off =")
        assert send_errors == http_500 and retries > 0 and exceeded == 1

        _wait_value(exporter, "llamacpp_requests_aborted_total", http_500, {"reason": "context_exceeded"})
        _wait_value(exporter, "llamacpp_kv_retries_total", retries)
        assert exporter.sample("llamacpp_context_exceeded_total") == exceeded
        assert exporter.sample("llamacpp_kv_cascades_total", {"outcome": "failed"}) == 1
        assert exporter.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
        # Every request's size, once: the histogram counts the release lines and sums their tokens.
        releases = [int(x.rsplit("n_tokens = ", 1)[1].split(",")[0]) for x in seed_server.log_lines("stop processing")]
        assert len(releases) == http_500
        assert exporter.sample("llamacpp_request_tokens_count") == len(releases)
        assert exporter.sample("llamacpp_request_tokens_sum") == sum(releases)
        assert exporter.sample("llamacpp_request_concurrency_count") == len(releases)
        # Every line of a real server is its own: none rejected, whatever the reason.
        for reason in ("malformed", "out_of_range", "format", "inconsistent", "unexpected"):
            assert exporter.sample("llamacpp_exporter_log_lines_rejected_total", {"reason": reason}) == 0, reason

        # Acceptance: promtool's linter has nothing to say about a scrape taken in the real scenario.
        scrape = exporter.scrape()
        lint = subprocess.run(
            [str(promtool_bin), "check", "metrics"], input=scrape.encode(), capture_output=True, timeout=30
        )
        assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint


def test_kv_unified_per_slot_fix(llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path) -> None:
    """--kv-unified-per-slot 512 without -c: the pool is 4 x 512, every promise can be kept, no cascade."""
    with (
        LlamaServer(llama_server_bin, tiny_llama_model, PER_SLOT_ARGS, log_file=tmp_path / "ls.log") as srv,
        ExporterProcess(srv.log_file) as exporter,
    ):
        assert exporter.sample("llamacpp_kv_pool_capacity_tokens") == 2048
        assert exporter.sample("llamacpp_kv_pool_overcommit_ratio") == 1.0
        results = run_concurrent_completions(srv.url, n=4)
        assert [status for status, _ in results] == [200] * 4, results
        # Wait for the releases to land, then check that nothing cascaded.
        wait_for(
            lambda: (
                exporter.sample("llamacpp_kv_pool_used_tokens")
                == sum(int(line.rsplit("n_tokens = ", 1)[1].split(",")[0]) for line in srv.log_lines("stop processing"))
                and _count_lines(srv.log_file, "stop processing") == 4
            ),
            timeout=15,
            what="four releases reflected in llamacpp_kv_pool_used_tokens",
        )
        assert _count_lines(srv.log_file, "retrying with smaller batch size") == 0
        assert exporter.sample("llamacpp_kv_retries_total") == 0
        assert exporter.sample("llamacpp_kv_cascades_total", {"outcome": "failed"}) == 0
        assert exporter.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 0


def _never_decreases(before: dict[tuple[str, tuple[tuple[str, str], ...]], float], after_text: str) -> None:
    after = _counters(after_text)
    for key, value in before.items():
        assert after.get(key, 0.0) >= value, f"counter {key} went from {value} to {after.get(key)}"


def test_server_crash_and_restart_on_the_same_log(seed_server: LlamaServer) -> None:
    """kill -9 + restart: starts +1, slot gauges reset, no counter decreases."""
    with ExporterProcess(seed_server.log_file) as exporter:
        status, _ = run_concurrent_completions(seed_server.url, n=1, n_predict=16)[0]
        assert status == 200
        wait_for(
            lambda: (exporter.sample("llamacpp_kv_pool_used_tokens") or 0) > 0,
            timeout=15,
            what="a slot holds tokens",
        )
        before = exporter.scrape()
        starts = _samples(before)[("llamacpp_server_starts_total", ())]

        seed_server.kill9()
        seed_server.restart()
        _wait_value(exporter, "llamacpp_server_starts_total", starts + 1)
        _wait_value(exporter, "llamacpp_kv_pool_used_tokens", 0)
        after = exporter.scrape()
        samples = _samples(after)
        assert all(samples[("llamacpp_slot_tokens", (("slot", str(i)),))] == 0 for i in range(4))
        assert samples[("llamacpp_kv_pool_capacity_tokens", ())] == 512
        _never_decreases(_counters(before), after)
        # One start, counted once, even though the server truncated the file and printed several banner lines.
        time.sleep(0.5)
        assert exporter.sample("llamacpp_server_starts_total") == starts + 1
        assert exporter.sample("llamacpp_exporter_log_truncations_total") == 1


@pytest.mark.linux  # the old server closing its log wakes the follower: an inotify close event
def test_last_lines_before_a_restart_are_counted(seed_server: LlamaServer) -> None:
    """Requests, then at once a server restart (which truncates the log): every timing line counted.

    A 2 s batch wait makes the race certain: the exporter is busy reading the requests' lines when
    the last response comes back, and the restarted server truncates the log well within 2 s. The
    old server closing the log (it exits) is what has the exporter read its last lines in time.
    """
    with ExporterProcess(seed_server.log_file, env={"LLAMACPP_EXPORTER_LOG_BATCH_INTERVAL": "2"}) as exporter:
        for _ in range(3):
            status, _ = run_concurrent_completions(seed_server.url, n=1, n_predict=8)[0]
            assert status == 200
        # The server logs from a thread of its own: its last timing line may come just after the response.
        wait_for(
            lambda: _count_lines(seed_server.log_file, "prompt eval time") == 3,
            timeout=15,
            what="the three requests' timing lines in the log",
        )
        timings = _count_lines(seed_server.log_file, "prompt eval time")
        seed_server.restart()
        _wait_value(exporter, "llamacpp_server_starts_total", 1)
        assert timings == 3
        assert exporter.sample("llamacpp_prompt_eval_seconds_count") == timings
        assert exporter.sample("llamacpp_exporter_log_lost_bytes_total") == 0


def test_exporter_restart_mid_log_does_not_recount(seed_server: LlamaServer) -> None:
    """Counters restart from zero and never count the past; gauges come back to the same values."""
    exporter = ExporterProcess(seed_server.log_file)
    with exporter:
        results = run_concurrent_completions(seed_server.url, n=4)
        assert sum(s == 500 for s, _ in results) == 4
        wait_for(
            lambda: _count_lines(seed_server.log_file, "decode() failed") == 1,
            timeout=15,
            what="abort logged",
        )
        status, _ = run_concurrent_completions(seed_server.url, n=1, n_predict=16)[0]
        assert status == 200
        wait_for(lambda: _count_lines(seed_server.log_file, "stop processing") == 5, timeout=15, what="5 releases")
        last_release = int(seed_server.log_lines("stop processing")[-1].rsplit("n_tokens = ", 1)[1].split(",")[0])
        _wait_value(exporter, "llamacpp_requests_aborted_total", 4, {"reason": "context_exceeded"})
        _wait_value(exporter, "llamacpp_kv_pool_used_tokens", last_release)
        before = _samples(exporter.scrape())
        assert before[("llamacpp_requests_aborted_total", (("reason", "context_exceeded"),))] == 4

        exporter.restart()
        after = _samples(exporter.scrape())
        for key, value in before.items():
            name = key[0]
            if name.startswith("llamacpp_kv_pool_active_"):
                continue  # a slot first seen idle has no known last turn (below)
            if name.startswith(("llamacpp_slot", "llamacpp_kv_pool", "llamacpp_slots", "llamacpp_server_info")):
                assert after[key] == value, key
        # The conversations coming back: the new exporter has seen no turn. The old one saw the last turn unless
        # its first scrape came after it (a slot first seen idle has no known last turn), and the aborted
        # requests' conversations (their clients may retry) where it saw those turns, at their release's cells.
        releases = [
            int(line.rsplit("n_tokens = ", 1)[1].split(",")[0]) for line in seed_server.log_lines("stop processing")
        ]
        active = before[("llamacpp_kv_pool_active_tokens", ())]
        assert active == 0 or last_release <= active <= sum(releases), (active, releases)
        assert after[("llamacpp_kv_pool_active_tokens", ())] == 0
        for key, value in _counters_from(after).items():
            assert value == 0, f"{key} counted events from before the restart: {value}"
        assert after[("llamacpp_request_tokens_count", ())] == 0  # a replayed request is not counted again

        # And the next incident is counted normally.
        results = run_concurrent_completions(seed_server.url, n=4)
        assert sum(s == 500 for s, _ in results) == 4
        _wait_value(exporter, "llamacpp_requests_aborted_total", 4, {"reason": "context_exceeded"})


def _counters_from(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        k: v
        for k, v in samples.items()
        if k[0].endswith("_total") and k[0].startswith("llamacpp_") and not k[0].startswith("llamacpp_exporter_")
    }
