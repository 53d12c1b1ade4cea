"""LogTailer.poll() through rotation step by step: rename and create, truncation, delete and recreate,
copytruncate (with and without O_APPEND), a file moved away and back, and a seeded random mix in which no
line is lost or repeated. Sequence-numbered lines, no sleeps; a writer racing the follower is
tests/unit/test_tail_rotation.py.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from seq_log import append, drain, line, lines_bytes, seqs

from exporter.logs.tail import LogTailer

BUDGETS = [None, 7, 4096]


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
