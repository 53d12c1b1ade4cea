"""Big llama-server logs built from the real b11434 captures, for diagnose's tests and
bench/diagnose_big.py: every capture again and again, each copy a later start of its server, with the
totals the report must show.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from paths import B11434

CAPTURES = B11434
_FATAL = re.compile(rb"Context size has been exceeded\. off = ")
_SEND_ERROR = re.compile(rb"send_error: task id = \d+, error: Context size has been exceeded")
_RETRY = re.compile(rb"retrying with smaller batch size")


@dataclass(frozen=True)
class BuiltLog:
    """What was written: the totals the report must show."""

    path: Path
    bytes: int
    repetitions: int
    runs: int
    failures: int
    aborted_requests: int
    retries: int


def capture_logs(root: Path = CAPTURES) -> list[bytes]:
    """The real captures, each as bytes ending in a newline."""
    logs = []
    for p in sorted(root.glob("*/llama-server.log")):
        data = p.read_bytes()
        logs.append(data if data.endswith(b"\n") else data + b"\n")
    if not logs:
        raise SystemExit(f"no captures under {root}")
    return logs


_FIRST_STAMP = re.compile(rb"^(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) |^(\{[^\n]*?\"time\":)(\d+)")


def distinct_run(log: bytes, k: int) -> bytes:
    """`log` as another start of the same server: its first line's time stamp k µs later.

    A real server never writes the same time stamps twice, and diagnose counts a run whose first
    lines (time stamps included) repeat an earlier run's as that run read twice; so a log made of
    one capture again and again moves each copy's first stamp.
    """
    m = _FIRST_STAMP.match(log)
    if m is None or k == 0:
        return log
    if m[6] is not None:
        return log[: m.start(6)] + str(int(m[6]) + k).encode() + log[m.end(6) :]
    us = ((int(m[1]) * 60 + int(m[2])) * 1000 + int(m[3])) * 1000 + int(m[4]) + k
    stamp = f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d} "
    return stamp.encode() + log[m.end() :]


def later_start(text: str, k: int) -> str:
    """A capture as the k-th later start of its server (its first time stamp moved: see distinct_run)."""
    return str(distinct_run(text.encode(), k).decode())


def build_log(path: Path, size_bytes: int, root: Path = CAPTURES) -> BuiltLog:
    """Write the captures again and again into `path` until it holds at least `size_bytes`, each copy
    as a later start of its server (`distinct_run`)."""
    logs = capture_logs(root)
    block = b"".join(logs)
    reps = max(1, -(-size_bytes // len(block)))
    with path.open("wb") as f:
        for k in range(reps):
            f.write(block if k == 0 else b"".join(distinct_run(log, k) for log in logs))
    return BuiltLog(
        path=path,
        bytes=reps * len(block),
        repetitions=reps,
        runs=reps * len(logs),
        failures=reps * len(_FATAL.findall(block)),
        aborted_requests=reps * len(_SEND_ERROR.findall(block)),
        retries=reps * len(_RETRY.findall(block)),
    )
