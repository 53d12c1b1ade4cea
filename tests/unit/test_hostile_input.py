"""The log is untrusted input: no line may raise, freeze the pipeline, or blow up state and series.

Clients write into llama-server's log (request paths, prompts at debug levels), and old builds pass
raw newlines through. Each case below is a line an attacker or a fuzzer produced against the real
b11434 captures; each failed on the exporter before it treated lines as untrusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import resource
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from llama_harness import ExporterProcess, wait_for
from paths import B11434

from exporter import diagnose
from exporter.logs import events as ev
from exporter.logs.parse import parse_line, parse_lines
from exporter.logs.pipeline import REJECT_LOG_INTERVAL, LogPipeline
from exporter.model.bounds import MAX_BYTES, MAX_SLOTS, MAX_TOKENS
from exporter.model.forecast import forecast
from exporter.model.state import ServerState

FIXTURES = B11434
HUGE = "9" * 5000  # more digits than int() reads (4,300 by default): ValueError

#: (line, the rejection reason it must be counted under)
POISON: list[tuple[str, str]] = [
    ("slot print_timing: id  0 | task 1 | prompt eval time = 1.2.3 ms / 1 tokens", "malformed"),
    (f"slot print_timing: id  0 | task 1 | prompt eval time = 1{HUGE} ms / 1 tokens", "out_of_range"),  # float: inf
    (f"srv    send_error: task id = {HUGE}, error: Context size has been exceeded.", "malformed"),
    (f"slot launch_slot_: id  {HUGE} | task 5 | processing task, is_child = 0", "malformed"),
    ("srv    load_model: initializing, n_slots = 1000000000, n_ctx_slot = 512, kv_unified = 'true'", "out_of_range"),
    ("slot launch_slot_: id  1000000 | task 5 | processing task, is_child = 0", "out_of_range"),
    (
        "slot      release: id  0 | task 9 | stop processing: n_tokens = 100000000000000000000, truncated = 0",
        "out_of_range",
    ),
    (
        "slot update_slots: id  0 | task 9 | created context checkpoint 1 of 3 (pos_min = 0, pos_max = 10, "
        "size = 99999999999999.0 MiB)",
        "out_of_range",
    ),
    ("llama_context: n_ctx         = 99999999999999", "out_of_range"),
]


def _captured(name: str) -> list[str]:
    return (FIXTURES / name / "llama-server.log").read_text(encoding="utf-8").splitlines()


def _apply_all(state: ServerState, lines: list[str]) -> None:
    for e in parse_lines(lines):
        state.apply(e)


@pytest.mark.parametrize(("line", "reason"), POISON, ids=[p[0][:50] for p in POISON])
def test_a_poison_line_is_rejected_and_counted(line: str, reason: str) -> None:
    state = ServerState()
    _apply_all(state, _captured("exhaust-lv4")[:200])  # a running server: 4 slots, 512 cells
    before = (state.run.n_slots, dict(state.run.slots), state.run.kv_cells)
    _apply_all(state, [f"0.00.100.000 I {line}"])  # in its run's format: the poison is the number
    assert state.rejected == {reason: 1}
    assert (state.run.n_slots, state.run.kv_cells) == (before[0], before[2])
    assert set(state.run.slots) <= set(range(4))
    # The lines after it still count: the rest of the log gives what it gives without the poison.
    _apply_all(state, _captured("exhaust-lv4")[200:])
    clean = ServerState()
    _apply_all(clean, _captured("exhaust-lv4"))
    assert clean.kv_retries > 0 and clean.requests_aborted
    assert (state.kv_retries, state.requests_aborted) == (clean.kv_retries, clean.requests_aborted)


def test_parse_never_raises_on_a_malformed_number() -> None:
    for line, _ in POISON:
        parse_line(line)  # must not raise
    e = parse_line(POISON[0][0])
    assert isinstance(e, ev.Rejected) and e.reason == "malformed"


def test_slot_ids_and_counts_are_bounded_before_the_server_says_how_many_slots() -> None:
    state = ServerState()
    lines = [f"slot launch_slot_: id {i} | task {i} | processing task, is_child = 0" for i in range(0, 5000, 3)]
    _apply_all(state, lines)
    assert len(state.run.slots) <= MAX_SLOTS and all(i < MAX_SLOTS for i in state.run.slots)
    assert state.rejected["out_of_range"] == sum(1 for i in range(0, 5000, 3) if i >= MAX_SLOTS)


def _mutate(rng: random.Random, line: str) -> str:
    """One fuzzer step: flip, insert or delete characters, splice digits, or graft another line's tail."""
    kind = rng.randrange(6)
    if not line:
        return line
    i = rng.randrange(len(line))
    if kind == 0:
        return line[:i] + chr(rng.randrange(32, 127)) + line[i + 1 :]
    if kind == 1:
        return line[:i] + rng.choice(["9" * rng.randrange(1, 40), "1.2.3", "-", "\x1b[31m", "|", "= ", " "]) + line[i:]
    if kind == 2:
        return line[:i] + line[i + rng.randrange(1, 8) :]
    if kind == 3:
        return line.replace(rng.choice("0123456789"), rng.choice(["99999999999", "1e9", "", "7"]))
    if kind == 4:
        return line[:i]
    return line + line[i:]


