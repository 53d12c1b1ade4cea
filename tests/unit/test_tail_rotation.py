"""Rotation and truncation in Vector's style: every line is read once or counted as lost, never repeated.

A writer thread behaves as llama-server does: one `write()` per line, its log opened without O_APPEND,
never reopened unless it starts again. Between its lines it rotates the log the ways logrotate and
people do: rename and create (the writer goes on into the renamed file for a while, then reopens the
path), copytruncate, truncate, delete and recreate (late writes into the deleted file). The follower
runs meanwhile, with inotify and with polling only, on a `ManualClock` the test moves while the writer
writes (its only real-time limits are hang guards). At the end each sequence number was read exactly
once, or its bytes are in `lost_bytes`: what was read plus what was counted lost is what was written.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from follow_watch import HANG_GUARD, ManualClock, wait_until

from exporter.logs.follow import follow
from exporter.logs.tail import LogTailer

SEQ = re.compile(r"seq=(\d{6}) ")
OPERATIONS = ("create", "copytruncate", "truncate", "delete-recreate")


def _line(i: int, rng: random.Random) -> bytes:
    return f"seq={i:06d} slot update_slots: id  0 | task {i} | {'x' * rng.randrange(0, 120)}\n".encode()


class Writer(threading.Thread):
    """llama-server's way of writing its log, and the rotations done to it while it writes."""

    def __init__(self, path: Path, tailer: LogTailer, seed: int, rounds: int) -> None:
        super().__init__(daemon=True)
        self.path, self.tailer, self.rng, self.rounds = path, tailer, random.Random(seed), rounds
        self.written: dict[int, bytes] = {}
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._seq = 0
        self._fd = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # fopen(path, "w")

    def _write(self, n: int, fd: int | None = None) -> None:
        for _ in range(n):
            data = _line(self._seq, self.rng)
            os.write(self._fd if fd is None else fd, data)
            self.written[self._seq] = data
            self._seq += 1
            if self.rng.random() < 0.2:
                time.sleep(self.rng.random() * 0.004)

    def _wait_seen(self, what: str, before: int) -> None:
        """Until the follower has noticed the operation: a second one before that would lose a whole file."""
        stats = self.tailer.stats
        deadline = time.monotonic() + 120  # a hang guard: a host under load may take seconds to schedule the follower
        while (stats.rotations if what == "rotations" else stats.truncations) <= before:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the follower never saw the {what}")
            self._write(1)
            time.sleep(0.01)

    def run(self) -> None:
        try:
            self._write(50)
            for round_ in range(self.rounds):
                op = OPERATIONS[round_ % len(OPERATIONS)]
                rotations, truncations = self.tailer.stats.rotations, self.tailer.stats.truncations
                if op == "create":
                    self.path.rename(self.path.with_name(f"{self.path.name}.{round_}"))
                    self._write(self.rng.randrange(1, 30))  # late writes: the server still has the old file open
                    os.close(self._fd)
                    self._fd = self._open()
                elif op == "delete-recreate":
                    self.path.unlink()
                    self._write(self.rng.randrange(1, 30))  # into the deleted file
                    os.close(self._fd)
                    self._fd = self._open()
                elif op == "copytruncate":
                    self._write(self.rng.randrange(0, 30))
                    shutil.copy(self.path, self.path.with_name(f"{self.path.name}.{round_}"))
                    os.truncate(self.path, 0)
                else:
                    self._write(self.rng.randrange(0, 30))
                    os.truncate(self.path, 0)
                self._write(self.rng.randrange(5, 40))
                if op in ("create", "delete-recreate"):
                    self._wait_seen("rotations", rotations)
                else:
                    self._wait_seen("truncations", truncations)
                self._write(self.rng.randrange(0, 60))
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc
        finally:
            os.close(self._fd)
            self.done.set()


