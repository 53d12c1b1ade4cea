"""A wrapper restarting llama-server on the same log, followed without close events (polling, or a watchdog
observer that reports none, as on Windows and macOS): every line is read, or what was not read is counted.

Each restart truncates the log (llama-server opens it with mode "w"). What the old server wrote after
the follower's last read and before that truncation is gone; the follower looks at the file's size while
it waits (`follow.Probe`), reads new bytes after a quiet spell and when the writer stops, and counts in
`lost_bytes` what it saw and could not read. The runs are real b11434 captures, written a line at a time.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from pathlib import Path

import pytest
from corpus_replay import exported
from follow_watch import HANG_GUARD, use_watch
from paths import FIXTURES
from watchdog.observers.polling import PollingObserver

from exporter.logs import watch as watch_mod
from exporter.logs.file_source import FileSource
from exporter.logs.follow import follow
from exporter.logs.replaced import QUIET
from exporter.logs.tail import LogTailer
from exporter.model.state import ServerState
from exporter.pipeline import LogPipeline

RUNS = [
    FIXTURES / "b11434" / name / "llama-server.log"
    for name in ("pool-overflow-lv4", "pool-overflow-default", "per-slot-streams", "exhaust-default-verbosity")
]
RESTART_GAP = 0.15  # from the old server's last line to the new one truncating the log


def _truth(log: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What /metrics shows when every line of the four runs is read (each run truncating the log)."""
    state = ServerState()
    tailer = LogTailer(log)
    pipeline = LogPipeline(state, tailer)
    pipeline.replay_existing()
    for run in RUNS:
        log.write_bytes(b"")
        pipeline.feed(tailer.poll())
        log.write_bytes(run.read_bytes())
        while tailer.has_pending():
            pipeline.feed(tailer.poll())
    tailer.close()
    return exported(state)


class Looks:
    """When the follower last looked at the file (a read or a size probe), for the writer to wait on."""

    def __init__(self, tailer: LogTailer) -> None:
        self.last = 0.0
        self.tailer = tailer
        self.cond = threading.Condition()
        for name in ("poll", "probe"):
            real = getattr(tailer, name)
            setattr(tailer, name, functools.partial(self._looking, real))

    def _looking(self, real, *args):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        result = real(*args)
        if self.tailer.is_open:
            with self.cond:
                self.last = started
                self.cond.notify_all()
        return result

    def wait_after(self, when: float, timeout: float = HANG_GUARD) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.last > when, timeout)

    def saw_quiet(self, stopped: float, timeout: float = HANG_GUARD) -> bool:
        """Whether (within `timeout`) the follower looked at the file after the writer `stopped`, and again
        twice `QUIET` after that look: the second look sees the writer had stopped, so nothing is estimated
        (a look right after the last write cannot tell a writer that stopped from one still writing)."""
        if not self.wait_after(stopped, timeout):
            return False
        with self.cond:
            seen = self.last
        return self.wait_after(seen + 2 * QUIET, timeout)


class Wrapper(threading.Thread):
    """Four llama-server runs on one log: each opens it with mode "w", writes its lines one write() at a
    time, exits, and the next starts RESTART_GAP later (and not before the follower looked at the file
    since the last line, and again once it could see the writer had stopped: what a probe every 50 ms does
    on a host that is not starved; a starved follower makes the restart wait)."""

    def __init__(self, log: Path, looks: Looks) -> None:
        super().__init__(daemon=True)
        self.log, self.looks = log, looks
        self.written = 0
        self.late: list[float] = []  # restarts that waited past RESTART_GAP for the follower to look
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i, run in enumerate(RUNS):
                fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                for n, line in enumerate(run.read_bytes().splitlines(keepends=True)):
                    os.write(fd, line)
                    self.written += len(line)
                    if n % 8 == 7:
                        time.sleep(0.002)  # a line every few hundred microseconds, in bursts
                os.close(fd)  # the server exits (a crash: its last lines are the ones that explain it)
                last = time.monotonic()
                time.sleep(RESTART_GAP)
                if i < len(RUNS) - 1 and not self.looks.saw_quiet(last, timeout=0):
                    self.looks.saw_quiet(last)
                    self.late.append(time.monotonic() - last)
        except BaseException as exc:
            self.error = exc


