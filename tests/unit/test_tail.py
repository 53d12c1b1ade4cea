"""Tests for exporter.logs.tail.

Sync tests drive LogTailer.poll() directly with sequence-numbered lines and no sleeps; the async
tests run follow() with a real filesystem watch (inotify on the event loop on Linux, a watchdog
observer elsewhere and as the fallback) and wait on "the follower has seen seq N" conditions with
a bounded timeout, never on a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import itertools
import logging
import os
import random
import re
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from watchdog.observers.api import BaseObserver

from exporter.logs import follow as follow_mod
from exporter.logs import watch as watch_mod
from exporter.logs.follow import CatchUp, follow
from exporter.logs.tail import LogTailer

SEQ_RE = re.compile(r"seq=(\d{6})")


def line(i: int) -> str:
    return f"seq={i:06d} slot print_timing: id 0 | task {i} | prompt eval time = {i * 7 % 1000} ms"


def lines_bytes(start: int, stop: int) -> bytes:
    return "".join(line(i) + "\n" for i in range(start, stop)).encode()


def append(path: Path, start: int, stop: int) -> int:
    data = lines_bytes(start, stop)
    with path.open("ab") as f:
        f.write(data)
    return len(data)


def seqs(lines: list[str]) -> list[int]:
    out = []
    for text in lines:
        m = SEQ_RE.match(text)
        assert m, f"line without a sequence number: {text!r}"
        out.append(int(m.group(1)))
    return out


def drain(t: LogTailer, max_bytes: int | None = None) -> list[str]:
    """Poll until a poll makes no progress, as follow() does on each wake."""
    out: list[str] = []
    for _ in range(100_000):
        s = t.stats
        before = (s.bytes, s.opens, s.rotations, s.truncations)
        out += t.poll(max_bytes)
        if (s.bytes, s.opens, s.rotations, s.truncations) == before:
            return out
    raise AssertionError("poll() never went quiet")


BUDGETS = [None, 7, 4096]


# --- basics -----------------------------------------------------------------------------------------


def test_reads_existing_file_from_beginning(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    size = append(p, 0, 10)
    t = LogTailer(p)
    got = t.poll()
    assert got == [line(i) for i in range(10)]
    assert t.is_open and t.last_error is None
    assert t.stats.lines == 10 and t.stats.bytes == size and t.stats.opens == 1
    assert t.poll() == [] and not t.has_pending()
    t.close()
    assert not t.is_open


def test_missing_file_then_created(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    t = LogTailer(p)
    assert t.poll() == []
    assert not t.is_open
    assert t.last_error is not None and "does not exist" in t.last_error and str(p) in t.last_error
    assert t.poll() == []  # still missing: no exception, same answer
    append(p, 0, 5)
    assert seqs(t.poll()) == [0, 1, 2, 3, 4]
    assert t.last_error is None
    assert (t.stats.opens, t.stats.rotations, t.stats.truncations) == (1, 0, 0)


def test_directory_at_path_is_an_error_not_a_crash(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    p.mkdir()
    t = LogTailer(p)
    assert t.poll() == []
    assert not t.is_open and t.last_error is not None and "not a regular file" in t.last_error
    p.rmdir()
    append(p, 0, 3)
    assert seqs(t.poll()) == [0, 1, 2]
    assert t.last_error is None


def test_path_replaced_by_directory_while_open(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 3)
    t = LogTailer(p)
    assert seqs(drain(t)) == [0, 1, 2]
    p.rename(tmp_path / "server.log.1")
    p.mkdir()
    assert drain(t) == []
    assert not t.is_open and t.last_error is not None and t.stats.rotations == 1


def test_permission_denied_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, where chmod 000 does not stop reads; fake the open() failure instead.
    p = tmp_path / "server.log"
    append(p, 0, 2)
    t = LogTailer(p)

    def denied(*args: Any, **kwargs: Any) -> int:
        raise PermissionError(errno.EACCES, "Permission denied", str(p))

    with monkeypatch.context() as m:
        m.setattr(os, "open", denied)
        assert t.poll() == []
    assert t.last_error is not None and "permission denied" in t.last_error
    assert seqs(t.poll()) == [0, 1]
    assert t.last_error is None


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can read mode-000 files")
def test_permission_denied_real_chmod(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 2)
    p.chmod(0)
    t = LogTailer(p)
    assert t.poll() == []
    assert t.last_error is not None and "permission denied" in t.last_error


def test_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError):
        LogTailer("x", max_line_bytes=0)
    with pytest.raises(ValueError):
        LogTailer("x", chunk_bytes=0)


# --- rotation, truncation, deletion -------------------------------------------------------------------


@pytest.mark.parametrize("budget", BUDGETS)
def test_rename_and_create_rotation(tmp_path: Path, budget: int | None) -> None:
    p = tmp_path / "server.log"
    old = tmp_path / "server.log.1"
    append(p, 0, 10)
    t = LogTailer(p)
    assert seqs(drain(t, budget)) == list(range(10))

    with p.open("ab", buffering=0) as writer:  # the server keeps its fd across the rename
        writer.write(lines_bytes(10, 15))
        p.rename(old)
        writer.write(lines_bytes(15, 19))
        writer.write(line(19).encode()[:30])  # not complete yet: the rotated file is still written
        append(p, 20, 30)

        got = drain(t, budget)
        assert seqs(got) == [*range(10, 19), *range(20, 30)]
        assert t.rotated_files == 1
        # llama-server never reopens its log: it goes on writing into the rotated file.
        writer.write(line(19).encode()[30:] + b"\n" + lines_bytes(30, 33))
        writer.write(line(33).encode()[:30])
    got = drain(t, budget)
    assert seqs(got) == [19, 30, 31, 32] and got[0] == line(19)
    assert t.stats.rotations == 1 and t.stats.truncations == 0 and t.stats.opens == 2
    t.close()
    assert t.stats.lost_bytes == 0


def test_a_rotated_file_is_closed_once_a_new_writer_took_over(tmp_path: Path) -> None:
    """Quiet for rotate_wait while the new file is written: the old writer is gone. Its unfinished line is a line."""
    p = tmp_path / "server.log"
    append(p, 0, 5)
    t = LogTailer(p, rotate_wait=0.0)
    assert seqs(drain(t)) == list(range(5))
    with p.open("ab") as writer:
        writer.write(line(5).encode()[:20])
    p.rename(tmp_path / "server.log.1")
    assert drain(t) == [] and t.rotated_files == 0 and t.is_open  # no new file yet: the old one is still current
    append(p, 6, 8)
    got = drain(t)
    assert seqs(got) == [6, 7, 5] and got[2] == line(5)[:20] and t.rotated_files == 0


def test_rotated_files_held_are_bounded(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    t = LogTailer(p, max_rotated=2)
    for i in range(5):
        append(p, i, i + 1)
        assert seqs(drain(t)) == [i]
        p.rename(tmp_path / f"server.log.{i}")
        drain(t)
    assert t.stats.rotations == 4 and t.rotated_files == 2  # the oldest two were closed
    assert t.stats.lost_bytes == 0


def test_rotation_drains_writes_that_race_the_stat(tmp_path: Path) -> None:
    """Lines appended to the old file after our EOF read but before the rename are still read."""
    p = tmp_path / "server.log"
    old = tmp_path / "server.log.1"

    class Racy(LogTailer):
        def _path_replaced(self, f: Any) -> bool:
            if not old.exists():
                append(p, 10, 15)  # lands in the old file, after the read that hit EOF
                p.rename(old)
                append(p, 15, 20)
            return super()._path_replaced(f)

    append(p, 0, 10)
    t = Racy(p)
    assert seqs(drain(t)) == list(range(20))
    assert t.stats.rotations == 1


@pytest.mark.parametrize("budget", BUDGETS)
def test_truncation_then_rewrite(tmp_path: Path, budget: int | None) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 50)
    t = LogTailer(p)
    got = drain(t, budget)

    # llama-server restart: fopen("w") truncates, then the new run writes less than we had read.
    p.open("wb").close()
    assert drain(t, budget) == []
    assert t.stats.truncations == 1
    append(p, 50, 60)
    got += drain(t, budget)

    # Restart again, and the new run outgrows our offset before we poll: size alone looks fine.
    offset = p.stat().st_size
    with p.open("wb") as f:
        f.write(lines_bytes(60, 200))
    assert p.stat().st_size > offset
    got += drain(t, budget)

    assert seqs(got) == list(range(200))
    assert t.stats.truncations == 2 and t.stats.rotations == 0 and t.stats.lost_bytes == 0


def test_restart_with_identical_banner_is_caught_by_tail_check(tmp_path: Path) -> None:
    # llama-server's first lines are the same on every start, so the head fingerprint matches.
    banner = (
        "build: 4589 (0f2bbe65) with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu\n"
        "system info: n_threads = 16, n_threads_batch = 16, total_threads = 32\n"
    )
    p = tmp_path / "server.log"
    p.write_text(banner + lines_bytes(0, 20).decode())
    t = LogTailer(p)
    first = drain(t)
    p.write_text(banner + lines_bytes(100, 300).decode())
    second = drain(t)
    assert first[:2] == second[:2] == banner.splitlines()
    assert seqs(first[2:]) == list(range(20))
    assert seqs(second[2:]) == list(range(100, 300))
    assert t.stats.truncations == 1


def test_rewrite_with_identical_tail_window_is_caught_by_head_check(tmp_path: Path) -> None:
    # Same length, same bytes just before our offset, different first line (e.g. a new start time).
    p = tmp_path / "server.log"
    p.write_text("seq=000000 started at 10:00:00\n" + lines_bytes(1, 20).decode())
    t = LogTailer(p)
    first = drain(t)
    p.write_text("seq=000000 started at 11:11:11\n" + lines_bytes(1, 30).decode())
    second = drain(t)
    assert seqs(first) == list(range(20)) and seqs(second) == list(range(30))
    assert second[0].endswith("11:11:11")
    assert t.stats.truncations == 1


def test_stat_and_fstat_disagreeing_is_not_a_rotation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Old overlayfs: fstat(fd) reports the underlying file's st_dev, stat(path) the overlay's."""
    real_fstat = os.fstat

    def skewed_fstat(fd: int) -> os.stat_result:
        fields = list(real_fstat(fd)[:10])
        fields[2] += 1  # st_dev
        return os.stat_result(fields)

    monkeypatch.setattr(os, "fstat", skewed_fstat)
    p = tmp_path / "server.log"
    append(p, 0, 10)
    t = LogTailer(p)
    got = drain(t)
    append(p, 10, 20)
    got += drain(t)
    assert t.stats.rotations == 0
    p.rename(tmp_path / "server.log.1")
    append(p, 20, 30)
    got += drain(t)
    assert seqs(got) == list(range(30))
    assert t.stats.rotations == 1 and t.stats.opens == 2


