"""Which inputs `diagnose` reads (files, patterns, standard input, journal exports; copies read once) and how
each is fed to a `Diagnoser`: in one process, or in parts on several cores (`parallel`)."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import math
import os
import re
import sys
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from exporter.diagnose import parallel
from exporter.diagnose.core import Diagnoser
from exporter.diagnose.journal import export_lines, journal_format, json_lines, short_iso_lines
from exporter.diagnose.read import (
    BLOCK_BYTES,
    InputError,
    ReadStats,
    feed_log,
    is_plain_file,
    looks_binary,
    open_input,
    read_lines,
)
from exporter.diagnose.report import Report
from exporter.logs import recognize


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

    ordered, tied = by_modification_time(unique)
    order = "by modification time, oldest first"
    if tied:
        order += (
            f"; {len(tied)} with the same time (within {TIE_SECONDS:g} s: a copy or an archive that did not keep "
            "the times) by the time stamp or number in their names, the file without one last, and their times "
            "not used"
        )
    return ordered, order


#: Modification times this close are the same time: zip and FAT keep times to 2 s, and files copied
#: without their times (mail, unzip, `cp` without -p) get times within as much of each other.
TIE_SECONDS = 2.0

# A wrapper's copy (`llama-server.stderr.prev-20261203-071500`, `.prev-3`) and a numbered rotation
# (logrotate's `.1`, `.2.gz`: the higher the older).
_PREV = re.compile(r".+?\.prev[-_.]?(?P<stamp>.*?\d.*?)(?:\.gz)?")
_NUMBERED = re.compile(r".+?\.(?P<n>\d+)(?:\.gz)?")


def _name_order(path: str, names: set[str]) -> tuple[int, tuple[int, ...], str]:
    """Oldest first, by name: numbered rotations (highest number first), then copies by the time stamp or
    number in their names, then files with neither; the file whose name the others extend (the current
    one) last."""
    name = Path(path).name
    if m := _PREV.fullmatch(name):
        return 1, tuple(int(x) for x in re.findall(r"\d+", m.group("stamp"))), name
    if m := _NUMBERED.fullmatch(name):
        return 0, (-int(m.group("n")),), name
    if any(other != name and other.startswith(name + ".") for other in names):
        return 3, (), name
    return 2, (), name


def by_modification_time(paths: Sequence[str]) -> tuple[list[str], set[str]]:
    """`paths` oldest first by modification time, and the files whose time ties another's (`TIE_SECONDS`):
    those are ordered by their names (`_name_order`), and their times say nothing of when their runs ended."""

    def mtime(path: str) -> float:
        try:
            return Path(path).stat().st_mtime
        except OSError:
            return math.inf  # opening it fails with the reason, in its place at the end

    times = {p: mtime(p) for p in paths}
    names = {Path(p).name for p in paths}
    ordered: list[str] = []
    tied: set[str] = set()
    group: list[str] = []
    for path in [*sorted(paths, key=lambda p: times[p]), None]:
        if group and (path is None or not times[path] - times[group[-1]] < TIE_SECONDS):
            if len(group) > 1:
                tied.update(group)
                group.sort(key=lambda p: _name_order(p, names))
            ordered.extend(group)
            group = []
        if path is not None:
            group.append(path)
    return ordered, tied


def _first_time(path: str) -> float | None:
    """The wall-clock time of the first dated line of a journal output file, or None (any other log:
    llama-server's own stamps count from its start)."""
    try:
        f = open_input(path)
    except InputError:
        return None
    try:
        head = _peek(f, BLOCK_BYTES)
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


def diagnose_file(path: str, *, max_runs: int = 10, max_failures: int = 10) -> Report:
    """Stream `path` (or `-` for standard input) through a `Diagnoser`; raise `InputError` for bad input."""
    return diagnose_files([path], max_runs=max_runs, max_failures=max_failures)


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
    files = [f for f in d.files if f != "-"]
    _, tied = by_modification_time(files) if len(files) > 1 else ([], set())
    for file in files:
        if file not in tied:  # the same time as another file's: not when its runs ended
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
        same_start = self._by_head.setdefault(_content_digest(path, BLOCK_BYTES), [])
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
    f = open_input(path)
    try:
        while left > 0 and (chunk := f.read(int(min(BLOCK_BYTES, left)))):
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
    f = open_input(path)
    try:
        kind = journal_format(_peek(f, 64 * 1024))
        if kind is not None:
            _feed_journal(d, f, kind, stats)
        elif not (is_plain_file(f) and _in_parts(d, path, stats)):
            feed_log(d, f, stats, before)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(f"{path}: read error after {stats.lines:,} lines: {exc}") from None
    finally:
        if f is not sys.stdin.buffer:
            f.close()
    _check_read(d, path, stats, before)


def _in_parts(d: Diagnoser, path: str, stats: ReadStats) -> bool:
    """A big plain file, on several cores where it can be split (see exporter/diagnose/parallel.py)."""
    return parallel.feed_in_parts(
        d, path, stats, max_runs=d.max_runs, max_failures=d.max_failures, series=d.keeps_series
    )


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
    if not recognize.understood(stats.lines, d.specific_events > before, complete=True):
        if looks_binary(stats):
            raise InputError(f"{path}: {recognize.BINARY}")
        raise InputError(f"{path}: {recognize.not_understood(stats.lines)}")