@pytest.mark.parametrize("fs_events", [True, False], ids=["inotify", "polling"])
async def test_every_line_is_read_once_or_counted_lost(tmp_path: Path, fs_events: bool) -> None:
    path = tmp_path / "llama-server.log"
    tailer = LogTailer(path)
    received: list[str] = []
    stop = asyncio.Event()
    writer = Writer(path, tailer, seed=20261201 + fs_events, rounds=12)
    # A busy writer is read in batches; at the default 2 s batches each rotation would wait about a
    # second to be seen, and what is checked here is what is read, not when.
    clock = ManualClock()
    follower = asyncio.ensure_future(
        follow(
            tailer,
            received.extend,
            use_watchdog=fs_events,
            poll_interval=0.05,
            batch_interval=0.2,
            stop=stop,
            clock=clock,
        )
    )
    writer.start()
    try:
        while not writer.done.is_set():  # the follower's time moves on as the writer writes
            await clock.advance(0.01)
            await asyncio.sleep(0.001)
        assert writer.error is None, writer.error

        def accounted() -> int:
            return sum(len(text.encode()) + 1 for text in received) + tailer.stats.lost_bytes

        total = sum(map(len, writer.written.values()))
        await clock.run_until(lambda: accounted() >= total, "every byte read or counted lost")
    finally:
        stop.set()
        await asyncio.wait_for(follower, HANG_GUARD)

    intact: list[int] = []
    fragments = 0  # bytes of lines cut by a truncation while half read (the rest is in the lost bytes)
    for text in received:
        m = SEQ.match(text)
        assert m is not None, f"a line that was never written: {text[:80]!r}"
        seq = int(m.group(1))
        if writer.written[seq] == (text + "\n").encode():
            intact.append(seq)
        else:
            assert writer.written[seq].startswith(text.encode()), text[:80]
            fragments += len(text.encode())
    assert len(intact) == len(set(intact)), "a line was read twice"
    missing = sum(len(data) for seq, data in writer.written.items() if seq not in set(intact))
    assert tailer.stats.lost_bytes == missing - fragments, (tailer.stats, missing, fragments)
    assert tailer.stats.rotations >= 6 and tailer.stats.truncations >= 6
    # Every operation that can be lossless was: a loss only comes from copytruncate or truncate.
    print(
        f"{'inotify' if fs_events else 'polling'}: {len(writer.written)} lines written, {len(intact)} read, "
        f"{tailer.stats.lost_bytes} bytes counted lost, {tailer.stats.rotations} rotations, "
        f"{tailer.stats.truncations} truncations"
    )


@pytest.mark.linux  # inotify
async def test_a_rotated_file_written_on_is_read_at_once(tmp_path: Path) -> None:
    """After logrotate's rename llama-server writes on into the renamed file: its lines wake the follower
    (inotify), they do not wait for the poll timer."""
    path = tmp_path / "llama-server.log"
    rng = random.Random(7)
    received: list[str] = []
    stop = asyncio.Event()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, _line(0, rng))
    tailer = LogTailer(path)
    # The clock moves a second between two writes (batch waits end), never to the 30 s poll timer: only an
    # event can have the follower read.
    clock = ManualClock()
    follower = asyncio.ensure_future(follow(tailer, received.extend, poll_interval=30, stop=stop, clock=clock))
    try:
        await wait_until(lambda: len(received) == 1, "the first line")
        path.rename(tmp_path / "llama-server.log.1")
        path.touch()  # logrotate's `create`
        await wait_until(lambda: tailer.stats.rotations == 1, "the rotation")
        for i in range(1, 4):
            await clock.advance(1)
            os.write(fd, _line(i, rng))
            await wait_until(functools.partial(lambda n: len(received) == n, i + 1), f"line {i}")
    finally:
        os.close(fd)
        stop.set()
        await asyncio.wait_for(follower, HANG_GUARD)
    assert clock.now < 30
    assert [text[: len("seq=000000")] for text in received] == [f"seq={i:06d}" for i in range(4)]
