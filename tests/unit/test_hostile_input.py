"""The log is untrusted input: no line may raise, freeze the pipeline, or blow up state and series.

Clients write into llama-server's log (request paths, prompts at debug levels), and old builds pass
raw newlines through. Each case below is a line an attacker or a fuzzer produced against the real
b11434 captures; each failed on the exporter before it treated lines as untrusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hostile_lines import POISON, apply_all, captured, mutate
from paths import B11434

from exporter import diagnose
from exporter.logs import events as ev
from exporter.logs.parse import parse_line
from exporter.logs.recognize import UNRECOGNIZED_AFTER_LINES
from exporter.logs.source import StreamSource
from exporter.model.bounds import MAX_BYTES, MAX_SLOTS, MAX_TOKENS
from exporter.model.forecast import forecast
from exporter.model.state import ServerState
from exporter.pipeline import REJECT_LOG_INTERVAL, LogPipeline

FIXTURES = B11434


@pytest.mark.parametrize(("line", "reason"), POISON, ids=[p[0][:50] for p in POISON])
def test_a_poison_line_is_rejected_and_counted(line: str, reason: str) -> None:
    state = ServerState()
    apply_all(state, captured("exhaust-lv4")[:200])  # a running server: 4 slots, 512 cells
    before = (state.run.n_slots, dict(state.run.slots), state.run.kv_cells)
    apply_all(state, [f"0.00.100.000 I {line}"])  # in its run's format: the poison is the number
    assert state.rejected == {reason: 1}
    assert (state.run.n_slots, state.run.kv_cells) == (before[0], before[2])
    assert set(state.run.slots) <= set(range(4))
    # The lines after it still count: the rest of the log gives what it gives without the poison.
    apply_all(state, captured("exhaust-lv4")[200:])
    clean = ServerState()
    apply_all(clean, captured("exhaust-lv4"))
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
    apply_all(state, lines)
    assert len(state.run.slots) <= MAX_SLOTS and all(i < MAX_SLOTS for i in state.run.slots)
    assert state.rejected["out_of_range"] == sum(1 for i in range(0, 5000, 3) if i >= MAX_SLOTS)


def rss_kib() -> int:
    """The peak RSS in KiB; where there is no `resource` module (Windows, the portable configuration) the
    current RSS from psutil."""
    try:
        import resource
    except ImportError:
        psutil = importlib.import_module("psutil")
        return int(psutil.Process().memory_info().rss // 1024)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_fuzz_a_million_mutated_real_lines() -> None:
    """Seeded and bounded: 1,000,000 mutated lines of every capture through parse + state.

    No exception, every later valid line still counted, slots within the bound, every gauge inside
    its physical range, memory bounded.
    """
    corpus = [
        line for p in sorted(FIXTURES.iterdir()) if (p / "llama-server.log").exists() for line in captured(p.name)
    ]
    rng = random.Random(20261201)
    state = ServerState()
    rss_before = rss_kib()
    total, batch = 0, 4096
    # A real server start up to its first retry: after the garbage, a restarted server's lines count.
    real = captured("exhaust-default-verbosity")
    restart = real[: next(i for i, line in enumerate(real) if "retrying with smaller batch" in line) + 1]
    while total < 1_000_000:
        lines = [mutate(rng, rng.choice(corpus)) for _ in range(batch)]
        apply_all(state, lines)
        total += batch
        before = state.kv_retries
        state.provenance.new_file = True  # what the pipeline does when the file is rewritten
        apply_all(state, restart)
        assert state.kv_retries == before + 1  # a valid line after the garbage still counts
        assert len(state.run.slots) <= MAX_SLOTS
        for s in state.run.slots.values():
            assert 0 <= s.tokens <= MAX_TOKENS
            assert 0 <= s.checkpoint_bytes <= MAX_BYTES * 64
        f = forecast(state)
        assert 0 <= f.prompt_demand <= MAX_TOKENS * MAX_SLOTS
    assert sum(state.rejected.values()) > 0
    grown_kib = rss_kib() - rss_before
    assert grown_kib < 200 * 1024, f"RSS grew by {grown_kib} KiB"


def test_no_real_line_is_rejected() -> None:
    """The bounds are far from what a real server writes: not one line of the captures is rejected."""
    for path in sorted(FIXTURES.iterdir()):
        if (path / "llama-server.log").exists():
            state = ServerState()
            apply_all(state, captured(path.name))
            assert state.rejected == {}, (path.name, state.rejected, state.last_unexpected)


class _Source(StreamSource):
    """A line source that feeds some lines and then fails, as a broken journal reader or pipe would."""

    description = "test source"
    up = True

    def __init__(self, lines: list[str], fails: Exception | None) -> None:
        super().__init__()
        self.lines, self.fails = lines, fails

    async def run(self, on_lines: Callable[[list[str]], None], stop: asyncio.Event) -> None:
        on_lines(self.lines)
        if self.fails is not None:
            raise self.fails


@pytest.mark.parametrize("error", [RuntimeError("reader died"), None], ids=["raises", "ends"])
async def test_a_pipeline_that_stops_shows_as_down(error: Exception | None) -> None:
    """Whatever ends the pipeline (an error, a source that ends), the log source reads down, not a frozen up."""
    state = ServerState()
    pipeline = LogPipeline(state, _Source([POISON[0][0], "srv  update_slots: all slots are idle"], error))
    assert pipeline.up
    stop = asyncio.Event()
    with contextlib.suppress(RuntimeError):
        await pipeline.run(stop=stop)
    assert not pipeline.up and pipeline.stopped is not None
    assert state.rejected == {"malformed": 1}


def test_rejections_are_logged_once_per_reason_and_interval(caplog: pytest.LogCaptureFixture) -> None:
    state = ServerState()
    pipeline = LogPipeline(state, _Source([], None))
    with caplog.at_level(logging.WARNING, logger="exporter.pipeline"):
        for _ in range(1000):
            pipeline.feed([POISON[0][0]])  # 1,000 poison lines within the interval: one log line
        rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
        assert len(rejected) == 1 and "rejected as malformed" in rejected[0]
        pipeline.report_rejected(now=time.monotonic() + REJECT_LOG_INTERVAL + 1)
        rejected = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
        assert len(rejected) == 2 and "1000 log line(s)" in rejected[1]
    assert state.rejected == {"malformed": 1000}


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_diagnose_refuses_a_device(device: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A device never ends: one line and exit 3 at once, not a read that never returns."""
    assert diagnose.main([device]) == 3  # an input that cannot be diagnosed
    assert capsys.readouterr().err.strip() == (
        f"llamacpp-exporter diagnose: error: {device}: is a character device, not a log file "
        "(give a file, or - for standard input)"
    )