@pytest.mark.parametrize("budget", BUDGETS)
def test_delete_and_recreate(tmp_path: Path, budget: int | None) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 10)
    t = LogTailer(p)
    got = drain(t, budget)

    with p.open("ab") as writer:
        p.unlink()
        writer.write(lines_bytes(10, 20))  # the server still writes into the deleted file
        writer.flush()
        got += drain(t, budget)
        assert seqs(got) == list(range(20))
        assert t.is_open and t.last_error is None and t.stats.rotations == 0
        writer.write(lines_bytes(20, 25))  # unread when the path comes back

    # Recreated with more bytes than our old offset: must not be mistaken for a continuation.
    old_offset = t.stats.bytes
    append(p, 25, 300)
    assert p.stat().st_size > old_offset
    got += drain(t, budget)
    assert seqs(got) == list(range(300))
    assert t.stats.rotations == 1 and t.stats.truncations == 0 and t.stats.lost_bytes == 0


def test_moved_away_and_back_is_not_a_rotation(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 5)
    t = LogTailer(p)
    drain(t)
    p.rename(tmp_path / "elsewhere")
    assert drain(t) == []
    (tmp_path / "elsewhere").rename(p)
    append(p, 5, 10)
    assert seqs(drain(t)) == [5, 6, 7, 8, 9]
    assert t.stats.rotations == 0 and t.stats.truncations == 0