@pytest.mark.parametrize("watch", ["polling", "watchdog-without-closes"])
async def test_a_wrapper_restarting_the_server_loses_nothing_uncounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: str
) -> None:
    truth = _truth(tmp_path / "truth.log")
    if watch == "watchdog-without-closes":
        use_watch(monkeypatch, "watchdog")
        monkeypatch.setattr(watch_mod, "Observer", functools.partial(PollingObserver, timeout=0.1))
    log = tmp_path / "llama-server.stderr"
    state = ServerState()
    tailer = LogTailer(log)
    # The exporter's defaults: a stat() every second, batches of up to 2 s.
    pipeline = LogPipeline(
        state, FileSource(tailer, poll_interval=1.0, batch_interval=2.0, use_watchdog=watch != "polling")
    )
    pipeline.replay_existing()  # no file yet: everything is live
    looks = Looks(tailer)
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(stop=stop))
    wrapper = Wrapper(log, looks)
    wrapper.start()
    while wrapper.is_alive():
        await asyncio.sleep(0.05)
    assert wrapper.error is None, wrapper.error
    deadline = time.monotonic() + HANG_GUARD  # real time: the restart gaps are real, and so is the follower's clock
    while tailer.stats.bytes + tailer.stats.lost_bytes < wrapper.written and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)

    unread = wrapper.written - tailer.stats.bytes
    print(
        f"{watch}: {wrapper.written} bytes written, {unread} not read, lost_bytes {tailer.stats.lost_bytes}, "
        f"{tailer.stats.truncations} truncations, restarts that waited for the follower: {wrapper.late}"
    )
    assert tailer.stats.truncations == len(RUNS) - 1
    # Every byte not read is counted, and nothing read is: the size the follower last saw, against what it read.
    assert tailer.stats.lost_bytes == unread
    if unread == 0:
        assert exported(state) == truth
    else:
        assert tailer.stats.lost_bytes > 0


