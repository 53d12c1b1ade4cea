"""Reading logs for `diagnose`: files, gzip, standard input, patterns; the only I/O."""

from __future__ import annotations

import contextlib
import glob
import gzip
import hashlib
import io
import math
import os
import stat
import sys
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from exporter.diagnose.core import Diagnoser
from exporter.diagnose.journal import export_lines, journal_format, json_lines, short_iso_lines
from exporter.diagnose.report import Report

#: Lines longer than this are cut (the rest is read and dropped), as the tailer does.
MAX_LINE_BYTES = 1024 * 1024
#: If the first bytes of a file hold no llama-server line and look binary, stop reading there.
SNIFF_BYTES = 1024 * 1024
_BLOCK_BYTES = 256 * 1024  # what diagnose reads and scans at once after the first MiB


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


def _open(path: str) -> IO[bytes]:
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
        return cast(IO[bytes], gzip.GzipFile(fileobj=f, mode="rb"))  # rotated logs are often gzipped
    return f


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
    stream's last line, which each come as a block of their own. Counts lines and bytes in `stats`
    as `read_lines` does. Memory is bounded by a block (at most `max_line`, at most 256 KiB).
    """
    size = max(1, min(max_line, _BLOCK_BYTES))
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
                stats.lines += 1
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
                stats.lines += 1
                yield head.decode("utf-8", "replace")
        end = chunk.rfind(b"\n", start) + 1
        if end > start:
            text = chunk[start:end].decode("utf-8", "replace")
            stats.lines += text.count("\n")
            yield text
        else:
            end = start
        pending = chunk[end:]
        if len(pending) >= max_line:  # a whole block with no newline: a line to cut
            stats.lines += 1
            stats.long_lines += 1
            yield pending[:max_line].decode("utf-8", "replace")
            pending, dropping = b"", True
    if pending:
        stats.lines += 1
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


def _looks_binary(stats: ReadStats) -> bool:
    sniffed = min(stats.bytes, SNIFF_BYTES) or 1
    return stats.nul_bytes > 0 or stats.replaced / sniffed > 0.05


def diagnose_file(path: str, *, max_runs: int = 10, max_failures: int = 10) -> Report:
    """Stream `path` (or `-` for standard input) through a `Diagnoser`; raise `InputError` for bad input."""
    return diagnose_files([path], max_runs=max_runs, max_failures=max_failures)


def input_files(args: Sequence[str]) -> tuple[list[str], str | None]:
    """The files to read for `diagnose LOG...`, and how they were ordered (None for one input).

    An argument that names no file is taken as a glob pattern (`'llama-server.log*'`). Several files
    are read oldest first by modification time: llama-server's own time stamps count from its start,
    so a file's time is what orders its runs. `-` (standard input) must be the only input.
    """
    paths: list[str] = []
    for arg in args:
        if arg == "-" or os.path.lexists(arg) or not glob.has_magic(arg):
            paths.append(arg)
            continue
        matches = sorted(glob.glob(arg))  # noqa: PTH207 (Path.glob takes no absolute pattern)
        if not matches:
            raise InputError(f"{arg}: no such file (and no file matches it as a pattern)")
        paths.extend(matches)
    unique = list(dict.fromkeys(paths))
    if "-" in unique and len(unique) > 1:
        raise InputError("-: standard input cannot be read together with files (give one or the other)")
    if len(unique) == 1:
        return unique, None

    starts = {path: _first_time(path) for path in unique}
    if all(t is not None for t in starts.values()):
        return sorted(unique, key=lambda p: starts[p] or 0.0), "by the journal's time stamps, oldest first"

    def mtime(path: str) -> float:
        try:
            return Path(path).stat().st_mtime
        except OSError:
            return math.inf  # opening it fails with the reason, in its place at the end

    return sorted(unique, key=mtime), "by modification time, oldest first"


def _first_time(path: str) -> float | None:
    """The wall-clock time of the first dated line of a journal output file, or None (any other log:
    llama-server's own stamps count from its start)."""
    try:
        f = _open(path)
    except InputError:
        return None
    try:
        head = _peek(f, _BLOCK_BYTES)
        kind = journal_format(head)
        if kind is None:
            return None
        if kind == "export":
            dated: Iterator[tuple[float | None, str]] = ((t, x) for t, x, _ in export_lines(io.BytesIO(head)))
        else:
            text = head.decode("utf-8", "replace").splitlines(keepends=True)
            dated = json_lines(text) if kind == "json" else short_iso_lines(text)
        return next((t for t, _ in dated if t is not None), None)
    except (OSError, EOFError, zlib.error):
        return None
    finally:
        f.close()


def _peek(f: IO[bytes], n: int) -> bytes:
    """Up to `n` bytes from the start of `f` without consuming them (a buffered file, gzip, or stdin)."""
    peek = getattr(f, "peek", None)
    return bytes(peek(n)[:n]) if peek is not None else b""


def diagnose_files(paths: Sequence[str], *, max_runs: int = 10, max_failures: int = 10, series: bool = False) -> Report:
    """`diagnose_file` over several files in the order given, one report; runs restart at each file.

    A file whose content equals an earlier one's (a `.prev-*` copy of a rotated file) is read once.
    `series`: keep each shown run's pool series (`Report.series`, for --html).
    With one file, bad input raises `InputError`; with several, a file that is not a log is skipped
    and said in the report, unless none is one.
    """
    d = Diagnoser(paths[0], max_runs=max_runs, max_failures=max_failures, series=series)
    seen = _Copies()
    long_lines = 0
    first_error: InputError | None = None
    read_any = False
    for path in paths:
        try:
            original = seen.copy_of(path) if len(paths) > 1 else None
            if original is not None:
                d.skipped.append(f"{path}: the same content as {original}, read once")
                continue
            if read_any:
                d.next_file(path)
            else:
                d.files[-1] = path
            stats = ReadStats()
            _feed_file(d, path, stats)
        except InputError as exc:
            if len(paths) == 1:
                raise
            first_error = first_error or exc
            d.skipped.append(str(exc))
            if read_any and d.files[-1] == path:
                d.files.pop()
            d.lines = 0  # none of its lines count
            continue
        read_any = True
        long_lines += stats.long_lines
    if not read_any:
        raise first_error or InputError("no input")
    d.long_lines = long_lines
    modified: dict[str, float] = {}
    for file in d.files:
        if file != "-":
            with contextlib.suppress(OSError):
                modified[file] = Path(file).stat().st_mtime
    return d.finish(modified)


class _Copies:
    """Which input is a copy of one seen before. Only the first block of each file is hashed, and a
    whole file only when its first block equals an earlier one's: distinct logs are not read twice."""

    def __init__(self) -> None:
        self._by_head: dict[str, list[str]] = {}  # digest of the first block -> the files that start so
        self._whole: dict[str, str] = {}  # path -> digest of all of it, once computed

    def copy_of(self, path: str) -> str | None:
        """The earlier file whose content equals `path`'s, or None (then `path` is remembered)."""
        same_start = self._by_head.setdefault(_content_digest(path, _BLOCK_BYTES), [])
        for other in same_start:
            if self._digest(other) == self._digest(path):
                return other
        same_start.append(path)
        return None

    def _digest(self, path: str) -> str:
        if path not in self._whole:
            self._whole[path] = _content_digest(path)
        return self._whole[path]


def _content_digest(path: str, limit: int | None = None) -> str:
    """SHA-256 of a file's content (decompressed), or of its first `limit` bytes; raises `InputError`
    when it cannot be read."""
    digest = hashlib.sha256()
    left = math.inf if limit is None else limit
    f = _open(path)
    try:
        while left > 0 and (chunk := f.read(int(min(_BLOCK_BYTES, left)))):
            digest.update(chunk)
            left -= len(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{path}: read error: {exc}") from None
    finally:
        f.close()
    return digest.hexdigest()


def _feed_file(d: Diagnoser, path: str, stats: ReadStats) -> None:
    """Read one input into `d`; raise `InputError` when it is not a llama-server log."""
    before = d.specific_events
    f = _open(path)
    try:
        kind = journal_format(_peek(f, 64 * 1024))
        if kind is not None:
            _feed_journal(d, f, kind, stats)
        elif not (isinstance(f, io.BufferedReader) and f is not sys.stdin.buffer and _in_parts(d, path, stats)):
            feed_log(d, f, stats, before)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(f"{path}: read error after {stats.lines:,} lines: {exc}") from None
    finally:
        if f is not sys.stdin.buffer:
            f.close()
    _check_read(d, path, stats, before)


def _in_parts(d: Diagnoser, path: str, stats: ReadStats) -> bool:
    """A big plain file, on several cores where it can be split (see exporter/diagnose/parallel.py)."""
    from exporter.diagnose import parallel  # it builds on this module's readers

    return parallel.feed_in_parts(
        d, path, stats, max_runs=d.max_runs, max_failures=d.max_failures, series=d.keeps_series
    )


def feed_log(d: Diagnoser, f: IO[bytes], stats: ReadStats, before: int) -> None:
    """llama-server's own log: line by line while the first MiB decides whether this is a log at all,
    then in blocks."""
    for line in read_lines(f, stats):
        d.feed_line(line, stats.lines)
        if stats.bytes >= SNIFF_BYTES:
            break
    if stats.bytes >= SNIFF_BYTES and (d.specific_events > before or not _looks_binary(stats)):
        for text in read_blocks(f, stats):
            first = stats.lines - text.count("\n", 0, len(text) - 1)
            d.feed_text(text, first)


def _feed_journal(d: Diagnoser, f: IO[bytes], kind: str, stats: ReadStats) -> None:
    """Journal output (see exporter/diagnose/journal.py): each log line with the time it was written."""
    lineno = 0
    if kind == "export":
        for when, line, read in export_lines(f):
            lineno += 1
            stats.bytes, stats.lines = read, lineno
            d.feed_line(line, lineno, when)
        return
    lines = read_lines(f, stats)
    for when, line in json_lines(lines) if kind == "json" else short_iso_lines(lines):
        d.feed_line(line, stats.lines, when)


def _check_read(d: Diagnoser, path: str, stats: ReadStats, before: int) -> None:
    """Raise `InputError` when what was read of `path` is not a llama-server log."""
    if stats.bytes == 0:
        raise InputError(f"{path}: empty file, nothing to diagnose")
    if stats.lines == 0:
        raise InputError(f"{path}: only NUL bytes, no text")
    if d.specific_events == before:
        if _looks_binary(stats):
            raise InputError(f"{path}: binary data, not a text log (expected llama-server's --log-file)")
        raise InputError(
            f"{path}: no llama-server log lines in {stats.lines:,} lines "
            "(expected llama-server's --log-file output, plain, prefixed, coloured or --log-jsonl)"
        )