def test_copytruncate_loss_is_exact_and_counted(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 100)
    t = LogTailer(p)
    got = drain(t)
    assert seqs(got) == list(range(100))

    seen_bytes = append(p, 100, 120)
    assert t.has_pending()  # this fstat makes the loss of 100..119 knowable
    append(p, 120, 130)  # appended after the last stat: lost, and nobody can know how much
    shutil.copy(p, tmp_path / "server.log.1")
    os.truncate(p, 0)
    append(p, 130, 150)

    got += drain(t)
    got_seqs = seqs(got)
    assert got_seqs == sorted(set(got_seqs))  # in order, no duplicates
    assert set(range(150)) - set(got_seqs) == set(range(100, 130))
    assert t.stats.truncations == 1 and t.stats.rotations == 0
    assert t.stats.lost_bytes == seen_bytes
    # The lines are not gone, they are only in the copy.
    assert seqs((tmp_path / "server.log.1").read_text().splitlines()) == list(range(130))


@pytest.mark.parametrize("poll_between", [False, True])
def test_copytruncate_without_o_append_skips_nul_hole(tmp_path: Path, poll_between: bool) -> None:
    # llama-server's fopen("w") has no O_APPEND: after copytruncate it writes at its old offset,
    # leaving a sparse hole of NULs at the start, and the file is never smaller than our offset.
    p = tmp_path / "server.log"
    t = LogTailer(p)
    with p.open("wb") as writer:
        writer.write(lines_bytes(0, 50))
        writer.flush()
        got = drain(t)
        shutil.copy(p, tmp_path / "server.log.1")
        os.truncate(p, 0)
        if poll_between:
            got += drain(t)
        writer.write(lines_bytes(50, 60))
    assert p.read_bytes().startswith(b"\0" * 64)
    got += drain(t)
    assert seqs(got) == list(range(60))
    assert not any("\0" in text for text in got)
    assert t.stats.truncations == 1 and t.stats.lost_bytes == 0


