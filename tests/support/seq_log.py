"""Sequence-numbered llama-server-like lines for the tailer's tests: write them, read their numbers back,
and poll a LogTailer until it goes quiet (as follow() does on each wake)."""

from __future__ import annotations

import re
from pathlib import Path

from exporter.logs.tail import LogTailer

SEQ_RE = re.compile(r"seq=(\d{6})")


def line(i: int) -> str:
    """Line i, a print_timing line that starts with its sequence number."""
    return f"seq={i:06d} slot print_timing: id 0 | task {i} | prompt eval time = {i * 7 % 1000} ms"


def lines_bytes(start: int, stop: int) -> bytes:
    """Lines start..stop-1, each ending in a newline."""
    return "".join(line(i) + "\n" for i in range(start, stop)).encode()


def append(path: Path, start: int, stop: int) -> int:
    """Append lines start..stop-1 to `path` in one write; the bytes written."""
    data = lines_bytes(start, stop)
    with path.open("ab") as f:
        f.write(data)
    return len(data)


def seqs(lines: list[str]) -> list[int]:
    """The sequence numbers of lines read back (each line must have one)."""
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
