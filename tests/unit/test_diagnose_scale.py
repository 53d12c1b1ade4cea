"""`llamacpp-exporter diagnose` on big logs: memory stays bounded, reading batches of lines gives the
report of reading line by line, and a log read in parts on several cores gives the report of one process.
"""

from __future__ import annotations

import dataclasses
import random
import re
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from big_log import build_log, later_start
from diagnose_checks import CAPTURE_NAMES, CAPTURE_ROOT, record_splits
from paths import B11434

from exporter import diagnose
from exporter.diagnose import Diagnoser, Report, diagnose_file, to_json
from exporter.diagnose.blocks import lines_of, odd_spans, unwrapped
from exporter.diagnose.render import history_entry
from exporter.logs.parse import unwrap_marked

FIXTURES = B11434


def test_memory_stays_bounded(tmp_path: Path) -> None:
    """Structural check for acceptance 3: 4x the log does not need more memory (no per-line state).

    bench/diagnose_big.py builds the log the same way (support/big_log.py) and measures 1 GiB in a subprocess.
    """
    peaks, runs = [], []
    for size_mb in (3, 12):
        built = build_log(tmp_path / f"{size_mb}.log", size_mb * 2**20)
        tracemalloc.start()
        try:
            report = diagnose_file(str(built.path))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert (report.runs_total, report.failures_total) == (built.runs, built.failures)
        assert len(report.runs) == 10 and report.omitted_runs.runs == built.runs - 10
        runs.append(built.runs)
    print(f"peak traced memory: 3 MiB log {peaks[0] / 1024:,.0f} KiB, 12 MiB log {peaks[1] / 1024:,.0f} KiB")
    # What may grow is the history, a line per run (RunSummary and Fingerprint: about 2.4 KiB each).
    assert peaks[1] < peaks[0] * 1.25 + 256 * 1024 + (runs[1] - runs[0]) * 3 * 1024
    assert peaks[1] < 8 * 2**20


def _line_by_line(path: Path) -> Report:
    """The reference: every line through `feed_line`, as `analyze` does."""
    d = Diagnoser(str(path))
    stats = diagnose.ReadStats()
    with path.open("rb") as f:
        for line in diagnose.read_lines(f, stats):
            d.feed_line(line, stats.lines)
    d.long_lines = stats.long_lines
    return d.finish({str(path): path.stat().st_mtime})  # what diagnose_files adds: the file's time


@pytest.mark.parametrize("mix", ["plain", "odd"])
def test_batched_diagnose_equals_line_by_line(tmp_path: Path, mix: str) -> None:
    """diagnose_file scans batches of lines at once after the first MiB; the report must not change.

    The log repeats every real capture past the 1 MiB sniff window (plain, no-prefix, default verbosity
    and long runs go through the batch scan), with, for "odd", JSONL, router-prefixed and coloured runs
    and an over-long line in between (those batches go line by line) and no newline at the end.
    """
    captures = [(CAPTURE_ROOT / c / "llama-server.log").read_text() for c in CAPTURE_NAMES]
    plain = [c for c in captures if not c.startswith("{")]
    parts: list[str] = []
    size = 0
    while size < 3 * diagnose.SNIFF_BYTES:
        for c in plain if mix == "plain" else captures:
            parts.append(later_start(c, len(parts)))
            size += len(c)
        if mix == "odd":
            first = plain[0].splitlines(keepends=True)
            parts.append("".join(f"[ 8081] {line}" for line in first[:400]))
            parts.append("".join(f"\x1b[32m{line}" if i % 3 else line for i, line in enumerate(first[:200])))
            parts.append("0.00.000.001 I " + "x" * (diagnose.MAX_LINE_BYTES + 10) + "\n")
    text = "".join(parts)
    path = tmp_path / "big.log"
    path.write_text(text.rstrip("\n") if mix == "odd" else text)
    batched, reference = diagnose_file(str(path)), _line_by_line(path)
    assert batched.runs_total > 50 and batched.failures_total > 10
    assert to_json(batched) == to_json(reference)