@pytest.mark.parametrize("poll_between", [False, True])
def test_a_nul_hole_measures_what_copytruncate_lost(tmp_path: Path, poll_between: bool) -> None:
    """The writer (no O_APPEND) writes on at its old offset: the hole ends where it was at the truncation,
    so what it wrote after our last read and before the truncation is known to the byte."""
    p = tmp_path / "server.log"
    t = LogTailer(p)
    with p.open("wb", buffering=0) as writer:
        writer.write(lines_bytes(0, 50))
        got = drain(t)
        unread = writer.write(lines_bytes(50, 70))  # written, never read: only the copy has it
        shutil.copy(p, tmp_path / "server.log.1")
        os.truncate(p, 0)
        if poll_between:
            got += drain(t)
        writer.write(lines_bytes(70, 80))
    got += drain(t)
    assert seqs(got) == [*range(50), *range(70, 80)]
    assert t.stats.truncations == 1 and t.stats.lost_bytes == unread


def test_randomized_no_line_lost_or_repeated(tmp_path: Path) -> None:
    """Appends, rotations, restarts and delete-and-recreate, polling between events like follow()."""
    rng = random.Random(1234)
    p = tmp_path / "server.log"
    t = LogTailer(p, max_line_bytes=4096, chunk_bytes=512)
    got: list[str] = []
    seq = 0
    rotations = truncations = 0
    for step in range(300):
        op = rng.choice(["append"] * 6 + ["split", "rotate", "restart", "recreate"])
        n = rng.randint(1, 40)
        if op == "append" or not p.exists():
            append(p, seq, seq + n)
        elif op == "split":
            data = lines_bytes(seq, seq + n)
            cut = rng.randint(1, len(data) - 1)
            with p.open("ab") as f:
                f.write(data[:cut])
            got += drain(t, rng.choice([None, 1, 13, 100]))
            with p.open("ab") as f:
                f.write(data[cut:])
        elif op == "rotate":
            p.rename(tmp_path / f"server.log.{step}")
            append(p, seq, seq + n)
            rotations += 1
        elif op == "restart":
            with p.open("wb") as f:
                f.write(lines_bytes(seq, seq + n))
            truncations += 1
        else:
            p.unlink()
            append(p, seq, seq + n)
            rotations += 1
        seq += n
        got += drain(t, rng.choice([None, 13, 100, 1000]))
    assert seqs(got) == list(range(seq))
    assert (t.stats.rotations, t.stats.truncations, t.stats.lost_bytes) == (rotations, truncations, 0)
    assert t.stats.lines == len(got)


# --- line splitting -------------------------------------------------------------------------------


def test_lines_written_in_pieces(tmp_path: Path) -> None:
    text = "seq=000000 héllo wörld ✓ 日本語 🦙\nseq=000001 plain\nseq=000002 ✓✓\n"
    data = text.encode()
    p = tmp_path / "server.log"
    p.write_bytes(b"")
    t = LogTailer(p)
    got: list[str] = []
    for i in range(len(data)):  # every split point, including inside multi-byte characters
        with p.open("ab") as f:
            f.write(data[i : i + 1])
        got += t.poll()
        complete = data[: i + 1].count(b"\n")
        assert len(got) == complete
    assert got == text.splitlines()
    assert not any("\ufffd" in s for s in got)


def test_very_long_line_is_cut_and_memory_bounded(tmp_path: Path) -> None:
    limit = 100  # above len(line(i)), so only the two long lines are cut
    p = tmp_path / "server.log"
    long_ascii = line(1) + " " + "x" * 5000
    long_utf8 = "seq=000003 " + "é" * 200  # 11 + 2k bytes: the cut lands inside a character
    exact = ("seq=000005 " + "y" * limit)[:limit]
    p.write_text("\n".join([line(0), long_ascii, line(2), long_utf8, line(4), exact, line(6)]) + "\n")
    t = LogTailer(p, max_line_bytes=limit, chunk_bytes=16)
    got: list[str] = []
    while True:
        batch = t.poll(max_bytes=16)
        assert t._file is not None and len(t._file.partial) <= limit
        got += batch
        if not t.has_pending() and not batch:
            break
    assert seqs(got) == list(range(7))
    assert got[1] == long_ascii[:limit]
    assert got[3].encode() == long_utf8.encode()[: limit - 1]  # backed off to a character boundary
    assert "\ufffd" not in got[3]
    assert got[5] == exact  # exactly max_line_bytes is not "long"
    assert t.stats.long_lines == 2
    assert t.stats.bytes == p.stat().st_size


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    p.write_bytes(b"seq=000000 ok\nseq=000001 bad \xff\xfe \xc3( end\nseq=000002 ok\n")
    got = LogTailer(p).poll()
    assert seqs(got) == [0, 1, 2]
    assert got[1].startswith("seq=000001 bad \ufffd") and got[1].endswith(" end")


