"""Hostile logs against the exporter as a program: a poisoned log followed on, a fuzz through the follower,
hostile counts that neither blow up a scrape nor block SIGTERM."""

from __future__ import annotations

import random
import time
from pathlib import Path

from hostile_lines import POISON, apply_all, captured, mutate
from llama_harness import ExporterProcess, wait_for
from paths import B11434

from exporter.model.bounds import MAX_SLOTS
from exporter.model.state import ServerState


def test_fuzz_through_the_follower(tmp_path: Path) -> None:
    """The live path: 50,000 mutated real lines appended while the exporter follows, then a real restart.

    /metrics keeps answering with the log up, what was rejected is counted, the series stay bounded,
    and the restarted server's lines count exactly as on a clean exporter.
    """
    corpus = [line for p in sorted(B11434.iterdir()) if (p / "llama-server.log").exists() for line in captured(p.name)]
    rng = random.Random(1201)
    log = tmp_path / "llama-server.log"
    log.write_text("\n".join(captured("exhaust-lv4")[:200]) + "\n")
    real = captured("exhaust-default-verbosity")
    expected = ServerState()
    apply_all(expected, real)
    with ExporterProcess(log, ["--http", "off", "--proc", "off", "--nvml", "off"]) as exp:
        with log.open("a") as f:
            for _ in range(50):
                f.write("\n".join(mutate(rng, rng.choice(corpus)) for _ in range(1000)) + "\n")
                f.flush()
                time.sleep(0.01)
        wait_for(
            lambda: (exp.sample("llamacpp_exporter_log_lines_total") or 0) >= 50_000,
            timeout=60,
            what="the fuzzed lines read",
        )
        assert exp.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
        assert sum(exp.sample("llamacpp_exporter_log_lines_rejected_total", {"reason": r}) or 0 for r in
                   ("malformed", "out_of_range", "format", "inconsistent")) > 0  # fmt: skip
        assert exp.sample("llamacpp_exporter_log_lines_rejected_total", {"reason": "unexpected"}) == 0
        series = [line for line in exp.scrape().splitlines() if line and not line.startswith("#")]
        assert len(series) < 120 + 12 * MAX_SLOTS, len(series)
        # Mutated start banners in the run's format count as starts (what the checks cannot catch).
        starts, retries = exp.sample("llamacpp_server_starts_total") or 0, exp.sample("llamacpp_kv_retries_total") or 0
        log.write_text("\n".join(real) + "\n")  # the server restarts: it truncates its log
        wait_for(
            lambda: exp.sample("llamacpp_server_starts_total") == starts + 1,
            timeout=30,
            what="the restart after the garbage",
        )
        wait_for(
            lambda: exp.sample("llamacpp_kv_retries_total") == retries + expected.kv_retries,
            timeout=30,
            what="the restarted server's retries",
        )
        assert exp.sample("llamacpp_slots") == expected.run.n_slots
        status = Path(f"/proc/{exp._proc.pid}/status").read_text() if exp._proc else ""
        rss_kib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        assert rss_kib < 200 * 1024, rss_kib


def test_hostile_counts_neither_blow_up_the_scrape_nor_block_sigterm(tmp_path: Path) -> None:
    """`n_slots = 1000000000` and slot ids up to 10⁶ after a start banner: a small scrape, and SIGTERM works at once."""
    log = tmp_path / "llama-server.log"
    hostile = [
        "srv    load_model: initializing, n_slots = 1000000000, n_ctx_slot = 512, kv_unified = 'true'",
        *(f"slot launch_slot_: id {i} | task {i} | processing task, is_child = 0" for i in range(0, 1_000_000, 997)),
    ]
    log.write_text("\n".join([*captured("exhaust-lv4")[:200], *hostile]) + "\n")
    exp = ExporterProcess(log, ["--http", "off", "--proc", "off", "--nvml", "off"]).start()
    try:
        text = exp.scrape()
        assert len(text) < 64 * 1024, len(text)  # 4 slots' series, not a million
        assert exp.sample("llamacpp_slots") == 4
        with log.open("a") as f:  # the same while running: counted, not applied
            f.write("\n".join(hostile) + "\n")
        wait_for(
            # every line but slot 0's: the server has 4 slots
            lambda: (
                exp.sample("llamacpp_exporter_log_lines_rejected_total", {"reason": "out_of_range"}) == len(hostile) - 1
            ),
            timeout=30,
            what="the hostile lines counted",
        )
        proc = exp._proc
        assert proc is not None
        started = time.monotonic()
        proc.terminate()
        assert proc.wait(10) == 0
        assert time.monotonic() - started < 10
    finally:
        exp.stop()


def test_the_exporter_keeps_following_a_poisoned_log(tmp_path: Path) -> None:
    """A poison line in the log at start and while running: /metrics up, counted, later lines counted, restartable."""
    log = tmp_path / "llama-server.log"
    real = captured("exhaust-lv4")
    poison = [f"0.00.100.000 I {line}" for line, _ in POISON]  # in the run's format: the numbers are the poison
    log.write_text("\n".join([*real[:200], poison[0], poison[2]]) + "\n")
    expected = ServerState()
    expected.counting = False
    apply_all(expected, real[:200])
    expected.counting = True
    apply_all(expected, real[200:])
    assert expected.kv_retries > 0
    with ExporterProcess(log, ["--http", "off", "--proc", "off", "--nvml", "off"]) as exp:
        assert exp.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
        with log.open("a") as f:
            f.write("\n".join([*poison, *real[200:]]) + "\n")
        wait_for(
            lambda: exp.sample("llamacpp_kv_retries_total") == expected.kv_retries,
            timeout=15,
            what="the retries after the poison",
        )
        assert exp.sample("llamacpp_exporter_log_lines_rejected_total", {"reason": "malformed"}) == 3
        assert exp.sample("llamacpp_exporter_log_lines_rejected_total", {"reason": "out_of_range"}) == len(POISON) - 3
        assert exp.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
        assert exp.sample("llamacpp_slots") == 4
        exp.restart()  # the whole poisoned log is replayed at start: no crash loop
        assert exp.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
        assert exp.sample("llamacpp_slots") == 4
