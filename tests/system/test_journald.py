"""The journald source (`--log-source journald --journal-unit UNIT`) against a real systemd-journald.

No journald runs on this machine (no systemd as pid 1), so the tests start their own: a real
``systemd-journald`` in a private journal namespace (needs root; CI runs as root). Processes are
attached to it the way systemd attaches a service with ``StandardOutput=journal`` (the stream socket
and its header, see ``source_harness``), so journald records ``_SYSTEMD_UNIT`` and ``_PID`` exactly as
for a real unit, and the exporter reads it with the real ``journalctl``.

What is checked: every real capture logged through the journal gives the same metrics as the file
source on the same lines; a real llama-server logging to the journal gives the same metrics as its
``--log-file``; a server restart is counted once; an exporter restart replays the journal back to the
newest start banner without counting; the hand-over between history and follow (and a journalctl
restart) loses and repeats no line. The source's parsing and flags, in process:
tests/unit/test_journald_source.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from llama_harness import ExporterProcess, LlamaServer, run_concurrent_completions, wait_for
from source_harness import (
    CAPTURES,
    NO_HTTP_SERVER,
    PrivateJournald,
    SourceExporter,
    count_lines,
    describe_difference,
    find_journald,
    server_samples,
    split_samples,
    wait_lines,
)

from exporter.logs.journald import JournaldSource

SEED_ARGS = ["-c", "512", "-np", "4", "-kvu", "-lv", "4", "--metrics", "-t", "2", "--log-colors", "on"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _missing(what: str) -> NoReturn:
    """Fail under CI (where scripts/test.sh runs as root with systemd's tools installed), skip elsewhere."""
    if _in_ci():
        pytest.fail(f"{what} (under CI)", pytrace=False)
    pytest.skip(what)


@pytest.fixture(scope="module")
def journald(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateJournald]:
    """A private real systemd-journald (namespaced), removed afterwards."""
    binary = find_journald()
    if binary is None or shutil.which("journalctl") is None:
        _missing("systemd-journald/journalctl not installed (Debian package systemd)")
    if os.geteuid() != 0:
        _missing("starting a private systemd-journald needs root")
    with PrivateJournald(binary, tmp_path_factory.mktemp("journald")) as j:
        yield j


def _journal_exporter(journald: PrivateJournald, unit: str, tmp_path: Path, name: str) -> SourceExporter:
    return SourceExporter(
        ["--log-source", "journald", "--journal-unit", unit, "--journal-namespace", journald.namespace],
        workdir=tmp_path,
        name=name,
    )


# ---------------------------------------------------------------------------------------------- parsing


# ------------------------------------------------------------------------------------ the real journal


@pytest.mark.system
def test_history_and_follow_hand_over_without_loss_or_repeat(journald: PrivateJournald, tmp_path: Path) -> None:
    """history() = the newest process since its banner; follow continues after it, also across a journalctl restart."""
    unit = "handover.service"
    by_name = {c.parent.name: c for c in CAPTURES}
    older, newest, later, last = (
        by_name["exhaust-lv4"],
        by_name["recover-purge-lv4"],
        by_name["longprompt-lv4"],
        by_name["checkpoints-swa-lv4"],
    )
    journald.write(unit, older)
    journald.write(unit, newest)
    expected_entries = count_lines(older.read_bytes()) + count_lines(newest.read_bytes())
    wait_for(
        lambda: len(journald.journalctl("-u", unit, "-o", "cat").splitlines()) == expected_entries,
        timeout=30,
        what="both captures in the journal",
    )

    source = JournaldSource(unit, namespace=journald.namespace, restart_delay=0.05)
    history = source.history()
    # journald strips trailing whitespace from stream lines (the parser does not care).
    assert history == _journal_lines(newest), "history must be exactly the newest process's lines"
    assert source.up and source.cursor is not None

    async def follow() -> list[str]:
        got: list[str] = []
        stop = asyncio.Event()
        task = asyncio.create_task(source.run(got.extend, stop))
        want_later = _journal_lines(later)
        await asyncio.to_thread(journald.write, unit, later)
        await _until(lambda: len(got) >= len(want_later), "the later capture")
        assert got == want_later
        # journalctl dies (the journal was vacuumed, someone killed it): restarted after the last cursor.
        restarts = source.restarts
        pid = await _journalctl_child(os.getpid())
        os.kill(pid, 9)
        await _until(lambda: source.restarts > restarts and source.up, "journalctl to be restarted")
        want_last = _journal_lines(last)
        await asyncio.to_thread(journald.write, unit, last)
        await _until(lambda: len(got) >= len(want_later) + len(want_last), "the last capture")
        stop.set()
        await asyncio.wait_for(task, 30)
        return got

    got = asyncio.run(follow())
    assert got == _journal_lines(later) + _journal_lines(last)


def _journal_lines(capture: Path) -> list[str]:
    return [line.rstrip() for line in capture.read_text().splitlines()]


async def _until(condition: object, what: str, timeout: float = 30.0) -> None:
    assert callable(condition)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def _journalctl_child(parent: int) -> int:
    """Pid of the `journalctl --follow` child of this process (the source's own)."""
    for _ in range(500):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == parent and cmdline and cmdline[0].endswith(b"journalctl") and b"--follow" in cmdline:
                return int(entry.name)
        await asyncio.sleep(0.02)
    raise TimeoutError("no journalctl --follow child found")


@pytest.mark.system
def test_captures_through_the_journal_match_the_file_source(journald: PrivateJournald, tmp_path: Path) -> None:
    """Each real capture, logged as one process of the unit: journal and file exporters agree after each."""
    unit = "captures.service"
    log_file = tmp_path / "llama-server.log"
    with (
        ExporterProcess(log_file, NO_HTTP_SERVER, output_file=tmp_path / "file.out") as by_file,
        _journal_exporter(journald, unit, tmp_path, "journal") as by_journal,
    ):
        assert by_journal.sample("llamacpp_exporter_source_up", {"source": "log"}) == 1
        total = 0
        for capture in CAPTURES:
            data = capture.read_bytes()
            total += count_lines(data)
            log_file.write_bytes(data)
            journald.write(unit, capture)
            wait_lines(by_file, total, "file")
            wait_lines(by_journal, total, "journal")
            a, b = server_samples(by_file.scrape()), server_samples(by_journal.scrape())
            assert a == b, f"{capture.parent.name}:\n{describe_difference(a, b, ('file', 'journal'))}"
        assert by_journal.sample("llamacpp_server_starts_total") == len(CAPTURES)

        # An exporter restart: the journal is replayed back to the newest banner, nothing is counted.
        gauges, _ = split_samples(by_journal.scrape())
        by_journal.restart()
        gauges_after, counters_after = split_samples(by_journal.scrape())
        newest_lines = count_lines(CAPTURES[-1].read_bytes())
        assert by_journal.sample("llamacpp_exporter_log_replayed_lines") == newest_lines
        assert by_journal.sample("llamacpp_exporter_log_lines_total") == 0
        assert gauges_after == gauges, describe_difference(gauges, gauges_after, ("before", "after"))
        counted = {k: v for k, v in counters_after.items() if v != 0}
        assert not counted, f"counted again after the exporter restart: {counted}"


@pytest.mark.system
@pytest.mark.llama_server
def test_real_llama_server_in_the_journal(
    journald: PrivateJournald, llama_server_bin: Path, tiny_llama_model: Path, tmp_path: Path
) -> None:
    """llama-server as a journald unit (colour on): the journal and its --log-file give the same metrics,
    a crash and restart is counted once, and an exporter restart does not count the past."""
    unit = "llama-server.service"
    log_file = tmp_path / "llama-server.log"
    server = LlamaServer(llama_server_bin, tiny_llama_model, SEED_ARGS, log_file=log_file)
    procs: list[subprocess.Popen[bytes]] = []

    def start_server() -> None:
        stderr_file = tmp_path / f"stream-{len(procs)}.err"
        with stderr_file.open("wb") as err:
            procs.append(
                subprocess.Popen(
                    journald.stream_command(unit, server.command),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=server.env,
                )
            )
        proc = procs[-1]

        def healthy() -> bool:
            if proc.poll() is not None:
                why = journald.why_a_writer_died(unit, "llama-server", proc.returncode, stderr_file)
                raise RuntimeError(f"{why}\n--- its --log-file ---\n{server.log_text()[-3000:]}")
            h = server.health()
            return h is not None and h[0] == 200

        wait_for(healthy, timeout=60, what="llama-server /health 200")

    def agree(want_aborted: int) -> None:
        def same() -> bool:
            a, b = server_samples(by_file.scrape()), server_samples(by_journal.scrape())
            key = ("llamacpp_requests_aborted_total", (("reason", "context_exceeded"),))
            return a == b and a.get(key) == want_aborted

        try:
            wait_for(same, timeout=30, what="journal and file exporters to agree")
        except TimeoutError:
            a, b = server_samples(by_file.scrape()), server_samples(by_journal.scrape())
            pytest.fail(f"journal and file exporters disagree:\n{describe_difference(a, b, ('file', 'journal'))}")

    try:
        with (
            ExporterProcess(log_file, NO_HTTP_SERVER, output_file=tmp_path / "file.out") as by_file,
            _journal_exporter(journald, unit, tmp_path, "journal") as by_journal,
        ):
            start_server()
            results = run_concurrent_completions(server.url, n=4)
            assert [status for status, _ in results] == [500] * 4, results
            agree(4)
            assert by_journal.sample("llamacpp_server_starts_total") == 1
            assert "\x1b[" in server.log_text(), "colour codes expected in the log (--log-colors on)"

            # Crash and restart: one more start, slots and pool reset, counters kept.
            procs[-1].kill()
            procs[-1].wait(30)
            start_server()
            wait_for(lambda: by_journal.sample("llamacpp_server_starts_total") == 2, timeout=30, what="2 starts")
            agree(4)
            assert by_journal.sample("llamacpp_kv_pool_used_tokens") == 0

            # Exporter restart: counters start from 0, gauges come back from the journal.
            gauges, _ = split_samples(by_journal.scrape())
            by_journal.restart()
            gauges_after, counters_after = split_samples(by_journal.scrape())
            assert gauges_after == gauges, describe_difference(gauges, gauges_after, ("before", "after"))
            counted = {k: v for k, v in counters_after.items() if v != 0}
            assert not counted, f"counted again after the exporter restart: {counted}"
            # The replay covered the current server process only (from its banner on).
            current_run_lines = len(server.log_lines())
            assert by_journal.sample("llamacpp_exporter_log_replayed_lines") == current_run_lines

            # And the next incident is counted normally.
            results = run_concurrent_completions(server.url, n=4)
            assert [status for status, _ in results] == [500] * 4, results
            wait_for(
                lambda: by_journal.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 4,
                timeout=30,
                what="4 aborts counted after the exporter restart",
            )
            # The file exporter kept running (4 + 4 aborts); gauges agree, and so do counters since the restart.
            wait_for(
                lambda: by_file.sample("llamacpp_requests_aborted_total", {"reason": "context_exceeded"}) == 8,
                timeout=30,
                what="8 aborts in the file exporter",
            )
            (a, _), (b, _) = split_samples(by_file.scrape()), split_samples(by_journal.scrape())
            assert a == b, describe_difference(a, b, ("file", "journal"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)


@pytest.mark.system
def test_the_harness_says_which_component_died(tmp_path: Path) -> None:
    """A writer that dies is named with its own last words; a journald that died under it is named as the cause."""
    binary = find_journald()
    if binary is None or shutil.which("journalctl") is None or os.geteuid() != 0:
        _missing("a private systemd-journald (Debian package systemd, root)")
    with PrivateJournald(binary, tmp_path) as j:
        unit = "dies.service"
        proc = subprocess.run(j.stream_command(unit, ["sh", "-c", "echo 'cannot load model'; exit 3"]), timeout=30)
        why = j.why_a_writer_died(unit, "sh", proc.returncode)
        assert "exited rc=3" in why and "is running" in why
        wait_for(lambda: "cannot load model" in j.why_a_writer_died(unit, "sh", 3), 10, what="its journal line")
        assert j._proc is not None
        j._proc.kill()
        j._proc.wait(10)
        err = tmp_path / "stream.err"
        with err.open("wb") as f:
            rc = subprocess.run(j.stream_command(unit, ["true"]), stderr=f, timeout=30).returncode
        why = j.why_a_writer_died(unit, "llama-server", rc, err)
        assert rc != 0 and "had died" in why and "that is the cause" in why
        assert "Error" in why.split("its stderr before the journal took over:")[1]  # the wrapper's own words


# ------------------------------------------------------------------------------------ diagnose on the journal


@pytest.mark.system
def test_diagnose_reads_the_journal_in_every_output_format(journald: PrivateJournald, tmp_path: Path) -> None:
    """Three real captures logged as three processes of a unit (one with colours, so that the export
    format writes its messages as binary fields): `diagnose` on `journalctl -o json`, `-o export`,
    `-o short-iso` (files or standard input) finds the same runs as on the plain lines (`-o cat`),
    each dated by the journal; several journal files are ordered by their time stamps, not by file
    times; and a --log-file that repeats a run of the journal is counted once."""
    unit = "diagnose.service"
    names = ("exhaust-lv4", "recover-purge-lv4", "checkpoints-swa-lv4")
    logs = [next(c for c in CAPTURES if c.parent.name == n) for n in names]
    coloured = tmp_path / "coloured.log"
    coloured.write_text("".join(f"\x1b[32m{x}\x1b[0m\n" for x in logs[1].read_text().splitlines()))
    total = 0
    for log in (logs[0], coloured, logs[2]):
        journald.write(unit, log)
        total += count_lines(log.read_bytes())
    wait_for(lambda: len(journald.journalctl("-u", unit, "-o", "cat").splitlines()) >= total, timeout=30, what="lines")

    def journal(*args: str) -> bytes:  # bytes: the export format is binary where a message has control bytes
        cmd = ["journalctl", "--no-pager", "--quiet", f"--namespace={journald.namespace}", "-u", unit, *args]
        return subprocess.run(cmd, capture_output=True, timeout=60, check=True).stdout

    def diagnose_json(*args: str, stdin: bytes | None = None) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "exporter", "diagnose", "--json", "--max-runs", "0", *args],
            input=stdin,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 1, out.stderr.decode()  # the first capture aborts requests
        return dict(json.loads(out.stdout))

    def key(report: dict[str, Any]) -> list[tuple[object, ...]]:
        return [(r["counts"], r["ending"]["how"], r["failure_summary"]["total"]) for r in report["runs"]]

    plain = diagnose_json("-", stdin=journal("-o", "cat"))
    assert plain["runs_total"] == 3 and [h["clock"] for h in plain["history"]] == [None, None, None]
    for fmt in ("json", "export", "short-iso", "short-iso-precise"):
        from_stdin = diagnose_json("-", stdin=journal("-o", fmt))
        assert key(from_stdin) == key(plain), fmt
        assert [h["clock"] for h in from_stdin["history"]] == ["log"] * 3, fmt
        starts = [h["started_at"] for h in from_stdin["history"]]
        assert starts == sorted(starts) and all(abs(t - time.time()) < 600 for t in starts), fmt

    # One journal file per run, their file times the wrong way round: the journal's clock orders them.
    files = []
    for i, cursor_run in enumerate(_journal_runs(journald, unit)):
        path = tmp_path / f"run{i}.json"
        path.write_text(cursor_run)
        os.utime(path, (1_000_000 - i, 1_000_000 - i))
        files.append(str(path))
    by_files = diagnose_json(*reversed(files))
    assert by_files["files_order"] == "by the journal's time stamps, oldest first"
    assert by_files["files"] == files and key(by_files) == key(plain)

    # The journal and a --log-file of its second run: that run is read twice and counted once.
    journal_file = tmp_path / "journal.export"
    journal_file.write_bytes(journal("-o", "export"))
    both = diagnose_json(str(journal_file), str(logs[2]))
    assert both["runs_total"] == 3 and len(both["overlaps"]) == 1, both["overlaps"]
    # The --log-file is older, so it is read first; the journal's last run is the same run, as long,
    # and dated: that copy is counted, the file's is the one read twice.
    assert [(Path(h["file"]).name, h["same_as"], h["clock"]) for h in both["history"]] == [
        (logs[2].name, 4, "file"),
        (journal_file.name, None, "log"),
        (journal_file.name, None, "log"),
        (journal_file.name, None, "log"),
    ]


def _journal_runs(journald: PrivateJournald, unit: str) -> list[str]:
    """`journalctl -o json` of each process of `unit`, one text per process (by _PID)."""
    runs: dict[str, list[str]] = {}
    for line in journald.journalctl("-u", unit, "-o", "json").splitlines():
        entry = json.loads(line)
        runs.setdefault(str(entry.get("_PID")), []).append(line + "\n")
    return ["".join(lines) for lines in runs.values()]