def test_crlf_is_stripped(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    p.write_bytes(b"seq=000000 a\r\nseq=000001 b\rc\r\n\r\nseq=000002 d\n")
    assert LogTailer(p).poll() == ["seq=000000 a", "seq=000001 b\rc", "", "seq=000002 d"]


def test_large_file_is_read_in_steps(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 5000)
    t = LogTailer(p)
    first = t.poll(max_bytes=1000)
    assert 0 < len(first) < 5000 and t.stats.bytes <= 1000
    assert t.has_pending()
    got = first + drain(t, 1000)
    assert seqs(got) == list(range(5000))
    assert not t.has_pending()


# --- follow() -------------------------------------------------------------------------------------


async def wait_until(cond: Callable[[], bool], what: str, timeout: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


def live_watches() -> list[str]:
    """The filesystem watches this process holds: watchdog observer threads and inotify instances (Linux)."""
    watches = [th.name for th in threading.enumerate() if isinstance(th, BaseObserver) and th.is_alive()]
    fds = Path("/proc/self/fd")
    for fd in fds.iterdir() if fds.is_dir() else ():
        with contextlib.suppress(OSError):
            if str(fd.readlink()) == "anon_inode:inotify":
                watches.append(f"inotify fd {fd.name}")
    return watches


class Seen:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.batches = 0

    def __call__(self, batch: list[str]) -> None:
        assert batch, "on_lines called with an empty batch"
        self.lines += batch
        self.batches += 1

    def has(self, i: int) -> bool:
        return bool(self.lines) and seqs(self.lines[-1:])[0] >= i


def use_watch(monkeypatch: pytest.MonkeyPatch, watch: str) -> None:
    """Have follow() use watchdog, or our own inotify watch (skipped where there is none)."""
    if watch == "watchdog":
        monkeypatch.setattr(watch_mod, "libc_with_inotify", lambda: None)
    elif watch_mod.libc_with_inotify() is None:
        pytest.skip("no inotify here")


def refuse_watches(monkeypatch: pytest.MonkeyPatch, refused: Callable[[int], bool]) -> None:
    """inotify_add_watch fails as it does at fs.inotify.max_user_watches (ENOSPC) for the masks `refused` picks."""
    found = watch_mod.libc_with_inotify()
    if found is None:
        pytest.skip("no inotify here")
    libc: ctypes.CDLL = found

    class Refusing:
        inotify_init1 = libc.inotify_init1
        inotify_rm_watch = libc.inotify_rm_watch

        @staticmethod
        def inotify_add_watch(fd: int, path: bytes, mask: int) -> int:
            if refused(mask):
                ctypes.set_errno(errno.ENOSPC)
                return -1
            return int(libc.inotify_add_watch(fd, path, mask))

    monkeypatch.setattr(watch_mod, "libc_with_inotify", Refusing)


@pytest.mark.parametrize("watch", ["inotify", "watchdog"])
async def test_follow_watchdog_rotation_and_truncation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: str
) -> None:
    use_watch(monkeypatch, watch)
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    # A 60 s timer: anything picked up within the test's timeouts came from a watchdog event.
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop))
    await wait_until(lambda: t.last_error is not None, "the first (missing-file) poll")

    async def write(f: Any, start: int, stop_: int) -> None:
        for i in range(start, stop_, 50):
            f.write(lines_bytes(i, min(i + 50, stop_)))
            f.flush()
            await asyncio.sleep(0)

    with p.open("ab") as f:
        await write(f, 0, 700)
        await wait_until(lambda: seen.has(699), "seq 699")
        p.rename(tmp_path / "server.log.1")
    with p.open("ab") as f:
        await write(f, 700, 1400)
        await wait_until(lambda: seen.has(1399), "seq 1399")
    with p.open("wb") as f:  # llama-server restart
        await write(f, 1400, 2000)
        await wait_until(lambda: seen.has(1999), "seq 1999")

    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(2000))
    assert (t.stats.rotations, t.stats.truncations, t.stats.lost_bytes) == (1, 1, 0)
    assert not live_watches()