@pytest.mark.parametrize("mix", ["plain", "odd", "starting"])
def test_a_big_log_on_several_cores_gives_the_same_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mix: str
) -> None:
    """A log split at start lines and read by worker processes gives the report of one process, byte
    for byte (JSON, with --html's series); where a split would change it (router mode, a run cut
    during its start-up), the log is read as a whole. "starting": every start-up is cut short, so a
    start line may follow a run that never printed its own `initializing ...`."""
    from exporter.diagnose import parallel

    built = build_log(tmp_path / "big.log", 6 * 2**20, root=CAPTURE_ROOT)
    path = built.path
    if mix == "odd":
        lines = (CAPTURE_ROOT / "exhaust-lv4" / "llama-server.log").read_text().splitlines(keepends=True)
        with path.open("a") as f:
            f.write("".join(f"[ 8081] {line}" for line in lines))
    elif mix == "starting":
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(line for line in lines if "initializing ..." not in line or len(line) % 3))
    split = record_splits(monkeypatch, workers=3)
    in_parts = diagnose.diagnose_files([str(path)], max_runs=0, series=True)
    monkeypatch.setattr(parallel, "MIN_BYTES", 1 << 62)
    whole = diagnose.diagnose_files([str(path)], max_runs=0, series=True)
    if mix != "starting":  # where the cuts fall decides whether a part ends in a start-up (then: as a whole)
        assert split[0] == (mix != "odd")  # router mode is read as a whole
    assert len(in_parts.history) > 100
    assert to_json(in_parts) == to_json(whole)
    assert {i: (s.x, s.tokens) for i, s in in_parts.series.items()} == {
        i: (s.x, s.tokens) for i, s in whole.series.items()
    }


@pytest.mark.parametrize("decoys", [False, True])
def test_a_split_log_keeps_the_series_of_the_runs_it_shows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoys: bool
) -> None:
    """The parts whose runs cannot be among the last --max-runs keep no pool series (counted by the start
    lines after them); the report is still the one process' report, series and all. With decoys (request
    lines that quote a start line's text, after the last runs) the count says more runs follow than do:
    the parts it misled are read again, with their series."""
    from concurrent.futures import ProcessPoolExecutor

    from exporter.diagnose import parallel

    path = build_log(tmp_path / "big.log", 6 * 2**20, root=CAPTURE_ROOT).path
    if decoys:
        with path.open("a") as f:
            f.write('0.00.000.001 I srv  log_server_r: request: {"prompt": "' + "initializing ... " * 2000 + '"}\n')
    series_of_parts: list[bool] = []
    starts: list[int] = []  # each part's first byte, as often as it was read

    class Recording(ProcessPoolExecutor):
        def _record(self, jobs: list[Any]) -> None:  # a part's job (not a count's): it says its series
            if jobs and hasattr(jobs[0], "series"):
                series_of_parts.extend(job.series for job in jobs)
                starts.extend(job.start for job in jobs)

        def map(self, fn, *iterables, **kwargs):  # type: ignore[no-untyped-def]
            self._record(list(iterables[0]))
            return super().map(fn, *iterables, **kwargs)

        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            self._record(list(args[:1]))
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(parallel, "ProcessPoolExecutor", Recording)
    split = record_splits(monkeypatch, workers=3)
    max_runs = 40 if decoys else 3
    in_parts = diagnose.diagnose_files([str(path)], max_runs=max_runs, series=True)
    monkeypatch.setattr(parallel, "MIN_BYTES", 1 << 62)
    whole = diagnose.diagnose_files([str(path)], max_runs=max_runs, series=True)
    assert split[0]  # read in parts
    assert False in series_of_parts and True in series_of_parts
    assert (len(starts) > len(set(starts))) == decoys  # parts read again, with their series
    assert to_json(in_parts) == to_json(whole)
    assert len(whole.series) == max_runs
    assert {i: (s.x, s.tokens) for i, s in in_parts.series.items()} == {
        i: (s.x, s.tokens) for i, s in whole.series.items()
    }


