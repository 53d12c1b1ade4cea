"""The systemd journal as `diagnose` input: ``journalctl -o json``, ``-o export`` and ``-o short-iso``.

Unlike llama-server's own time stamps (time since its start), the journal dates every line, so a
history read from it is put in order and dated by its own clock. ``journalctl -o cat`` output is
plain log lines and needs nothing from here. Each reader yields (wall-clock time or None, line)::

    $ journalctl -u llama-server -o json
    {"__CURSOR":"s=…","__REALTIME_TIMESTAMP":"1764612809123456","_PID":"4242","MESSAGE":"srv  load_model: …"}
    $ journalctl -u llama-server -o json | llamacpp-exporter diagnose -
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import IO

from exporter.logs.journald import LATEST_WALL_CLOCK, message_lines, parse_entry, realtime_seconds

#: `journalctl -o short-iso` / `short-iso-precise`: `2026-12-01T19:13:29.123456+00:00 host llama-server[42]: `
_SHORT_ISO = re.compile(
    r"^(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)) \S+ [^\s:\[]+(?:\[\d+\])?: "
)
#: The longest field of an export entry that is read (a MESSAGE is at most 48 KiB in journald's default).
_MAX_FIELD = 1024 * 1024


def journal_format(head: bytes) -> str | None:
    """ "json", "export" or "short-iso" when the first bytes of an input are journalctl output, else None.
    (Older journalctl starts its text output with a `-- Logs begin at …` line: skipped.)"""
    first = next((line for line in head.split(b"\n") if not line.startswith(b"-- ")), b"")
    if first.startswith(b"{") and (b'"__REALTIME_TIMESTAMP"' in first or b'"__CURSOR"' in first):
        return "json"
    if first.startswith((b"__CURSOR=", b"__REALTIME_TIMESTAMP=")):
        return "export"
    if _SHORT_ISO.match(first.decode("utf-8", "replace")):
        return "short-iso"
    return None


def json_lines(lines: Iterable[str]) -> Iterator[tuple[float | None, str]]:
    """The log lines of `journalctl -o json` output, with the time of each entry."""
    for raw in lines:
        entry = parse_entry(raw)
        if entry is None:
            continue
        for line in entry.lines:
            yield entry.realtime, line + "\n"


def short_iso_lines(lines: Iterable[str]) -> Iterator[tuple[float | None, str]]:
    """The log lines of `journalctl -o short-iso` output (the prefix removed), with their time; a line
    without the prefix (journalctl's `-- Boot … --` markers) is passed on as it is, undated."""
    for raw in lines:
        m = _SHORT_ISO.match(raw)
        if m is None:
            yield None, raw
            continue
        stamp = m["t"].replace(",", ".")
        if stamp.endswith("Z"):
            stamp = stamp[:-1] + "+00:00"
        try:
            when: float | None = datetime.fromisoformat(_micro(stamp)).timestamp()
        except (ValueError, OverflowError):
            when = None
        if when is not None and not 0 < when < LATEST_WALL_CLOCK:
            when = None
        yield when, raw[m.end() :]


def _micro(stamp: str) -> str:
    """Python 3.10's fromisoformat takes 3 or 6 fraction digits and a zone with a colon."""
    m = re.match(r"^(.{19})(?:\.(\d+))?([+-]\d\d):?(\d\d)$", stamp)
    if m is None:
        return stamp
    fraction = f".{(m[2] or '')[:6].ljust(6, '0')}" if m[2] else ""
    return f"{m[1]}{fraction}{m[3]}:{m[4]}"


def export_lines(f: IO[bytes]) -> Iterator[tuple[float | None, str, int]]:
    """The log lines of `journalctl -o export` output, with the entry's time and the number of input
    bytes read so far. Entries are `FIELD=value` lines up to an empty line; a field with control
    characters or newlines is `FIELD\\n`, its length (64-bit little-endian), the bytes, a newline.
    A field longer than 1 MiB is cut there (the rest of it is read and dropped)."""
    read = 0
    realtime: float | None = None
    message: bytes | None = None
    while True:
        raw = f.readline(_MAX_FIELD)
        read += len(raw)
        if len(raw) == _MAX_FIELD and not raw.endswith(b"\n"):  # a text field cut: drop the rest of it
            while (more := f.readline(_MAX_FIELD)) and not more.endswith(b"\n"):
                read += len(more)
            read += len(more)
        if raw in (b"\n", b""):
            if message is not None:
                for line in message_lines(message.decode("utf-8", "replace")):
                    yield realtime, line + "\n", read
            realtime, message = None, None
            if not raw:
                return
            continue
        name, eq, value = raw.rstrip(b"\n").partition(b"=")
        if not eq:  # a binary field: its length, then its bytes
            size_bytes = f.read(8)
            read += len(size_bytes)
            if len(size_bytes) < 8:
                return
            (size,) = struct.unpack("<Q", size_bytes)
            if size > _MAX_FIELD:  # not kept: read past it
                left = size + 1
                while left > 0 and (chunk := f.read(min(left, 1 << 16))):
                    left -= len(chunk)
                    read += len(chunk)
                continue
            value = f.read(size)
            read += len(value) + len(f.read(1))
        if name == b"MESSAGE":
            message = value
        elif name == b"__REALTIME_TIMESTAMP":
            realtime = realtime_seconds(value)