def test_diagnose_reads_poison_lines_without_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Poison lines in a real log: the failure in it is still reported, exit 1 (a failure found), no traceback."""
    lines = captured("exhaust-lv4")
    log = tmp_path / "poisoned.log"
    log.write_text("\n".join([*lines[:250], *(line for line, _ in POISON), *lines[250:]]) + "\n")
    assert diagnose.main([str(log)]) == 1
    out = capsys.readouterr()
    assert "Failure 1 at line" in out.out and out.err == ""
    report = diagnose.diagnose_file(str(log))
    assert report.runs_total == 1  # the forged `initializing, n_slots = 1000000000` starts no second run
    assert report.runs[0].configuration.n_slots == 4


def test_a_log_that_is_not_llama_servers_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Another program's log, random bytes: after the rule's first lines (exporter/logs/recognize.py) without
    one llama-server line, one warning and a 0; a llama-server line later turns it to 1."""
    rng = random.Random(7)
    other = [
        f'127.0.0.1 - - [01/Dec/2026:10:00:{i % 60:02d}] "GET /x{i} HTTP/1.1" 200 {rng.randrange(999)}'
        for i in range(600)
    ]
    noise = ["".join(chr(rng.randrange(32, 127)) for _ in range(80)) for _ in range(600)]
    state = ServerState()
    pipeline = LogPipeline(state, _Source([], None))
    with caplog.at_level(logging.WARNING, logger="exporter.pipeline"):
        pipeline.feed(other[: UNRECOGNIZED_AFTER_LINES - 1])
        assert pipeline.understood is None  # not enough lines to tell yet
        pipeline.feed(other[UNRECOGNIZED_AFTER_LINES - 1 :])
        pipeline.feed(noise)
        pipeline.feed(noise)
    assert pipeline.understood is False
    assert [r.getMessage() for r in caplog.records] == [
        "test source: no llama-server log lines in 600 lines (expected llama-server's --log-file output, plain, "
        "prefixed, coloured or --log-jsonl): is it llama-server's log? (llamacpp_exporter_log_understood 0)"
    ]
    pipeline.feed(captured("exhaust-lv4")[:50])
    assert pipeline.understood is True