def test_a_big_file_that_is_not_a_log_is_refused_in_parts_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1 MiB of binary data, then a log: one process stops at the first MiB and says so; so must the
    parts (a later part alone would find the log)."""
    from exporter.diagnose import parallel

    built = build_log(tmp_path / "log", 4 * 2**20, root=CAPTURE_ROOT)
    path = tmp_path / "binary-then-log"
    path.write_bytes(random.Random(7).randbytes(2**20) + built.path.read_bytes())
    monkeypatch.setattr(parallel, "MIN_BYTES", 1024 * 1024)
    monkeypatch.setattr(parallel, "workers", lambda: 3)
    with pytest.raises(diagnose.InputError, match="binary data"):
        diagnose.diagnose_files([str(path)])


def test_odd_spans_are_the_lines_between_plain_runs() -> None:
    """`odd_spans` finds the lines that `_feed_plain` cannot take by searching for what makes them odd;
    the reference is a regex over every line: the maximal runs of plain whole lines, and between them the rest."""
    plain_run = re.compile(r"^(?:[^\n\[{\x1b\r][^\n\x1b\r]*\n|\n)+", re.M)

    def reference(text: str) -> list[tuple[int, int]]:
        spans, pos = [], 0
        for m in plain_run.finditer(text):
            if m.start() > pos:
                spans.append((pos, m.start()))
            pos = m.end()
        return [*spans, (pos, len(text))] if pos < len(text) else spans

    rng = random.Random(48)
    pieces = ["a", "b c", "\n", "\n", "[", "{", "\x1b", "\r", "\n[", "\n{", "\r\n"]
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 24)))
        assert odd_spans(text) == reference(text), repr(text)


def test_history_entries_are_the_run_summaries_less_two_fields() -> None:
    """The JSON history writes each RunSummary as `dataclasses.asdict` would, less its request sizes and
    configuration, without converting those first."""
    d = Diagnoser("captures")
    for name in CAPTURE_NAMES:
        d.feed_text((CAPTURE_ROOT / name / "llama-server.log").read_text(), 1)
    history = d.finish().history
    assert any(s.memory is not None for s in history) and any(s.request_sizes is not None for s in history)
    for s in history:
        want = dataclasses.asdict(s)
        del want["request_sizes"], want["configuration"]
        got = history_entry(s)
        assert got == want and list(got) == list(want)


def test_bulk_unwrapping_is_each_line_unwrapped() -> None:
    """`unwrapped` removes JSONL wrapping and colours with a regex over a whole block; the reference is
    `unwrap_marked` on each line, over random blocks of real and odd lines (plain JSONL entries, ones with
    escapes or spaces after them, colours at the start or inside, CR line ends, lines without any)."""
    pieces = [
        '{"type":"log","time":976,"level":"info","msg":"srv  llama_server: initializing ...\\n"}',
        '{"type":"log","time":12,"level":"warn","msg":"slot update_slots: id  0 | task 5 | new prompt"}',
        '{"type":"log","time":7,"level":"info","msg":"a \\"quoted\\" \\u001b[31mred\\n"}',
        '{"type":"log","time":7,"level":"info","msg":"two\\nlines\\n"} ',
        '{"type":"log","time":-0,"level":"info","msg":"x\\n"}',
        '{"type":"log","time":5,"level":"info","msg":"raw\ttab\\n"}',  # a control character: not JSON
        '{"type":"log","time":05,"level":"info","msg":"x\\n"}',
        '{"type":"log","time":5,"level":"ínfo","msg":"x\\n"}',
        '{"type":"log","time":5,"level":"info","msg":"né \\/ é\\n"}',
        '{"type":"log","time":5,"level":"info","msg":""}',
        '{"type":"log","time":5,"level":"info","msg":"\\n"}',
        '{"type":"log","time":5,"level":"info","msg":"x\\n\\n"}',
        '{"type":"log","time":5,"level":"info","msg":"x\\n"}}',
        '{"type":"log","time":5,"level":"info","msg":"x\\n"',
        '{"type":"log","time":5,"level":"info","msg":"params: \\n\\trepeat = \\"64\\"\\u00e9\\ud800\\n"}',
        '{"type":"log","time":5,"level":"info","msg":"params: \\n\\x41\\n"}',  # not JSON: \\x
        '{"type":"log","time":5,"level":"info","msg":"params: \\n\\u12\\n"}',
        '{"type":"log","time":5,"level":"info","msg":"params: \\n"tail\\n"}',
        '{"msg": "loose"}',
        "{not json",
        "\x1b[34m0.00.009.658\x1b[0m \x1b[32mI \x1b[0msrv  llama_server: initializing ...",
        "0.00.010.972 I srv  update_slots: all slots are idle \x1b[0m",
        "\x1b[35mW srv  send_error: task id = 24, error: Context size has been exceeded.\x1b[0m",
        "\x1b\x1b[0m[31m",
        "plain line",
        "",
    ]
    rng = random.Random(4848)
    for _ in range(5_000):
        lines = [rng.choice(pieces) + rng.choice(["\n", "\n", "\n", "\r\n"]) for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.3 and lines[-1].rstrip("\r\n"):  # a last line without its end (never an empty one)
            lines[-1] = lines[-1][: -1 if lines[-1][-2:] != "\r\n" or rng.random() < 0.5 else -2]
        want = "\n".join([unwrap_marked(x) if x[:1] == "{" or "\x1b" in x else x.rstrip("\r\n") for x in lines])
        assert unwrapped("".join(lines), lines) == want, lines
    for name in CAPTURE_NAMES:
        lines = lines_of((CAPTURE_ROOT / name / "llama-server.log").read_text())
        want = "\n".join([unwrap_marked(x) if x[:1] == "{" or "\x1b" in x else x.rstrip("\r\n") for x in lines])
        assert unwrapped("".join(lines), lines) == want, name