def test_fuzz_a_million_mutated_real_lines() -> None:
    """Seeded and bounded: 1,000,000 mutated lines of every capture through parse + state.

    No exception, every later valid line still counted, slots within the bound, every gauge inside
    its physical range, memory bounded.
    """
    corpus = [
        line for p in sorted(FIXTURES.iterdir()) if (p / "llama-server.log").exists() for line in _captured(p.name)
    ]
    rng = random.Random(20261201)
    state = ServerState()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    total, batch = 0, 4096
    # A real server start up to its first retry: after the garbage, a restarted server's lines count.
    real = _captured("exhaust-default-verbosity")
    restart = real[: next(i for i, line in enumerate(real) if "retrying with smaller batch" in line) + 1]
    while total < 1_000_000:
        lines = [_mutate(rng, rng.choice(corpus)) for _ in range(batch)]
        _apply_all(state, lines)
        total += batch
        before = state.kv_retries
        state.provenance.new_file = True  # what the pipeline does when the file is rewritten
        _apply_all(state, restart)
        assert state.kv_retries == before + 1  # a valid line after the garbage still counts
        assert len(state.run.slots) <= MAX_SLOTS
        for s in state.run.slots.values():
            assert 0 <= s.tokens <= MAX_TOKENS
            assert 0 <= s.checkpoint_bytes <= MAX_BYTES * 64
        f = forecast(state)
        assert 0 <= f.prompt_demand <= MAX_TOKENS * MAX_SLOTS
    assert sum(state.rejected.values()) > 0
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert grown_kib < 200 * 1024, f"RSS grew by {grown_kib} KiB"


def test_no_real_line_is_rejected() -> None:
    """The bounds are far from what a real server writes: not one line of the captures is rejected."""
    for path in sorted(FIXTURES.iterdir()):
        if (path / "llama-server.log").exists():
            state = ServerState()
            _apply_all(state, _captured(path.name))
            assert state.rejected == {}, (path.name, state.rejected, state.last_unexpected)


class _Source:
    """A line source that feeds some lines and then fails, as a broken journal reader or pipe would."""

    description = "test source"
    up = True

    def __init__(self, lines: list[str], error: Exception | None) -> None:
        self.lines, self.error = lines, error

    def history(self) -> list[str]:
        return []

    async def run(self, on_lines: Callable[[list[str]], None], stop: asyncio.Event) -> None:
        on_lines(self.lines)
        if self.error is not None:
            raise self.error


@pytest.mark.parametrize("error", [RuntimeError("reader died"), None], ids=["raises", "ends"])
async def test_a_pipeline_that_stops_shows_as_down(error: Exception | None) -> None:
    """Whatever ends the pipeline (an error, a source that ends), the log source reads down, not a frozen up."""
    state = ServerState()
    pipeline = LogPipeline(state, None, _Source([POISON[0][0], "srv  update_slots: all slots are idle"], error))
    assert pipeline.up
    stop = asyncio.Event()
    with contextlib.suppress(RuntimeError):
        await pipeline.run(poll_interval=1, batch_interval=0, use_watchdog=False, stop=stop)
    assert not pipeline.up and pipeline.stopped is not None
    assert state.rejected == {"malformed": 1}


def test_rejections_are_logged_once_per_reason_and_interval(caplog: pytest.LogCaptureFixture) -> None:
    state = ServerState()
    pipeline = LogPipeline(state, None, _Source([], None))
    with caplog.at_level(logging.WARNING, logger="exporter.logs.pipeline"):
        for _ in range(1000):
            pipeline.feed([POISON[0][0]])  # 1,000 poison lines within the interval: one log line
        rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
        assert len(rejected) == 1 and "rejected as malformed" in rejected[0]
        pipeline.report_rejected(now=time.monotonic() + REJECT_LOG_INTERVAL + 1)
        rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
        assert len(rejected) == 2 and "1000 log line(s)" in rejected[1]
    assert state.rejected == {"malformed": 1000}