async def test_follow_reads_a_backlog_in_chunks_on_one_wake(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    t = LogTailer(p, chunk_bytes=1024)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop))
    await wait_until(lambda: t.last_error is not None, "the first poll")
    observed: list[int] = []

    async def ticker() -> None:
        while True:
            observed.append(seen.batches)
            await asyncio.sleep(0)

    ticking = asyncio.create_task(ticker())
    p.write_bytes(lines_bytes(0, 3000))  # one write, a handful of events, ~270 KB
    await wait_until(lambda: seen.has(2999), "seq 2999")
    ticking.cancel()
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(3000))
    assert seen.batches > 100  # delivered chunk by chunk...
    assert any(0 < n < seen.batches for n in observed)  # ...yielding to other tasks in between


async def test_follow_is_idle_when_nothing_happens(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 3)
    t = LogTailer(p)
    polls = 0
    real_poll = t.poll

    def counting_poll(max_bytes: int | None = None) -> list[str]:
        nonlocal polls
        polls += 1
        return real_poll(max_bytes)

    t.poll = counting_poll  # type: ignore[method-assign]
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop))
    await wait_until(lambda: seen.has(2), "seq 2")
    for i in (3, 4):
        # Absence of activity needs a window: our own open/read of the file must not wake us up,
        # and a handled event must not leave us spinning.
        await asyncio.sleep(0.05)
        settled = polls
        await asyncio.sleep(0.05)
        assert polls == settled <= 6 * (i - 2)
        append(p, i, i + 1)
        await wait_until(lambda: seen.has(i), f"seq {i}")  # noqa: B023 (awaited right here)
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)


async def test_follow_poll_only_uses_stat_fallback(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=0.01, use_watchdog=False, stop=stop))
    await wait_until(lambda: t.last_error is not None, "the first poll")
    assert not live_watches()
    append(p, 0, 100)
    await wait_until(lambda: seen.has(99), "seq 99")
    p.rename(tmp_path / "server.log.1")
    append(p, 100, 200)
    await wait_until(lambda: seen.has(199), "seq 199")
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(200))
    assert t.stats.rotations == 1


async def test_follow_returns_promptly_on_stop(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 3)
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop))
    await wait_until(lambda: seen.has(2), "seq 2")
    assert live_watches()
    loop = asyncio.get_running_loop()
    started = loop.time()
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert loop.time() - started < 0.5
    assert not live_watches()


async def test_follow_cancellation_stops_observer(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    t = LogTailer(p)
    task = asyncio.create_task(follow(t, Seen(), poll_interval=60))
    await wait_until(lambda: t.last_error is not None, "the first poll")
    assert live_watches()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not live_watches()


async def test_follow_parent_directory_created_later(tmp_path: Path) -> None:
    d = tmp_path / "logs"
    p = d / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=0.01, stop=stop))
    await wait_until(lambda: t.last_error is not None, "the first poll")
    assert not live_watches()  # nothing to watch yet
    d.mkdir()
    append(p, 0, 10)
    await wait_until(lambda: seen.has(9), "seq 9")
    await wait_until(lambda: bool(live_watches()), "the watch to be scheduled")
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(10))


async def test_follow_falls_back_to_polling_when_watchdog_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenObserver:
        def start(self) -> None:
            raise OSError(errno.EMFILE, "inotify instance limit reached")

    monkeypatch.setattr(watch_mod, "libc_with_inotify", lambda: None)  # no inotify: watchdog's turn
    monkeypatch.setattr(watch_mod, "Observer", BrokenObserver)
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="exporter.logs.follow"):
        task = asyncio.create_task(follow(t, seen, poll_interval=0.01, stop=stop))
        append(p, 0, 10)
        await wait_until(lambda: seen.has(9), "seq 9")
        append(p, 10, 20)
        await wait_until(lambda: seen.has(19), "seq 19")
        stop.set()
        await asyncio.wait_for(task, timeout=1.0)
    warnings = [r for r in caplog.records if r.name == "exporter.logs.follow"]
    assert len(warnings) == 1 and "falling back to polling" in warnings[0].getMessage()
    assert seqs(seen.lines) == list(range(20))


async def test_follow_falls_back_to_polling_when_inotify_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    refuse_watches(monkeypatch, lambda mask: True)
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="exporter.logs.follow"):
        task = asyncio.create_task(follow(t, seen, poll_interval=0.01, stop=stop))
        append(p, 0, 10)
        await wait_until(lambda: seen.has(9), "seq 9")
        assert not live_watches()
        append(p, 10, 20)
        await wait_until(lambda: seen.has(19), "seq 19")
        stop.set()
        await asyncio.wait_for(task, timeout=1.0)
    warnings = [r for r in caplog.records if r.name == "exporter.logs.follow"]
    assert len(warnings) == 1 and "falling back to polling" in warnings[0].getMessage()
    assert seqs(seen.lines) == list(range(20))


