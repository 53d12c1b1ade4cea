"""A wrapper restarting llama-server on the same log, followed without close events (polling, or a watchdog
observer that reports none, as on Windows and macOS): every line is read, or what was not read is counted.

Each restart truncates the log (llama-server opens it with mode "w"). What the old server wrote after
the follower's last read and before that truncation is gone; the follower looks at the file's size while
it waits (`follow._Probe`), reads new bytes after a quiet spell and when the writer stops, and counts in
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
from follow_watch import use_watch
from paths import FIXTURES
from watchdog.observers.polling import PollingObserver

from exporter.logs import watch as watch_mod
from exporter.logs.follow import follow
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

    def wait_after(self, when: float, timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.last > when, timeout)


class Wrapper(threading.Thread):
    """Four llama-server runs on one log: each opens it with mode "w", writes its lines one write() at a
    time, exits, and the next starts RESTART_GAP later (and not before the follower looked at the file
    once since the last line: that is what a probe every 50 ms does on a host that is not starved)."""

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
                if i < len(RUNS) - 1 and not self.looks.wait_after(last, timeout=0):
                    self.looks.wait_after(last)
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
    pipeline = LogPipeline(state, tailer)
    pipeline.replay_existing()  # no file yet: everything is live
    looks = Looks(tailer)
    stop = asyncio.Event()
    # The exporter's defaults: a stat() every second, batches of up to 2 s.
    task = asyncio.create_task(
        pipeline.run(poll_interval=1.0, batch_interval=2.0, use_watchdog=watch != "polling", stop=stop)
    )
    wrapper = Wrapper(log, looks)
    wrapper.start()
    while wrapper.is_alive():
        await asyncio.sleep(0.05)
    assert wrapper.error is None, wrapper.error
    deadline = time.monotonic() + 10
    while tailer.stats.bytes + tailer.stats.lost_bytes < wrapper.written and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)

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


def test_a_truncation_counts_what_a_probe_saw_and_no_read_took(tmp_path: Path) -> None:
    """The counting itself, step by step: a probe between reads remembers the size; the restart's truncation
    counts the difference; a probe that comes after the restart counts nothing of the new run."""
    log = tmp_path / "llama-server.stderr"
    first = RUNS[0].read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(first[:100]))
    tailer = LogTailer(log)
    assert len(tailer.poll(max_bytes=1 << 30)) == 100
    with log.open("ab") as f:
        f.write(b"".join(first[100:150]))
    assert tailer.probe() == len(b"".join(first[100:150]))  # seen, not read
    with log.open("ab") as f:
        f.write(b"".join(first[150:160]))  # written after the probe: no trace of it
    second = RUNS[1].read_bytes()
    log.write_bytes(second)  # the restart: truncated, rewritten (larger than what was read)
    tailer.probe()  # the new content's size is not the old one's: the fingerprints differ
    tailer.poll(max_bytes=1 << 30)
    assert tailer.stats.truncations == 1
    assert tailer.stats.lost_bytes == len(b"".join(first[100:150]))


async def test_without_close_events_a_writer_that_stops_is_read_before_the_batch_wait_ends(tmp_path: Path) -> None:
    """Polling with 30 s waits: a busy writer's last lines are read once it stops (two probes see no
    growth), and a line after a quiet spell is read at once (a probe sees it), not after 30 s."""
    from follow_watch import Seen, wait_until
    from seq_log import append, lines_bytes, seqs

    log = tmp_path / "llama-server.stderr"
    append(log, 0, 1)
    tailer, seen, stop = LogTailer(log), Seen(), asyncio.Event()
    task = asyncio.create_task(follow(tailer, seen, poll_interval=30, batch_interval=30, use_watchdog=False, stop=stop))
    await wait_until(lambda: seen.has(0), "seq 0")
    with log.open("ab") as f:  # busy: a line every millisecond or so, then the writer stops
        for i in range(1, 400):
            f.write(lines_bytes(i, i + 1))
            f.flush()
            await asyncio.sleep(0.001)
    await wait_until(lambda: seen.has(399), "the last line, after the writer stopped", timeout=10)
    await asyncio.sleep(0.3)  # quiet
    append(log, 400, 401)
    await wait_until(lambda: seen.has(400), "a line after a quiet spell", timeout=10)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert seqs(seen.lines) == list(range(401))
