"""LogTailer.poll() on one file: reading from the start, a file not there yet, a directory or an unreadable
file in its place (reported, not raised), and how lines are split: written in pieces, over-long, invalid
UTF-8, CRLF, a large file read in steps. Sequence-numbered lines, no sleeps.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from seq_log import append, drain, line, seqs

from exporter.logs.encoding import newlines
from exporter.logs.tail import LogTailer


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
    assert not t.is_open and t.last_error is not None and "is a directory, not a log" in t.last_error
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


@pytest.mark.parametrize("chunk", [7, 64, 1 << 15])
@pytest.mark.parametrize("piece", [13, 1000])
def test_read_batch_text_is_its_lines_joined(tmp_path: Path, chunk: int, piece: int) -> None:
    """`read()` hands a batch over as the text the parser scans: "\\n" before each line, the same lines
    `poll()` gives (written in pieces, empty lines, invalid UTF-8, CRLF, a cut line, a line left unfinished)."""
    data = (
        b"seq=000000 \xc3\xa9\n\nseq=000001 bad \xff\n"
        + b"seq=000002 "
        + b"x" * 300
        + b"\nseq=000003 a\r\nseq=000004 b\n\n\nseq=000005 end"
    )
    p, q = tmp_path / "a.log", tmp_path / "b.log"
    p.write_bytes(b"")
    q.write_bytes(b"")
    batches, polls = LogTailer(p, max_line_bytes=200, chunk_bytes=chunk), LogTailer(q, max_line_bytes=200)
    read: list[str] = []
    for i in range(0, len(data), piece):
        for path in (p, q):
            with path.open("ab") as f:
                f.write(data[i : i + piece])
        while True:
            batch = batches.read()
            assert batch.text == "".join("\n" + x for x in batch) and len(batch) == len(batch.lines())
            read += batch
            if not batches.has_pending():
                break
    assert read == polls.poll() and read[5:] == ["seq=000004 b", "", ""] and len(read) == 8
    assert batches.stats.lines == 8 and batches.stats.long_lines == 1


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"no newline",
        b"\n",
        b"\n" * 5000,  # blank lines: counted byte by byte
        b"ab\n" * 3000,
        b"x" * 2000 + b"\n" * 5000,  # a long first KiB, then blank lines: counted by memchr
        b"0.17.891.371 W decode: failed to find a memory slot for batch of size 4\n" * 2000 + b"\n\n",
        bytes(range(256)) * 40,  # every byte value, "\n" among them
    ],
    ids=["empty", "no-newline", "one", "blank", "short", "long-then-blank", "log", "every-byte"],
)
def test_newlines_counts_what_bytes_count_counts(data: bytes) -> None:
    assert newlines(data) == data.count(b"\n")


def test_a_block_of_blank_lines_after_long_ones_is_read_as_every_line(tmp_path: Path) -> None:
    p = tmp_path / "server.log"
    p.write_bytes(b"first\n" + b"x" * 3000 + b"\n" * 4000 + b"last\n")  # the read's block starts with 3000 x
    t = LogTailer(p)
    got = t.read()
    assert len(got) == 4002 == len(got.lines()) and got.lines()[-1] == "last"
    assert t.stats.lines == 4002