async def test_follow_without_the_close_watch_still_watches_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No watch left for the second instance: one warning, and changes still wake the follower."""
    refuse_watches(monkeypatch, lambda mask: mask & watch_mod.IN_CHANGES == watch_mod.IN_CLOSE_WRITE)  # "closes"
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, logger="exporter.logs.follow"):
        task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop))
        await wait_until(lambda: t.last_error is not None, "the first (missing-file) poll")
        append(p, 0, 10)
        await wait_until(lambda: seen.has(9), "seq 9")  # a 60 s timer: the changes watch woke it
        assert len(live_watches()) == 1
        stop.set()
        await asyncio.wait_for(task, timeout=1.0)
    warnings = [r.getMessage() for r in caplog.records if r.name == "exporter.logs.follow"]
    assert len(warnings) == 1 and "closing its log" in warnings[0]
    assert not live_watches()


async def test_follow_batches_a_busy_writer(tmp_path: Path) -> None:
    """A write every millisecond is read in batches (at most one drain per batch interval), and all of it."""
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, batch_interval=0.05))
    await wait_until(lambda: seen.has(0), "seq 0")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with p.open("ab") as f:
        for i in range(1, 301):
            f.write(lines_bytes(i, i + 1))
            f.flush()
            await asyncio.sleep(0.001)
    await wait_until(lambda: seen.has(300), "seq 300")
    elapsed = loop.time() - started
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(301))
    assert seen.batches - 1 <= elapsed / 0.05 + 4  # not one batch per write (the first wait is 25 ms)


@pytest.mark.parametrize("watch", ["inotify", "watchdog"])
async def test_follow_reads_at_once_when_the_writer_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watch: str
) -> None:
    """A server's last lines are read when it closes the log, not after the batch wait: a restarted
    server truncates the file as it starts, so whatever is still unread at that moment is lost."""
    use_watch(monkeypatch, watch)
    p = tmp_path / "server.log"
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    # Batch waits of up to 30 s: once the follower is busy, only the close can have it read in time.
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, batch_interval=30))
    await wait_until(lambda: t.last_error is not None, "the first (missing-file) poll")
    with p.open("wb") as f:
        for i in range(100):  # a write every few ms: two drains close together make the follower busy
            f.write(lines_bytes(i, i + 1))
            f.flush()
            await asyncio.sleep(0.003)
    # Closed: the server exited. Read well within the 30 s batch wait, before a successor truncates the log.
    await wait_until(lambda: seen.has(99), "the last line before the close", timeout=5.0)
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(100))
    # Busy: the writes were not read one by one (the waits grew 25, 50, 100, 200, 400 ms meanwhile).
    assert seen.batches <= 8


def record_waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The timeout of every wait follow() makes from now on (batch waits and idle waits), in order."""
    waits: list[float] = []
    real_wait = watch_mod.Waker.wait

    async def recording_wait(self: Any, timeout: float) -> None:
        waits.append(timeout)
        await real_wait(self, timeout)

    monkeypatch.setattr(watch_mod.Waker, "wait", recording_wait)
    return waits


async def test_follow_cadence_adapts_to_the_writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While lines keep coming the batch wait doubles from 25 ms up to the batch interval, never
    beyond it; a line after a quiet spell is read at once, alone, with no batch wait before it."""
    waits = record_waits(monkeypatch)
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, batch_interval=0.2))
    await wait_until(lambda: seen.has(0), "seq 0")
    with p.open("ab") as f:  # a stream: a line every 5 ms for about 2 s
        for i in range(1, 401):
            f.write(lines_bytes(i, i + 1))
            f.flush()
            await asyncio.sleep(0.005)
    await wait_until(lambda: seen.has(400), "seq 400")
    await asyncio.sleep(0.5)  # quiet: the follower goes back to waiting for an event
    batches, waits_before = seen.batches, len(waits)
    append(p, 401, 402)
    await wait_until(lambda: seen.has(401), "the line after the quiet spell", timeout=10.0)
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(402))

    batch_waits = [w for w in waits[:waits_before] if w < 60]
    assert batch_waits[:4] == [0.025, 0.05, 0.1, 0.2]  # doubling...
    assert max(batch_waits) == 0.2 and batch_waits.count(0.2) >= 5  # ...up to the interval, never beyond
    for prev, w in itertools.pairwise(batch_waits):
        assert w in (min(2 * prev, 0.2), 0.025), batch_waits  # or starting over after a quiet read
    assert batches < 60  # 400 writes, read a few times a second
    # The quiet line: its own batch, read on its event (the idle wait is 60 s), no batch wait first.
    assert seen.batches == batches + 1
    assert all(w == 60 for w in waits[waits_before:])


async def _in_a_batch_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Seen, CatchUp, Any, Any]:
    """A follower busy with a writer, now in a 5 s batch wait (the first one, made long): the log,
    what it read, its CatchUp, its stop event and its task."""
    waits = record_waits(monkeypatch)
    monkeypatch.setattr(follow_mod, "BATCH_START", 5.0)
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t, seen, catch_up, stop = LogTailer(p), Seen(), CatchUp(), asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, batch_interval=30, catch_up=catch_up))
    await wait_until(lambda: seen.has(0), "seq 0")
    append(p, 1, 2)  # soon after the last read: busy, so the read of it is followed by a batch wait
    await wait_until(lambda: seen.has(1) and 5.0 in waits, "the batch wait")
    return p, seen, catch_up, stop, task


async def test_a_scrape_reads_the_log_without_waiting_for_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrape (CatchUp) during a batch wait has the lines written before it read at once, and
    waits for that read (several chunks: it goes on when the read reaches where the log ended);
    the follower then goes on batching."""
    p, seen, catch_up, stop, task = await _in_a_batch_wait(tmp_path, monkeypatch)
    n = 2
    while p.stat().st_size < 200_000:  # several of the tailer's reads, below CATCH_UP_MAX_BYTES
        append(p, n, n + 500)
        n += 500
    loop = asyncio.get_running_loop()
    started = loop.time()
    await catch_up()
    assert seen.has(n - 1), "the lines written before the scrape are read when it returns"
    assert loop.time() - started < 1.0  # not at the end of the 5 s wait
    batches = seen.batches
    append(p, n, n + 10)
    await asyncio.sleep(0.3)
    assert seen.batches == batches  # still batching: the next read is at the end of the wait
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(n))


