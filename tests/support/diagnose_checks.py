"""diagnose's report held to the log's own lines (counted by plain regular expressions), for the unit
tests on the captures and the real llama-server's test (tests/real_server/test_diagnose_cli.py)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
from paths import B11434

from exporter.diagnose import Report, parallel

#: The project's own b11434 captures (the logs as recorded, in tests/fixtures).
CAPTURE_ROOT = B11434
# The project's captures (the build corpus, with a capture.json, is tests/unit/test_build_corpus.py's).
CAPTURE_NAMES = sorted(
    p.name for p in CAPTURE_ROOT.iterdir() if (p / "llama-server.log").is_file() and not (p / "capture.json").exists()
)
RETRY = re.compile(r"retrying with smaller batch size")
MEMORY = re.compile(r"failed to find a memory slot for batch of size")
FATAL = re.compile(r"Context size has been exceeded\. off = ")
SEND_ERROR = re.compile(r"send_error: task id = \d+, error: Context size has been exceeded")
RELEASE = re.compile(r"slot\s+\S+: id\s+(\d+) \| task (\d+) \| stop processing: n_tokens = (\d+)")
PURGE = re.compile(r"purging slot \d+ with \d+ tokens")
TASK = re.compile(r"\| processing task\b")
DECODE_FAILED = re.compile(r"decode\(\) failed: ")


def log_lines(path: Path) -> list[str]:
    """The file's lines, undecodable bytes replaced."""
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def same_failures(a: Report, b: Report) -> None:
    """Two reports find the same failures with the same counts (elapsed times aside)."""

    def key(r: Report) -> list[Any]:
        return [
            (dataclasses.astuple(run.counts), [dataclasses.replace(f, elapsed_s=None) for f in run.failures])
            for run in r.runs
        ]

    assert key(a) == key(b)


def failure_releases(lines: list[str]) -> list[tuple[int, list[tuple[int, int, int]]]]:
    """(fatal line number, [(slot, task, n_tokens)…]) from the release lines between the fatal and `decode() failed`."""
    out = []
    for i, line in enumerate(lines):
        if FATAL.search(line):
            releases = []
            for later in lines[i + 1 :]:
                if DECODE_FAILED.search(later):
                    break
                m = RELEASE.search(later)
                if m:
                    releases.append((int(m[1]), int(m[2]), int(m[3])))
            out.append((i + 1, sorted(releases)))
    return out


def check_against_lines(report: Report, lines: list[str]) -> None:
    """Acceptance 2: every count is the number of such lines; every failure adds up its release lines."""
    runs = report.runs

    def total(f: Any) -> int:
        return sum(f(r.counts) for r in runs)

    def count(rx: re.Pattern[str]) -> int:
        return sum(1 for ln in lines if rx.search(ln))

    assert report.omitted_runs.runs == 0
    assert total(lambda c: c.retries) == count(RETRY)
    assert total(lambda c: c.memory_slot_failures) == count(MEMORY)
    assert total(lambda c: c.aborts) == count(FATAL) == report.failures_total
    assert total(lambda c: c.aborted_requests) == count(SEND_ERROR) == report.aborted_requests_total
    assert total(lambda c: c.idle_slots_purged) == count(PURGE)
    assert total(lambda c: c.requests_started) == count(TASK)
    assert total(lambda c: c.requests_finished) == count(RELEASE)
    assert total(lambda c: c.cascades_failed) == count(FATAL)
    expected = failure_releases(lines)
    got = [f for r in runs for f in r.failures]
    assert [f.line for f in got] == [line for line, _ in expected]
    for f, (_, releases) in zip(got, expected, strict=True):
        assert [(s.slot, s.task, s.tokens) for s in f.slots] == releases
        assert f.tokens_sum == sum(n for _, _, n in releases)
        assert f.aborted_requests == len(releases)
    assert report.exit_status == (1 if expected else 0)


def record_splits(monkeypatch: pytest.MonkeyPatch, workers: int) -> list[bool]:
    """Have diagnose read logs of 1 MiB or more in parts on `workers` processes; the list it returns gets,
    for each file, whether it was read in parts (`parallel.feed_in_parts`' own answer)."""
    split: list[bool] = []
    real = parallel.feed_in_parts

    def recorded(*args: Any, **kwargs: Any) -> bool:
        split.append(real(*args, **kwargs))
        return split[-1]

    monkeypatch.setattr(parallel, "feed_in_parts", recorded)
    monkeypatch.setattr(parallel, "MIN_BYTES", 1024 * 1024)
    monkeypatch.setattr(parallel, "workers", lambda: workers)
    return split
