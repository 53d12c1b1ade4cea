"""Reading one input for `diagnose`: opening it (gzip, standard input), its lines and blocks, what is no log.

The I/O of `diagnose` is here, in `inputs` (which inputs, fed how) and in `parallel` (parts of one big file
read by worker processes); the analysis (`core`, `run`, `advice`, `report`, `render`) is pure."""

from __future__ import annotations

import contextlib
import gzip
import io
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from exporter.diagnose.core import Diagnoser
from exporter.logs import recognize
from exporter.logs.encoding import Encoding, PowerShellRecord, Transcoder, sniff

#: Lines longer than this are cut (the rest is read and dropped), as the tailer does.
MAX_LINE_BYTES = 1024 * 1024
#: If the first bytes of a file hold no llama-server line and look binary, stop reading there.
SNIFF_BYTES = 1024 * 1024
BLOCK_BYTES = 256 * 1024  # what diagnose reads and scans at once after the first MiB


# ------------------------------------------------------------------------------------------------- I/O


class InputError(Exception):
    """The input cannot be diagnosed (missing, unreadable, empty, binary, not a llama-server log)."""


@dataclass
class ReadStats:
    bytes: int = 0
    lines: int = 0
    long_lines: int = 0
    nul_bytes: int = 0  # in the first SNIFF_BYTES
    replaced: int = 0  # undecodable bytes in the first SNIFF_BYTES


_NOT_LOGS = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket"))


def open_input(path: str) -> IO[bytes]:
    if path == "-":
        if sys.stdin is None:  # started with standard input closed (`<&-`)
            raise InputError("-: standard input is closed")
        return sys.stdin.buffer
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{path}: is a directory, not a log file")
    with contextlib.suppress(OSError):  # a file that cannot be stat'ed fails to open below, with the reason
        mode = p.stat().st_mode
        # /dev/zero and /dev/urandom never end; a pipe is a stream like standard input and is read.
        kind = next((k for test, k in _NOT_LOGS if test(mode)), None)
        if kind is not None:
            raise InputError(f"{path}: is a {kind}, not a log file (give a file, or - for standard input)")
    try:
        f: IO[bytes] = p.open("rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open: {exc.strerror or exc}") from None
    if isinstance(f, io.BufferedReader) and f.peek(2)[:2] == b"\x1f\x8b":
        f = cast(IO[bytes], gzip.GzipFile(fileobj=f, mode="rb"))  # rotated logs are often gzipped
    return as_utf8(f)


def as_utf8(f: IO[bytes]) -> IO[bytes]:
    """`f` read as UTF-8: a byte order mark skipped, UTF-16 (PowerShell 5.1's `2>`) turned into UTF-8."""
    peek = getattr(f, "peek", None)
    if peek is None:
        return f
    head = b""
    encoding = None
    try:
        for _ in range(4):  # peek may give fewer bytes than asked (a pipe): at most 4 are needed
            head = bytes(peek(4)[:4])
            encoding = sniff(head)
            if encoding is not None or len(head) >= 4:
                break
    except (OSError, EOFError, zlib.error):
        return f  # a corrupt gzip: reading it says so, where the reader reports read errors
    if encoding is None:
        return f  # a file of fewer than four bytes
    if encoding.is_utf8:
        if encoding.bom:
            f.read(encoding.bom)
        return f
    f.read(encoding.bom)
    return io.BufferedReader(_Transcoded(f, encoding), BLOCK_BYTES)