class Clock:
    """The tailer's clock, moved by the test: the looks' times are what the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_truncation_counts_what_a_probe_saw_and_estimates_what_none_did(tmp_path: Path) -> None:
    """The counting itself, step by step: a probe between reads remembers the size; the restart's truncation
    counts the difference, and, since the last look saw the server still writing, what it wrote after that
    look at the rate the looks saw; a probe that comes after the restart counts nothing of the new run."""

    log = tmp_path / "llama-server.stderr"
    first = RUNS[0].read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(first[:100]))
    clock = Clock()
    tailer = LogTailer(log, clock=clock)
    assert len(tailer.poll(max_bytes=1 << 30)) == 100
    tailer.probe()  # the probes' looks, evenly spaced, measure the rate
    with log.open("ab") as f:
        f.write(b"".join(first[100:150]))
    clock.now = QUIET / 5
    seen = len(b"".join(first[100:150]))
    assert tailer.probe() == seen  # seen, not read
    with log.open("ab") as f:
        f.write(b"".join(first[150:160]))  # written after the probe: no size shows it
    second = RUNS[1].read_bytes()
    log.write_bytes(second)  # the restart: truncated, rewritten (larger than what was read)
    clock.now = 2 * QUIET / 5
    tailer.probe()  # the new content's size is not the old one's: the fingerprints differ
    assert tailer.replaced
    clock.now = QUIET  # the read comes later: the estimate stops at the look that found the restart
    tailer.poll(max_bytes=1 << 30)
    assert tailer.stats.truncations == 1
    unseen = 2 * seen  # the same span again, at twice the rate the two looks saw
    assert tailer.stats.lost_bytes == seen + unseen >= seen + len(b"".join(first[150:160]))


def test_a_writer_seen_quiet_before_the_restart_counts_no_estimate(tmp_path: Path) -> None:
    """A look QUIET after the old server's last growth saw no more: it had stopped, nothing is estimated;
    what that look saw and no read took is counted to the byte."""
    log = tmp_path / "llama-server.stderr"
    first = RUNS[0].read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(first[:100]))
    clock = Clock()
    tailer = LogTailer(log, clock=clock)
    tailer.poll(max_bytes=1 << 30)
    with log.open("ab") as f:
        f.write(b"".join(first[100:150]))
    clock.now = 0.01
    tailer.probe()
    clock.now = 0.01 + QUIET
    tailer.probe()  # no growth since: the writer stopped
    log.write_bytes(RUNS[1].read_bytes())
    clock.now = 1.0
    tailer.poll(max_bytes=1 << 30)
    assert (tailer.stats.truncations, tailer.stats.lost_bytes) == (1, len(b"".join(first[100:150])))


async def test_without_close_events_a_writer_that_stops_is_read_before_the_batch_wait_ends(tmp_path: Path) -> None:
    """Polling with 30 s waits: a busy writer's last lines are read once it stops (two probes see no
    growth), and a line after a quiet spell is read at once (a probe sees it), not after 30 s."""
    from follow_watch import HANG_GUARD, ManualClock, Seen, wait_until
    from seq_log import append, lines_bytes, seqs

    log = tmp_path / "llama-server.stderr"
    append(log, 0, 1)
    clock = ManualClock()  # the follower's and the tailer's, moved by the test
    tailer, seen, stop = LogTailer(log, clock=clock), Seen(), asyncio.Event()
    task = asyncio.create_task(
        follow(tailer, seen, poll_interval=30, batch_interval=30, use_watchdog=False, stop=stop, clock=clock)
    )
    await wait_until(lambda: seen.has(0), "seq 0")
    with log.open("ab") as f:  # busy: a line every millisecond, then the writer stops
        for i in range(1, 400):
            f.write(lines_bytes(i, i + 1))
            f.flush()
            await clock.advance(0.001)
    # Read once the looks see the writer quiet, long before the 30 s batch wait ends.
    await clock.run_until(lambda: seen.has(399), "the last line, after the writer stopped", within=1)
    await clock.advance(0.3)  # quiet
    append(log, 400, 401)
    await clock.run_until(lambda: seen.has(400), "a line after a quiet spell", within=1)  # a look saw it
    stop.set()
    await asyncio.wait_for(task, HANG_GUARD)
    assert seqs(seen.lines) == list(range(401))


def test_a_run_replaced_in_turn_before_any_read_counts_its_truncation_and_bytes(tmp_path: Path) -> None:
    """Driven, step by step: a probe finds the followed run replaced (the wait is to end), the new run grows,
    and is replaced again before a read: the read counts both truncations, what the probes saw of the
    first run beyond the read, and the whole second run; the third is read from its start."""
    log = tmp_path / "llama-server.stderr"
    first, second, third = (r.read_bytes().splitlines(keepends=True) for r in RUNS[:3])
    log.write_bytes(b"".join(first[:100]))
    clock = Clock()
    tailer = LogTailer(log, clock=clock)
    tailer.poll(max_bytes=1 << 30)
    with log.open("ab") as f:
        f.write(b"".join(first[100:120]))
    for clock.now in (0.01, 0.1):  # the second look sees the writer stopped: no estimate
        tailer.probe()
    assert not tailer.replaced
    log.write_bytes(b"".join(second[:50]))  # the restart: a smaller file
    tailer.probe()
    assert tailer.replaced
    with log.open("ab") as f:
        f.write(b"".join(second[50:]))
    tailer.probe()  # the second run, grown: the same content, larger
    log.write_bytes(b"".join(third))  # restarted again before a read
    tailer.probe()
    lines = tailer.poll(max_bytes=1 << 30)
    assert not tailer.replaced
    assert tailer.stats.truncations == 2
    assert tailer.stats.lost_bytes == len(b"".join(first[100:120])) + len(b"".join(second))
    assert len(lines) == len(third)
    assert tailer.stats.bytes == len(b"".join(first[:100])) + len(b"".join(third))


def test_a_replacement_the_read_still_finds_is_read_not_counted(tmp_path: Path) -> None:
    """The run a probe saw replacing the followed one is the one the next read finds: it is read whole,
    nothing of it counted as lost, one truncation."""
    log = tmp_path / "llama-server.stderr"
    first, second = (r.read_bytes() for r in RUNS[:2])
    log.write_bytes(first)
    tailer = LogTailer(log)
    tailer.poll(max_bytes=1 << 30)
    log.write_bytes(second[:100])
    tailer.probe()
    with log.open("ab") as f:
        f.write(second[100:])
    tailer.probe()
    tailer.poll(max_bytes=1 << 30)
    assert (tailer.stats.truncations, tailer.stats.lost_bytes) == (1, 0)
    assert tailer.stats.bytes == len(first) + len(second)


def test_the_probe_ends_a_batch_wait_on_a_replaced_file_and_on_a_quiet_writer(tmp_path: Path) -> None:
    """`Probe.step` driven with its clock: during a batch wait growth keeps waiting, a quiet spell of
    PROBE_INTERVAL ends it, and so does a file found shrunk at once; idle, any new byte ends it."""
    from exporter.logs.follow import PROBE_INTERVAL, PROBE_INTERVAL_BUSY, Probe

    log = tmp_path / "llama-server.stderr"
    run = RUNS[0].read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(run[:10]))
    clock = Clock()  # the tailer's and the probe's: the test's
    tailer = LogTailer(log, clock=clock)
    tailer.poll(max_bytes=1 << 30)
    busy = Probe(tailer, False, 0.0)
    assert busy.interval(0.0) == PROBE_INTERVAL_BUSY < PROBE_INTERVAL
    for i in range(10, 20):  # a line per look: the writer is busy
        with log.open("ab") as f:
            f.write(run[i])
        clock.now += PROBE_INTERVAL_BUSY
        assert not busy.step(clock.now)
    quiet_from = clock.now
    while clock.now - quiet_from < PROBE_INTERVAL:
        assert not busy.step(clock.now)
        clock.now += PROBE_INTERVAL_BUSY
    assert busy.step(clock.now)  # quiet for PROBE_INTERVAL: the server may be exiting
    busy = Probe(tailer, False, clock.now)
    log.write_bytes(run[0])  # restarted: shrunk, whatever the growth
    clock.now += PROBE_INTERVAL_BUSY
    assert busy.step(clock.now)
    tailer.poll(max_bytes=1 << 30)
    assert tailer.stats.lost_bytes == len(b"".join(run[10:20]))  # seen quiet first: no estimate
    idle = Probe(tailer, True, clock.now, clock.now + 1.0)
    assert idle.interval(clock.now) == PROBE_INTERVAL_BUSY and idle.interval(clock.now + 1.0) == PROBE_INTERVAL
    clock.now += PROBE_INTERVAL
    assert not idle.step(clock.now)
    with log.open("ab") as f:
        f.write(run[1])
    clock.now += PROBE_INTERVAL
    assert idle.step(clock.now)


def test_a_run_a_look_saw_before_the_file_was_opened_is_counted_when_replaced(tmp_path: Path) -> None:
    """The follower waits for a log not there yet; a look sees the first run (the wait is to end), and that
    run is replaced before the read: the look opened it, so its truncation and what the look saw count.
    A look that only stat()ed the path would leave the whole run unseen: no truncation, nothing counted."""
    from exporter.logs.follow import Probe

    log = tmp_path / "llama-server.stderr"
    first, second = (r.read_bytes().splitlines(keepends=True) for r in RUNS[:2])
    clock = Clock()
    tailer = LogTailer(log, clock=clock)
    assert tailer.poll() == [] and not tailer.is_open
    idle = Probe(tailer, True, clock.now)
    log.write_bytes(b"".join(first[:40]))
    clock.now = 0.05
    assert idle.step(clock.now)  # a look sees the file: the idle wait is to end
    with log.open("ab") as f:
        f.write(b"".join(first[40:]))  # after the look: no size shows it (one look: no rate, no estimate)
    log.write_bytes(b"".join(second))  # restarted before the read
    clock.now = 0.3
    lines = tailer.poll(max_bytes=1 << 30)
    assert (tailer.stats.truncations, tailer.stats.lost_bytes) == (1, len(b"".join(first[:40])))
    assert len(lines) == len(second) and tailer.stats.bytes == len(b"".join(second))


def test_an_estimate_is_kept_when_the_next_run_is_replaced_before_its_first_byte_is_read(tmp_path: Path) -> None:
    """The old server's estimate is counted at the new run's first byte read (unless a copytruncate hole
    measures the loss). A new run that a read found empty, a look saw grow, and that was replaced in turn
    before a read never gives that byte: its own loss and the estimate before it both count."""
    log = tmp_path / "llama-server.stderr"
    first, second, third = (r.read_bytes().splitlines(keepends=True) for r in RUNS[:3])
    log.write_bytes(b"".join(first[:100]))
    clock = Clock()
    tailer = LogTailer(log, clock=clock)
    tailer.poll(max_bytes=1 << 30)
    tailer.probe()
    with log.open("ab") as f:
        f.write(b"".join(first[100:150]))
    seen = len(b"".join(first[100:150]))
    clock.now = 0.01
    tailer.probe()  # growing: `seen` bytes in 10 ms
    log.write_bytes(b"")  # the restart, 2 ms after that look; the new server has not written yet
    clock.now = 0.012
    assert tailer.poll(max_bytes=1 << 30) == []
    estimate = round(2 * seen / 0.01 * 0.002)  # twice the rate, for the 2 ms since the last look
    assert (tailer.stats.truncations, tailer.stats.lost_bytes) == (1, seen)  # the estimate waits for a byte
    log.write_bytes(b"".join(second[:20]))
    clock.now = 0.02
    tailer.probe()  # a look sees the second run grow (its first look: no rate of its own)
    log.write_bytes(b"".join(third[:5]))  # restarted again, smaller, before any read
    clock.now = 0.03
    assert len(tailer.poll(max_bytes=1 << 30)) == 5
    assert tailer.stats.truncations == 2
    assert tailer.stats.lost_bytes == seen + estimate + len(b"".join(second[:20]))


def _interleaving(seed: int, log: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """One seeded interleaving of a wrapper restarting distinct runs (a line per write, at times a long
    stretch with no look: a starved follower) and the follower's looks and reads, on the tailer's clock.
    Returns (bytes the looks saw and no read took, lost_bytes), the estimate left out (its own tests)."""
    import random

    from exporter.logs import replaced

    monkeypatch.setattr(replaced, "_BURST", 0)  # no estimate: what is counted is what the looks saw
    rnd = random.Random(seed)
    clock = Clock()
    tailer = LogTailer(log, clock=clock, chunk_bytes=rnd.choice([64, 4096, 1 << 15]))
    runs = [r.read_bytes().splitlines(keepends=True) for r in rnd.sample(RUNS, rnd.randint(2, 4))]
    writes = [(i, line) for i, run in enumerate(runs) for line in [b"", *run]]  # b"": the run opens the log
    seen: dict[int, int] = {}  # per run, the largest size a look (a probe or a read) found
    fd, current, stall = -1, -1, 0
    for i, line in writes:
        while stall == 0 and rnd.random() < 0.3:  # the follower's turn
            clock.now += rnd.choice([0.001, 0.005, 0.05])
            tailer.probe() if rnd.random() < 0.6 else tailer.poll()
            if current >= 0:
                seen[current] = max(seen.get(current, 0), os.fstat(fd).st_size)
        stall = max(0, stall - 1) if stall else (rnd.randint(10, 400) if rnd.random() < 0.02 else 0)
        if not line:
            if fd >= 0:
                os.close(fd)
            fd, current = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), i
        os.write(fd, line)
        clock.now += rnd.choice([0.0001, 0.0002, 0.002])
    os.close(fd)
    seen[current] = len(b"".join(runs[current]))  # the last run stays: read to its end
    for _ in range(3):
        tailer.poll(max_bytes=1 << 30)
    tailer.close()
    return sum(seen.values()) - tailer.stats.bytes, tailer.stats.lost_bytes


def test_every_byte_a_look_saw_is_read_or_counted_in_any_interleaving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 seeded interleavings of restarts and looks, starved stretches included: whatever a look saw of
    a run (before the file was opened, after a read found it empty, replaced in turn) and no read took is
    in lost_bytes, to the byte. A run no look saw while it existed is out of reach, and not asked for."""
    for seed in range(200):
        log = tmp_path / f"{seed}.log"
        unread_seen, lost = _interleaving(seed, log, monkeypatch)
        assert lost == unread_seen, f"seed {seed}: {unread_seen} bytes seen, not read, {lost} counted"
