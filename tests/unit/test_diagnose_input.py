"""What `llamacpp-exporter diagnose` reads: every form a line comes in (JSONL, colours, router
prefixes, CRLF, no prefix), logs of many runs or starting mid-run, gzip, copytruncate holes, over-long lines,
invalid UTF-8, hostile journal output, and the console script's dispatch.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
import re
import sys
from pathlib import Path

import pytest
from diagnose_checks import CAPTURE_NAMES, CAPTURE_ROOT, check_against_lines, log_lines, same_failures
from paths import B11434

from exporter import diagnose
from exporter.diagnose import analyze, diagnose_file, render_text
from exporter.diagnose.cli import main as diagnose_main

FIXTURES = B11434


def _jsonl(line: str, i: int) -> str:
    return json.dumps({"type": "log", "time": i * 17, "level": "info", "msg": line + "\n"})


def _coloured(line: str) -> str:
    # llama-server's colours: blue timestamp, level letter in colour, the reset at the start of the next line.
    m = re.match(r"^(\d+\.\d{2}\.\d{3}\.\d{3}) ([IWE]) (.*)$", line)
    if not m:
        return line
    colour = {"I": "\x1b[32m", "W": "\x1b[35m", "E": "\x1b[31m"}[m[2]]
    return f"\x1b[0m\x1b[34m{m[1]}\x1b[0m {colour}{m[2]} \x1b[0m{m[3]}"


@pytest.mark.parametrize("form", ["jsonl", "coloured", "router", "crlf", "no-prefix"])
def test_other_line_forms_give_the_same_report(form: str) -> None:
    plain = log_lines(FIXTURES / "exhaust-lv4" / "llama-server.log")
    if form == "jsonl":
        lines = [_jsonl(re.sub(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ", "", ln), i) for i, ln in enumerate(plain)]
    elif form == "coloured":
        lines = [_coloured(ln) for ln in plain]
    elif form == "router":
        lines = [f"[18080] {ln}" for ln in plain]
    elif form == "crlf":
        lines = [ln + "\r\n" for ln in plain]
    else:
        lines = [re.sub(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ", "", ln) for ln in plain]
    if form == "jsonl":
        # A JSONL entry may hold several lines; the physical lines of the plain log that are continuations
        # become part of the previous entry's msg, so compare everything but line numbers.
        base, other = analyze(plain), analyze(lines)
        assert [dataclasses.astuple(r.counts) for r in base.runs] == [dataclasses.astuple(r.counts) for r in other.runs]
        assert [[s.tokens for s in f.slots] for f in other.runs[0].failures] == [[128, 128, 129, 128]]
        return
    report = analyze(lines)
    same_failures(analyze(plain), report)
    if form == "router":
        assert report.runs[0].source == "18080"
    if form == "no-prefix":
        assert report.runs[0].failures[0].elapsed_s is None


def test_jsonl_capture() -> None:
    report = diagnose_file(str(FIXTURES / "exhaust-jsonl" / "llama-server.log"))
    (f,) = report.runs[0].failures
    assert [s.tokens for s in f.slots] == [129, 129, 129, 129]
    assert (f.overflow, f.failed_batch, f.elapsed_s) == (4, 4, 0.067023)  # JSONL `time` is in microseconds
    assert f.victims == []  # everyone held more than 128 = pool / 4
    assert "slots 0, 1, 2, 3 (tied)" in render_text(report)


def test_multi_run_log(tmp_path: Path) -> None:
    """All captures in one file (as `>>` or a restarted server's stderr would leave them): one run each."""
    path = tmp_path / "all.log"
    singles = [diagnose_file(str(CAPTURE_ROOT / n / "llama-server.log")) for n in CAPTURE_NAMES]
    with path.open("w", encoding="utf-8") as f:
        for n in CAPTURE_NAMES:
            f.write((CAPTURE_ROOT / n / "llama-server.log").read_text(encoding="utf-8"))
    report = diagnose_file(str(path), max_runs=0)
    assert report.runs_total == len(CAPTURE_NAMES) == len(report.runs)
    check_against_lines(report, log_lines(path))
    for single, run in zip(singles, report.runs, strict=True):
        assert dataclasses.astuple(single.runs[0].counts) == dataclasses.astuple(run.counts)
        assert dataclasses.astuple(single.runs[0].configuration) == dataclasses.astuple(run.configuration)
        assert [[s.tokens for s in f.slots] for f in single.runs[0].failures] == [
            [s.tokens for s in f.slots] for f in run.failures
        ]
    assert sum(r.failure_summary.total for r in report.runs) == report.failures_total

    # Only the last two runs in detail; the others are summarized, and the totals still cover everything.
    short = diagnose_file(str(path), max_runs=2)
    assert [r.index for r in short.runs] == [len(CAPTURE_NAMES) - 1, len(CAPTURE_NAMES)]
    assert short.omitted_runs.runs == len(CAPTURE_NAMES) - 2
    assert short.omitted_runs.failures + sum(r.failure_summary.total for r in short.runs) == report.failures_total
    assert (short.failures_total, short.aborted_requests_total) == (
        report.failures_total,
        report.aborted_requests_total,
    )
    assert "summarized, not shown" in render_text(short)


def test_log_starting_mid_run_then_restart() -> None:
    """A log that begins after the server started (no banner), then a restart: two runs."""
    lines = log_lines(FIXTURES / "exhaust-lv4" / "llama-server.log")
    tail = lines[250:]  # from the middle of the first request on
    report = analyze([*tail, *lines])
    assert report.runs_total == 2
    first, second = report.runs
    assert not first.started and second.started
    assert first.configuration.pool_cells is None and second.configuration.pool_cells == 512
    assert len(first.failures) == len(second.failures) == 1
    assert [s.tokens for s in first.failures[0].slots] == [128, 128, 129, 128]


def test_crash_loop_during_start_up_is_one_run_per_start() -> None:
    """A server that dies while loading and is restarted prints its banner again before any request."""
    lines = log_lines(FIXTURES / "exhaust-lv4" / "llama-server.log")
    loading = lines[:20]  # banner and model loading, then the process died
    report = analyze([*loading, *loading, *lines])
    assert report.runs_total == 3
    assert [r.started for r in report.runs] == [True, True, True]
    assert [len(r.failures) for r in report.runs] == [0, 0, 1]


def test_a_copytruncate_hole_before_the_log_is_skipped(tmp_path: Path) -> None:
    """copytruncate without O_APPEND leaves NUL bytes where the old lines were (see logs/tail.py): not binary."""
    log = FIXTURES / "exhaust-lv4" / "llama-server.log"
    path = tmp_path / "llama-server.log"
    path.write_bytes(b"\x00" * (2 * diagnose.SNIFF_BYTES + 3) + log.read_bytes())
    with_hole, plain = diagnose_file(str(path)), diagnose_file(str(log))
    same_failures(plain, with_hole)
    assert (with_hole.lines, with_hole.runs_total) == (plain.lines, plain.runs_total)


def test_gzip_log(tmp_path: Path) -> None:
    path = tmp_path / "llama-server.log.1.gz"
    path.write_bytes(gzip.compress((FIXTURES / "exhaust-lv4" / "llama-server.log").read_bytes()))
    same_failures(diagnose_file(str(FIXTURES / "exhaust-lv4" / "llama-server.log")), diagnose_file(str(path)))


def test_over_long_line_is_cut_not_kept(tmp_path: Path) -> None:
    lines = (FIXTURES / "exhaust-lv4" / "llama-server.log").read_bytes().splitlines(keepends=True)
    path = tmp_path / "long.log"
    path.write_bytes(b"".join([*lines[:200], b"x" * (3 * diagnose.MAX_LINE_BYTES + 5) + b"\n", *lines[200:]]))
    report = diagnose_file(str(path))
    assert report.long_lines == 1 and report.lines == len(lines) + 1
    assert [s.tokens for s in report.runs[0].failures[0].slots] == [128, 128, 129, 128]
    assert report.runs[0].failures[0].line == 355


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    data = (FIXTURES / "exhaust-lv4" / "llama-server.log").read_bytes()
    path = tmp_path / "bad-utf8.log"
    path.write_bytes(data.replace(b"tiny-llama", b"tiny-\xff\xfellama"))
    report = diagnose_file(str(path))
    assert report.runs[0].configuration.model == "models/tiny-\ufffd\ufffdllama.gguf"
    assert report.failures_total == 1


def test_stream_reader_bounds_lines() -> None:
    stats = diagnose.ReadStats()
    data = b"a\n" + b"b" * 100 + b"\nc"
    assert list(diagnose.read_lines(io.BytesIO(data), stats, max_line=10)) == ["a\n", "b" * 10, "c"]
    assert (stats.lines, stats.long_lines, stats.bytes) == (3, 1, len(data))


def test_block_reader_gives_the_lines_and_counts_of_the_line_reader() -> None:
    """`read_blocks` (diagnose after the first MiB) against `read_lines` on random lines around the
    cut length, lines longer than a block, a missing final newline and multi-byte characters; the lines
    `Diagnoser.feed_text` says it read of each block are the block's."""
    rng = random.Random(7)
    for case in range(300):
        max_line = rng.choice([4, 7, 10, 33])
        parts = []
        for _ in range(rng.randrange(0, 30)):
            n = rng.choice([0, 1, max_line - 2, max_line - 1, max_line, max_line + 1, 3 * max_line, rng.randrange(50)])
            parts.append(bytes(rng.choice(b"ab\xc3\xa9 ") for _ in range(n)) + b"\n")
        data = b"".join(parts)
        if case % 3 == 0:
            data = data.rstrip(b"\n")
        by_line, by_block = diagnose.ReadStats(), diagnose.ReadStats()
        lines = list(diagnose.read_lines(io.BytesIO(data), by_line, max_line))
        blocks = list(diagnose.read_blocks(io.BytesIO(data), by_block, max_line))
        assert [x for b in blocks for x in diagnose.lines_of(b)] == lines, (case, data)
        assert (by_block.long_lines, by_block.bytes) == (by_line.long_lines, by_line.bytes), (case, data)
        # Lines are counted by who reads the blocks: a Diagnoser, as it feeds each (`feed_text`).
        d = diagnose.Diagnoser("log")
        assert [d.feed_text(b, 1) for b in blocks] == [len(diagnose.lines_of(b)) for b in blocks], (case, data)
        assert sum(map(len, map(diagnose.lines_of, blocks))) == by_line.lines


def test_journal_readers_take_hostile_input() -> None:
    """journalctl output is read from files anyone may have edited: nesting deeper than Python
    recurses, a 1 MiB+ text field, a cut binary field, impossible dates and U+2028 in a message (which
    str.splitlines would take for a line end, letting a prompt forge a line) neither raise nor forge."""
    from exporter.diagnose.journal import export_lines, json_lines
    from exporter.logs.journald import parse_entry

    assert parse_entry("[" * 100_000) is None
    forged = '{"__CURSOR":"c","MESSAGE":"prompt\\u2028srv  update_slots: all slots are idle"}'
    entry = parse_entry(forged)
    assert entry is not None and entry.lines == ["prompt\u2028srv  update_slots: all slots are idle"]
    dated = list(json_lines(['{"__REALTIME_TIMESTAMP":"9999999999999999999","MESSAGE":"a"}\n', "[" * 50_000]))
    assert dated == [(None, "a\n")]

    def entry_bytes(**fields: bytes) -> bytes:
        out = b""
        for name, value in fields.items():
            if b"\n" in value or b"\x1b" in value:
                out += name.encode() + b"\n" + len(value).to_bytes(8, "little") + value + b"\n"
            else:
                out += name.encode() + b"=" + value + b"\n"
        return out + b"\n"

    stream = (
        entry_bytes(__REALTIME_TIMESTAMP=b"1764612809000000", MESSAGE=b"first")
        + entry_bytes(MESSAGE=b"x" * (1024 * 1024 + 100))  # a text field over the 1 MiB kept
        + entry_bytes(__REALTIME_TIMESTAMP=b"1764612810000000", MESSAGE=b"\x1b[32mcoloured\x1b[0m\nsecond line")
        + entry_bytes(__REALTIME_TIMESTAMP=b"99999999999999999", MESSAGE=b"year 5138")
        + b"MESSAGE\n\x10\x00\x00"  # a binary field cut in its length
    )
    got = [(t, line) for t, line, _ in export_lines(io.BytesIO(stream))]
    assert got[0] == (1764612809.0, "first\n")
    assert got[1][0] is None and len(got[1][1]) == 1024 * 1024 - len("MESSAGE=") + 1
    assert got[2:] == [
        (1764612810.0, "\x1b[32mcoloured\x1b[0m\n"),
        (1764612810.0, "second line\n"),
        (None, "year 5138\n"),
    ]


def test_console_script_dispatches_diagnose() -> None:
    """`llamacpp-exporter diagnose …` goes to exporter.diagnose before the exporter's own flags are parsed."""
    from exporter.cli import main as cli_main

    assert cli_main(["diagnose", str(FIXTURES / "recover-purge-lv4" / "llama-server.log"), "--json"]) == 0


def _non_latin_log(tmp_path: Path) -> Path:
    """A real log whose model path cp1252 cannot encode (Cyrillic, Chinese, Greek)."""
    log = tmp_path / "llama-server.log"
    text = (B11434 / "exhaust-lv4" / "llama-server.log").read_text()
    log.write_text(text.replace("models/tiny-llama.gguf", "C:/модели/模型-τ.gguf"), encoding="utf-8")
    return log


def test_a_report_on_a_console_replaces_what_its_code_page_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a console in cp1252 the characters it cannot show are replaced; the report is written whole."""

    class Console(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    raw = io.BytesIO()
    console = Console(raw, encoding="cp1252")
    monkeypatch.setattr(sys, "stdout", console)
    log = _non_latin_log(tmp_path)
    assert diagnose_main([str(log)]) == 1
    console.flush()
    text = raw.getvalue().decode("cp1252")
    assert "model 'C:/??????/??-?.gguf'" in text and "How runs ended" in text