class _Transcoded(io.RawIOBase):
    """A binary stream in UTF-16, read as UTF-8."""

    def __init__(self, raw: IO[bytes], encoding: Encoding) -> None:
        super().__init__()
        self._raw, self._transcode, self._buf = raw, Transcoder(encoding), b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            chunk = self._raw.read(BLOCK_BYTES)
            if not chunk:
                return 0
            self._buf = self._transcode(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        if self._raw is not sys.stdin.buffer:
            self._raw.close()
        super().close()


def is_plain_file(f: IO[bytes]) -> bool:
    """A file read as it is from its start (not standard input, gzip, UTF-16, or after a byte order mark):
    one that can be split by offsets (see parallel)."""
    return type(f) is io.BufferedReader and isinstance(f.raw, io.FileIO) and f is not sys.stdin.buffer and f.tell() == 0


def read_lines(f: IO[bytes], stats: ReadStats, max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """Lines of a binary stream as text, each at most `max_line` bytes (the rest of a longer one is dropped).

    Bytes that are not UTF-8 become U+FFFD. Memory is bounded by `max_line`, whatever the file size.
    """
    readline = f.readline
    raw = _first_text(f, stats, max_line)
    while raw:
        n = len(raw)
        if n == max_line and not raw.endswith(b"\n"):
            stats.long_lines += 1
            while True:  # drop the rest of the over-long line
                more = readline(max_line)
                n += len(more)
                if not more or more.endswith(b"\n"):
                    break
        if stats.bytes < SNIFF_BYTES:
            stats.nul_bytes += raw.count(b"\x00")
        stats.bytes += n
        stats.lines += 1
        text = raw.decode("utf-8", "replace")
        if stats.bytes <= SNIFF_BYTES + n and "\ufffd" in text:
            stats.replaced += text.count("\ufffd")
        yield text
        raw = readline(max_line)


def read_blocks(f: IO[bytes], stats: ReadStats, max_line: int = MAX_LINE_BYTES) -> Iterator[str]:
    """The rest of a binary stream as blocks of whole lines of text: `read_lines` without the split.

    Each block ends in "\\n", but a line cut at `max_line` bytes (the rest of it is dropped) and the
    stream's last line, which each come as a block of their own. Counts bytes and cut lines in `stats`
    as `read_lines` does, not lines: the reader of a block counts them as it scans it (`Diagnoser.feed_text`
    returns how many), the one pass over its newlines. Memory is bounded by a block (at most `max_line`, at
    most 256 KiB).
    """
    size = max(1, min(max_line, BLOCK_BYTES))
    pending = b""  # the start of a line that goes on in the next block (shorter than max_line)
    dropping = False  # in the rest of a cut line, up to its newline
    while chunk := f.read(size):
        stats.bytes += len(chunk)
        start = 0
        if dropping:
            nl = chunk.find(b"\n")
            if nl < 0:
                continue
            dropping, start = False, nl + 1
        elif pending:
            nl = chunk.find(b"\n")
            head = pending + chunk[: nl + 1 if nl >= 0 else len(chunk)]
            if len(head) >= max_line and not head[:max_line].endswith(b"\n"):
                stats.long_lines += 1
                yield head[:max_line].decode("utf-8", "replace")
                pending, dropping = b"", nl < 0
                if nl < 0:
                    continue
                start = nl + 1
            elif nl < 0:
                pending = head
                continue
            else:
                pending, start = b"", nl + 1
                yield head.decode("utf-8", "replace")
        end = chunk.rfind(b"\n", start) + 1
        if end > start:
            text = chunk[start:end].decode("utf-8", "replace")
            yield text
        else:
            end = start
        pending = chunk[end:]
        if len(pending) >= max_line:  # a whole block with no newline: a line to cut
            stats.long_lines += 1
            yield pending[:max_line].decode("utf-8", "replace")
            pending, dropping = b"", True
    if pending:
        yield pending.decode("utf-8", "replace")


def _first_text(f: IO[bytes], stats: ReadStats, max_line: int) -> bytes:
    """What `readline(max_line)` would give after the NUL bytes at the start of the stream (counted in
    `stats.bytes`): the hole a copytruncate leaves (see logs/tail.py) is skipped, not called binary."""
    while raw := f.readline(max_line):
        text = raw.lstrip(b"\0")
        stats.bytes += len(raw) - len(text)
        if text:
            if len(raw) == max_line and not text.endswith(b"\n"):
                text += f.readline(max_line - len(text))
            return text
    return b""


def looks_binary(stats: ReadStats) -> bool:
    """The follower's rule (`exporter.logs.recognize`) over what was sampled of the first MiB."""
    return recognize.looks_binary(stats.nul_bytes, stats.replaced, min(stats.bytes, SNIFF_BYTES))


def feed_log(d: Diagnoser, f: IO[bytes], stats: ReadStats, before: int) -> None:
    """llama-server's own log: line by line while the first MiB decides whether this is a log at all,
    then in blocks (line by line again where a block holds PowerShell 5.1's error record of a run)."""
    record: PowerShellRecord | None = PowerShellRecord()  # the error records of PowerShell 5.1's `2>`/`2>>`
    held = 0  # the number of the line the record holds
    for line in read_lines(f, stats):
        if record is None:
            d.feed_line(line, stats.lines)
        else:
            held = _unwrapped(d, record, line, stats.lines, held)
            if record.done:
                record = None
        if stats.bytes >= SNIFF_BYTES:
            break
    if stats.bytes >= SNIFF_BYTES and (d.specific_events > before or not looks_binary(stats)):
        for text in read_blocks(f, stats):
            first = stats.lines + 1
            prefix = record.prefix if record is not None else None
            if record is None or (prefix is not None and record.watching and prefix not in text):
                stats.lines += d.feed_text(text, first)
                continue
            pieces = text.split("\n")
            for i, piece in enumerate(pieces[:-1]):
                held = _unwrapped(d, record, piece + "\n", first + i, held)
            if pieces[-1]:
                held = _unwrapped(d, record, pieces[-1], first + len(pieces) - 1, held)
            stats.lines += len(pieces) - 1 + (pieces[-1] != "")
    for text in record.flush() if record is not None else ():
        d.feed_line(text, held)


def _unwrapped(d: Diagnoser, record: PowerShellRecord, line: str, lineno: int, held: int) -> int:
    """One line through the record (a line that may open one is held until the next): the held line's number."""
    was_holding = record.holding
    for i, text in enumerate(record.feed([line])):
        d.feed_line(text, held if i == 0 and was_holding else lineno)
    return lineno if record.holding else held