def test_the_exporter_keeps_following_a_poisoned_log(tmp_path: Path) -> None:
    """A poison line in the log at start and while running: /metrics up, counted, later lines counted, restartable."""
    log = tmp_path / "llama-server.log"
    real = _captured("exhaust-lv4")
    poison = [f"0.00.100.000 I {line}" for line, _ in POISON]  # in the run's format: the numbers are the poison
    log.write_text("\n".join([*real[:200], poison[0], poison[2]]) + "\n")
    expected = ServerState()
    expected.counting = False
    _apply_all(expected, real[:200])
    expected.counting = True
    _apply_all(expected, real[200:])
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


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_diagnose_refuses_a_device(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A device never ends: one line and exit 2 at once, not a read that never returns."""
    assert diagnose.main([device]) == 2
    assert capsys.readouterr().err.strip() == (
        f"llamacpp-exporter diagnose: error: {device}: is a character device, not a log file "
        "(give a file, or - for standard input)"
    )


def test_diagnose_reads_poison_lines_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Poison lines in a real log: the failure in it is still reported, exit 1 (a failure found), no traceback."""
    lines = _captured("exhaust-lv4")
    log = tmp_path / "poisoned.log"
    log.write_text("\n".join([*lines[:250], *(line for line, _ in POISON), *lines[250:]]) + "\n")
    assert diagnose.main([str(log)]) == 1
    out = capsys.readouterr()
    assert "Failure 1 at line" in out.out and out.err == ""
    report = diagnose.diagnose_file(str(log))
    assert report.runs_total == 1  # the forged `initializing, n_slots = 1000000000` starts no second run
    assert report.runs[0].configuration.n_slots == 4


def test_a_log_that_is_not_llama_servers_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Another program's log, random bytes: after 1,000 lines without one llama-server line, one warning and a 0."""
    rng = random.Random(7)
    other = [
        f'127.0.0.1 - - [01/Dec/2026:10:00:{i % 60:02d}] "GET /x{i} HTTP/1.1" 200 {rng.randrange(999)}'
        for i in range(600)
    ]
    noise = ["".join(chr(rng.randrange(32, 127)) for _ in range(80)) for _ in range(600)]
    state = ServerState()
    pipeline = LogPipeline(state, None, _Source([], None))
    with caplog.at_level(logging.WARNING, logger="exporter.logs.pipeline"):
        pipeline.feed(other)
        assert pipeline.understood is None  # not enough lines to tell yet
        pipeline.feed(noise)
        pipeline.feed(noise)
    assert pipeline.understood is False
    assert [r.getMessage() for r in caplog.records] == [
        "1200 lines read and not one written by llama-server: is this its log? (llamacpp_exporter_log_understood 0)"
    ]
    pipeline.feed(_captured("exhaust-lv4")[:50])
    assert pipeline.understood is True


def test_hostile_counts_neither_blow_up_the_scrape_nor_block_sigterm(tmp_path: Path) -> None:
    """`n_slots = 1000000000` and slot ids up to 10⁶ after a start banner: a small scrape, and SIGTERM works at once."""
    log = tmp_path / "llama-server.log"
    hostile = [
        "srv    load_model: initializing, n_slots = 1000000000, n_ctx_slot = 512, kv_unified = 'true'",
        *(f"slot launch_slot_: id {i} | task {i} | processing task, is_child = 0" for i in range(0, 1_000_000, 997)),
    ]
    log.write_text("\n".join([*_captured("exhaust-lv4")[:200], *hostile]) + "\n")
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


def test_fuzz_through_the_follower(tmp_path: Path) -> None:
    """The live path: 50,000 mutated real lines appended while the exporter follows, then a real restart.

    /metrics keeps answering with the log up, what was rejected is counted, the series stay bounded,
    and the restarted server's lines count exactly as on a clean exporter.
    """
    corpus = [
        line for p in sorted(FIXTURES.iterdir()) if (p / "llama-server.log").exists() for line in _captured(p.name)
    ]
    rng = random.Random(1201)
    log = tmp_path / "llama-server.log"
    log.write_text("\n".join(_captured("exhaust-lv4")[:200]) + "\n")
    real = _captured("exhaust-default-verbosity")
    expected = ServerState()
    _apply_all(expected, real)
    with ExporterProcess(log, ["--http", "off", "--proc", "off", "--nvml", "off"]) as exp:
        with log.open("a") as f:
            for _ in range(50):
                f.write("\n".join(_mutate(rng, rng.choice(corpus)) for _ in range(1000)) + "\n")
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