async def test_a_scrape_does_not_wait_for_a_flood(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With more unread than CATCH_UP_MAX_BYTES, a scrape only ends the batch wait: it answers with
    what was read so far while the follower reads the backlog."""
    p, seen, catch_up, stop, task = await _in_a_batch_wait(tmp_path, monkeypatch)
    n = 2
    while p.stat().st_size < 2 * follow_mod.CATCH_UP_MAX_BYTES:
        append(p, n, n + 1000)
        n += 1000
    await catch_up()
    assert not seen.has(2)  # returned before the follower read anything
    await wait_until(lambda: seen.has(n - 1), "the backlog, read well before the 5 s wait ends", timeout=2.0)
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(n))


async def test_a_scrape_before_or_after_the_follower_returns_at_once(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    append(p, 0, 1)
    catch_up = CatchUp()
    await asyncio.wait_for(catch_up(), timeout=1.0)  # no follower yet
    t, seen, stop = LogTailer(p), Seen(), asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, catch_up=catch_up))
    await wait_until(lambda: seen.has(0), "seq 0")
    batches = seen.batches
    loop = asyncio.get_running_loop()
    started = loop.time()
    await catch_up()  # idle, nothing unread: nothing to do
    assert seen.batches == batches and loop.time() - started < 0.5
    append(p, 1, 2)
    await catch_up()  # written just before the scrape, its filesystem event not handled yet: read now
    assert seen.has(1)
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    await asyncio.wait_for(catch_up(), timeout=1.0)  # stopped


async def test_a_scrape_reads_a_polled_log_at_once(tmp_path: Path) -> None:
    """Without filesystem events (--fs-events false) the follower idles until its next stat(): a
    scrape reads what was written meanwhile."""
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t, seen, stop, catch_up = LogTailer(p), Seen(), asyncio.Event(), CatchUp()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, use_watchdog=False, stop=stop, catch_up=catch_up))
    await wait_until(lambda: seen.has(0), "seq 0")
    append(p, 1, 10)
    await asyncio.sleep(0.1)
    assert not seen.has(1)  # polled every 60 s
    await asyncio.wait_for(catch_up(), timeout=1.0)
    assert seen.has(9)
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)


async def test_follow_batches_a_writer_that_closes_after_every_write(tmp_path: Path) -> None:
    """`echo line >> log` closes the file after each line: those closes do not end the batch wait."""
    p = tmp_path / "server.log"
    append(p, 0, 1)
    t = LogTailer(p)
    seen = Seen()
    stop = asyncio.Event()
    task = asyncio.create_task(follow(t, seen, poll_interval=60, stop=stop, batch_interval=0.05))
    await wait_until(lambda: seen.has(0), "seq 0")
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(1, 301):
        append(p, i, i + 1)
        await asyncio.sleep(0.001)
    await wait_until(lambda: seen.has(300), "seq 300")
    elapsed = loop.time() - started
    stop.set()
    await asyncio.wait_for(task, timeout=1.0)
    assert seqs(seen.lines) == list(range(301))
    assert seen.batches - 1 <= elapsed / 0.05 + 3  # not one batch per write
